#!/usr/bin/env bash
# Session 43, call 2: issue 8's training step at head (blocks pair order again, PDL on): naive, exact, dropless bf16 and
# FP8 (save policy, no zero-fill), and the tokamax anchor (no CSE, no zero-fill), 6 steps each. On a card other than an
# H200 only the four of session 41's runs (its baseline). END (seconds, default 560) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
END=${END:-560}
V=ours_save_noinit,ours_fp8_save_noinit,ours_exact_save_noinit,naive
[[ "$GPU" == *H200* ]] && V=$V,tokamax_nocse_noinit
bench train_step $((END - (SECONDS - T0) - 5)) 'benchmarks/results/train_step_s43*' \
  python3 benchmarks/train_step.py --xla-flags runtime --steps 6 --variants $V --out train_step_s43
echo "total $((SECONDS - T0)) s"
