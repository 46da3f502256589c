#!/usr/bin/env bash
# Session 26, call 5: the FP8 forward / dgrad kernel reading the lhs scales in place (K-major SFA; no repack kernel)
# in the new shipped library (.gpu) against the previous one (.gpu_old, gzipped, with its own Python workspace
# sizing swapped in for its runs): output digests on the benchmark shapes (bitwise), forward timing alternating
# old/new twice, then the FP8 GPU tests and compute-sanitizer on the FP8 cases with the new library.
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
NEW=$PWD/.gpu/libjax_moe_ffi_cuda.so; OLD=/tmp/old/libjax_moe_ffi_cuda.so
mkdir -p /tmp/old && gunzip -c .gpu_old/libjax_moe_ffi_cuda.so.gz > $OLD
PY=jax_moe_ffi/ops/grouped_gemm_fp8.py; cp $PY /tmp/new_fp8.py
use() {  # use old|new: the library and its Python workspace sizing
  if [ "$1" = old ]; then cp .gpu_old/grouped_gemm_fp8_old.py $PY; export JAX_MOE_FFI_CUDA_LIB=$OLD
  else cp /tmp/new_fp8.py $PY; export JAX_MOE_FFI_CUDA_LIB=$NEW; fi
}
for v in old new; do
  use $v; timeout 150 python3 tools/fp8_digest.py > $R/digest_$v.txt 2> $R/digest_$v.err; echo "digest $v rc=$?"
done
if diff $R/digest_old.txt $R/digest_new.txt > /dev/null && [ -s $R/digest_new.txt ]; then
  echo "digests: bitwise equal ($(wc -l < $R/digest_new.txt) lines)"
else echo "digests DIFFER"; diff $R/digest_old.txt $R/digest_new.txt | head; tail -3 $R/digest_*.err; fi
SKIP=xla_ragged_dot,tokamax,dense,dense_fp8,copy,ours_fp8_with_quant,ours_fp8_fp8_wgrad,ours_fp8_cached_weights
for r in 1 2; do
  for v in old new; do
    use $v
    timeout 120 python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd --skip $SKIP --no-torch \
      --out fp8_sfa_${v}_r${r}_h200 > $R/bench_${v}_r${r}.log 2>&1
    echo "bench $v r$r rc=$?"; grep "ours" $R/bench_${v}_r${r}.log | cut -c1-100
    cp benchmarks/results/fp8_sfa_${v}_r${r}_h200.* $R/ 2>/dev/null
  done
done
use new
timeout ${T_TESTS:-130} python3 -m pytest -m gpu -q --tb=line -p no:cacheprovider --timeout 90 \
  tests/test_grouped_gemm_fp8.py -k "random_shapes or many_groups or block_scaled or benchmark_shapes or grads" \
  > $R/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; tail -4 $R/gpu_tests.log
for tool in memcheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py fp8 > $R/sanitize_$tool.log 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" $R/sanitize_$tool.log | tail -2 | cut -c1-150
done
tar czf $OUT_DEV/results.tgz -C $R .
