#!/usr/bin/env bash
# Session 27, call 5: what the remaining copies / slices / concatenates of the step are. The profile with XLA's
# command buffers off (so each kernel names the HLO instruction that launched it) and the optimized HLO, for
# ours_save_noinit.
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 150 python3 benchmarks/profile_step.py --variants ours_save_noinit \
  --steps 2 --top 30 --dump-hlo $R/hlo \
  --detail memcpy,loop_slice_fusion,wrapped_concatenate,loop_broadcast_fusion,input_scatter_fusion,input_reduce_fusion \
  > $R/profile_nocmdbuf.log 2>&1
echo "profile rc=$?"; sed -n '/== ours_save_noinit/,$p' $R/profile_nocmdbuf.log | head -90 | cut -c1-160
gzip -f $R/hlo/*.txt
tar czf $OUT_DEV/results.tgz -C $R .
