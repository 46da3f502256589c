#!/usr/bin/env bash
# Session 26, call 2 (shipped-equivalent library of call 1; the pass change is Python only): the train step with
# optimize()'s scanned jax.checkpoint rebuilt with prevent_cse=False (the default now) against the model's
# prevent_cse=True (*_keepcse), variants interleaved, plus the tokamax anchor both ways; the remaining table rows last.
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
timeout ${T_TRAIN:-540} python3 benchmarks/train_step.py --xla-flags runtime --variants \
  ours,ours_keepcse,ours_exact,ours_exact_keepcse,ours_save,ours_save_keepcse,ours_fp8_save,ours_fp8_save_keepcse,tokamax,tokamax_nocse,naive,ours_fp8,ours_exact_save,xla_ragged_dot \
  > $R/train_step.log 2>&1
echo "train rc=$?"; grep -E "ms/step|FAILED" $R/train_step.log | cut -c1-150
cp benchmarks/results/train_step_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
