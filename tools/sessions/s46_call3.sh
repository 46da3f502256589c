#!/usr/bin/env bash
# Session 46, call 3 (after s45_call2.sh's tables on an H200): the wgrad tile A/B of session 45 (H100: cooperative
# 128x256 2x1 +3-21% on the large-K shapes and every skewed row, the train step -1.1 to -2.4%; now the default) on the
# H200 the targets name, alternating, every shape; then the train step under each, alternating. If the H200 disagrees,
# the default can be made card-dependent. END caps the call (`left`, setup.sh).
set -uo pipefail
R=/tmp/r3w; source tools/sessions/setup.sh
for r in 1 2; do
  for t in pingpong coop; do
    JAX_MOE_FFI_WGRAD_TILES=$t bench wg_${t}_r$r $(left 75) 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
      --passes wgrad --skip tokamax,dense,copy,xla_ragged_dot --no-torch --out grouped_gemm_wgrad_all_s46_${t}_r${r}_$TAG
  done
done
for t in pingpong coop; do
  JAX_MOE_FFI_WGRAD_TILES=$t bench step_$t $(left 70) 'benchmarks/results/train_step_s46*' python3 benchmarks/train_step.py \
    --xla-flags runtime --steps 6 --variants ours_save_noinit,ours_exact_save_noinit --out train_step_s46_wgrad_${t}_$TAG
done
echo "total $((SECONDS - T0)) s"
