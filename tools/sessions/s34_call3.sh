#!/usr/bin/env bash
# Session 34, call 3: the two benchmark-shape tests again with the per-group wgrad reference (XLA's ragged_dot_general
# reference ran out of memory on the H100 in calls 1-2), then the FP8 / quantize kernel GPU tests, then the rest of
# test_gpu_grouped_gemm.py (call 2 reached its 61st test). Each step (setup.sh) gets SIGINT at its limit, so pytest still
# prints its summary and the failures' tracebacks.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
step bench_shapes_2048x1536 100 -m gpu tests/test_gpu_grouped_gemm.py -k "fwd_dgrad_wgrad and 65536x2048x1536x128"
step fp8_quantize_tests 200 -m gpu tests/test_quantize.py tests/test_fp8_wgrad.py tests/test_grouped_gemm_fp8.py
left=$((${T_TOTAL:-450} - (SECONDS - T0)))
[ $left -gt 30 ] && step grouped_gemm_rest $left -m gpu tests/test_gpu_grouped_gemm.py \
  -k "not fwd_dgrad_wgrad and not random_shapes_empty_groups and not library_loaded and not custom_call_is_in"
