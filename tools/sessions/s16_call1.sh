#!/usr/bin/env bash
# Prepared in session 15 for the next device session (not run yet):
# 1. GPU tests of the FP8 path (its weight codes now cross the custom_vjp as uint8 bitcasts) and of the pass at run
#    time (runtime.xla_flags() now keeps CUDA graphs, CONCURRENT);
# 2. the issue-8 table under the new flags, with the new ours_fp8_save row (FP8 weights kept across remat).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-200} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  tests/test_pass_runtime.py tests/test_rewrite_capacity.py > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $R/gpu_tests.log
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TRAIN:-360} python3 benchmarks/train_step.py --xla-flags runtime --out train_step_h200 > $R/train_step.log 2>&1
echo "train rc=$?"; grep -E "ms/step|FAILED|Error" $R/train_step.log | cut -c1-160
cp benchmarks/results/train_step_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
