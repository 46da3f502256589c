#!/usr/bin/env bash
# Session 19, call 3 (shipped build of 4bc567a; later commits change comments only): the whole GPU test suite,
# including the FP8 wgrad tests call 2 did not reach.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
timeout ${T_TESTS:-420} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --durations=8 tests > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -12 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
