#!/usr/bin/env bash
# Session 43, call 3 (the same warm H100, one inline command, kept here as it ran): the layer profile at the then
# default (1x1 cluster at N = 768; profile_layer_c1x1_s43_h100.json), two more alternating pairs of the train step
# (n192, then the then-default auto, renamed *_c1x1_r{2,3}_h100), dropless and exact, and the tile-config GPU tests.
R=/tmp/r3; source tools/sessions/setup.sh; export JMF_GIT_COMMIT=daa3d4f
bench profile_auto 80 'benchmarks/results/profile_layer_*.json' python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10
for r in 2 3; do
  for t in n192 auto; do
    JAX_MOE_FFI_GEMM_TILES=$t bench train_${t}_r$r 100 'benchmarks/results/train_step_s43*' python3 benchmarks/train_step.py \
      --xla-flags runtime --steps 6 --variants ours_save_noinit,ours_exact_save_noinit --out train_step_s43_tiles_${t}_r$r
  done
done
step tile_tests 120 tests/test_gpu_grouped_gemm.py -m gpu -k "tile_configs"
echo total $((SECONDS-T0))
