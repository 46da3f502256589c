#!/usr/bin/env bash
# Session 28, call 7: the 1 x 128 row quantiser with 16 elements per thread (rowblock16_kernel, x16 / x16_unroll2;
# quantize.cu-only experiment build in .gpu/qexp/, built here) against the default, alternating in one process,
# every output compared bitwise with the default's.
set -uo pipefail
R=/tmp/r7; source tools/sessions/setup.sh
export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/qexp/libjax_moe_ffi_cuda.so XLA_FLAGS=--xla_gpu_enable_command_buffer=
T0=$SECONDS
timeout 150 python3 benchmarks/quantize_rows_ab.py --rounds 2 \
  --variants fdiv,x16,x16_unroll2 --out quantize_rows_ab_x16_s28_h200 > $R/ab.log 2>&1
echo "ab rc=$? at $((SECONDS - T0)) s"; grep -E "GB/s" $R/ab.log | cut -c1-110 | head -70
cp benchmarks/results/quantize_rows_ab_x16_s28_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
