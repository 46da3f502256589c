#!/usr/bin/env bash
# Session 22, call 4 (shipped build of 5039dba: auto with 128x64 epilogue subtiles -- FP8 one-slice wide kernel at
# K <= 2048, bf16 plain 1x2 forward / dgrad): their bitwise tests against the 128x128 FP8 kernel and the bf16 row
# splits, then the qwen3-30b FP8 forward rows of the #6 table (FP8 kernel vs our bf16 in one process).
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
timeout ${T_TESTS:-80} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  tests/test_gpu_grouped_gemm.py -k "(wide_tiles_match and (auto or wide_one_slice)) or (row_split and 2048 and split-serial)" \
  > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -6 | cut -c1-200
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-90} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd --cases qwen3-30b \
  --skip xla_ragged_dot,tokamax,ours_fp8_with_quant,ours_fp8_cached_weights,dense,dense_fp8,copy --no-torch \
  --out grouped_gemm_fp8_qwen3_s22_h200 > $R/fp8_bench.log 2>&1
echo "fp8 rows rc=$?"; grep -E "TFLOP|x ours" $R/fp8_bench.log | cut -c1-150 | tail -12
cp benchmarks/results/grouped_gemm_fp8_qwen3_s22_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
