#!/usr/bin/env bash
# Prepared in session 17 for the next device session (not run yet: device time ran out). Needs the experiment
# build (cmake ... -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON, then .gpu/libjax_moe_ffi_cuda.so). CUTLASS's per-tensor
# fast-accumulation FP8 kernel (no promotion, no scale loads) against the direct* ceilings (same tiles, the
# blockwise collective's scale loads kept) and the shipped kernel, alternating in one process: is it the
# blockwise collective's structure, not the tile, that keeps the FP8 forward near 1200 TFLOP/s when CUTLASS's own
# per-tensor grouped example reached 1523?
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_CEIL:-200} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  --variants default,direct128,pertensor128,direct256c21,pertensor256c21 --out fp8_ceiling_pertensor_h200 \
  > $R/fp8_ceiling_pertensor.log 2>&1
echo "ceiling rc=$?"; grep -E "TFLOP" $R/fp8_ceiling_pertensor.log | cut -c1-120
cp benchmarks/results/fp8_ceiling_pertensor_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
