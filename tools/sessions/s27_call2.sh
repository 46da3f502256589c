#!/usr/bin/env bash
# Session 27, call 2: is runtime.uninitialized_scan_outputs() exact? The GPU tests (small scanned models, NaN-poisoned
# free memory, against the default executable) and tools/scan_outputs_check.py on the train-step model (4 layers).
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
T0=$SECONDS
timeout 120 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 100 tests/test_runtime.py \
  -k uninitialized > $R/gpu_tests_noinit.log 2>&1
echo "noinit GPU tests rc=$? at $((SECONDS - T0)) s"; tail -3 $R/gpu_tests_noinit.log
timeout 300 python3 tools/scan_outputs_check.py --variants ours_save,ours_fp8_save --out $R/scan_outputs_check_s27_h200.json \
  > $R/scan_outputs_check.log 2>&1; echo "check rc=$? at $((SECONDS - T0)) s"; tail -4 $R/scan_outputs_check.log | cut -c1-600
tar czf $OUT_DEV/results.tgz -C $R .
