#!/usr/bin/env bash
# Session 45, calls 2 and 3 on the H100 (after s45_first.sh ran s45_call1.sh there), as they ran (inline, one line each;
# collected here): STAGE=2 the wgrad pass under ping-pong / coop on every shape, two alternating rounds, then the train
# step under coop then ping-pong; STAGE=3 the train step again in the other order, then the GPU tests with "wgrad" in
# their id under coop. Results `grouped_gemm_wgrad_all_s45_*`, `train_step_s45_wgrad_*`, logs `runs/session45_call{2,3}_*`.
set -uo pipefail
if [ "${STAGE:-2}" = 2 ]; then
  R=/tmp/r2; source tools/sessions/setup.sh; END=600
  for r in 1 2; do for t in pingpong coop; do
    JAX_MOE_FFI_WGRAD_TILES=$t bench wg_${t}_r$r $(left 70) 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
      --passes wgrad --skip tokamax,dense,copy,xla_ragged_dot --no-torch --out grouped_gemm_wgrad_all_s45_${t}_r${r}_$TAG
  done; done
  for t in coop pingpong; do
    JAX_MOE_FFI_WGRAD_TILES=$t bench step_$t $(left 150) 'benchmarks/results/train_step_s45*' python3 benchmarks/train_step.py \
      --xla-flags runtime --steps 6 --variants ours_save_noinit,ours_exact_save_noinit --out train_step_s45_wgrad_${t}_$TAG
  done
else
  R=/tmp/r3; source tools/sessions/setup.sh; END=270
  for t in pingpong coop; do
    JAX_MOE_FFI_WGRAD_TILES=$t bench step2_$t $(left 60) 'benchmarks/results/train_step_s45*' python3 benchmarks/train_step.py \
      --xla-flags runtime --steps 6 --variants ours_save_noinit,ours_exact_save_noinit --out train_step_s45_wgrad_${t}_r2_$TAG
  done
  JAX_MOE_FFI_WGRAD_TILES=coop step gpu_wgrad_coop $(left 200) tests/test_gpu_grouped_gemm.py -m gpu -k "wgrad"
fi
echo "total $((SECONDS - T0)) s"
