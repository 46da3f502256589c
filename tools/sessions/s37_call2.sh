#!/usr/bin/env bash
# Session 37, call 2: (a) the Qwen3 MoE layer (dropless, forward and forward+backward) with JAX_MOE_FFI_PDL off / on,
# a process per setting, alternating twice (call 1's layer step was cut by the call's limit); (b) in what time is
# left, the pass test files on the GPU platform (NOTES item 000), pytest-xdist with 4 workers.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
for i in 1 2; do for pdl in 0 1; do
  JAX_MOE_FFI_PDL=$pdl timeout ${T_LAYER:-60} python3 benchmarks/moe_layer.py --impls ours_dropless \
    --out moe_layer_pdl${pdl}_r${i}_s37 > $R/layer_pdl${pdl}_r$i.log 2>&1
  echo "layer pdl=$pdl r$i rc=$? at $((SECONDS - T0)) s"; grep -E "ours_dropless" $R/layer_pdl${pdl}_r$i.log | tail -2
  cp benchmarks/results/moe_layer_pdl*_s37* $R/ 2>/dev/null; tar czf "$OUT_DEV/results.tgz" -C "$R" .
done; done
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import xdist; print('xdist', xdist.__version__)" && PT="$PT -n ${WORKERS:-4}"
left=$((${T_TOTAL:-520} - (SECONDS - T0)))
[ $left -gt 40 ] && step pass_files_on_gpu $left tests/test_rewrite_ragged.py tests/test_rewrite_gathered.py \
  tests/test_rewrite_outer_router.py tests/test_rewrite_repeating_ids.py tests/test_rewrite_praxis_top2.py \
  tests/test_rewrite_capacity.py tests/test_flax.py tests/test_pass_runtime.py tests/test_rewrite.py
echo "total $((SECONDS - T0)) s"
