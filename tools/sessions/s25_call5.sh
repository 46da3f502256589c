#!/usr/bin/env bash
# Session 25, call 5 (shipped build at HEAD, .gpu/: the wgrad's problems largest group first since bad732b, nothing
# else changed in shipped kernels since the session-23 table): issue 3's bf16 table again (all five shapes, even /
# skewed, fwd and fwd+bwd, against torch._grouped_mm, tokamax, dense and copy).
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
timeout ${T_BENCH:-250} python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot \
  > $R/bench.log 2>&1
echo "bench rc=$?"; grep -E "ours:|torch" $R/bench.log | cut -c1-150 | tail -30
cp benchmarks/results/grouped_gemm_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
