#!/usr/bin/env bash
# Session 24, call 2 (shipped build of bad732b, .gpu/): the GPU tests call 1's limits did not reach (FP8 wgrad bitwise
# order / mainloop, FP8 wgrad benchmark-shape similarity, more groups than SMs incl. the 160-rows-a-group case,
# accumulate form, pair launch), then issue 6's FP8 table.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_TESTS:-190} python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider -rA \
  tests/test_fp8_wgrad.py tests/test_grouped_gemm_fp8.py tests/test_gpu_grouped_gemm.py \
  -k "overlap_mainloop_matches_cutlass_bitwise or (similarity and not 65536x2048) or many_groups or accumulate_form or pair_launch" \
  > $R/gpu_tests.log 2>&1
echo "tests rc=$?"; grep -E "^PASSED|^FAILED|passed|failed|Error" $R/gpu_tests.log | tail -30 | cut -c1-150
tar czf $OUT_DEV/results.tgz -C $R .
timeout ${T_FP8:-290} python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd --skip xla_ragged_dot \
  --no-torch > $R/fp8_bench.log 2>&1
echo "fp8 table rc=$?"; grep -E "x ours|ours_fp8:|ours:" $R/fp8_bench.log | cut -c1-150 | tail -24
cp benchmarks/results/grouped_gemm_fp8_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
