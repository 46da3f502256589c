#!/usr/bin/env bash
# Session 24, call 4 (shipped build of bad732b, .gpu/; run inline, recorded here): the subprocess tests of the opt-in
# paths not re-run since the per-group descriptors (grid scale, row splits, paired pick).
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
timeout 240 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA tests/test_gpu_grouped_gemm.py \
  -k "GEMM_GRID or row_split or paired_cluster" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests.log | tail -20 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
