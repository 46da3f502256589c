#!/usr/bin/env bash
# Session 29, call 2: the weights' tile quantiser with an L2 prefetch of each CTA's next tile (band_kernel, now the
# default) and the 1 x 128 row quantiser's two kernels merged into one (rowblock_kernel with kChunks = 2 for the
# 16-element default). Shipped library (built here): the quantize GPU tests (CUDA bitwise CPU), then the FP8 step's
# profile (band / rowblock rows against call 1's 2.891 / 1.675 ms) and the step time. Experiment library
# (.gpu/qexp, quantize.cu only, built here): prefetch against band_noprefetch on expert weights, and the merged row
# kernel against x8 (session 28 call 7's default / x8 / copy ratios), alternating in one process, bitwise.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
T0=$SECONDS
timeout 120 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 110 tests/test_quantize.py \
  > $R/gpu_tests.log 2>&1
echo "quantize GPU tests rc=$? at $((SECONDS - T0)) s"; tail -2 $R/gpu_tests.log; grep -E "^(FAILED|ERROR)" $R/gpu_tests.log | head
(
  export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/qexp/libjax_moe_ffi_cuda.so XLA_FLAGS=--xla_gpu_enable_command_buffer=
  timeout 120 python3 benchmarks/quantize_rows_ab.py --weights --rounds 2 --out quantize_weights_ab_s29_h200 \
    > $R/ab_weights.log 2>&1
  echo "ab weights rc=$? at $((SECONDS - T0)) s"; grep -E "GB/s" $R/ab_weights.log | cut -c1-110
  timeout 100 python3 benchmarks/quantize_rows_ab.py --rounds 2 --variants default,x8 \
    --out quantize_rows_ab_merged_s29_h200 > $R/ab_rows.log 2>&1
  echo "ab rows rc=$? at $((SECONDS - T0)) s"; grep -E "GB/s" $R/ab_rows.log | cut -c1-110 | head -48
  cp benchmarks/results/quantize_weights_ab_s29_h200.* benchmarks/results/quantize_rows_ab_merged_s29_h200.* $R/ 2>/dev/null
)
tar czf $OUT_DEV/results.tgz -C $R .
timeout 110 python3 benchmarks/profile_step.py --variants ours_save_noinit,ours_fp8_save_noinit --steps 3 \
  > $R/profile_fp8.log 2>&1
echo "profile rc=$? at $((SECONDS - T0)) s"; grep -A8 "ours_fp8_save_noinit - ours_save_noinit" $R/profile_fp8.log | cut -c1-120
cp benchmarks/results/profile_step_h200.json $R/profile_step_fp8_s29b_h200.json 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout 80 python3 benchmarks/train_step.py --xla-flags runtime --variants ours_fp8_save_noinit,ours_save_noinit \
  --out train_step_fp8_s29_h200 > $R/train.log 2>&1
echo "train rc=$? at $((SECONDS - T0)) s"; grep "ms/step" $R/train.log | cut -c1-120
cp benchmarks/results/train_step_fp8_s29_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
