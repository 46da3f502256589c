#!/usr/bin/env bash
# Session 17, call 2: the FP8 wgrad's overlapped mainloop is now the default. GPU tests (FP8 wgrad incl. the
# bitwise test against CUTLASS's mainloop, the FP8 forward's GPU tests) and the cached-weights tests on the GPU
# path; then the FP8 table with the new ours_fp8_cached_weights rows (weights quantised once, outside the timing).
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_TESTS:-150} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_fp8_wgrad.py \
  tests/test_grouped_gemm_fp8.py -k "gpu or cached" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-330} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd \
  --skip xla_ragged_dot --no-torch > $R/fp8_bench.log 2>&1
echo "fp8 table rc=$?"; grep -E "x ours \(bf16\)" $R/fp8_bench.log | cut -c1-150
cp benchmarks/results/grouped_gemm_fp8_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
