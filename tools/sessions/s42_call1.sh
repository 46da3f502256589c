#!/usr/bin/env bash
# Session 42, call 1: (a) the pair launch's GPU tests with the interleaved order now the default (JAX_MOE_FFI_PAIR_ORDER;
# never run on a GPU before), and the blocks order's bitwise test; (b) benchmarks/gate_up_pair.py: why the Qwen3
# layer's gate/up pair forward (2G problems of N = 768) took 1051-1108 us on session 41's H100 against 659 us for the same FLOPs as one N = 1536 GEMM; (c) the dropless
# layer profile with the interleaved order (session 41's H100 profiles are the blocks order); then, on an H200,
# issue 3's bf16 table at head, or on any other card the training step's bf16 variants with the interleaved order
# (session 41's H100 runs are the blocks order). END (seconds, default 560) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
step knobs 100 tests/test_gpu_grouped_gemm.py -m gpu -k "PAIR_ORDER or shared_lhs_pair or pair_launch_bitwise or pair_backward"
bench gate_up_pair ${T_PAIR:-150} 'benchmarks/results/gate_up_pair_*' python3 benchmarks/gate_up_pair.py --rounds 2
JAX_MOE_FFI_PAIR_ORDER=interleave bench profile_interleave ${T_PROF:-70} 'benchmarks/results/profile_layer_*.json' \
  python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10
END=${END:-560}
if [[ "$GPU" == *H200* ]]; then
  t=$((END - (SECONDS - T0) - 5)); [ $t -gt 230 ] && t=230
  bench grouped_gemm $t 'benchmarks/results/grouped_gemm_*' \
    python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot
else
  JAX_MOE_FFI_PAIR_ORDER=interleave bench train_step_interleave $((END - (SECONDS - T0) - 5)) \
    'benchmarks/results/train_step_s42*' python3 benchmarks/train_step.py --xla-flags runtime --steps 6 \
    --variants ours_save_noinit,ours_exact_save_noinit --out train_step_s42_interleave
fi
echo "total $((SECONDS - T0)) s"
