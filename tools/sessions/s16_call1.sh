#!/usr/bin/env bash
# Session 16, call 1: the new FP8 weight gradient (quantize_groups_t + grouped_gemm_fp8_wgrad) on the H200:
# 1. GPU tests: the new ops (bitwise vs the CPU, vs the CPU path, benchmark-shape similarity), the FP8 grouped
#    GEMM (its weight codes now cross the custom_vjp as uint8 bitcasts; session 15, CPU-tested only), the pass at
#    run time under runtime.xla_flags()'s new defaults, the capacity forms;
# 2. the FP8 benchmark with the new rows (ours_fp8_bf16_wgrad; --passes wgrad), all anchors but XLA ragged_dot;
# 3. the FP8 wgrad tile A/B (ping-pong default vs cooperative), wgrad pass only.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-220} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_fp8_wgrad.py \
  tests/test_grouped_gemm_fp8.py tests/test_pass_runtime.py tests/test_rewrite_capacity.py > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -12 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-250} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd,wgrad \
  --skip xla_ragged_dot --no-torch > $R/fp8_bench.log 2>&1
echo "fp8 bench rc=$?"; grep -E "x ours|FAILED" $R/fp8_bench.log | cut -c1-200 | tail -40
cp benchmarks/results/grouped_gemm_fp8_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
JAX_MOE_FFI_FP8_WGRAD_TILES=coop timeout ${T_AB:-80} python3 benchmarks/grouped_gemm.py --recipe blockwise \
  --passes wgrad --skip xla_ragged_dot,tokamax,dense,copy --no-torch --out fp8_wgrad_coop_h200 > $R/fp8_wgrad_coop.log 2>&1
echo "coop rc=$?"; grep -E "wgrad" $R/fp8_wgrad_coop.log | grep -v "x ours" | cut -c1-160
cp benchmarks/results/fp8_wgrad_coop_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
