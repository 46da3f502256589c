#!/usr/bin/env bash
# Session 40, call 1: (a) the GPU-platform pass tests, with session 39's two fixes (call-done lines; no stream region
# under jax.vmap) -- CPU-tested only until now; (b) the bf16 grouped-GEMM table (issue 3) with PDL on; (c) the FP8
# table (issue 6) with the own scale loads and PDL on. END (seconds, default 545) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
(
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  python3 -c "import xdist" && PT="$PT -n ${WORKERS:-4}"
  step pass_tests ${T_PASS:-100} tests/test_pass_runtime.py tests/test_flax.py::test_linen_scan_remat_stack \
    tests/test_rewrite_gathered.py::test_package_model_is_rewritten_and_routes_once \
    tests/test_rewrite.py::test_vmap_and_pure_jax_backend tests/test_rewrite.py::test_vmap_and_grad_lower_for_a_gpu
)
tables ${END:-545}
echo "total $((SECONDS - T0)) s"
