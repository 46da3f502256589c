#!/usr/bin/env bash
# Session 27, call 7: the uninitialised scan outputs against the default executable with XLA's deterministic ops
# (the step's own run-to-run differences gone, so equal means bitwise), NaN-poisoned memory as before.
set -uo pipefail
R=/tmp/r7; source tools/sessions/setup.sh
T0=$SECONDS
XLA_FLAGS=--xla_gpu_deterministic_ops=true timeout 150 python3 tools/scan_outputs_check.py --variants ours_save \
  --out $R/scan_outputs_check_deterministic_h200.json > $R/check_cudnn.log 2>&1
rc=$?; echo "check (cudnn attention) rc=$rc at $((SECONDS - T0)) s"; tail -3 $R/check_cudnn.log | cut -c1-700
if [ $rc -ne 0 ]; then
  XLA_FLAGS=--xla_gpu_deterministic_ops=true timeout 150 python3 tools/scan_outputs_check.py --variants ours_save \
    --attention xla --out $R/scan_outputs_check_deterministic_h200.json > $R/check_xla.log 2>&1
  echo "check (xla attention) rc=$? at $((SECONDS - T0)) s"; tail -3 $R/check_xla.log | cut -c1-700
fi
tar czf $OUT_DEV/results.tgz -C $R .
