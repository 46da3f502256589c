#!/usr/bin/env bash
# Session 25, call 3 (experiment build with JAX_MOE_FFI_WGRAD_ORDER=mixed, read per call): the wgrad's problem order
# largest first (default) / interleaved largest-smallest (mixed) / group order, alternating in one process, three
# rounds, bitwise checked; the bitwise tests of the mixed order (bf16 and FP8 wgrad); the per-kernel profile of the
# bf16 and FP8 training steps (issue 8).
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-230} python3 benchmarks/tile_ab.py --passes wgrad \
  --groups skew,even --variants static+size,static+mixed,static+groups --rounds 3 --out wgrad_order_mixed_ab_h200 \
  > $R/wgrad_ab.log 2>&1
echo "wgrad ab rc=$?"; grep -E "TFLOP" $R/wgrad_ab.log | cut -c1-110 | tail -90 | grep skew
cp benchmarks/results/wgrad_order_mixed_ab_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS:-90} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA tests/test_gpu_grouped_gemm.py \
  tests/test_fp8_wgrad.py -k "WGRAD_ORDER or order_mixed" > $R/gpu_tests.log 2>&1
echo "order tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests.log | tail -8 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_PROFILESTEP:-200} python3 benchmarks/profile_step.py --variants ours_save,ours_fp8_save --steps 3 \
  > $R/profile_step.log 2>&1
echo "profile_step rc=$?"; grep -v "^W1" $R/profile_step.log | grep -vE "^      " | tail -50 | cut -c1-150
cp benchmarks/results/profile_step_h200.json $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
