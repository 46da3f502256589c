# Sourced by the session scripts on the device: R (results directory, tarred into the device's $OUT at the end
# as OUT_DEV/results.tgz), the one-time set-up of tools/device_session.sh, and the environment every step needs.
# Usage: R=/tmp/rN; source tools/sessions/setup.sh
mkdir -p "$R"
OUT_DEV=$OUT
OUT=$R bash tools/device_session.sh none > "$R/setup.log" 2>&1 || { tail -20 "$R/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda.so PYTHONUNBUFFERED=1
export JMF_GIT_COMMIT=${JMF_GIT_COMMIT:-unknown}
PT="python3 -m pytest -q --tb=short -p no:cacheprovider --timeout 150 -rf"
T0=$SECONDS
# step NAME SECONDS PYTEST_ARGS...: a pytest run with its own limit, given SIGINT there (so pytest still prints its
# summary and the failures' tracebacks), its log in $R/NAME.log, the results tarred after each step.
step() {
  local name=$1 secs=$2; shift 2
  timeout -s INT -k 15 "$secs" $PT "$@" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s"; tail -8 "$R/$name.log"
  tar czf "$OUT_DEV/results.tgz" -C "$R" .
}
# bench NAME SECONDS RESULT_GLOB COMMAND...: a benchmark (or any command) with its own limit, its log in $R/NAME.log
# (the last 30 lines echoed, without tokamax's autotuning-cache lines), the files matching RESULT_GLOB (relative to the
# repository, e.g. 'benchmarks/results/grouped_gemm_*') that the command wrote copied into $R/NAME/ (not the committed
# results of other runs the glob also matches), the results tarred. Skipped when SECONDS < 60.
bench() {
  local name=$1 secs=$2 glob=$3 f; shift 3
  if [ "$secs" -lt 60 ]; then echo "$name skipped: $secs s left"; return; fi
  mkdir -p "$R/$name"; touch "$R/$name/.started"
  timeout "$secs" "$@" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s"; grep -v "Autotuning cache miss" "$R/$name.log" | tail -30 | cut -c1-200
  for f in $glob; do [ "$f" -nt "$R/$name/.started" ] && cp "$f" "$R/$name/"; done
  tar czf "$OUT_DEV/results.tgz" -C "$R" .
}
# tables END: issue 3's bf16 grouped-GEMM table (at most 230 s) and issue 6's FP8 table, in what is left of END seconds
# since T0 (each step skipped under 60 s).
tables() {
  local end=$1 t
  t=$((end - (SECONDS - T0) - 5)); [ $t -gt 230 ] && t=230
  bench grouped_gemm $t 'benchmarks/results/grouped_gemm_*' \
    python3 benchmarks/grouped_gemm.py --anchor-groups even --skip xla_ragged_dot
  bench grouped_gemm_fp8 $((end - (SECONDS - T0) - 5)) 'benchmarks/results/grouped_gemm_fp8_*' \
    python3 benchmarks/grouped_gemm.py --recipe blockwise --passes fwd,fwd_bwd --skip xla_ragged_dot --no-torch
}
# The card: GPU (its name), TAG (h200 or h100, for result names), its name, clocks and memory in $R/gpu.txt; left MAX:
# the seconds to give the next step, at most MAX and at most what END (seconds a call's steps may use, default 570;
# not set here, so older scripts keep their own defaults) leaves.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader | tee "$R/gpu.txt"
TAG=$([[ "$GPU" == *H200* ]] && echo h200 || echo h100)
left() { local t=$((${END:-570} - (SECONDS - T0) - 5)); [ $t -gt $1 ] && t=$1; echo $t; }
