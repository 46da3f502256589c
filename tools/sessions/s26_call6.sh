#!/usr/bin/env bash
# Session 26, call 6 (the shipped library of 3a75458 again: call 5's in-place FP8 scales were reverted; the
# session's Python): the issue-8 train-step table (the scanned checkpoint without its barrier, FP8 weights
# quantised once before the scan), then the issue-7 host-offload pair (save vs offload, a process each) on the
# DeepSeek-shaped runtime model. ~330 s of device time were left.
set -uo pipefail
R=/tmp/r6; source tools/sessions/setup.sh
timeout ${T_TRAIN:-170} python3 benchmarks/train_step.py --xla-flags runtime --variants \
  naive,ours_exact,ours_exact_save,ours,ours_save,ours_fp8,ours_fp8_save,tokamax_nocse,tokamax,xla_ragged_dot \
  > $R/train_step.log 2>&1
echo "train rc=$?"; grep -E "ms/step|FAILED" $R/train_step.log | cut -c1-150
cp benchmarks/results/train_step_h200.* $R/ 2>/dev/null
timeout ${T_RUNTIME:-80} python3 benchmarks/runtime.py --isolate --variants ours_save,ours_offload \
  --out runtime_offload_s26_h200 > $R/runtime.log 2>&1
echo "runtime rc=$?"; grep -v "^W1" $R/runtime.log | tail -8 | cut -c1-160
cp benchmarks/results/runtime_offload_s26_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
