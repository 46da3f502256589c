#!/usr/bin/env bash
# Session 24, call 1 (shipped build with the wgrad's problems listed largest group first, .gpu/): the new bitwise
# tests (order = groups vs size, bf16 and FP8 wgrad) and the bf16 wgrad tests; the wgrad order A/B (separate
# processes, as a shipped build reads JAX_MOE_FFI_WGRAD_ORDER once; alternating groups / size, two rounds); then
# the GPU tests not run since the per-group descriptor refactor (many groups incl. the 160-rows-a-group case,
# benchmark shapes, accumulate form, pair launch, FP8 suites).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS1:-110} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA \
  tests/test_gpu_grouped_gemm.py tests/test_fp8_wgrad.py -k "(WGRAD_ORDER or order or wgrad) and not GEMM_GRID" > $R/gpu_tests_order.log 2>&1
echo "order tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests_order.log | tail -30 | cut -c1-160
tar czf $OUT_DEV/results.tgz -C $R .
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
for r in 1 2; do
  for order in groups size; do
    JAX_MOE_FFI_WGRAD_ORDER=$order timeout ${T_AB:-75} python3 benchmarks/tile_ab.py --passes wgrad --variants static \
      --rounds 1 --out wgrad_order_${order}_r${r}_h200 > $R/ab_${order}_r$r.log 2>&1
    echo "ab $order r$r rc=$?"; grep -E "TFLOP" $R/ab_${order}_r$r.log | cut -c1-110
    cp benchmarks/results/wgrad_order_${order}_r${r}_h200.* $R/ 2>/dev/null
  done
done
unset XLA_FLAGS
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS2:-120} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider \
  tests/test_gpu_grouped_gemm.py -k "many_groups or benchmark_shapes or accumulate_form or pair_launch" \
  > $R/gpu_tests_bf16.log 2>&1
echo "bf16 tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_bf16.log | tail -8 | cut -c1-200
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS3:-90} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider \
  tests/test_grouped_gemm_fp8.py -k "many_groups or benchmark_shapes or random_shapes" > $R/gpu_tests_fp8.log 2>&1
echo "fp8 tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_fp8.log | tail -8 | cut -c1-200
tar czf $OUT_DEV/results.tgz -C $R .
