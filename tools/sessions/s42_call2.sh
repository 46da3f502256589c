#!/usr/bin/env bash
# Session 42, call 2: the issue-8 training step at head (interleaved pair order, the default since 1de1d8d): naive,
# exact, dropless bf16 and FP8 (save policy, no zero-fill). On an H200, issue 6's FP8 table first (session 41's ran on
# an H100); on any other card, the dropless bf16 step again with JAX_MOE_FFI_PAIR_ORDER=blocks in the same call, as the
# baseline of the order change. END (seconds, default 570) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
END=${END:-570}
if [[ "$GPU" == *H200* ]]; then
  bench grouped_gemm_fp8 ${T_FP8:-200} 'benchmarks/results/grouped_gemm_fp8_*' \
    python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd --skip xla_ragged_dot --no-torch
else
  JAX_MOE_FFI_PAIR_ORDER=blocks bench train_step_blocks ${T_BLOCKS:-130} 'benchmarks/results/train_step_s42*' \
    python3 benchmarks/train_step.py --xla-flags runtime --steps 6 --variants ours_save_noinit \
    --out train_step_s42_blocks
fi
bench train_step $((END - (SECONDS - T0) - 5)) 'benchmarks/results/train_step_s42*' \
  python3 benchmarks/train_step.py --xla-flags runtime --steps 6 \
  --variants ours_save_noinit,ours_fp8_save_noinit,ours_exact_save_noinit,naive --out train_step_s42
echo "total $((SECONDS - T0)) s"
