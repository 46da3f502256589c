#!/usr/bin/env bash
# Session 15, call 5: runtime.xla_flags()'s new defaults (XLA's CUDA graphs kept, CONCURRENT scheduling inside them,
# latency-hiding scheduler, stream annotations) against XLA's defaults on the Qwen3 train step, alternating; then
# the shared-expert model (4 layers) ours vs ours_streams under the new defaults.
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
for run in 1 2; do
  for fl in xla runtime; do
    out=train_step_flags_${fl}_r${run}_h200
    timeout ${T_TRAIN:-90} python3 benchmarks/train_step.py --xla-flags $fl --variants ours,ours_exact --steps 10 \
      --out $out > $R/$out.log 2>&1
    echo "$out rc=$?: $(grep -E 'ms/step' $R/$out.log | awk '{printf "%s %s; ", $1, $2}')"
    cp benchmarks/results/$out.* $R/ 2>/dev/null
    tar czf $OUT_DEV/results.tgz -C $R .
  done
done
out=runtime_streams_concurrent_h200
timeout ${T_RT:-150} python3 benchmarks/runtime.py --layers 4 --variants ours,ours_streams,ours,ours_streams --out $out \
  > $R/$out.log 2>&1
echo "$out rc=$?: $(grep -E '^ +ours' $R/$out.log | awk '{printf "%s %s; ", $1, $2}')"
cp benchmarks/results/$out.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
