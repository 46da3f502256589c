#!/usr/bin/env bash
# For the next device session (written in session 34): the 47 kernel GPU tests session 34 did not reach
# (tools/sessions/s34_kernel_tests_not_reached.txt: the last 31 of the FP8 / quantize files and the last 16 of
# test_gpu_grouped_gemm.py; the other 165 ran on an H100 in session 34, none failing but two whose XLA reference
# ran out of memory, since fixed), then the pass test files on the GPU platform (their CPU-marked tests run the
# CUDA kernels there; never finished: 200 s was too short in session 34), session 35's new files first.
# Each step (setup.sh) gets SIGINT at its limit, so pytest still prints its summary. T_KERNEL / T_FILES: seconds.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
step kernel_tests_not_reached ${T_KERNEL:-240} -m gpu $(cat tools/sessions/s34_kernel_tests_not_reached.txt)
step pass_files_on_gpu ${T_FILES:-300} tests/test_rewrite_praxis_top2.py tests/test_rewrite_per_column.py \
  tests/test_rewrite_repeating_ids.py tests/test_rewrite_ragged.py tests/test_rewrite_gathered.py tests/test_dispatch.py
