#!/usr/bin/env bash
# Session 27, call 6: the side-branch top_k swap (4f8042d) on the GPU -- the pass's GPU tests (top_k, runtime
# tests), the train step with XLA's stream annotations on (the aux loss's top_k now runs the FFI kernel inside the
# shared-expert stream region), and the profile (the 8 XLA sorts a step should be gone).
set -uo pipefail
R=/tmp/r6; source tools/sessions/setup.sh
T0=$SECONDS
timeout 150 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 120 tests/test_topk.py \
  tests/test_pass_runtime.py tests/test_runtime.py > $R/gpu_tests.log 2>&1
echo "GPU tests rc=$? at $((SECONDS - T0)) s"; tail -3 $R/gpu_tests.log
timeout 200 python3 benchmarks/train_step.py --xla-flags runtime --variants ours_save_noinit,ours_fp8_save_noinit,ours_exact_save_noinit,ours_save \
  --out train_step_topk_s27_h200 > $R/train_step.log 2>&1
echo "train rc=$? at $((SECONDS - T0)) s"; grep "ms/step\|FAILED" $R/train_step.log | cut -c1-150
cp benchmarks/results/train_step_topk_s27_h200.* $R/ 2>/dev/null
timeout 90 python3 benchmarks/profile_step.py --variants ours_save_noinit --steps 3 > $R/profile.log 2>&1
echo "profile rc=$? at $((SECONDS - T0)) s"; grep -E "ms of kernels|sort|top_k|TopK" $R/profile.log | head -8
cp benchmarks/results/profile_step_h200.json $R/profile_step_topk_s27_h200.json 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
