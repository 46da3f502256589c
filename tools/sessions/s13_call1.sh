#!/usr/bin/env bash
# Prepared in session 13 (no device time then) for the next device session's first call:
# 1. GPU tests of the pass at run time (the session-12 pair broadcast and session-13 pass changes on CUDA);
# 2. the pair-broadcast A/B on the Qwen3 layer, alternating JAX_MOE_FFI_PAIR_BROADCAST=1 / 0, fwd and fwd+bwd;
# 3. the layer profile with the broadcast (is the 13.9 us input_scatter_fusion gone?);
# 4. is the dropless train step's loss bitwise repeatable now (session 12: 10.2136 / 10.2131 on the same data)?
set -uo pipefail
R=/tmp/r; source tools/sessions/setup.sh
timeout ${T_TESTS:-120} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_pass_runtime.py \
  tests/test_rewrite_ragged.py tests/test_topk.py > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $R/gpu_tests.log
for run in 1 2; do
  for pb in 1 0; do
    out=moe_layer_pb${pb}_r${run}_h200
    JAX_MOE_FFI_PAIR_BROADCAST=$pb timeout 100 python3 benchmarks/moe_layer.py --impls ours --out $out \
      > $R/$out.log 2>&1
    echo "pair_broadcast=$pb run $run: $(grep -E ' ours ' $R/$out.log | grep -v '^W1' | awk '{print $3, $4}' | tr '\n' ' ')"
    cp benchmarks/results/$out.* $R/ 2>/dev/null
  done
  tar czf $OUT_DEV/results.tgz -C $R .
done
timeout 100 python3 benchmarks/profile_layer.py > $R/profile_layer.log 2>&1; grep "==" $R/profile_layer.log
grep -E "scatter" $R/profile_layer.log | head -6
cp benchmarks/results/profile_layer_h200.json $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
for run in 1 2; do
  timeout ${T_TRAIN:-150} python3 benchmarks/train_step.py --variants ours --out train_step_repeat_r${run}_h200 \
    > $R/train_repeat_$run.log 2>&1
  python3 -c "import json; r=json.load(open('benchmarks/results/train_step_repeat_r${run}_h200.json'))['rows'][0]; print('ours loss_last', repr(r['loss_last']), r['ms'], 'ms')"
done
tar czf $OUT_DEV/results.tgz -C $R .
