#!/usr/bin/env bash
# Session 28, call 8 (shipped library with rowblock16_kernel as the 1 x 128 row quantiser's default): the quantize
# GPU tests (CUDA bitwise CPU: odd shapes, specials, every bf16 / f16 pattern, 2^22 float32 patterns near block
# maxima), then the FP8 train step against bf16 in one process.
set -uo pipefail
R=/tmp/r8; source tools/sessions/setup.sh
T0=$SECONDS
timeout 110 python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider --timeout 100 tests/test_quantize.py \
  > $R/gpu_tests.log 2>&1
echo "quantize GPU tests rc=$? at $((SECONDS - T0)) s"; tail -2 $R/gpu_tests.log; grep -E "^(FAILED|ERROR)" $R/gpu_tests.log | head
timeout 70 python3 benchmarks/train_step.py --xla-flags runtime --variants ours_fp8_save_noinit,ours_save_noinit \
  --out train_step_fp8_x16_s28_h200 > $R/train.log 2>&1
echo "train rc=$? at $((SECONDS - T0)) s"; grep "ms/step" $R/train.log | cut -c1-120
cp benchmarks/results/train_step_fp8_x16_s28_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
