#!/usr/bin/env bash
# Session 34, call 2: the kernel GPU test that failed in call 1 (H100; traceback lost to the step timeout) --
# its shape on several seeds against two references, then the kernel GPU test files with tracebacks (T_KERNEL s).
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
T0=$SECONDS
timeout 150 python3 tools/sessions/s34_diag_shape.py > $R/diag_shape.log 2>&1
echo "diag rc=$? at $((SECONDS - T0)) s"; tail -40 $R/diag_shape.log
tar czf $OUT_DEV/results.tgz -C $R .
PT="python3 -m pytest -q --tb=short -p no:cacheprovider --timeout 150 -rf"
timeout ${T_KERNEL:-240} $PT -m gpu tests/test_gpu_grouped_gemm.py > $R/gpu_grouped_gemm_tests.log 2>&1
echo "test_gpu_grouped_gemm rc=$? at $((SECONDS - T0)) s"; tail -30 $R/gpu_grouped_gemm_tests.log
tar czf $OUT_DEV/results.tgz -C $R .
