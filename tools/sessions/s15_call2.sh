#!/usr/bin/env bash
# Session 15, call 2: is call 1's qwen3 gate_up forward at JAX_MOE_FFI_GEMM_GRID=4 (623 vs 569 TFLOP/s) real?
# Alternating grid 1 / 4, forward only, even and skew; the FP8 kernel at deepseek-v3 gate_up the same way
# (issue 6's 1200 TFLOP/s target); then the Qwen3 layer (ours) at grid 1 / 4.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
for run in 1 2 3; do
  for grid in 1 4; do
    out=gg_fwd_grid${grid}_r${run}_h200
    JAX_MOE_FFI_GEMM_GRID=$grid timeout 60 python3 benchmarks/grouped_gemm.py --cases "qwen3-30b-a3b,qwen3-235b" \
      --passes fwd --skip xla_ragged_dot,tokamax,dense,copy --no-torch --out $out > $R/$out.log 2>&1
    echo "grid=$grid run $run: $(grep -E '\| ours \|' benchmarks/results/$out.md | awk -F'|' '{printf "%s/%s %s; ", $2,$5,$7}')"
    cp benchmarks/results/$out.* $R/ 2>/dev/null
  done
done
tar czf $OUT_DEV/results.tgz -C $R .
for run in 1 2; do
  for grid in 1 4; do
    out=gg_fp8_grid${grid}_r${run}_h200
    JAX_MOE_FFI_GEMM_GRID=$grid timeout 70 python3 benchmarks/grouped_gemm.py --cases "deepseek-v3" --recipe blockwise \
      --groups even --passes fwd --skip xla_ragged_dot,tokamax,dense,copy,ours_fp8_with_quant --no-torch --out $out > $R/$out.log 2>&1
    echo "fp8 grid=$grid run $run: $(grep -E '\| ours(_fp8)? \|' benchmarks/results/$out.md | awk -F'|' '{printf "%s/%s %s; ", $2,$3,$7}')"
    cp benchmarks/results/$out.* $R/ 2>/dev/null
  done
done
tar czf $OUT_DEV/results.tgz -C $R .
for grid in 1 4 1 4; do
  out=moe_layer_grid${grid}_h200
  JAX_MOE_FFI_GEMM_GRID=$grid timeout 100 python3 benchmarks/moe_layer.py --impls ours --out $out > $R/$out.log 2>&1
  echo "layer grid=$grid: $(grep -E ' ours ' $R/$out.log | grep -v '^W1' | awk '{print $3, $4}' | tr '\n' ' ')"
  cp benchmarks/results/$out.* $R/ 2>/dev/null
done
tar czf $OUT_DEV/results.tgz -C $R .
