#!/usr/bin/env bash
# Session 37, call 3: the training step (issue 8's optimized bf16 and FP8 variants) with JAX_MOE_FFI_PDL off / on,
# a process per setting, alternating while time is left (call 2 saw the Qwen3 layer 4.6% faster forward, 1.1%
# forward+backward with PDL on).
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
for i in 1 2; do for pdl in 0 1; do
  left=$((${T_TOTAL:-450} - (SECONDS - T0))); [ $left -gt 60 ] || break 2
  t=$(( left < ${T_TRAIN:-130} ? left : ${T_TRAIN:-130} ))
  JAX_MOE_FFI_PDL=$pdl timeout $t python3 benchmarks/train_step.py --xla-flags runtime \
    --variants ours_save_noinit,ours_fp8_save_noinit --out train_step_pdl${pdl}_r${i}_s37 > $R/train_pdl${pdl}_r$i.log 2>&1
  echo "train pdl=$pdl r$i rc=$? at $((SECONDS - T0)) s"; grep -E "ms/step|rror" $R/train_pdl${pdl}_r$i.log | cut -c1-160 | tail -3
  cp benchmarks/results/train_step_pdl*_s37* $R/ 2>/dev/null; tar czf "$OUT_DEV/results.tgz" -C "$R" .
done; done
echo "total $((SECONDS - T0)) s"
