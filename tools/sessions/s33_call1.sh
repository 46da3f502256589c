#!/usr/bin/env bash
# Session 33, call 1: the pass's forms first rewritten without a device (sessions 30-32: Llama 4 scattered logits,
# reciprocal-mask loops, stacked outputs, rolled fori / scan loops, gathered expert weights, ragged_dot with narrow or
# mixed dtypes) on the CUDA kernels; then the whole pass test files on the GPU platform (their CPU-marked tests run
# the CUDA kernels there; T_FILES seconds), the new repeating-ids / column-gate forms (session 33), then every kernel GPU test (library unchanged since session 29: a regression check;
# skipped when T_TOTAL seconds are spent).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
T0=$SECONDS
PT="python3 -m pytest -q --tb=short -p no:cacheprovider --timeout 150 -rf"
timeout 200 $PT -m gpu tests/test_rewrite_gathered.py tests/test_rewrite_ragged.py tests/test_rewrite_repeating_ids.py tests/test_rewrite.py \
  tests/test_rewrite_capacity.py tests/test_pass_runtime.py tests/test_dispatch.py tests/test_topk.py tests/test_runtime.py \
  > $R/pass_gpu_tests.log 2>&1
echo "pass gpu-marked tests rc=$? at $((SECONDS - T0)) s"; tail -6 $R/pass_gpu_tests.log
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FILES:-150} $PT tests/test_rewrite_ragged.py tests/test_rewrite_repeating_ids.py tests/test_rewrite_gathered.py tests/test_dispatch.py > $R/pass_files_on_gpu.log 2>&1
echo "ragged + gathered + dispatch files on the GPU platform rc=$? at $((SECONDS - T0)) s"; tail -6 $R/pass_files_on_gpu.log
tar czf $OUT_DEV/results.tgz -C $R .
if [ $((${T_TOTAL:-420} - (SECONDS - T0))) -gt 30 ]; then
  timeout $((${T_TOTAL:-420} - (SECONDS - T0))) $PT -m gpu tests/test_gpu_grouped_gemm.py tests/test_quantize.py \
    tests/test_fp8_wgrad.py tests/test_grouped_gemm_fp8.py > $R/kernel_gpu_tests.log 2>&1
  echo "kernel gpu tests rc=$? at $((SECONDS - T0)) s"; tail -6 $R/kernel_gpu_tests.log
else
  echo "kernel gpu tests skipped (T_TOTAL=${T_TOTAL:-420} s spent)"
fi
tar czf $OUT_DEV/results.tgz -C $R .
