#!/usr/bin/env bash
# Session 11, call 3 (final library of the session's kernels): GPU tests; the issue-5 table twice (naive, ours,
# ours_dropless; the second run's files get the suffix _r2); the per-kernel profile of the layer.
set -uo pipefail
R=/tmp/r; mkdir -p $R
OUT_DEV=$OUT
OUT=$R bash tools/device_session.sh none > $R/setup.log 2>&1 || { tail -20 $R/setup.log; exit 1; }
export PYTHONPATH=/tmp/site JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda.so PYTHONUNBUFFERED=1
export JMF_GIT_COMMIT=${JMF_GIT_COMMIT:-unknown}
timeout ${T_TESTS:-200} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_topk.py \
  tests/test_pass_runtime.py tests/test_gpu_grouped_gemm.py \
  -k "${GPU_K:-top_k or scanned or pass or sum_dgrad or pair_launch or zeroed or negative or paired or accumulate or library_loaded or benchmark}" \
  > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -4 $R/gpu_tests.log
for run in 1 2; do
  out=moe_layer_h200; [ $run = 2 ] && out=moe_layer_r2_h200
  timeout 150 python3 benchmarks/moe_layer.py --out $out > $R/moe_layer_table_$run.log 2>&1
  grep -E " ours " $R/moe_layer_table_$run.log | grep -v "^W1"
  cp benchmarks/results/$out.* $R/ 2>/dev/null
done
timeout 120 python3 benchmarks/profile_layer.py > $R/profile_layer.log 2>&1; grep "==" $R/profile_layer.log
cp benchmarks/results/profile_layer_h200.json $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
