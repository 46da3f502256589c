#!/usr/bin/env bash
# Session 16, call 5 (the last ~5 minutes of the budget): the FP8 wgrad on the overlapped mainloop's new
# two-sided path (per-column B scales). GPU tests: bitwise CUTLASS's mainloop (subprocess), against the CPU path,
# similarity on the benchmark shapes; then the wgrad alone, overlap (default) vs cutlass, two shapes, even groups.
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
timeout ${T_TESTS:-100} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_fp8_wgrad.py \
  -k "overlap or vs_cpu_path or similarity" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
for ml in overlap cutlass; do
  JAX_MOE_FFI_FP8_MAINLOOP=$ml timeout ${T_AB:-50} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes wgrad \
    --cases "deepseek-v3 gate_up,qwen3-30b-a3b gate_up" --groups even --skip xla_ragged_dot,tokamax,dense,copy \
    --no-torch --out fp8_wgrad_mainloop_${ml}_h200 > $R/wgrad_$ml.log 2>&1
  echo "$ml rc=$?"; grep -E "wgrad +ours" $R/wgrad_$ml.log | cut -c1-120
  cp benchmarks/results/fp8_wgrad_mainloop_${ml}_h200.* $R/ 2>/dev/null
  tar czf $OUT_DEV/results.tgz -C $R .
done
