#!/usr/bin/env bash
# Session 45's first call on whichever card comes: on an H200, issue 3's bf16 and issue 6's FP8 tables at head
# (s45_call2.sh; the H200's target tables are still sessions 24-25's); on another card, the fwd_bwd split and the
# backward tile A/B (s45_call1.sh; session 44 ran the tables on an H100).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash tools/sessions/s45_call2.sh
fi
exec bash tools/sessions/s45_call1.sh
