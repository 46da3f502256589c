#!/usr/bin/env bash
# Session 15, call 3: streams inside CUDA graphs. runtime.xla_flags(multistream=True) turned command buffers off
# (session 6: the annotated regions were folded into one graph); XLA's command-buffer scheduling mode (default LHS:
# "uses the latency-hiding schedule's overlap decisions"; CONCURRENT: a DAG of independent commands) may let the
# shared expert overlap the routed path inside the graph. Same model as call 1 (deepseek-v3-ep8-local + shared
# expert, 2 layers), ours vs ours_streams alternating, one process per setting; then the Qwen3 train step (dropless)
# at XLA's defaults vs CONCURRENT.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
run_rt() {  # name, extra args
  local out=runtime_$1_h200; shift
  timeout ${T_RT:-100} python3 benchmarks/runtime.py --layers 2 --variants ours,ours_streams,ours,ours_streams \
    --out $out "$@" > $R/$out.log 2>&1
  echo "$out rc=$?: $(grep -E '^ +ours' $R/$out.log | awk '{printf "%s %s; ", $1, $2}')"
  grep -m2 -E "Error|error:" $R/$out.log | cut -c1-300
  cp benchmarks/results/$out.* $R/ 2>/dev/null
  tar czf $OUT_DEV/results.tgz -C $R .
}
run_rt cbxla --command-buffer xla
run_rt cbxla_concurrent --command-buffer xla --xla-extra xla_gpu_command_buffer_scheduling_mode=CONCURRENT
run_rt cboff
run_rt cbxla_regions --command-buffer xla --xla-extra xla_gpu_command_buffer_scheduling_mode=CONCURRENT_REGIONS
for mode in default CONCURRENT; do
  out=train_step_mode_${mode}_h200
  flags=""; [ $mode != default ] && flags="--xla_gpu_command_buffer_scheduling_mode=$mode"
  XLA_FLAGS="$flags" timeout ${T_TRAIN:-110} python3 benchmarks/train_step.py --variants ours,ours_exact --steps 10 \
    --out $out > $R/$out.log 2>&1
  echo "$out rc=$?: $(grep -E 'ms/step' $R/$out.log | awk '{printf "%s %s; ", $1, $2}')"
  cp benchmarks/results/$out.* $R/ 2>/dev/null
  tar czf $OUT_DEV/results.tgz -C $R .
done
