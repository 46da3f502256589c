#!/usr/bin/env bash
# Session 12, call 4: XLA's dynamic-slice fusion (--xla_gpu_enable_dynamic_slice_fusion, default false) on the
# train step, alternating with the default: under the scanned layers' backward, each layer's weight gradients
# (our wgrad custom calls) are written into the stacked [L, ...] gradient by a dynamic-update-slice, i.e. a
# device copy; with the fusion the call could write into the slice in place. One flagged compile dumps its HLO
# (the fusion names only) to check what XLA did.
set -uo pipefail
R=/tmp/r4; source tools/sessions/setup.sh
DSF=--xla_gpu_enable_dynamic_slice_fusion=true
run() {  # name flags variants
  XLA_FLAGS="$2" timeout 200 python3 benchmarks/train_step.py --variants $3 --out train_step_dsf_$1 \
    > $R/train_$1.log 2>&1; echo "$1 rc=$?"; grep -E "ms/step|FAILED" $R/train_$1.log | sed "s/^/$1 /"
}
run a "" ours,ours_exact
run b "$DSF --xla_dump_to=$R/dump --xla_dump_hlo_pass_re=^$ --xla_dump_hlo_module_re=step" ours,ours_exact
run c "" ours
run d "$DSF" ours,naive
for f in $(ls $R/dump/*after_optimizations.txt 2>/dev/null | head -4); do
  echo "$f: $(grep -c 'dynamic-slice-fusion\|dynamic_slice_fusion\|address_computation' $f) dsf lines, $(grep -c 'custom_call_target=\"jax_moe_ffi' $f) jmf calls"
  grep -E 'dynamic.slice.fusion|address_computation' $f | grep -E 'fusion|custom' | cut -c1-300 | head -12 > $R/dsf_lines_$(basename $f).txt
done
rm -rf $R/dump
cp benchmarks/results/train_step_dsf_* $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
