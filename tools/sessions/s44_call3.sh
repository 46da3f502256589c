#!/usr/bin/env bash
# Session 44, call 3 (ran on an H100 80GB, the machine of calls 1-2, warm): issue 8's training step at head on one machine, in one run: naive (capacity einsum), exact,
# dropless bf16 and FP8 (save policy, no zero-fill) and the tokamax anchor (its session-27 table is the last with
# naive and tokamax in the same run). Then, if time is left, gate_up_pair.py's pair and concat forms with
# JAX_MOE_FFI_GEMM_TILES=n192all (concat = one N = 1536 GEMM with 192-wide tiles there), against the session-43 H200
# pair forward of 645 us. END (seconds, default 570) as in s38_call2.sh. Its results were renamed in the repo with the
# card's tag: train_step_s44_h100.*, gate_up_pair_s44_{auto,n192all}_h100.*.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
END=${END:-570}
left() { local t=$((END - (SECONDS - T0) - 5)); [ $t -gt $1 ] && t=$1; echo $t; }
bench train_step $(left ${T_STEP:-420}) 'benchmarks/results/train_step_s44*' \
  python3 benchmarks/train_step.py --xla-flags runtime --steps 6 \
  --variants naive,ours_exact_save_noinit,ours_save_noinit,ours_fp8_save_noinit,tokamax --out train_step_s44
for t in auto n192all; do
  JAX_MOE_FFI_GEMM_TILES=$t bench gate_up_pair_$t $(left 60) 'benchmarks/results/gate_up_pair_*' \
    python3 benchmarks/gate_up_pair.py --rounds 2 --groups even,skew --variants pair,concat --out gate_up_pair_s44_$t
done
echo "total $((SECONDS - T0)) s"
