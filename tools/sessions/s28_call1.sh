#!/usr/bin/env bash
# Prepared in session 27 for the next device session (shipped library at HEAD as .gpu/; CUDA sources unchanged since
# 2df3ed4, so session 27's library still fits unless cc/ changed).
# 1. GPU tests touched by session 27's last commits (dispatch/combine fallbacks, runtime knob, top_k, pass runtime).
# 2. The fallback-residual fix: the step profile (loop_broadcast_fusion 0.38 ms -> ~0.22 expected) and the train
#    step's peak (memory_stats) for ours_save_noinit.
# 3. Issue 7's offload rows with the runtime model's checkpoint at prevent_cse=False (prepared since session 10).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
T0=$SECONDS
timeout 150 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 120 tests/test_dispatch.py \
  tests/test_runtime.py tests/test_topk.py tests/test_pass_runtime.py > $R/gpu_tests.log 2>&1
echo "GPU tests rc=$? at $((SECONDS - T0)) s"; tail -3 $R/gpu_tests.log
timeout 90 python3 benchmarks/profile_step.py --variants ours_save_noinit --steps 3 > $R/profile.log 2>&1
echo "profile rc=$? at $((SECONDS - T0)) s"; grep -E "ms of kernels|loop_broadcast_fusion" $R/profile.log | head -4
cp benchmarks/results/profile_step_h200.json $R/profile_step_s28_h200.json 2>/dev/null
timeout 150 python3 benchmarks/train_step.py --xla-flags runtime --variants ours_save_noinit,ours_save \
  --out train_step_s28_h200 > $R/train_step.log 2>&1
echo "train rc=$? at $((SECONDS - T0)) s"; grep "ms/step" $R/train_step.log | cut -c1-150
cp benchmarks/results/train_step_s28_h200.* $R/ 2>/dev/null
for cse in "" "--no-prevent-cse"; do
  timeout 120 python3 benchmarks/runtime.py --isolate --variants ours_save,ours_offload $cse \
    --out runtime_offload_cse${cse:+_off}_s28_h200 > $R/runtime${cse:+_nocse}.log 2>&1
  echo "runtime $cse rc=$? at $((SECONDS - T0)) s"; grep -E "ours_(save|offload) " $R/runtime${cse:+_nocse}.log | cut -c1-150
  cp benchmarks/results/runtime_offload_cse${cse:+_off}_s28_h200.* $R/ 2>/dev/null
done
tar czf $OUT_DEV/results.tgz -C $R .
