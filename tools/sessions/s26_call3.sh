#!/usr/bin/env bash
# Session 26, call 3: per-kernel profile of the train step's forward+backward, the model's prevent_cse=True kept
# (ours*_keepcse) against optimize()'s prevent_cse=False in the scan body: where the 3.4 ms of call 2 went.
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
timeout ${T_PROF:-300} python3 benchmarks/profile_step.py --variants ours_save_keepcse,ours_save,ours_fp8_save_keepcse,ours_fp8_save \
  --steps 3 > $R/profile.log 2>&1
echo "profile rc=$?"; grep -v "^W1" $R/profile.log | tail -60 | cut -c1-160
cp benchmarks/results/profile_step_h200.json $R/profile_step_cse_s26_h200.json 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
