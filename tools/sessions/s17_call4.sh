#!/usr/bin/env bash
# Session 17, call 4: the 1 x 128 row quantiser's variants (benchmarks/quantize_rows_ab.py: exact reciprocal
# division with a Markstein correction, 8 chunks in flight), each checked bitwise against the default; then the
# GPU quantize tests (bitwise CUDA = CPU on the edge cases: NaN/Inf blocks, subnormals, all-zero blocks, ...)
# with the markstein variant forced.
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-150} python3 benchmarks/quantize_rows_ab.py \
  > $R/quantize_rows_ab.log 2>&1
echo "ab rc=$?"; grep -E "GB/s" $R/quantize_rows_ab.log | cut -c1-110
cp benchmarks/results/quantize_rows_ab_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
JAX_MOE_FFI_QUANT_EXPERIMENT=markstein timeout ${T_TESTS:-150} python3 -m pytest -m gpu -q --tb=short \
  -p no:cacheprovider tests/test_quantize.py > $R/gpu_tests_markstein.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests_markstein.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
