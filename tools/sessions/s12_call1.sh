#!/usr/bin/env bash
# Session 12, call 1: ping-pong 64x256 tiles (JAX_MOE_FFI_GEMM_TILES=pp64) for the forward / dgrad against the
# default 128x256 cooperative tiles. GPU tests under pp64; our grouped GEMM alone (all shapes, even and skewed,
# fwd and fwd+bwd) under auto and pp64; the Qwen3 layer alternating auto / pp64. Results tarred into $OUT.
set -uo pipefail
R=/tmp/r; source tools/sessions/setup.sh
JAX_MOE_FFI_GEMM_TILES=pp64 timeout ${T_TESTS:-150} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider \
  tests/test_gpu_grouped_gemm.py -k "${GPU_K:-large_tile_configs or sum_dgrad_vs or zeroed or pair_launch or random_shapes}" \
  > $R/gpu_tests_pp64.log 2>&1; echo "tests rc=$?"; tail -4 $R/gpu_tests_pp64.log
for t in auto pp64; do
  JAX_MOE_FFI_GEMM_TILES=$t timeout 120 python3 benchmarks/grouped_gemm.py --skip xla_ragged_dot,tokamax,dense,copy \
    --no-torch --out gg_tiles_$t > $R/gg_$t.log 2>&1; echo "gg $t rc=$?"
  grep -E "ours" $R/gg_$t.log | grep -v "^W1" | grep "ms" | head -24
  cp benchmarks/results/gg_tiles_$t.* $R/ 2>/dev/null
done
for t in ${LAYER_TILES:-auto pp64 auto pp64}; do
  JAX_MOE_FFI_GEMM_TILES=$t timeout 90 python3 benchmarks/moe_layer.py --impls ours --out moe_layer_s12_$t \
    2>&1 | grep -v "^W1" > $R/layer_$t.log
  echo "tiles=$t: $(grep -E ' ours +fwd' $R/layer_$t.log | awk '{print $3, $4}' | tr '\n' ' ')" | tee -a $R/layer_ab.txt
done
cp benchmarks/results/moe_layer_s12_* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
