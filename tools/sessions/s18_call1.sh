#!/usr/bin/env bash
# Session 18, call 1 (library built with -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON). (a) GPU tests of the 128x256 FP8 tiles
# with sliced promotion (JAX_MOE_FFI_FP8_TILES=wide / wide_c21): bitwise the default kernel and against the float32
# reference; the block-scaled and random-shape FP8 tests again with wide forced; the mainloop bitwise tests (the
# EnvSwitch refactor of session 17 was not GPU-run). (b) benchmarks/fp8_ceiling.py: default vs wide64c12 /
# wide64c21 (correct numerics, bitwise-checked per call) vs the direct256c21 ceiling and CUTLASS's per-tensor
# kernels (pertensor128 / pertensor256c21, prepared in session 17), alternating in one process; then skewed groups.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-150} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  -k "wide or block_scaled or overlap_mainloop" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
JAX_MOE_FFI_FP8_TILES=wide timeout ${T_TESTS2:-100} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider \
  tests/test_grouped_gemm_fp8.py -k "block_scaled or random_shapes or benchmark_shapes" > $R/gpu_tests_wide.log 2>&1
echo "tests(wide) rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_wide.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_CEIL:-200} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  --variants default,wide64c12,wide64c21,direct256c21,pertensor128,pertensor256c21 --out fp8_wide_h200 \
  > $R/fp8_wide.log 2>&1
echo "wide rc=$?"; grep -E "TFLOP" $R/fp8_wide.log | cut -c1-120
cp benchmarks/results/fp8_wide_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_SKEW:-100} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  --groups skew --variants default,wide64c12,wide64c21 --out fp8_wide_skew_h200 > $R/fp8_wide_skew.log 2>&1
echo "skew rc=$?"; grep -E "TFLOP" $R/fp8_wide_skew.log | cut -c1-120
cp benchmarks/results/fp8_wide_skew_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_WG:-90} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_fp8_wgrad.py \
  -k "overlap" > $R/gpu_tests_wgrad.log 2>&1
echo "wgrad tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_wgrad.log | tail -4 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
