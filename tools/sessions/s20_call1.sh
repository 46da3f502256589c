#!/usr/bin/env bash
# (Ran at d0ec514, experiment build; wide_ordered / wide128oc12 / wide128fc12 were removed after it: the one-slice
# kernel became wide_one_slice / wide128c12, the turn-taking one was dropped.)
# Session 20, call 1 (experiment build). The ordered-warp-group 128x256 FP8 tile (JAX_MOE_FFI_FP8_TILES=wide_ordered,
# experiment variant wide128oc12: one 128-column slice accumulator per warp group, the two warp groups' wgmma issue
# taking turns on a pair of named barriers): bitwise the 128x128 kernel (GPU test, short limit in case the barrier
# protocol hangs), then alternating timings against the default (wide64c12) and the direct256 ceiling, even and skew.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-150} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  -k "wide_tiles_match and (wide_ordered or auto)" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error|assert|Timeout" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_CEIL:-150} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  --variants default,wide128oc12,wide128fc12,direct256 --out fp8_wide_ordered_h200 > $R/fp8_wide_ordered.log 2>&1
echo "ordered rc=$?"; grep -E "TFLOP" $R/fp8_wide_ordered.log | cut -c1-120
cp benchmarks/results/fp8_wide_ordered_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_SKEW:-90} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  --groups skew --variants default,wide128oc12,wide128fc12 --out fp8_wide_ordered_skew_h200 > $R/fp8_wide_ordered_skew.log 2>&1
echo "skew rc=$?"; grep -E "TFLOP" $R/fp8_wide_ordered_skew.log | cut -c1-120
cp benchmarks/results/fp8_wide_ordered_skew_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
JAX_MOE_FFI_FP8_TILES=wide_ordered timeout ${T_FORCED:-100} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider \
  tests/test_grouped_gemm_fp8.py -k "not wide" > $R/gpu_tests_forced_wide_ordered.log 2>&1
echo "forced wide_ordered tests rc=$?"; grep -E "passed|failed|FAILED|Error|assert" $R/gpu_tests_forced_wide_ordered.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
