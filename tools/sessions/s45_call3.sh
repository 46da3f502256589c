#!/usr/bin/env bash
# Session 45, call 3 (the same warm machine): (a) on an H200, JAX_MOE_FFI_GEMM_TILES=n192all against the default on
# the qwen3 shapes, alternating (session 44 found no gain on the H100: 594 / 575 against 613 / 599 TFLOP/s at qwen3
# gate_up forward); (b) issue 8's step with the naive model and tokamax in the same run (s44_call3.sh's variants; on
# the H100 session 44 had naive 150.0, dropless 52.7, exact 49.3, FP8 56.0, tokamax 111.1 ms), after (a') gate_up_pair.py's
# pair and concat forms at the default and n192all. END (seconds, default 570): what `left` (setup.sh) budgets against.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
if [[ "$GPU" == *H200* ]]; then
  for r in 1 2; do
    for t in auto n192all; do
      JAX_MOE_FFI_GEMM_TILES=$t bench gg_${t}_r$r $(left 80) 'benchmarks/results/grouped_gemm_*' \
        python3 benchmarks/grouped_gemm.py --cases qwen3 --skip tokamax,dense,copy,xla_ragged_dot --no-torch \
        --out grouped_gemm_tiles_s45_${t}_r${r}_$TAG
    done
  done
fi
# the H200's pair-vs-concat gap (H200 only: on the H100 session 44 measured it, concat 15-20% faster; a 2N-column pair kernel would close it): pair
# and concat forms at the default and with n192all (concat = one N = 1536 GEMM, 192-wide tiles under n192all)
[[ "$GPU" == *H200* ]] && for t in auto n192all; do
  JAX_MOE_FFI_GEMM_TILES=$t bench gate_up_pair_$t $(left 60) 'benchmarks/results/gate_up_pair_*' \
    python3 benchmarks/gate_up_pair.py --rounds 2 --groups even,skew --variants pair,concat --out gate_up_pair_s45_${t}_$TAG
done
bench train_step $(left 200) 'benchmarks/results/train_step_s45*' python3 benchmarks/train_step.py --xla-flags runtime \
  --steps 6 --variants naive,ours_exact_save_noinit,ours_save_noinit,ours_fp8_save_noinit,tokamax --out train_step_s45_$TAG
echo "total $((SECONDS - T0)) s"
