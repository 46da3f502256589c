#!/usr/bin/env bash
# Prepared in session 16 for the next device session (not run yet: its device time ran out):
# the FP8 wgrad on the overlapped mainloop's new two-sided path (per-column B scales; opt-in
# JAX_MOE_FFI_FP8_WGRAD_MAINLOOP=overlap). GPU tests: bitwise CUTLASS's mainloop (subprocess), against the CPU
# path, similarity on the benchmark shapes; then the wgrad alone, overlap vs cutlass, alternating, all shapes.
# If it is bitwise and faster, make it the default (grouped_gemm_fp8.cu UseOverlapWgradMainloop) and re-run the
# FP8 table with --passes fwd,fwd_bwd,wgrad.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-150} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_fp8_wgrad.py \
  > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
for run in 1 2; do
  for ml in overlap cutlass; do
    out=fp8_wgrad_mainloop_${ml}_r${run}_h200
    JAX_MOE_FFI_FP8_WGRAD_MAINLOOP=$ml timeout ${T_AB:-90} python3 benchmarks/grouped_gemm.py --recipe blockwise \
      --passes wgrad --skip xla_ragged_dot,tokamax,dense,copy --no-torch --out $out > $R/$out.log 2>&1
    echo "$out rc=$?"; grep -E "wgrad +ours_fp8 " $R/$out.log | cut -c1-120
    cp benchmarks/results/$out.* $R/ 2>/dev/null
    tar czf $OUT_DEV/results.tgz -C $R .
  done
done
