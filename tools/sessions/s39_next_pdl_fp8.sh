#!/usr/bin/env bash
# Planned in session 39, not yet run (no device time left): (a) where PDL's ~90 us off the Qwen3 layer's forward
# comes from (benchmarks/profile_layer.py --impl ours_dropless, JAX_MOE_FFI_PDL=0 and 1: per-kernel time and the idle
# time before each); (b) the FP8 table (issue 6) on the library with the own scale loads and PDL on. END (seconds,
# default 545) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r2b; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
for pdl in 0 1; do
  JAX_MOE_FFI_PDL=$pdl timeout ${T_PROF:-70} python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10 \
    > $R/profile_pdl$pdl.log 2>&1
  echo "profile pdl=$pdl rc=$? at $((SECONDS - T0)) s"; tail -25 $R/profile_pdl$pdl.log | cut -c1-160
  cp benchmarks/results/profile_layer_*.json $R/profile_layer_pdl$pdl.json 2>/dev/null
  tar czf "$OUT_DEV/results.tgz" -C "$R" .
done
END=${END:-545}; T_FP8=$((END - (SECONDS - T0) - 5))
if [ $T_FP8 -ge 60 ]; then
  timeout $T_FP8 python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd --skip xla_ragged_dot \
    --no-torch > $R/grouped_gemm_fp8.log 2>&1
  echo "grouped_gemm fp8 rc=$? at $((SECONDS - T0)) s"; tail -30 $R/grouped_gemm_fp8.log | cut -c1-160
  cp benchmarks/results/grouped_gemm_fp8_* $R/ 2>/dev/null
  tar czf "$OUT_DEV/results.tgz" -C "$R" .
fi
echo "total $((SECONDS - T0)) s"
