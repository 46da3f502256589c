#!/usr/bin/env bash
# Session 43, call 5 (the warm H200 of call 4, one inline command, kept here as it ran): the train step and the layer
# profile with JAX_MOE_FFI_GEMM_TILES=c1x1. Not the old default: c1x1 forces the 1x1 cluster on every forward / dgrad
# shape, the down forward's N = 2048 too (the old default ran 1x2 there); the two-product dgrad and the wgrads ignore it.
R=/tmp/r5; source tools/sessions/setup.sh; export JMF_GIT_COMMIT=6e19235
JAX_MOE_FFI_GEMM_TILES=c1x1 bench train_c1x1 70 'benchmarks/results/train_step_s43*' python3 benchmarks/train_step.py \
  --xla-flags runtime --steps 6 --variants ours_save_noinit,ours_exact_save_noinit --out train_step_s43_final_c1x1
JAX_MOE_FFI_GEMM_TILES=c1x1 bench profile_c1x1 60 'benchmarks/results/profile_layer_*.json' \
  python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10
echo total $((SECONDS-T0))
