#!/usr/bin/env bash
# Session 16, call 4: after the review's refactor (the band kernel's column maxima and scale stores shared with the
# groups_t kernel; the FP8 handlers' workspace carving and CUTLASS launch shared by the forward and the wgrad):
# the quantize, FP8 grouped GEMM and FP8 wgrad GPU tests again (bitwise CPU = CUDA for every quantize kernel).
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
timeout ${T_TESTS:-300} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_quantize.py \
  tests/test_fp8_wgrad.py tests/test_grouped_gemm_fp8.py > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -12 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
