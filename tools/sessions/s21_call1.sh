#!/usr/bin/env bash
# Session 21, call 1. The cluster split (SplitRows: a 2x1 kernel on each group's pairs of 128-row tiles, the 1x2 /
# 1x1 kernel on odd last tiles), bf16 and FP8. Carries two libraries: .gpu/ the shipped build (auto = the split, as
# committed), .gpu/exp/ the experiment build of fdc3305 (auto = the previous default; JAX_MOE_FFI_GEMM_TILES read per
# call; FP8 experiment variants). Bitwise tests on the shipped build, then alternating A/B timings on the experiment
# build against the previous defaults, even and skewed groups.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-170} python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_gpu_grouped_gemm.py \
  tests/test_grouped_gemm_fp8.py -k "cluster_split or (wide_tiles_match and (split or one_slice_c21 or auto))" \
  > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error|assert" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/exp/libjax_moe_ffi_cuda.so XLA_FLAGS=--xla_gpu_enable_command_buffer=
timeout ${T_FP8:-150} python3 benchmarks/fp8_ceiling.py --rounds 2 --groups even,skew \
  --variants default,split,wide128c21,wide64c12,wide64c21 --out fp8_split_h200 > $R/fp8_split.log 2>&1
echo "fp8 rc=$?"; grep -E "TFLOP" $R/fp8_split.log | cut -c1-120
cp benchmarks/results/fp8_split_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_BF16:-200} python3 benchmarks/tile_ab.py --rounds 2 --variants static,split,pick,c2x1 \
  --out tile_ab_split_h200 > $R/tile_ab.log 2>&1
echo "bf16 rc=$?"; grep -E "TFLOP" $R/tile_ab.log | cut -c1-130
cp benchmarks/results/tile_ab_split_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
