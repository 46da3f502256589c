#!/usr/bin/env bash
# Session 11, call 1: GPU tests of the pair launch and the two-product dgrad (and the setup-kernel paths they
# changed), then the Qwen3 layer with each off / on, alternating. Results under $R, tarred into $OUT.
set -uo pipefail
R=/tmp/r; mkdir -p $R
OUT_DEV=$OUT
OUT=$R bash tools/device_session.sh none > $R/setup.log 2>&1 || { tail -20 $R/setup.log; exit 1; }
export PYTHONPATH=/tmp/site JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda.so PYTHONUNBUFFERED=1
timeout ${T_TESTS:-200} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_gpu_grouped_gemm.py \
  -k "${GPU_K:-sum_dgrad or pair_launch or zeroed or negative or wgrad_tile or paired or accumulate or library_loaded}" \
  > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -5 $R/gpu_tests.log
for cfg in ${LAYER_CFGS:-00 11 11 00 10 01}; do
  JAX_MOE_FFI_PAIR_LAUNCH=${cfg:0:1} JAX_MOE_FFI_SUM_DGRAD=${cfg:1:1} timeout 90 python3 benchmarks/moe_layer.py \
    --impls ours --out moe_layer_s11_$cfg 2>&1 | grep -v "^W1" > $R/layer_$cfg.log
  echo "pair=${cfg:0:1} sum=${cfg:1:1}: $(grep -E ' ours +fwd' $R/layer_$cfg.log | awk '{print $3, $4}' | tr '\n' ' ')" | tee -a $R/layer_ab.txt
done
if [ -n "${PROFILE_CFG:-}" ]; then
  JAX_MOE_FFI_PAIR_LAUNCH=${PROFILE_CFG:0:1} JAX_MOE_FFI_SUM_DGRAD=${PROFILE_CFG:1:1} timeout 120 \
    python3 benchmarks/profile_layer.py > $R/profile_layer.log 2>&1; grep "==" $R/profile_layer.log
  cp benchmarks/results/profile_layer_h200.json $R/ 2>/dev/null
fi
cp benchmarks/results/moe_layer_s11_* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
