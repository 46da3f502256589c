#!/usr/bin/env bash
# Session 11, call 2: GPU tests of the top-k kernel and of the pass on the GPU; the Qwen3 layer with the router
# top-k swap on / off (alternating); the issue-5 table (naive, ours, ours_dropless); the issue-7 runtime table.
set -uo pipefail
R=/tmp/r; mkdir -p $R
OUT_DEV=$OUT
OUT=$R bash tools/device_session.sh none > $R/setup.log 2>&1 || { tail -20 $R/setup.log; exit 1; }
export PYTHONPATH=/tmp/site JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda.so PYTHONUNBUFFERED=1
export JMF_GIT_COMMIT=${JMF_GIT_COMMIT:-unknown}
timeout ${T_TESTS:-150} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider ${GPU_TESTS:-tests/test_topk.py \
  tests/test_pass_runtime.py tests/test_rewrite_ragged.py} > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -4 $R/gpu_tests.log
for t in ${TOPK_CFGS:-1 0 1 0}; do
  JAX_MOE_FFI_ROUTER_TOPK=$t timeout 90 python3 benchmarks/moe_layer.py --impls ours --out moe_layer_s11_topk$t \
    2>&1 | grep -v "^W1" > $R/layer_topk$t.log
  echo "router_topk=$t: $(grep -E ' ours +fwd' $R/layer_topk$t.log | awk '{print $3, $4}' | tr '\n' ' ')" | tee -a $R/layer_ab.txt
done
if [ -z "${SKIP_TABLE:-}" ]; then
  timeout 150 python3 benchmarks/moe_layer.py > $R/moe_layer_table.log 2>&1; grep -E "fwd" $R/moe_layer_table.log | grep -v "^W1"
  cp benchmarks/results/moe_layer_h200.* $R/ 2>/dev/null
fi
if [ -z "${SKIP_RUNTIME:-}" ]; then
  timeout 150 python3 benchmarks/runtime.py --isolate --variants ${RUNTIME_VARIANTS:-ours,ours_streams,ours_offload,ours_save} \
    --out runtime_h200 > $R/runtime.log 2>&1; grep -E "ms|peak" $R/runtime.log | grep -v "^W1" | tail -8
  cp benchmarks/results/runtime_h200.* $R/ 2>/dev/null
fi
cp benchmarks/results/moe_layer_s11_* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
