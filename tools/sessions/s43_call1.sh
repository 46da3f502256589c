#!/usr/bin/env bash
# Session 43, call 1. Session 42's call-1 files were lost with its sandbox (its numbers are in benchmarks/NOTES.md), so:
# (a) the pair launch's GPU tests with blocks the default again and the interleaved order's bitwise knob test;
# (b) on an H200, issue 3's bf16 table and issue 6's FP8 table at head (the target tables are sessions 24-25's);
# (c) benchmarks/gate_up_pair.py at the Qwen3 layer's N = 768 (pair / interleaved / two launches / concatenated, the
#     files session 42 lost), then the pair and concat forward under other tile choices (JAX_MOE_FFI_GEMM_TILES is read
#     once per process: one process each): c2x1 (weight tile multicast across two row tiles), n192 (128x192 tiles, 1x2
#     cluster: 4 tiles across 768), pp128 (ping-pong 128x128, 1x2 cluster). Session 42's H100 run had concat (N = 1536,
#     cluster 1x2) 17-20% faster than the pair (N = 768, cluster 1x1) in the forward; is it the cluster / tile shape?
# END (seconds, default 570) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
END=${END:-570}
step pair_tests ${T_TESTS:-90} tests/test_gpu_grouped_gemm.py -m gpu -k "PAIR_ORDER or pair_launch_bitwise or shared_lhs_pair"
if [[ "$GPU" == *H200* ]]; then
  bench grouped_gemm ${T_GG:-230} 'benchmarks/results/grouped_gemm_*' \
    python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot
  bench grouped_gemm_fp8 ${T_FP8:-190} 'benchmarks/results/grouped_gemm_fp8_*' \
    python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd --skip xla_ragged_dot --no-torch
fi
left() { local t=$((END - (SECONDS - T0) - 5)); [ $t -gt $1 ] && t=$1; echo $t; }
bench gate_up_pair $(left 120) 'benchmarks/results/gate_up_pair_*' \
  python3 benchmarks/gate_up_pair.py --rounds 2 --groups even,skew,routed
for tiles in c2x1 n192 pp128; do
  JAX_MOE_FFI_GEMM_TILES=$tiles bench gate_up_pair_$tiles $(left 75) 'benchmarks/results/gate_up_pair_*' \
    python3 benchmarks/gate_up_pair.py --rounds 2 --groups skew,routed --passes fwd,fwd_bwd --variants pair,concat \
    --out "gate_up_pair_tiles_${tiles}"
done
echo "total $((SECONDS - T0)) s"
