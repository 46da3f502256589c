#!/usr/bin/env bash
# Session 23, call 3 (shipped build with per-group TMA descriptors in every grouped GEMM kernel, .gpu/): the GPU tests
# of the bf16 and FP8 grouped GEMMs (the subprocess A/B tests left out for time), then compute-sanitizer memcheck /
# racecheck on tools/sanitize_case.py.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
timeout ${T_TESTS:-170} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --durations=8 \
  tests/test_gpu_grouped_gemm.py -k "not row_split and not grid_scale and not paired_cluster" > $R/gpu_tests_bf16.log 2>&1
echo "bf16 tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_bf16.log | tail -8 | cut -c1-200
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS8:-110} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --durations=5 \
  tests/test_grouped_gemm_fp8.py -k "many_groups or random_shapes or benchmark_shapes or (wide_tiles_match and auto) or grads_vs_bf16 or block_scaled_operands" \
  > $R/gpu_tests_fp8.log 2>&1
echo "fp8 tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_fp8.log | tail -8 | cut -c1-200
tar czf $OUT_DEV/results.tgz -C $R .
for tool in memcheck racecheck; do
  timeout ${T_SAN:-110} compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py > $R/sanitize_$tool.log 2>&1
  echo "$tool rc=$?"; tail -3 $R/sanitize_$tool.log | cut -c1-200
done
tar czf $OUT_DEV/results.tgz -C $R .
