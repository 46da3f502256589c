#!/usr/bin/env bash
# Session 29, call 5: the step without the layers' jax.checkpoint (ours_noremat: attention and its projections are
# not recomputed in the backward; the MoE was already saved by offload="device") at 32 x 2048 tokens, where call 4
# reached 409 (bf16) / 415 (FP8) model TFLOP/s with the model's remat, and at the default 4 x 2048.
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
T0=$SECONDS
timeout 150 python3 benchmarks/train_step.py --xla-flags runtime --batch 32 --steps 6 \
  --variants ours_noremat_noinit,ours_fp8_noremat_noinit --out train_step_b32_noremat_s29_h200 > $R/train_b32.log 2>&1
echo "train b32 rc=$? at $((SECONDS - T0)) s"; grep -E "ms/step|rror" $R/train_b32.log | cut -c1-160 | head
cp benchmarks/results/train_step_b32_noremat_s29_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout 80 python3 benchmarks/train_step.py --xla-flags runtime --variants ours_noremat_noinit \
  --out train_step_noremat_s29_h200 > $R/train_b4.log 2>&1
echo "train b4 rc=$? at $((SECONDS - T0)) s"; grep -E "ms/step|rror" $R/train_b4.log | cut -c1-160 | head
cp benchmarks/results/train_step_noremat_s29_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
