#!/usr/bin/env bash
# Session 43, call 2 (ran on the warm H100 of call 1, as one inline command; kept here as it ran): the train step's
# dropless bf16 variant at the then default tiles (auto = 128x256 on a 1x1 cluster at N = 768; results renamed
# *_c1x1_r1_h100) and with JAX_MOE_FFI_GEMM_TILES=n192 (128x192 tiles, 1x2 cluster), then the dropless layer profile
# with n192 (profile_layer_n192_s43_h100.json). (An earlier version of this file, a train-step call never run, was
# replaced by this record.)
R=/tmp/r2; source tools/sessions/setup.sh; export JMF_GIT_COMMIT=daa3d4f
for t in auto n192; do
  JAX_MOE_FFI_GEMM_TILES=$t bench train_$t 150 'benchmarks/results/train_step_s43*' python3 benchmarks/train_step.py \
    --xla-flags runtime --steps 6 --variants ours_save_noinit --out train_step_s43_tiles_$t
done
JAX_MOE_FFI_GEMM_TILES=n192 bench profile_n192 80 'benchmarks/results/profile_layer_*.json' \
  python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10
echo total $((SECONDS-T0))
