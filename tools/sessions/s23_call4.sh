#!/usr/bin/env bash
# Session 23, call 4 (shipped build with per-group TMA descriptors, .gpu/): issue 3's bf16 table (all five shapes,
# even / skewed, fwd and fwd+bwd, against torch._grouped_mm, tokamax, dense and copy), then issue 6's FP8 table
# (blockwise FP8 vs our bf16 and the anchors, all shapes).
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
timeout ${T_BENCH:-230} python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot \
  > $R/bench.log 2>&1
echo "bench rc=$?"; grep -E "ours:" $R/bench.log | cut -c1-150 | tail -20
cp benchmarks/results/grouped_gemm_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-250} python3 benchmarks/grouped_gemm.py --recipe blockwise --anchor-groups even \
  --skip xla_ragged_dot,tokamax --no-torch --out grouped_gemm_fp8_h200 > $R/fp8_bench.log 2>&1
echo "fp8 rc=$?"; grep -E "x ours|ours_fp8:" $R/fp8_bench.log | cut -c1-150 | tail -24
cp benchmarks/results/grouped_gemm_fp8_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
