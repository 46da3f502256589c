#!/usr/bin/env bash
# Session 44, calls 6-7 (H100 80GB, warm; no H200 came this session): issue 3's bf16 table and issue 6's FP8 table at
# 51e3e6c on the H100, each in its own call (run inline without JMF_GIT_COMMIT: the commit was filled in afterwards).
set -uo pipefail
R=/tmp/r8; source tools/sessions/setup.sh
bench grouped_gemm 240 'benchmarks/results/grouped_gemm_*' python3 benchmarks/grouped_gemm.py --anchor-groups even \
  --skip xla_ragged_dot --out grouped_gemm_s44_h100
bench grouped_gemm_fp8 230 'benchmarks/results/grouped_gemm_fp8_*' python3 benchmarks/grouped_gemm.py --recipe blockwise \
  --passes fwd,fwd_bwd --skip xla_ragged_dot,tokamax --no-torch --out grouped_gemm_fp8_s44_h100
echo "total $((SECONDS - T0)) s"
