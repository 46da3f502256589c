#!/usr/bin/env bash
# Session 27, call 4: the uninitialised-scan-outputs GPU tests on bf16 models (the CUDA kernels), then the
# issue-8 table again (round 2; the capacity twins' kept share now measured too).
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
T0=$SECONDS
timeout 100 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 90 tests/test_runtime.py \
  -k uninitialized > $R/gpu_tests_noinit.log 2>&1
echo "noinit GPU tests rc=$? at $((SECONDS - T0)) s"; tail -3 $R/gpu_tests_noinit.log
V=naive,naive_noinit,ours_exact,ours_exact_noinit,ours_exact_save,ours_exact_save_noinit,ours,ours_noinit,ours_save,ours_save_noinit
V=$V,ours_fp8,ours_fp8_noinit,ours_fp8_save,ours_fp8_save_noinit,tokamax,tokamax_nocse,tokamax_nocse_noinit,xla_ragged_dot
timeout 420 python3 benchmarks/train_step.py --xla-flags runtime --variants $V > $R/train_step.log 2>&1
echo "train rc=$? at $((SECONDS - T0)) s"; grep "ms/step\|FAILED" $R/train_step.log | cut -c1-150
cp benchmarks/results/train_step_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
