#!/usr/bin/env bash
# Session 44, call 2 (H100 80GB, warm after call 1): s44_call1.sh's part (b), which call 1 skipped (45 s a run, under
# bench's 60 s floor): JAX_MOE_FFI_GEMM_TILES=n192all against the default on the qwen3 shapes, 80 s a run. It ran as
# the same loop typed inline after `R=/tmp/r5; source tools/sessions/setup.sh`, without JMF_GIT_COMMIT (the results'
# commit was filled in afterwards as 51e3e6c); this is that loop.
exec env PART=b bash tools/sessions/s44_call1.sh "$@"
