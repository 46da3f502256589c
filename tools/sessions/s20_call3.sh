#!/usr/bin/env bash
# Session 20, call 3 (shipped build, as call 2): the FP8 forward table again for the two qwen3-30b shapes (call 2
# put qwen3 gate_up at exactly 1.60x bf16), the cached-weight FP8 GPU tests call 2's limit cut off, and the 28
# test_gpu_grouped_gemm.py tests session 19's whole-suite run did not reach (s20_call3_ids.txt).
set -uo pipefail
R=/tmp/r3; source tools/sessions/setup.sh
timeout ${T_FP8:-150} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd --cases qwen3-30b \
  --skip xla_ragged_dot --no-torch --out grouped_gemm_fp8_qwen3_r2_h200 > $R/fp8_bench.log 2>&1
echo "fp8 qwen3 rc=$?"; grep -E "ours_fp8: .*x ours \(bf16\)" $R/fp8_bench.log | cut -c1-150
cp benchmarks/results/grouped_gemm_fp8_qwen3_r2_h200.* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_TESTS:-200} python3 -m pytest -q --tb=short -p no:cacheprovider \
  $(cat tools/sessions/s20_call3_ids.txt) > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | tail -8 | cut -c1-220
tar czf $OUT_DEV/results.tgz -C $R .
