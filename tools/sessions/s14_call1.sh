#!/usr/bin/env bash
# Session 14, call 1 (session 13's prepared call, trimmed to one 600 s command):
# 1. GPU tests of the pass at run time (session-12 pair broadcast, session-13/14 pass changes on CUDA);
# 2. the pair-broadcast A/B on the Qwen3 layer, alternating JAX_MOE_FFI_PAIR_BROADCAST=1 / 0, fwd and fwd+bwd;
# 3. the layer profile with the broadcast (is the 13.9 us input_scatter_fusion gone?).
set -uo pipefail
R=/tmp/r; source tools/sessions/setup.sh
timeout ${T_TESTS:-120} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_pass_runtime.py \
  tests/test_rewrite_ragged.py tests/test_topk.py > $R/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -3 $R/gpu_tests.log
tar czf $OUT_DEV/results.tgz -C $R .
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
