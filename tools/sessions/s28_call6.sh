#!/usr/bin/env bash
# Session 28, call 6: the 1 x 128 row quantiser's variants (quantize.cu-only experiment build in .gpu/qexp/, built
# here), alternating in one process, every output compared bitwise with the default's: midpoint (fewer instructions
# per element), unroll2 / occ6 (more resident warps), and both. Call 5's ncu: instruction-bound at 50% occupancy.
set -uo pipefail
R=/tmp/r6; source tools/sessions/setup.sh
export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/qexp/libjax_moe_ffi_cuda.so XLA_FLAGS=--xla_gpu_enable_command_buffer=
T0=$SECONDS
timeout 240 python3 benchmarks/quantize_rows_ab.py --rounds 2 \
  --variants fdiv,midpoint,unroll2,occ6,midpoint_unroll2,midpoint_occ6 --out quantize_rows_ab_s28_h200 > $R/ab.log 2>&1
echo "ab rc=$? at $((SECONDS - T0)) s"; grep -E "GB/s" $R/ab.log | cut -c1-110 | head -70
cp benchmarks/results/quantize_rows_ab_s28_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
