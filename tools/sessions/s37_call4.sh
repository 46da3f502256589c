#!/usr/bin/env bash
# Session 37, call 4 (library rebuilt with PDL on by default): (a) the six GPU-platform pass tests fixed after call 2
# and the vmap tests; (b) the PDL bitwise test on the shipped default; (c) where the layer's forward gain comes from:
# benchmarks/profile_layer.py --impl ours_dropless with JAX_MOE_FFI_PDL=0 and 1 (per-kernel time, idle time before each).
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PT0=$PT
python3 -c "import xdist" && PT="$PT -n ${WORKERS:-4}"
step fixed_pass_tests ${T_FIXED:-150} tests/test_pass_runtime.py tests/test_flax.py::test_linen_scan_remat_stack \
  tests/test_rewrite_gathered.py::test_package_model_is_rewritten_and_routes_once \
  tests/test_rewrite.py::test_vmap_and_pure_jax_backend tests/test_rewrite.py::test_vmap_and_grad_lower_for_a_gpu
PT=$PT0
unset XLA_PYTHON_CLIENT_PREALLOCATE
step pdl_bitwise_default ${T_BITWISE:-90} -m gpu tests/test_gpu_grouped_gemm.py -k dependent_launch
for pdl in 0 1; do
  JAX_MOE_FFI_PDL=$pdl timeout ${T_PROF:-60} python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10 \
    > $R/profile_pdl$pdl.log 2>&1
  echo "profile pdl=$pdl rc=$? at $((SECONDS - T0)) s"; head -40 $R/profile_pdl$pdl.log | cut -c1-150 | grep -iE "span|total|fwd" | head -6
  cp benchmarks/results/profile_layer_*.json $R/profile_layer_pdl$pdl.json 2>/dev/null
  tar czf "$OUT_DEV/results.tgz" -C "$R" .
done
echo "total $((SECONDS - T0)) s"
