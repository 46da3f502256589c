#!/usr/bin/env bash
# Session 39, call 2 (H100 80GB, right after call 1 = tools/sessions/s38_call2.sh): (a) the FP8 wide-tile bitwise
# tests again, their child process no longer preallocating GPU memory (call 1: out of memory beside pytest's 75%);
# (b) the two pass tests that failed in call 1, -x, for their tracebacks.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
step fp8_wide_bitwise 100 -m gpu tests/test_grouped_gemm_fp8.py -k "wide_tiles_match"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step two_pass_tests 90 -x tests/test_pass_runtime.py::test_streams_in_scanned_grad_leave_one_annotated_call_per_region \
  tests/test_rewrite.py::test_vmap_and_pure_jax_backend
grep -n "Error\|error:\|assert" $R/two_pass_tests.log | head -30
echo "total $((SECONDS - T0)) s"
