#!/usr/bin/env bash
# Session 12, call 6 (the last of the session's device time): the top-k kernel with redux.sync (GPU bitwise
# tests, the layer profile), and the FP8 2x1-cluster A/B (JAX_MOE_FFI_FP8_TILES=c2x1): GPU
# tests under it, the FP8 forward on even groups under auto and c2x1.
set -uo pipefail
R=/tmp/r6; source tools/sessions/setup.sh
snap() { tar czf $OUT_DEV/results.tgz -C $R .; }  # after every step: a timeout still returns what ran
timeout 45 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_topk.py > $R/gpu_tests_topk.log 2>&1
echo "topk tests rc=$?"; tail -2 $R/gpu_tests_topk.log; snap
timeout 50 python3 benchmarks/profile_layer.py > $R/profile_layer.log 2>&1; grep "==" $R/profile_layer.log
grep -E "TopK" $R/profile_layer.log | cut -c1-60
cp benchmarks/results/profile_layer_h200.json $R/ 2>/dev/null; snap
for t in auto c2x1; do
  JAX_MOE_FFI_FP8_TILES=$t timeout 65 python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd --groups even \
    --skip xla_ragged_dot,tokamax,dense,copy,ours_fp8_with_quant --no-torch --out gg_fp8_tiles_$t > $R/gg_fp8_$t.log 2>&1
  echo "fp8 $t rc=$?"; grep -E "ours_fp8|  ours " $R/gg_fp8_$t.log | grep "ms" | head -10
  cp benchmarks/results/gg_fp8_tiles_$t.* $R/ 2>/dev/null; snap
done
JAX_MOE_FFI_FP8_TILES=c2x1 timeout 50 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_grouped_gemm_fp8.py \
  -k "random_shapes or block_scaled or benchmark_shapes" > $R/gpu_tests_fp8_c2x1.log 2>&1
echo "fp8 c2x1 tests rc=$?"; tail -2 $R/gpu_tests_fp8_c2x1.log
snap
