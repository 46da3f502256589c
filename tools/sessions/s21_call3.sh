#!/usr/bin/env bash
# Session 21, call 3 (shipped build after the review: the workspace halving of the pick / split launches is one
# helper, HalveWorkspace): the split's bitwise tests (bf16 and FP8, which use both halves) and the pick's.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
timeout ${T_TESTS:-150} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_gpu_grouped_gemm.py \
  tests/test_grouped_gemm_fp8.py -k "cluster_split or (wide_tiles_match and (split or auto))" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error|assert" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
