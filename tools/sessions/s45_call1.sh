#!/usr/bin/env bash
# Session 45 (prepared in session 44), call 1, any card: (a) fwd_bwd split into its three GEMMs, ours and
# torch._grouped_mm, every shape, even and skewed groups (`--passes fwd,dgrad,wgrad,fwd_bwd`, no other anchor): on the
# H100 (sessions 39, 41, 44) our fwd_bwd trails torch on deepseek-v3 gate_up and qwen3-235b (0.94-0.97x) while the
# forward leads (1.07-1.08x), so the dgrad or the wgrad is behind there; this says which. (b) On an H200 only, issue 3's
# bf16 table and issue 6's FP8 table at head (the target tables are still sessions 24-25's). END (seconds, default 570)
# as in s38_call2.sh.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
END=${END:-570}
TAG=$([[ "$GPU" == *H200* ]] && echo h200 || echo h100)
bench split ${T_SPLIT:-200} 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
  --passes fwd,dgrad,wgrad,fwd_bwd --skip tokamax,dense,copy,xla_ragged_dot --out grouped_gemm_split_s45_$TAG
[[ "$GPU" == *H200* ]] && tables $END
echo "total $((SECONDS - T0)) s"
