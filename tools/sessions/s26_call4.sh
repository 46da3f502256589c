#!/usr/bin/env bash
# Session 26, call 4 (shipped library at 3a75458 + Python changes): FP8 train step with the stacked expert
# weights quantised once before the layer scan (default now) against per layer inside it (*_inbody), interleaved,
# bf16 ours_save beside them; the per-kernel profile of bf16 vs FP8 at the new defaults; the GPU tests of the pass.
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
timeout ${T_TRAIN:-260} python3 benchmarks/train_step.py --xla-flags runtime --variants \
  ours_fp8_save,ours_fp8_save_inbody,ours_fp8,ours_fp8_inbody,ours_save,ours_fp8_save,ours_fp8_save_inbody \
  --out train_step_fp8_hoist_h200 > $R/train_step.log 2>&1
echo "train rc=$?"; grep -E "ms/step|FAILED" $R/train_step.log | cut -c1-150
cp benchmarks/results/train_step_fp8_hoist_h200.* $R/ 2>/dev/null
timeout ${T_PROF:-120} python3 benchmarks/profile_step.py --variants ours_save,ours_fp8_save --steps 3 > $R/profile.log 2>&1
echo "profile rc=$?"; grep -v "^W1" $R/profile.log | grep -A22 "ours_fp8_save - ours_save" | cut -c1-150
cp benchmarks/results/profile_step_h200.json $R/profile_step_fp8_s26_h200.json 2>/dev/null
timeout ${T_TESTS:-200} python3 -m pytest -m gpu -q --tb=line -p no:cacheprovider --timeout 90 tests/test_pass_runtime.py \
  tests/test_rewrite_capacity.py tests/test_grouped_gemm_fp8.py -k "pass or scan or grads or capacity or cached" \
  > $R/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; tail -6 $R/gpu_tests.log
tar czf $OUT_DEV/results.tgz -C $R .
