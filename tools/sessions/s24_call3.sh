#!/usr/bin/env bash
# Session 24, call 3 (shipped build of bad732b, .gpu/): the bf16 GPU tests call 2's limit did not reach (more groups
# than SMs -- G up to 1000, so the wgrad's size-ordered problem slots at large G -- the accumulate form, the pair
# launch), then issue 8's train step, bf16 dropless vs FP8 (both with offload="device"), at this commit.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
timeout ${T_TESTS:-200} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA \
  tests/test_gpu_grouped_gemm.py -k "many_groups or pair_launch or accumulate_form" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests.log | tail -20 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TRAIN:-190} python3 benchmarks/train_step.py --xla-flags runtime --variants ours_save,ours_fp8_save \
  --out train_step_s24_h200 > $R/train.log 2>&1
echo "train rc=$?"; grep -E "ms|FAILED|Error" $R/train.log | tail -8 | cut -c1-200
cp benchmarks/results/train_step_s24_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
