#!/usr/bin/env bash
# Session 28, call 3 (library of call 2): the accumulate-form GPU tests that call 2's 170 s test step did not reach
# (it ran the plain FP8 tile tests first), then the issue-8 rows with the FP8 pair's summed dgrad: naive, exact and
# dropless bf16 / FP8 with offload="device" and the scan-output knob, FP8 without the knob.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
T0=$SECONDS
timeout 150 python3 -m pytest -m gpu -rA -q --tb=short -p no:cacheprovider --timeout 120 tests/test_grouped_gemm_fp8.py \
  -k "acc_kernel or shared_lhs_blockwise_grads" > $R/gpu_tests.log 2>&1
echo "GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $R/gpu_tests.log | head -12
V=naive,ours_exact_save_noinit,ours_save_noinit,ours_fp8_save,ours_fp8_save_noinit,ours_save
timeout 300 python3 benchmarks/train_step.py --xla-flags runtime --variants $V --out train_step_s28b_h200 \
  > $R/train_step.log 2>&1
echo "train rc=$? at $((SECONDS - T0)) s"; grep "ms/step\|FAILED" $R/train_step.log | cut -c1-150
cp benchmarks/results/train_step_s28b_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
