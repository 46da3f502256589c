#!/usr/bin/env bash
# Session 41 (for the next device session), call 1: (a) why the Qwen3 layer's gate/up pair forward took 1051-1108 us
# (372-392 TFLOP/s) in session 41's H100 profile against 716-731 us on the H200 before (benchmarks/gate_up_pair.py: the
# pair launch, two launches and concatenated weights at N = 768, even / skew / routed sizes) and the layer profile of
# the exact mode (the 8ee0d55 H200 profile's mode); (b) the H200 bf16 and FP8 tables at head (issues 3 and 6; session
# 41's ran on an H100). END (seconds, default 545) as in s38_call2.sh.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
bench gate_up_pair ${T_PAIR:-150} 'benchmarks/results/gate_up_pair_*' python3 benchmarks/gate_up_pair.py --rounds 2
bench profile_exact ${T_PROF:-60} 'benchmarks/results/profile_layer_*.json' \
  python3 benchmarks/profile_layer.py --impl ours --steps 10
tables ${END:-545}
echo "total $((SECONDS - T0)) s"
