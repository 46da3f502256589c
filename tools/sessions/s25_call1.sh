#!/usr/bin/env bash
# Session 25, call 1 (experiment build carried as .gpu/: cmake -DJAX_MOE_FFI_CUDA=ON -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON;
# its handlers read JAX_MOE_FFI_WGRAD_TILES / _SCHEDULE / _SUM_MAPS on every call).
# 1. Why the skewed wgrad runs at 0.85 of even: alternating in one process, bitwise checked against the first variant:
#    the default; the tile order along N / swizzled (L2 reuse on large groups); 4 store stages and larger epilogue
#    subtiles (the epilogue latency of short groups' tiles).
# 2. The summed dgrad with per-group prebuilt descriptors vs per-SM rewritten ones (JAX_MOE_FFI_SUM_MAPS), alternating.
# 3. The summed dgrad's correctness tests with the prebuilt descriptors, then the knobs' bitwise tests.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
timeout ${T_AB:-270} python3 benchmarks/tile_ab.py --passes wgrad \
  --groups skew,even --variants static,static+n1,static+m4,static+n4,s4,e64x64,e64x128 --rounds 2 \
  --out wgrad_sched_ab_h200 > $R/wgrad_ab.log 2>&1
echo "wgrad ab rc=$?"; grep -E "TFLOP" $R/wgrad_ab.log | cut -c1-120 | tail -80
cp benchmarks/results/wgrad_sched_ab_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_SUM:-110} python3 benchmarks/tile_ab.py --passes sum --groups even,skew --variants persm,prebuilt \
  --rounds 2 --out sum_maps_ab_h200 > $R/sum_ab.log 2>&1
echo "sum ab rc=$?"; grep -E "TFLOP|Error" $R/sum_ab.log | cut -c1-120 | tail -40
cp benchmarks/results/sum_maps_ab_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
unset XLA_FLAGS
JAX_MOE_FFI_SUM_MAPS=prebuilt timeout ${T_TESTS1:-100} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA \
  tests/test_gpu_grouped_gemm.py -k "sum_dgrad" > $R/gpu_tests_sum_prebuilt.log 2>&1
echo "sum prebuilt tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests_sum_prebuilt.log | tail -12 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS2:-100} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA tests/test_gpu_grouped_gemm.py \
  tests/test_fp8_wgrad.py -k "WGRAD_SCHEDULE or schedule" > $R/gpu_tests.log 2>&1
echo "knob tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests.log | tail -20 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
