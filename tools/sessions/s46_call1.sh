#!/usr/bin/env bash
# Session 46 (prepared in session 45), call 1, any card: the bf16/fp16 wgrad's new default (cooperative 128x256 2x1,
# session 45) under the whole GPU grouped-GEMM test file and compute-sanitizer. Session 45 ran only the tests with
# "wgrad" in their id under JAX_MOE_FFI_WGRAD_TILES=coop (14 passed; the 4 env-knob tests failed on memory, not on
# the kernels: their child processes could not allocate beside the parent's preallocation, which tests/conftest.py now
# turns off). PART=a (default): the first half of the file's ids; PART=b: the rest, then memcheck / racecheck on
# tools/sanitize_case.py (its wgrad cases now run the cooperative kernel). END caps the call (`left`, setup.sh).
set -uo pipefail
R=/tmp/r1${PART:-a}; source tools/sessions/setup.sh
python3 -m pytest -q --collect-only -p no:cacheprovider -m gpu tests/test_gpu_grouped_gemm.py 2>/dev/null | grep '::' > $R/ids.txt
half=$(( $(wc -l < $R/ids.txt) / 2 ))
if [ "${PART:-a}" = a ]; then
  step gg_first $(left 560) $(head -n $half $R/ids.txt)
else
  step gg_second $(left 420) $(tail -n +$((half + 1)) $R/ids.txt)
  for tool in memcheck racecheck; do
    timeout $(left 100) compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py \
      > "$R/sanitize_$tool.log" 2>&1
    echo "$tool rc=$?"; tail -4 "$R/sanitize_$tool.log"
  done
  tar czf "$OUT_DEV/results.tgz" -C "$R" .
fi
echo "total $((SECONDS - T0)) s"
