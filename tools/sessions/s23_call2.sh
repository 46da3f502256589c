#!/usr/bin/env bash
# Session 23, call 2 (experiment build with group_tensormaps.cuh in .gpu/libjax_moe_ffi_cuda_exp.so): per-group TMA
# descriptors built before the GEMM against CUTLASS's per-SM descriptors rewritten on each group change, alternating
# in one process, every output compared bitwise with auto's. bf16: JAX_MOE_FFI_GEMM_TILES=pre (auto's plain 1x2
# kernel, forward and dgrad; JAX_MOE_FFI_WGRAD_TILES=pre: the wgrad's ping-pong 2x1 kernel); FP8: JAX_MOE_FFI_FP8_EXPERIMENT=wide128e64pre (K <= 2048) / wide64pre (K > 2048).
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda_exp.so
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-170} python3 benchmarks/tile_ab.py \
  --variants static,pre --passes fwd,dgrad,wgrad --groups even,skew --cases qwen3-30b,"deepseek-v3 gate_up" --rounds 2 \
  --out tile_ab_premaps_h200 > $R/tile_ab.log 2>&1
echo "tile_ab rc=$?"; grep -E "TFLOP|rror" $R/tile_ab.log | sed 's/  */ /g' | cut -c1-110
cp benchmarks/results/tile_ab_premaps_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_FP8AB:-110} python3 benchmarks/fp8_ceiling.py \
  --variants default,wide128e64pre --groups even,skew --cases qwen3-30b --rounds 3 \
  --out fp8_premaps_qwen3_h200 > $R/fp8_ab.log 2>&1
echo "fp8 ab rc=$?"; grep -E "TFLOP|rror" $R/fp8_ab.log | cut -c1-110
cp benchmarks/results/fp8_premaps_qwen3_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_FP8AB2:-80} python3 benchmarks/fp8_ceiling.py \
  --variants default,wide64pre --groups even,skew --cases "deepseek-v3 gate_up" --rounds 2 \
  --out fp8_premaps_dsv3_h200 > $R/fp8_ab2.log 2>&1
echo "fp8 ab2 rc=$?"; grep -E "TFLOP|rror" $R/fp8_ab2.log | cut -c1-110
cp benchmarks/results/fp8_premaps_dsv3_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
