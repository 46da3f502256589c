#!/usr/bin/env bash
# Session 38, call 1 (library at 99e0ebc, PDL on by default): (a) the GPU-platform pass tests fixed in session 37 and
# the vmap tests; (b) the PDL bitwise test on the shipped default; (c) the bf16 grouped-GEMM table (issue 3) with PDL on.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PT0=$PT
python3 -c "import xdist" && PT="$PT -n ${WORKERS:-4}"
step fixed_pass_tests ${T_FIXED:-140} tests/test_pass_runtime.py tests/test_flax.py::test_linen_scan_remat_stack \
  tests/test_rewrite_gathered.py::test_package_model_is_rewritten_and_routes_once \
  tests/test_rewrite.py::test_vmap_and_pure_jax_backend tests/test_rewrite.py::test_vmap_and_grad_lower_for_a_gpu
PT=$PT0
unset XLA_PYTHON_CLIENT_PREALLOCATE
[ -n "${BITWISE:-}" ] && step pdl_bitwise_default ${T_BITWISE:-80} -m gpu tests/test_gpu_grouped_gemm.py -k dependent_launch
timeout ${T_GG:-270} python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot > $R/grouped_gemm.log 2>&1
echo "grouped_gemm rc=$? at $((SECONDS - T0)) s"; tail -30 $R/grouped_gemm.log | cut -c1-160
cp benchmarks/results/grouped_gemm_* $R/ 2>/dev/null
tar czf "$OUT_DEV/results.tgz" -C "$R" .
echo "total $((SECONDS - T0)) s"
