#!/usr/bin/env bash
# Session 12, call 3: the issue-8 training step with the session-11/12 defaults (pair launch, two-product dgrad,
# router top-k with the select backward), all variants and anchors.
set -uo pipefail
R=/tmp/r; source tools/sessions/setup.sh
timeout ${T_TRAIN:-500} python3 benchmarks/train_step.py ${TRAIN_ARGS:-} > $R/train_step.log 2>&1; echo "train rc=$?"
grep -v "^W1" $R/train_step.log | tail -14
cp benchmarks/results/train_step_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
