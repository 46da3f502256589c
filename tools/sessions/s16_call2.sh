#!/usr/bin/env bash
# Session 16, call 2: the FP8 wgrad GPU tests again (cooperative tiles are now its default), then the issue-8 table
# under runtime.xla_flags() (graphs kept + CONCURRENT; session 15), with the ours_fp8_save row (FP8 weights kept
# across the remat instead of quantised again).
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_TESTS:-100} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_fp8_wgrad.py \
  > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TRAIN:-380} python3 benchmarks/train_step.py --xla-flags runtime > $R/train_step.log 2>&1
echo "train rc=$?"; grep -E "ms/step|FAILED|Error|out of memory" $R/train_step.log | cut -c1-180
cp benchmarks/results/train_step_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
