#!/usr/bin/env bash
# Session 19, call 1 (experiment build; prepared in session 18 as its call 2). The 128x256 sliced FP8 tiles with A in registers (wgmma RS:
# JAX_MOE_FFI_FP8_TILES=wide_rs / wide_rs_c21): bitwise the default and against the float32 reference (GPU tests),
# then alternating timings against the default, the shared-memory-A sliced kernel and the direct256c21 ceiling.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_TESTS:-120} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  -k "wide" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error|assert" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_CEIL:-170} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  --variants default,wide64c12,wide64rsc12,wide64rsc21,direct256c21 --out fp8_wide_rs_h200 > $R/fp8_wide_rs.log 2>&1
echo "wide rs rc=$?"; grep -E "TFLOP" $R/fp8_wide_rs.log | cut -c1-120
cp benchmarks/results/fp8_wide_rs_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_SKEW:-90} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  --groups skew --variants default,wide64c12,wide64rsc12 --out fp8_wide_rs_skew_h200 > $R/fp8_wide_rs_skew.log 2>&1
echo "skew rc=$?"; grep -E "TFLOP" $R/fp8_wide_rs_skew.log | cut -c1-120
cp benchmarks/results/fp8_wide_rs_skew_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
JAX_MOE_FFI_FP8_TILES=wide_rs timeout ${T_FORCED:-100} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider \
  tests/test_grouped_gemm_fp8.py -k "not wide" > $R/gpu_tests_forced_wide_rs.log 2>&1
echo "forced wide_rs tests rc=$?"; grep -E "passed|failed|FAILED|Error|assert" $R/gpu_tests_forced_wide_rs.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
