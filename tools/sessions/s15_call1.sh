#!/usr/bin/env bash
# Session 15, call 1: the persistent-grid knob JAX_MOE_FFI_GEMM_GRID (issue 7: can streams gain once the routed
# grouped GEMMs no longer hold every SM with a static tile split?).
# 1. GPU tests: the grid knob is bitwise the default grid; the capacity forms (T5X bf16 after session 14's fix).
# 2. Our grouped GEMM alone at grid 1 / 2 / 4 (what oversubscription costs without other streams).
# 3. The runtime benchmark's model (deepseek-v3-ep8-local + shared expert, 2 layers), ours vs ours_streams,
#    alternating in one process per grid value.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-170} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_rewrite_capacity.py \
  "tests/test_gpu_grouped_gemm.py::test_grid_scale_is_bitwise_the_default_grid" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; tail -4 $R/gpu_tests.log
tar czf $OUT_DEV/results.tgz -C $R .
for grid in 1 2 4; do
  out=gg_grid${grid}_h200
  JAX_MOE_FFI_GEMM_GRID=$grid timeout 60 python3 benchmarks/grouped_gemm.py --cases "qwen3-30b-a3b gate_up,deepseek-v3 down" \
    --skip xla_ragged_dot,tokamax,dense,copy --no-torch --out $out > $R/$out.log 2>&1
  echo "grid=$grid rc=$?"; grep -E "\| ours \|" benchmarks/results/$out.md | awk -F'|' '{print $2,$4,$5,$7}'
  cp benchmarks/results/$out.* $R/ 2>/dev/null
done
tar czf $OUT_DEV/results.tgz -C $R .
for grid in 1 2 4; do
  out=runtime_grid${grid}_h200
  JAX_MOE_FFI_GEMM_GRID=$grid timeout ${T_RT:-110} python3 benchmarks/runtime.py --layers 2 \
    --variants ours,ours_streams,ours,ours_streams --out $out > $R/$out.log 2>&1
  echo "grid=$grid rc=$?"; grep -E "ours" $R/$out.log | grep -E "ms" | head -8
  cp benchmarks/results/$out.* $R/ 2>/dev/null
  tar czf $OUT_DEV/results.tgz -C $R .
done
