#!/usr/bin/env bash
# Session 25, call 6 (experiment build with JAX_MOE_FFI_WGRAD_TILES=trim; ~190 s of device time left): the wgrad whose
# consumer skips the zero-padded wgmma steps of each group's last k-tile (TrimmedTailMainloop) against the default,
# alternating in one process, two rounds, bitwise checked (a wrong mailbox slot would change or hang the output).
set -uo pipefail
R=/tmp/r6; source tools/sessions/setup.sh
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout ${T_AB:-140} python3 benchmarks/tile_ab.py --passes wgrad \
  --groups skew,even --variants static,trim --rounds 2 --out wgrad_trim_ab_h200 > $R/wgrad_ab.log 2>&1
echo "wgrad ab rc=$?"; grep -E "TFLOP|Error|error" $R/wgrad_ab.log | cut -c1-110 | tail -44
cp benchmarks/results/wgrad_trim_ab_h200.* $R/ 2>/dev/null; tar czf $OUT_DEV/results.tgz -C $R .
