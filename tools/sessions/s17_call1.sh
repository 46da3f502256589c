#!/usr/bin/env bash
# Session 17, call 1. (a) The FP8 wgrad on the overlapped mainloop's two-sided path (prepared in session 16):
# bitwise CUTLASS's mainloop, then overlap vs cutlass A/B on the wgrad alone. (b) The FP8 forward against
# ceilings of its tile shape (benchmarks/fp8_ceiling.py; library built with -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_CEIL:-200} python3 benchmarks/fp8_ceiling.py --rounds 2 \
  > $R/fp8_ceiling.log 2>&1
echo "ceiling rc=$?"; grep -E "TFLOP" $R/fp8_ceiling.log | cut -c1-120
cp benchmarks/results/fp8_ceiling_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS:-120} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_fp8_wgrad.py \
  -k "overlap or vs_cpu_path" > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
for run in 1 2; do
  for ml in overlap cutlass; do
    out=fp8_wgrad_mainloop_${ml}_r${run}_h200
    JAX_MOE_FFI_FP8_WGRAD_MAINLOOP=$ml timeout ${T_AB:-80} python3 benchmarks/grouped_gemm.py --recipe blockwise \
      --groups even --passes wgrad --skip xla_ragged_dot,tokamax,dense,copy,ours_fp8_with_quant --no-torch \
      --out $out > $R/$out.log 2>&1
    echo "$out rc=$?"; grep -E "wgrad +ours_fp8 " $R/$out.log | cut -c1-120
    cp benchmarks/results/$out.* $R/ 2>/dev/null
    tar czf $OUT_DEV/results.tgz -C $R .
  done
done
