#!/usr/bin/env bash
# Prepared in session 26 for the next device session (shipped library built at HEAD, carried as .gpu/): the FP8
# lhs-scale repack by rows (JAX_MOE_FFI_FP8_REPACK=rows, opt-in) against the default by elements -- its bitwise GPU
# tests, then the forward alternating two rounds a process each (the knob is read once per process in a shipped
# build); then the session-26 pass changes' GPU tests.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
timeout ${T_TESTS:-150} python3 -m pytest -m gpu -q --tb=line -p no:cacheprovider --timeout 120 \
  tests/test_grouped_gemm_fp8.py -k "wide_tiles_match and (rows or auto)" > $R/gpu_tests_rows.log 2>&1
echo "repack-rows tests rc=$?"; tail -3 $R/gpu_tests_rows.log
SKIP=xla_ragged_dot,tokamax,dense,dense_fp8,copy,ours_fp8_with_quant,ours_fp8_fp8_wgrad,ours_fp8_cached_weights
for r in 1 2; do
  for v in elements rows; do
    JAX_MOE_FFI_FP8_REPACK=$v timeout 120 python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd \
      --skip $SKIP --no-torch --out fp8_repack_${v}_r${r}_h200 > $R/bench_${v}_r${r}.log 2>&1
    echo "bench $v r$r rc=$?"; grep "ours_fp8 " $R/bench_${v}_r${r}.log | cut -c1-100
    cp benchmarks/results/fp8_repack_${v}_r${r}_h200.* $R/ 2>/dev/null
  done
done
tar czf $OUT_DEV/results.tgz -C $R .
