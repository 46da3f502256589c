#!/usr/bin/env bash
# Session 15, call 4: call 3's train step ran faster with --xla_gpu_command_buffer_scheduling_mode=CONCURRENT
# (exact 49.99 -> 48.56, dropless 54.82 -> 54.46 ms; one run each). Alternating repeats, FP8 too.
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
for run in 1 2; do
  for mode in default CONCURRENT; do
    out=train_step_mode_${mode}_r${run}_h200
    flags=""; [ $mode != default ] && flags="--xla_gpu_command_buffer_scheduling_mode=$mode"
    XLA_FLAGS="$flags" timeout ${T_TRAIN:-120} python3 benchmarks/train_step.py --variants ours,ours_exact,ours_fp8 \
      --steps 10 --out $out > $R/$out.log 2>&1
    echo "$out rc=$?: $(grep -E 'ms/step' $R/$out.log | awk '{printf "%s %s; ", $1, $2}')"
    cp benchmarks/results/$out.* $R/ 2>/dev/null
    tar czf $OUT_DEV/results.tgz -C $R .
  done
done
