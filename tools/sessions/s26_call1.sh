#!/usr/bin/env bash
# Session 26, call 1 (experiment build of 79cce30, JAX_MOE_FFI_WGRAD_TILES=trim restructured: last k-tile peeled):
# the trimmed-tail wgrad against the default, alternating in one process, two rounds, bitwise checked; then the
# wgrad GPU tests and compute-sanitizer racecheck (the producer -> consumer shared-memory mailbox) under trim.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-150} python3 benchmarks/tile_ab.py --passes wgrad \
  --groups skew,even --variants static,trim --rounds 2 --out wgrad_trim2_ab_h200 > $R/wgrad_ab.log 2>&1
echo "wgrad ab rc=$?"; grep -E "TFLOP|Error|error|bitwise" $R/wgrad_ab.log | cut -c1-110 | tail -44
cp benchmarks/results/wgrad_trim2_ab_h200.* $R/ 2>/dev/null
JAX_MOE_FFI_WGRAD_TILES=trim timeout 120 python3 -m pytest -m gpu -q --tb=line -p no:cacheprovider --timeout 60 \
  tests/test_gpu_grouped_gemm.py tests/test_grouped_gemm.py -k "wgrad" > $R/trim_tests.log 2>&1
echo "trim wgrad tests rc=$?"; tail -5 $R/trim_tests.log
JAX_MOE_FFI_WGRAD_TILES=trim timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 \
  python3 tools/sanitize_case.py > $R/trim_racecheck.log 2>&1
echo "trim racecheck rc=$?"; tail -4 $R/trim_racecheck.log
tar czf $OUT_DEV/results.tgz -C $R .
