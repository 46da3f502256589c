#!/usr/bin/env bash
# Session 12, call 2: GPU tests (top-k with the select-based backward, the pass at run time, grouped GEMM
# subsets); the issue-5 table three times (files of runs 2 and 3 get _r2 / _r3); the layer's kernel profile.
set -uo pipefail
R=/tmp/r; source tools/sessions/setup.sh
timeout ${T_TESTS:-130} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_topk.py \
  tests/test_pass_runtime.py tests/test_gpu_grouped_gemm.py \
  -k "${GPU_K:-top_k or scanned or pass or sum_dgrad or pair_launch or zeroed or library_loaded}" \
  > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $R/gpu_tests.log
for run in 1 2 3; do
  out=moe_layer_h200; [ $run != 1 ] && out=moe_layer_r${run}_h200
  timeout 120 python3 benchmarks/moe_layer.py --out $out > $R/moe_layer_table_$run.log 2>&1
  grep -E " (ours|naive) " $R/moe_layer_table_$run.log | grep -v "^W1"
  cp benchmarks/results/$out.* $R/ 2>/dev/null
done
timeout 100 python3 benchmarks/profile_layer.py > $R/profile_layer.log 2>&1; grep "==" $R/profile_layer.log
grep -E "scatter|select|top" $R/profile_layer.log | head -8
cp benchmarks/results/profile_layer_h200.json $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
