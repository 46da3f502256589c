#!/usr/bin/env bash
# Session 22, call 2 (experiment build of the working tree in .gpu/, JAX_MOE_FFI_GEMM_TILES / _FP8_EXPERIMENT /
# _SECOND_LAUNCH read per call). The short-tail split (tail64: 128-row tiles on all but a group's last <= 64 rows,
# 64-row tiles on those) and the second kernel of a split on a side stream (+stream), alternating against auto:
# bf16 forward / dgrad (tile_ab.py), FP8 forward (fp8_ceiling.py); their bitwise tests incl. CUDA-graph capture of
# the fork; then the per-tile anatomy of the forward (gemm_anatomy.py: fixed cost per tile over K and G).
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
# .gpu/libjax_moe_ffi_cuda.so is the experiment build in this call (setup.sh points there)
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-190} python3 benchmarks/tile_ab.py \
  --variants static,tail64,tail64+stream,split+stream --cases qwen3-30b,deepseek-v3 --rounds 2 \
  --out tile_ab_tail64_h200 > $R/tile_ab.log 2>&1
echo "tile_ab rc=$?"; grep -E "TFLOP" $R/tile_ab.log | awk '{print $1,$2,$3,$4,$5,$6,$7,$9,$11}' | cut -c1-120 | tail -80
cp benchmarks/results/tile_ab_tail64_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_FP8AB:-110} python3 benchmarks/fp8_ceiling.py \
  --variants default,tail64,tail64+stream --groups even,skew --cases qwen3-30b,deepseek-v3 --rounds 2 \
  --out fp8_tail64_h200 > $R/fp8_ab.log 2>&1
echo "fp8 ab rc=$?"; grep -E "TFLOP" $R/fp8_ab.log | cut -c1-120 | tail -50
cp benchmarks/results/fp8_tail64_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS:-150} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_gpu_grouped_gemm.py \
  tests/test_grouped_gemm_fp8.py -k "(row_split and tail64) or (row_split and stream) or (wide_tiles_match and (tail64 or split))" \
  > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_ANAT:-100} python3 benchmarks/gemm_anatomy.py > $R/anatomy.log 2>&1
echo "anatomy rc=$?"; grep -E "fit|TFLOP" $R/anatomy.log | cut -c1-120
cp benchmarks/results/gemm_anatomy_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
