#!/usr/bin/env bash
# Session 22, call 3 (experiment build of 3bd0405 in .gpu/): wider epilogue subtiles against auto, alternating in one
# process -- bf16 128x256 1x2 with 128x64 (e64) / 128x128 (e128) subtiles instead of CUTLASS's 128x32, FP8 wide
# kernels with 128x64 subtiles (wide128e64 at K <= 2048, wide64e64 above) -- and the FP8 row of call 2's anatomy that
# its time limit cut (G = 128).
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_FP8AB:-100} python3 benchmarks/fp8_ceiling.py \
  --variants default,wide128e64,wide64e64 --groups even,skew --cases qwen3-30b,"deepseek-v3 gate_up" --rounds 2 \
  --out fp8_epi64_h200 > $R/fp8_ab.log 2>&1
echo "fp8 ab rc=$?"; grep -E "TFLOP" $R/fp8_ab.log | cut -c1-110
cp benchmarks/results/fp8_epi64_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-150} python3 benchmarks/tile_ab.py \
  --variants static,e64,e128 --groups even --cases qwen3-30b,"deepseek-v3 gate_up" --rounds 2 \
  --out tile_ab_epi_h200 > $R/tile_ab.log 2>&1
echo "tile_ab rc=$?"; grep -E "TFLOP" $R/tile_ab.log | sed 's/  */ /g' | cut -c1-110
cp benchmarks/results/tile_ab_epi_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_ANAT:-45} python3 benchmarks/gemm_anatomy.py --gs 128 --impls ours_fp8 --out gemm_anatomy_fp8_g128_h200 \
  > $R/anatomy.log 2>&1
echo "anatomy rc=$?"; grep -E "fit|TFLOP" $R/anatomy.log | cut -c1-120
cp benchmarks/results/gemm_anatomy_fp8_g128_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
