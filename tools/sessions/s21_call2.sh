#!/usr/bin/env bash
# Session 21, call 2 (shipped build; auto back to the session-20 choices after call 1, the cluster split opt-in). The
# setup kernels of every 128-row forward / dgrad now take a row part (SplitRows; kAll for auto) and the FP8 workspace
# is twice as large: the GPU tests of the grouped GEMM (bf16, FP8 forward / wgrad) on the shipped build, then the
# FP8 forward table's rows for the two qwen3-30b shapes once more.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_FP8T:-150} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  tests/test_fp8_wgrad.py -k "gpu or cached or split" > $R/gpu_tests_fp8.log 2>&1
echo "fp8 tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_fp8.log | tail -6 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_BF16T:-200} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_gpu_grouped_gemm.py \
  -k "not benchmark_shapes and not paired_cluster_pick and not grid_scale" > $R/gpu_tests_bf16.log 2>&1
echo "bf16 tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_bf16.log | tail -6 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-100} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd --cases qwen3-30b \
  --skip xla_ragged_dot,tokamax --no-torch --out grouped_gemm_fp8_qwen3_r3_h200 > $R/fp8_bench.log 2>&1
echo "fp8 rows rc=$?"; grep -E "x ours \(bf16\)" $R/fp8_bench.log | cut -c1-150
cp benchmarks/results/grouped_gemm_fp8_qwen3_r3_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
