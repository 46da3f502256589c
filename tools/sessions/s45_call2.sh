#!/usr/bin/env bash
# Session 45, call 2 (the same warm machine): on an H200, issue 3's bf16 table and issue 6's FP8 table at head (the
# target tables are still sessions 24-25's); on another card, nothing (session 44 ran both on an H100).
set -uo pipefail
R=/tmp/r2t; source tools/sessions/setup.sh
[[ "$GPU" == *H200* ]] && tables ${END:-570}
echo "total $((SECONDS - T0)) s"
