#!/usr/bin/env bash
# Session 37, call 1: programmatic dependent launch (JAX_MOE_FFI_PDL, cc/cuda/dependent_launch.cuh).
# (a) correctness: the new bitwise PDL test (graphs and streams), then kernel GPU tests with PDL on for the whole
#     process (benchmark shapes, random shapes, many groups, zeros, determinism, pair / sum launches, FP8);
# (b) benchmarks/pdl_ab.py: off / on alternated in one process, fresh jit per run (command buffers on);
# (c) the Qwen3 MoE layer (dropless) with PDL off / on, a process each, twice;
# (d) in what time is left, the pass test files on the GPU platform (NOTES item 000), pytest-xdist with 4 workers.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
step pdl_bitwise ${T_BITWISE:-150} -m gpu tests/test_gpu_grouped_gemm.py -k dependent_launch
export JAX_MOE_FFI_PDL=1
step kernel_tests_pdl_on ${T_KERNEL:-150} -m gpu tests/test_gpu_grouped_gemm.py \
  -k "benchmark_shapes or random_shapes or many_groups or zeroed or deterministic or pair_launch or sum_dgrad or accumulate"
step fp8_tests_pdl_on ${T_FP8:-90} -m gpu tests/test_grouped_gemm_fp8.py tests/test_fp8_wgrad.py
unset JAX_MOE_FFI_PDL
timeout ${T_AB:-200} python3 benchmarks/pdl_ab.py --rounds 2 ${AB_ARGS:-} > $R/pdl_ab.log 2>&1
echo "pdl_ab rc=$? at $((SECONDS - T0)) s"; tail -4 $R/pdl_ab.log
cp benchmarks/results/pdl_ab_*.* $R/ 2>/dev/null
tar czf "$OUT_DEV/results.tgz" -C "$R" .
for i in 1 2; do for pdl in 0 1; do  # the Qwen3 layer, dropless, a process per setting, alternating
  JAX_MOE_FFI_PDL=$pdl timeout ${T_LAYER:-45} python3 benchmarks/moe_layer.py --impls ours_dropless \
    --out moe_layer_pdl${pdl}_r${i}_s37_h200 > $R/layer_pdl${pdl}_r$i.log 2>&1
  echo "layer pdl=$pdl r$i rc=$? at $((SECONDS - T0)) s"; grep -E "ours_dropless" $R/layer_pdl${pdl}_r$i.log | tail -2
done; done
cp benchmarks/results/moe_layer_pdl*_s37_h200.* $R/ 2>/dev/null
tar czf "$OUT_DEV/results.tgz" -C "$R" .
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import xdist; print('xdist', xdist.__version__)" && PT="$PT -n ${WORKERS:-4}"
left=$((${T_TOTAL:-560} - (SECONDS - T0)))
[ $left -gt 40 ] && step pass_files_on_gpu $left tests/test_rewrite_ragged.py tests/test_rewrite_gathered.py \
  tests/test_rewrite_outer_router.py tests/test_rewrite_repeating_ids.py tests/test_rewrite_praxis_top2.py \
  tests/test_rewrite_capacity.py tests/test_flax.py tests/test_pass_runtime.py tests/test_rewrite.py
echo "total $((SECONDS - T0)) s"
