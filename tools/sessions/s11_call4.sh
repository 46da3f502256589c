#!/usr/bin/env bash
# Session 11, call 4: the top-k kernel's second version (sorted lanes, two warp reductions a round) and its
# select-based gradient: GPU tests, the issue-5 table three times (_r3.._r5), the layer profile, the train step.
set -uo pipefail
R=/tmp/r; mkdir -p $R
OUT_DEV=$OUT
OUT=$R bash tools/device_session.sh none > $R/setup.log 2>&1 || { tail -20 $R/setup.log; exit 1; }
export PYTHONPATH=/tmp/site JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda.so PYTHONUNBUFFERED=1
export JMF_GIT_COMMIT=${JMF_GIT_COMMIT:-unknown}
timeout 100 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_topk.py tests/test_pass_runtime.py \
  > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $R/gpu_tests.log
for run in 3 4 5; do
  timeout 150 python3 benchmarks/moe_layer.py --out moe_layer_r${run}_h200 > $R/moe_layer_table_$run.log 2>&1
  grep -E " ours " $R/moe_layer_table_$run.log | grep -v "^W1"
  cp benchmarks/results/moe_layer_r${run}_h200.* $R/ 2>/dev/null
done
timeout 100 python3 benchmarks/profile_layer.py > $R/profile_layer.log 2>&1; grep "==\|TopK\|scatter" $R/profile_layer.log | cut -c1-120
cp benchmarks/results/profile_layer_h200.json $R/ 2>/dev/null
timeout ${T_TRAIN:-190} python3 benchmarks/train_step.py --variants ${TRAIN_VARIANTS:-ours_save,ours_fp8,ours_exact,ours,naive} \
  > $R/train_step.log 2>&1; grep -E "ms|error" $R/train_step.log | grep -v "^W1" | tail -8
cp benchmarks/results/train_step_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
