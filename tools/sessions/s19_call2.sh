#!/usr/bin/env bash
# Session 19, call 2 (shipped build, no experiments): JAX_MOE_FFI_FP8_TILES=auto now takes the 128x256 sliced
# tiles (1x2 cluster) where N has an even number of 256-wide tiles. GPU tests of the FP8 forward (incl. every
# wide variant and auto bitwise the 128x128 kernel), wgrad and cached weights; then the FP8 table.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_TESTS:-190} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  tests/test_fp8_wgrad.py -k "gpu or cached" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-330} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd \
  --skip xla_ragged_dot --no-torch > $R/fp8_bench.log 2>&1
echo "fp8 table rc=$?"; grep -E "x ours \(bf16\)" $R/fp8_bench.log | cut -c1-150
cp benchmarks/results/grouped_gemm_fp8_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
