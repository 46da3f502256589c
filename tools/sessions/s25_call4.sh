#!/usr/bin/env bash
# Session 25, call 4 (experiment build with JAX_MOE_FFI_WGRAD_TILES=k32, read per call): the wgrad with 32-deep
# k-tiles (half the zero padding of each group's last k-tile) against the default 64-deep ones, alternating in one
# process, three rounds, bitwise checked; the wgrad tile-config tests with k32.
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-200} python3 benchmarks/tile_ab.py --passes wgrad \
  --groups skew,even --variants static,k32 --rounds 3 --out wgrad_k32_ab_h200 > $R/wgrad_ab.log 2>&1
echo "wgrad ab rc=$?"; grep -E "TFLOP|Error" $R/wgrad_ab.log | cut -c1-110 | tail -70
cp benchmarks/results/wgrad_k32_ab_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
JAX_MOE_FFI_WGRAD_TILES=k32 timeout ${T_TESTS:-90} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA \
  tests/test_gpu_grouped_gemm.py -k "wgrad_tile_configs" > $R/gpu_tests.log 2>&1
echo "k32 tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests.log | tail -8 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
