#!/usr/bin/env bash
# Session 29, call 3: (1) the merged 1 x 128 row kernel (rowblock_kernel, kChunks = 2, encode-then-store order)
# against session 28's separate 16-element kernel (x16_s28, kept in the experiment build for this A/B) and x8,
# alternating in one process, bitwise -- call 2's first merged form ran 8% below session 28's figures; (2) the
# quantize GPU tests on the shipped library (band kernel back to no prefetch, merged row kernel); (3) the FP8 step
# against bf16 at the default 4 x 2048 tokens and at 16 x 2048 (the per-step costs -- AdamW, the weights'
# quantisation -- shared by 4x the tokens).
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
T0=$SECONDS
(
  export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/qexp/libjax_moe_ffi_cuda.so XLA_FLAGS=--xla_gpu_enable_command_buffer=
  timeout 100 python3 benchmarks/quantize_rows_ab.py --rounds 3 --variants default,x16_s28,x8 \
    --out quantize_rows_ab_merged2_s29_h200 > $R/ab_rows.log 2>&1
  echo "ab rows rc=$? at $((SECONDS - T0)) s"; grep -E "GB/s" $R/ab_rows.log | cut -c1-110 | head -100
  cp benchmarks/results/quantize_rows_ab_merged2_s29_h200.* $R/ 2>/dev/null
)
tar czf $OUT_DEV/results.tgz -C $R .
timeout 100 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 90 tests/test_quantize.py \
  > $R/gpu_tests.log 2>&1
echo "quantize GPU tests rc=$? at $((SECONDS - T0)) s"; tail -2 $R/gpu_tests.log; grep -E "^(FAILED|ERROR)" $R/gpu_tests.log | head
timeout 80 python3 benchmarks/train_step.py --xla-flags runtime --variants ours_fp8_save_noinit,ours_save_noinit \
  --out train_step_fp8_s29b_h200 > $R/train.log 2>&1
echo "train rc=$? at $((SECONDS - T0)) s"; grep "ms/step" $R/train.log | cut -c1-120
cp benchmarks/results/train_step_fp8_s29b_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout 170 python3 benchmarks/train_step.py --xla-flags runtime --batch 16 --steps 6 \
  --variants ours_save_noinit,ours_fp8_save_noinit --out train_step_b16_s29_h200 > $R/train_b16.log 2>&1
echo "train b16 rc=$? at $((SECONDS - T0)) s"; grep -E "ms/step|rror" $R/train_b16.log | cut -c1-160 | head
cp benchmarks/results/train_step_b16_s29_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
