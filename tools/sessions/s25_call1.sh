#!/usr/bin/env bash
# Prepared in session 24 (not yet run), for an experiment build carried as .gpu/ (cmake -DJAX_MOE_FFI_CUDA=ON
# -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON; the handlers then read JAX_MOE_FFI_WGRAD_TILES / _SCHEDULE on every call):
# why the skewed wgrad runs at 0.85 of even. Alternating in one process, bitwise checked against the first variant:
# the default; the tile order along N / swizzled (L2 reuse on large groups); 4 store stages and larger epilogue
# subtiles (the epilogue latency of short groups' tiles). Then the bitwise tests of the new knobs.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-300} python3 benchmarks/tile_ab.py --passes wgrad \
  --groups skew,even --variants static,static+n1,static+m4,static+n4,s4,e64x64,e64x128 --rounds 2 \
  --out wgrad_sched_ab_h200 > $R/wgrad_ab.log 2>&1
echo "wgrad ab rc=$?"; grep -E "TFLOP" $R/wgrad_ab.log | cut -c1-120 | tail -80
cp benchmarks/results/wgrad_sched_ab_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS:-200} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA tests/test_gpu_grouped_gemm.py \
  tests/test_fp8_wgrad.py -k "WGRAD_SCHEDULE or schedule or wgrad_tile_configs" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests.log | tail -20 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
