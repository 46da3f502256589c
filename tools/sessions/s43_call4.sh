#!/usr/bin/env bash
# Session 43, call 4: the 128x192 tiles (1x2 cluster) now auto's choice where N is an odd number of 256-wide tiles
# that splits into 192-wide pairs (N = 768: the Qwen3 layer's gate/up pair forward and down dgrad). (a) every GPU test
# of the bf16 grouped GEMM with the new default; (b) the dropless layer profile at the default (session 43's call 2 had
# it with JAX_MOE_FFI_GEMM_TILES=n192: 1550 / 4400 us); (c) the train step at the default against c1x1 (the old
# choice) in one call; (d) gate_up_pair.py's pair and concat forms at the default. END (seconds, default 520).
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
END=${END:-520}
step gg_tests ${T_TESTS:-270} tests/test_gpu_grouped_gemm.py -m gpu
bench profile_default 60 'benchmarks/results/profile_layer_*.json' \
  python3 benchmarks/profile_layer.py --impl ours_dropless --steps 10
left() { local t=$((END - (SECONDS - T0) - 5)); [ $t -gt $1 ] && t=$1; echo $t; }
for t in auto c1x1; do
  JAX_MOE_FFI_GEMM_TILES=$t bench train_$t $(left 60) 'benchmarks/results/train_step_s43*' python3 benchmarks/train_step.py \
    --xla-flags runtime --steps 6 --variants ours_save_noinit,ours_exact_save_noinit --out train_step_s43_final_$t
done
bench gate_up_pair_auto $(left 50) 'benchmarks/results/gate_up_pair_*' python3 benchmarks/gate_up_pair.py --rounds 2 \
  --groups skew,routed --variants pair,concat --out gate_up_pair_tiles_auto
echo "total $((SECONDS - T0)) s"
