#!/usr/bin/env bash
# Session 23, call 1. Shipped build of 5039dba (.gpu/libjax_moe_ffi_cuda.so): the whole bf16 table of issue 3 with
# the new auto (128x64 epilogue subtiles), all five shapes, even / skewed, fwd and fwd+bwd, against torch._grouped_mm,
# tokamax, dense and copy. Then the experiment build of db51233 (.gpu/libjax_moe_ffi_cuda_exp.so): the store-stage
# variants of the epilogue, alternating in one process (bf16 tile_ab, FP8 fp8_ceiling).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_BENCH:-270} python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot \
  > $R/bench.log 2>&1
echo "bench rc=$?"; grep -E "TFLOP|x torch|x tokamax" $R/bench.log | cut -c1-150 | tail -40
cp benchmarks/results/grouped_gemm_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda_exp.so
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-120} python3 benchmarks/tile_ab.py \
  --variants static,e32,e64s3,e32s4 --groups even,skew --cases qwen3-30b --rounds 2 \
  --out tile_ab_stages_h200 > $R/tile_ab.log 2>&1
echo "tile_ab rc=$?"; grep -E "TFLOP" $R/tile_ab.log | sed 's/  */ /g' | cut -c1-110
cp benchmarks/results/tile_ab_stages_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_FP8AB:-110} python3 benchmarks/fp8_ceiling.py \
  --variants default,wide128c12,wide128e64s3,wide128e32s4 --groups even,skew --cases qwen3-30b --rounds 2 \
  --out fp8_stages_h200 > $R/fp8_ab.log 2>&1
echo "fp8 ab rc=$?"; grep -E "TFLOP" $R/fp8_ab.log | cut -c1-110
cp benchmarks/results/fp8_stages_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
