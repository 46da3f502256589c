#!/usr/bin/env bash
# Session 28, call 2 (library built here with the FP8 accumulate form, grouped_gemm_fp8_acc):
# 1. GPU tests: the accumulate kernel against the reference (auto's four kernels), the shared-lhs FP8 pair's
#    gradients, and the plain FP8 kernels still bitwise across tile variants (their template gained a parameter).
# 2. FP8 train step with the pair's dgrad in the epilogue (default) vs an XLA add (JAX_MOE_FFI_FP8_ACC_DGRAD=0),
#    separate processes, alternating, bf16 ours_save_noinit in each as the same-process anchor.
# 3. Profiles: the FP8 step's kernels (wrapped_add gone?) and the whole step with the AdamW update.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
T0=$SECONDS
timeout 170 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 120 tests/test_grouped_gemm_fp8.py \
  -k "acc or shared_lhs or kernel_is_loaded or wide_tiles_match or benchmark_shapes or grads_vs_bf16" > $R/gpu_tests.log 2>&1
echo "GPU tests rc=$? at $((SECONDS - T0)) s"; tail -3 $R/gpu_tests.log; grep -E "^(FAILED|ERROR)" $R/gpu_tests.log | head
for round in 1 2; do
  for acc in 1 0; do
    JAX_MOE_FFI_FP8_ACC_DGRAD=$acc timeout 100 python3 benchmarks/train_step.py --xla-flags runtime \
      --variants ours_fp8_save_noinit,ours_save_noinit --out train_step_fp8acc${acc}_r${round}_s28_h200 \
      > $R/train_acc${acc}_r${round}.log 2>&1
    echo "train acc=$acc round $round rc=$? at $((SECONDS - T0)) s"; grep "ms/step" $R/train_acc${acc}_r${round}.log | cut -c1-120
    cp benchmarks/results/train_step_fp8acc${acc}_r${round}_s28_h200.* $R/ 2>/dev/null
  done
done
timeout 100 python3 benchmarks/profile_step.py --variants ours_save_noinit,ours_fp8_save_noinit --steps 3 \
  > $R/profile_fp8.log 2>&1
echo "profile fp8 rc=$? at $((SECONDS - T0)) s"; grep -A14 "ours_fp8_save_noinit - ours_save_noinit" $R/profile_fp8.log
cp benchmarks/results/profile_step_h200.json $R/profile_step_fp8acc_s28_h200.json 2>/dev/null
timeout 100 python3 benchmarks/profile_step.py --variants ours_save_noinit,ours_save_noinit_adamw --steps 3 \
  > $R/profile_adamw.log 2>&1
echo "profile adamw rc=$? at $((SECONDS - T0)) s"; grep -E "^== " -A8 $R/profile_adamw.log | tail -24
cp benchmarks/results/profile_step_h200.json $R/profile_step_adamw_s28_h200.json 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
