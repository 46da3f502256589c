#!/usr/bin/env bash
# Session 40, call 2: (a) where PDL's ~90 us off the Qwen3 layer's forward comes from (benchmarks/profile_layer.py
# --impl ours_dropless with JAX_MOE_FFI_PDL=0 and 1: per-kernel times and the idle time before each; planned in
# session 39, never run there); (b) the issue-8 training step at this commit (PDL on, own FP8 scale loads):
# naive, exact and dropless bf16 (save policy, no zero-fill), FP8. END (seconds, default 545) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
for pdl in 0 1; do
  JAX_MOE_FFI_PDL=$pdl bench profile_pdl$pdl ${T_PROF:-70} 'benchmarks/results/profile_layer_*.json' \
    python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10
done
END=${END:-545}
bench train_step $((END - (SECONDS - T0) - 5)) 'benchmarks/results/train_step_s40.*' \
  python3 benchmarks/train_step.py --xla-flags runtime --steps 6 \
  --variants ours_save_noinit,ours_fp8_save_noinit,ours_exact_save_noinit,naive --out train_step_s40
echo "total $((SECONDS - T0)) s"
