#!/usr/bin/env bash
# Session 16, call 3: issue 7's offload rows again under runtime.xla_flags()'s new defaults (session 11 measured
# them with CUDA graphs off), then the FP8 table refreshed with the new row names (ours_fp8_with_quant: bf16
# wgrad, the default; ours_fp8_fp8_wgrad: the opt-in FP8 wgrad).
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
out=runtime_offload_s16_h200
timeout ${T_RT:-200} python3 benchmarks/runtime.py --isolate --variants ours_save,ours_offload,ours_save,ours_offload \
  --out $out > $R/$out.log 2>&1
echo "$out rc=$?"; grep -E "^ +ours|peak|FAILED" $R/$out.log | cut -c1-200 | tail -12
cp benchmarks/results/$out.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-250} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd \
  --skip xla_ragged_dot --no-torch > $R/fp8_bench.log 2>&1
echo "fp8 bench rc=$?"; grep -E "x ours|FAILED" $R/fp8_bench.log | grep -E "fwd_bwd|ours_fp8:" | cut -c1-200 | tail -30
cp benchmarks/results/grouped_gemm_fp8_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
