#!/usr/bin/env bash
# Session 12, call 5: the issue-3 grouped GEMM table with the current kernels (setup kernel at one block per SM,
# zeros in the setup launch), all anchors but XLA's ragged_dot (36-79 ms a call; its session-9 rows stand),
# torch._grouped_mm in a second process of the same invocation.
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
timeout ${T_GG:-480} python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot > $R/grouped_gemm.log 2>&1
echo "gg rc=$?"; grep -E "TFLOP/s;" $R/grouped_gemm.log | head -30
cp benchmarks/results/grouped_gemm_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
