#!/usr/bin/env bash
# Session 38, call 2 (ran in session 39, on an H100). Needs the library built with the own FP8 scale loads
# (-DJAX_MOE_FFI_FP8_OWN_SCALE_LOADS, on by default since). (a) racecheck on the FP8 sanitize cases (the 128x256 kernel's
# duplicate SFB write should be gone) and the wide-vs-128x128 bitwise test;
# (b) the bf16 grouped-GEMM table (issue 3) with PDL on; (c) the GPU-platform pass tests fixed in session 37.
set -uo pipefail
# END (seconds, default 545): when the last step must have finished; the table and the pass tests get what is left.
R=/tmp/r2; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout ${T_RACE:-110} compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_case.py fp8 \
  > $R/racecheck_fp8.log 2>&1
echo "racecheck fp8 rc=$? at $((SECONDS - T0)) s"; tail -3 $R/racecheck_fp8.log | cut -c1-300
step fp8_wide_bitwise ${T_BITWISE:-70} -m gpu tests/test_grouped_gemm_fp8.py -k "wide_tiles_match"
END=${END:-545}; T_GG=$((END - (SECONDS - T0) - 5)); [ $T_GG -gt 270 ] && T_GG=270
if [ $T_GG -ge 60 ]; then
  timeout $T_GG python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot > $R/grouped_gemm.log 2>&1
  echo "grouped_gemm rc=$? at $((SECONDS - T0)) s"; tail -30 $R/grouped_gemm.log | cut -c1-160
  cp benchmarks/results/grouped_gemm_* $R/ 2>/dev/null
  tar czf "$OUT_DEV/results.tgz" -C "$R" .
fi
left=$((END - (SECONDS - T0)))
if [ $left -gt 40 ]; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  python3 -c "import xdist" && PT="$PT -n ${WORKERS:-4}"
  step fixed_pass_tests $left tests/test_pass_runtime.py tests/test_flax.py::test_linen_scan_remat_stack \
    tests/test_rewrite_gathered.py::test_package_model_is_rewritten_and_routes_once \
    tests/test_rewrite.py::test_vmap_and_pure_jax_backend tests/test_rewrite.py::test_vmap_and_grad_lower_for_a_gpu
fi
echo "total $((SECONDS - T0)) s"
