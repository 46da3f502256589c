#!/usr/bin/env bash
# Session 45 (prepared in session 44), call 1, any card: (a) fwd_bwd split into its three GEMMs, ours and
# torch._grouped_mm, every shape, even and skewed groups (`--passes fwd,dgrad,wgrad,fwd_bwd`, no other anchor): on the
# H100 (sessions 39, 41, 44) our fwd_bwd trails torch on deepseek-v3 gate_up and qwen3-235b (0.94-0.97x) while the
# forward leads (1.07-1.08x), so the dgrad or the wgrad is behind there; this says which. (b) The backward GEMMs'
# compiled tile choices on those shapes, ours only. Then s45_call2.sh (H200: the tables), s45_call3.sh.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
bench split $(left ${T_SPLIT:-220}) 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
  --passes fwd,dgrad,wgrad,fwd_bwd --skip tokamax,dense,copy,xla_ragged_dot --out grouped_gemm_split_s45_$TAG
# the backward GEMMs' tile choices on the large-K shapes (ours only, one process each): wgrad ping-pong (default) /
# coop / c2x2, dgrad auto / c2x1. For reference: PyTorch's GroupMM.cu (read in session 44) runs every non-small bf16
# case -- forward, dgrad and the ragged-K wgrad -- as CUTLASS's cooperative 128x256x64 with a 2x1 cluster, i.e. our
# `coop` wgrad and `c2x1` dgrad (ping-pong 64x128x128 2x1 when the average group has <= 128 rows or N <= 128).
# WGRAD_SET / DGRAD_SET (env) trim the lists; END (seconds, default 570) caps the call (`left`, setup.sh).
for t in ${WGRAD_SET:-pingpong coop c2x2}; do
  JAX_MOE_FFI_WGRAD_TILES=$t bench wgrad_$t $(left 70) 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
    --cases deepseek-v3,qwen3-235b --passes wgrad --skip tokamax,dense,copy,xla_ragged_dot --no-torch \
    --out grouped_gemm_wgrad_tiles_s45_${t}_$TAG
done
for t in ${DGRAD_SET:-auto c2x1}; do
  JAX_MOE_FFI_GEMM_TILES=$t bench dgrad_$t $(left 70) 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
    --cases deepseek-v3,qwen3-235b --passes dgrad --skip tokamax,dense,copy,xla_ragged_dot --no-torch \
    --out grouped_gemm_dgrad_tiles_s45_${t}_$TAG
done
echo "total $((SECONDS - T0)) s"
