#!/usr/bin/env bash
# Session 20, call 2 (shipped build, no experiments): JAX_MOE_FFI_FP8_TILES=auto now takes one 128-column slice per
# warp group on the 128x256 tiles for K <= 2048 (wide_one_slice). GPU tests of the FP8 forward (incl. auto and every
# wide variant bitwise the 128x128 kernel), wgrad and cached weights; the FP8 table; then GPU test files session 19's
# whole-suite run did not reach.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_TESTS:-170} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  -k "gpu or cached" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-300} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd \
  --skip xla_ragged_dot --no-torch > $R/fp8_bench.log 2>&1
echo "fp8 table rc=$?"; grep -E "x ours \(bf16\)" $R/fp8_bench.log | cut -c1-150
cp benchmarks/results/grouped_gemm_fp8_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_REST:-80} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_quantize.py tests/test_topk.py \
  tests/test_pass_runtime.py tests/test_rewrite_capacity.py tests/test_rewrite_ragged.py > $R/gpu_tests_rest.log 2>&1
echo "rest rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_rest.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
