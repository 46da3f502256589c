#!/usr/bin/env bash
# Session 44 (prepared in session 43), call 1: (a) the whole bf16 grouped-GEMM GPU test file at the 128x192 default
# for N = 768 (session 43's call 4 ran 28 of its tests before its limit) and the tile tests with n192all; (b) the
# 128x192 tiles where N is an even number of them (JAX_MOE_FFI_GEMM_TILES=n192all: qwen3 gate_up N = 1536, qwen3-235b
# N = 3072) against the default, forward and forward+backward, our kernel only, each in its own process (the switch is
# read once), twice in alternation; (c) on an H200, issue 3's table and issue 6's FP8 table at head if time is left.
# END (seconds, default 570) as in s38_call2.sh. As run (H100 80GB), (b) got 45 s a run, under bench's 60 s floor, so
# it was skipped; call 2 ran it (80 s a run, which this file now gives; PART=b runs part (b) alone).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
END=${END:-570}
if [ "${PART:-all}" != b ]; then
  step gg_tests ${T_TESTS:-240} tests/test_gpu_grouped_gemm.py -m gpu
  JAX_MOE_FFI_GEMM_TILES=n192all step tile_tests_n192all 60 tests/test_gpu_grouped_gemm.py -m gpu -k "large_tile or paired"
fi
for r in 1 2; do
  for t in auto n192all; do
    JAX_MOE_FFI_GEMM_TILES=$t bench gg_${t}_r$r 80 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py \
      --cases qwen3 --skip tokamax,dense,copy,xla_ragged_dot --no-torch --out grouped_gemm_tiles_${t}_r$r
  done
done
[[ "$GPU" == *H200* && "${PART:-all}" != b ]] && tables $END
echo "total $((SECONDS - T0)) s"
