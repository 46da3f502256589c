#!/usr/bin/env bash
# Session 44, call 2 (H100 80GB, warm after call 1): call 1's part (b), which call 1 skipped (45 s a run, under bench's
# 60 s floor): the 128x192 tiles where N is an even number of them (JAX_MOE_FFI_GEMM_TILES=n192all: qwen3 gate_up
# N = 1536, qwen3-235b N = 3072) against the default, our kernel only, one process each, twice in alternation.
# Run inline as: R=/tmp/r5; source tools/sessions/setup.sh; <the loop below> (without JMF_GIT_COMMIT: the results'
# commit was filled in afterwards as 51e3e6c).
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for r in 1 2; do
  for t in auto n192all; do
    JAX_MOE_FFI_GEMM_TILES=$t bench gg_${t}_r$r 80 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
      --cases qwen3 --skip tokamax,dense,copy,xla_ragged_dot --no-torch --out grouped_gemm_tiles_${t}_r$r
  done
done
echo "total $((SECONDS - T0)) s"
