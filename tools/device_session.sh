#!/usr/bin/env bash
# One device call: install carried wheels, build the CPU extension for the device's Python, load the
# CUDA library (carried in .gpu/ if prebuilt here, else built there), run GPU tests, sanitizer, benchmarks.
# Usage on the device: bash tools/device_session.sh "<what: tests,tiletests,tiles,sanitize,cvt,bench,fp8,fp8ab,dispatch,moe,moeflags,profile,timing,sweep,maxtext,quantize,runtime,streams,streamsdebug,train,trainflags,profilestep,ncu>" [bench args]
# Per-step arguments and time limits: GPU_TESTS (paths / node ids), GPU_K (a pytest -k expression), FP8_ARGS, TRAIN_ARGS, RUNTIME_ARGS, QUANTIZE_ARGS; T_<STEP> seconds (e.g. T_TRAIN=240).
# Set JMF_GIT_COMMIT to the commit being measured (the device copy has no .git) so results name it.
set -uo pipefail
export PYTHONUNBUFFERED=1
what="${1:-tests,bench}"; shift || true
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
log "build CPU extension"
JAX_MOE_FFI_CUDA=OFF python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build_cpu.log" 2>&1 || { tail -30 "$OUT/build_cpu.log"; exit 1; }
if [ -f .gpu/libjax_moe_ffi_cuda.so ]; then
  export JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda.so
else
  log "build CUDA library"
  cmake -S . -B /tmp/cudabuild -G Ninja -DJAX_MOE_FFI_CUDA=ON -DPython_EXECUTABLE=$(command -v python3) \
     -DCUTLASS_INCLUDE_DIR=/tmp/site/cutlass_library/source/include > "$OUT/build_cuda.log" 2>&1 \
   && cmake --build /tmp/cudabuild --target jax_moe_ffi_cuda -j 16 >> "$OUT/build_cuda.log" 2>&1 \
   || { tail -40 "$OUT/build_cuda.log"; exit 1; }
  export JAX_MOE_FFI_CUDA_LIB=/tmp/cudabuild/libjax_moe_ffi_cuda.so
fi
python3 -c "import jax_moe_ffi as j; print('cuda targets', j._registry.cuda_targets, j._registry.cuda_load_error)"
if [[ ",$what," == *",tests,"* ]]; then
  log "GPU tests"
  timeout ${T_TESTS:-480} python3 -m pytest -m gpu -q --tb=line -p no:cacheprovider --timeout 60 --durations=12 ${GPU_TESTS:-tests} ${GPU_K:+-k "$GPU_K"} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
if [[ ",$what," == *",sanitize,"* ]]; then
  log "compute-sanitizer"
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py > "$OUT/sanitize_$tool.log" 2>&1
    echo "$tool rc=$?"; tail -4 "$OUT/sanitize_$tool.log"
  done
fi
if [[ ",$what," == *",cvt,"* ]]; then
  log "exhaustive FP8 conversion check (hardware cvt == the CPU encoder)"
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I cc -o /tmp/check_fp8_cvt tools/check_fp8_cvt.cu \
    && timeout 200 /tmp/check_fp8_cvt 2>&1 | tee "$OUT/check_fp8_cvt.log" | tail -6
fi
if [[ ",$what," == *",bench,"* ]]; then
  log "benchmark grouped gemm"
  timeout 280 python3 benchmarks/grouped_gemm.py "$@" 2>&1 | tee "$OUT/bench.log" | tail -45
  cp benchmarks/results/grouped_gemm_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",fp8,"* ]]; then
  log "benchmark FP8 grouped gemm"
  timeout ${T_FP8:-280} python3 benchmarks/grouped_gemm.py --recipe blockwise ${FP8_ARGS:-} 2>&1 | tee "$OUT/fp8_bench.log" | grep -v "^W1\|^  ans_pytree" | tail -45
  cp benchmarks/results/grouped_gemm_fp8_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",fp8ab,"* ]]; then
  # Same-call A/B of the FP8 kernel's consumer mainloop (cc/cuda/fp8_overlap_mainloop.cuh vs CUTLASS's),
  # forward only, bf16 "ours" rows beside each; alternating order, FP8AB_ROUNDS rounds.
  for r in $(seq 1 ${FP8AB_ROUNDS:-1}); do
    for ml in cutlass overlap; do
      log "FP8 mainloop A/B: $ml (round $r)"
      JAX_MOE_FFI_FP8_MAINLOOP=$ml timeout ${T_FP8AB:-150} python3 benchmarks/grouped_gemm.py --recipe blockwise \
        --skip xla_ragged_dot,tokamax --no-torch --passes ${FP8AB_PASSES:-fwd} --out grouped_gemm_fp8_${ml}_r${r}_h200 \
        2>&1 | grep -v "^W1\|^  ans_pytree" | tee "$OUT/fp8ab_${ml}_r${r}.log" | grep "ours" | tail -24
      cp benchmarks/results/grouped_gemm_fp8_${ml}_r${r}_h200.* "$OUT/" 2>/dev/null
    done
  done
fi
if [[ ",$what," == *",dispatch,"* ]]; then
  log "benchmark dispatch"
  timeout 300 python3 benchmarks/dispatch.py 2>&1 | tee "$OUT/dispatch.log" | tail -20
  cp benchmarks/results/dispatch_h200.* "$OUT/" 2>/dev/null
  log "dispatch with the row-major gather kernel (A/B)"
  JAX_MOE_FFI_DISPATCH_GATHER=rows timeout 200 python3 benchmarks/dispatch.py --skip argsort_gather,scatter_einsum \
    --out dispatch_rows_gather_h200 2>&1 | tee "$OUT/dispatch_rows_gather.log" | tail -10
fi
if [[ ",$what," == *",moe,"* ]]; then
  log "benchmark MoE layer"
  timeout 400 python3 benchmarks/moe_layer.py ${MOE_ARGS:-} 2>&1 | tee -a "$OUT/moe_layer.log" | grep -v "^W1" | tail -20
  cp benchmarks/results/moe_layer*_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",moeflags,"* ]]; then
  flags="${MOE_XLA_FLAGS:---xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN --xla_gpu_graph_min_graph_size=1}"
  log "benchmark MoE layer with XLA_FLAGS=$flags"
  XLA_FLAGS="$flags" timeout 300 python3 benchmarks/moe_layer.py --out moe_layer_flags_h200 ${MOE_ARGS:-} 2>&1 | tee "$OUT/moe_layer_flags.log" | grep "ms " | tail -8
  cp benchmarks/results/moe_layer_flags_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",profile,"* ]]; then
  log "per-kernel profile of the optimized MoE layer"
  timeout ${T_PROFILE:-200} python3 benchmarks/profile_layer.py 2>&1 | tee "$OUT/profile_layer.log" | tail -60
  cp benchmarks/results/profile_layer_h200.json "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",timing,"* ]]; then
  log "timing check (per-call vs per-trial cost of the MoE layer)"
  # SM clock / power / temperature every 100 ms while it runs (do longer trials run at lower clocks?)
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 100 > "$OUT/timing_smi.csv" 2>&1 &
  smi=$!
  timeout ${T_TIMING:-200} python3 benchmarks/timing_check.py 2>&1 | tee "$OUT/timing_check.log" | tail -8
  kill $smi 2>/dev/null
  cp benchmarks/results/timing_check_h200.json "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",sweep,"* ]]; then
  # Tile configurations switched at run time (no rebuild): bf16 forward, then FP8 forward kernel.
  for tiles in ${SWEEP_TILES:-large small}; do
    log "bf16 tiles=$tiles"
    JAX_MOE_FFI_GEMM_TILES=$tiles timeout ${T_SWEEP:-150} python3 benchmarks/grouped_gemm.py --skip xla_ragged_dot,tokamax \
      --no-torch --passes fwd --out sweep_bf16_${tiles}_h200 ${SWEEP_ARGS:-} 2>&1 | grep " ours \|skew" | tail -12
  done
  for tiles in ${SWEEP_FP8_TILES:-small}; do
    log "fp8 tiles=$tiles"
    JAX_MOE_FFI_FP8_TILES=$tiles timeout ${T_SWEEP:-150} python3 benchmarks/grouped_gemm.py --recipe blockwise \
      --skip xla_ragged_dot,tokamax,ours_fp8_with_quant --no-torch --passes fwd --out sweep_fp8_${tiles}_h200 \
      ${SWEEP_ARGS:-} 2>&1 | grep "ours_fp8 " | tail -12
  done
  cp benchmarks/results/sweep_*_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",tiletests,"* ]]; then
  # Correctness of each forward / dgrad tile config (the env is read once per process: one pytest each).
  for tiles in ${TILETEST_LIST:-c1x1 c1x2 pp128 c2x1 pick n192all}; do
    log "GPU tests, JAX_MOE_FFI_GEMM_TILES=$tiles"
    JAX_MOE_FFI_GEMM_TILES=$tiles timeout ${T_TILETESTS:-90} python3 -m pytest -m gpu -q --tb=line -p no:cacheprovider \
      tests/test_gpu_grouped_gemm.py -k "large_tile or paired" 2>&1 | tee -a "$OUT/tile_tests.log" | tail -2
  done
  for wt in ${WGRAD_TILETEST_LIST:-pingpong coop c2x2}; do
    log "GPU tests, JAX_MOE_FFI_WGRAD_TILES=$wt"
    JAX_MOE_FFI_WGRAD_TILES=$wt timeout ${T_TILETESTS:-90} python3 -m pytest -m gpu -q --tb=line -p no:cacheprovider \
      tests/test_gpu_grouped_gemm.py -k "wgrad_tile_configs" 2>&1 | tee -a "$OUT/tile_tests.log" | tail -2
  done
fi
if [[ ",$what," == *",tiles,"* ]]; then
  # Forward / dgrad tile configs (JAX_MOE_FFI_GEMM_TILES): grouped GEMM forward, then the MoE layer.
  # TILES_LIST entries as MOE_TILES_LIST's: GEMM_TILES or GEMM_TILES/WGRAD_TILES.
  for entry in ${TILES_LIST-c2x1 c1x1 c1x2 pp128}; do
    tiles=${entry%%/*}; wt=pingpong; [[ "$entry" == */* ]] && wt=${entry#*/}
    name=$tiles; [[ "$wt" != pingpong ]] && name=${tiles}_w${wt}
    log "bf16 grouped GEMM, tiles=$tiles wgrad=$wt"
    JAX_MOE_FFI_GEMM_TILES=$tiles JAX_MOE_FFI_WGRAD_TILES=$wt timeout ${T_TILES:-100} python3 benchmarks/grouped_gemm.py \
      --skip xla_ragged_dot,tokamax,dense,copy --no-torch --passes ${TILES_PASSES:-fwd} --out tiles_bf16_${name}_h200 \
      ${TILES_ARGS:-} 2>&1 | grep " ours " | tail -20
  done
  # MOE_TILES_LIST entries: GEMM_TILES or GEMM_TILES/WGRAD_TILES (e.g. auto/c2x2); MOE_XLA_FLAGS applies to all.
  for entry in ${MOE_TILES_LIST-c2x1 auto pp128}; do
    tiles=${entry%%/*}; wt=pingpong; [[ "$entry" == */* ]] && wt=${entry#*/}
    name=$tiles; [[ "$wt" != pingpong ]] && name=${tiles}_w${wt}
    log "MoE layer, tiles=$tiles wgrad=$wt"
    XLA_FLAGS="${MOE_XLA_FLAGS:-${XLA_FLAGS:-}}" JAX_MOE_FFI_GEMM_TILES=$tiles JAX_MOE_FFI_WGRAD_TILES=$wt \
      timeout ${T_MOETILES:-120} python3 benchmarks/moe_layer.py --impls ours \
      --out moe_layer_tiles_${name}_h200 2>&1 | grep " ms " | tail -4
  done
  cp benchmarks/results/tiles_bf16_*_h200.* benchmarks/results/moe_layer_tiles_*_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",maxtext,"* ]]; then
  # MaxText is not on the H200 image: carry its wheels in .whl-models (see benchmarks/NOTES.md).
  log "benchmark MaxText RoutedMoE training step"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl-models/*.whl > "$OUT/maxtext_install.log" 2>&1 || tail -5 "$OUT/maxtext_install.log"
  timeout ${T_MAXTEXT:-300} python3 benchmarks/train_step_maxtext.py ${MAXTEXT_ARGS:-} 2>&1 \
    | tee "$OUT/train_step_maxtext.log" | grep -v "^W1" | tail -15
  cp benchmarks/results/train_step_maxtext*_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",quantize,"* ]]; then
  log "benchmark quantize"
  timeout ${T_QUANTIZE:-300} python3 benchmarks/quantize.py ${QUANTIZE_ARGS:-} 2>&1 | tee "$OUT/quantize.log" | tail -20
  cp benchmarks/results/quantize*_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",runtime,"* ]]; then
  log "benchmark streams/offload"
  timeout ${T_RUNTIME:-400} python3 benchmarks/runtime.py ${RUNTIME_ARGS:-} 2>&1 | tee "$OUT/runtime.log" | tail -10
  cp benchmarks/results/runtime*_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",streams,"* ]]; then
  log "per-stream busy time and overlap (runtime model, streams off/on)"
  timeout ${T_STREAMS:-200} python3 benchmarks/profile_streams.py ${STREAMS_ARGS:-} 2>&1 | tee -a "$OUT/profile_streams.log" | grep -v "^W1" | tail -6
  cp benchmarks/results/profile_streams*_h200.json "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",streamsdebug,"* ]]; then
  # Why do annotated regions run on the main stream? (benchmarks/NOTES.md, session 4): the thunk sequence and
  # async-thunk logs of the small streams check, then the stream profile with command buffers off.
  log "streams debug: XLA dump + async thunk logs"
  XLA_FLAGS="--xla_dump_to=$OUT/xla_dump --xla_dump_hlo_as_text" TF_CPP_MIN_LOG_LEVEL=0 \
    TF_CPP_VMODULE=async_thunk=1,gpu_executable=2 timeout ${T_SDUMP:-150} python3 tools/stream_hlo_check.py \
    > "$OUT/streams_debug.log" 2>&1
  grep -i "additional compute stream\|Execute async\|stream_id" "$OUT/streams_debug.log" | head -20
  ls "$OUT/xla_dump" | grep -i thunk | head; (cd "$OUT" && tar czf xla_dump.tgz xla_dump && rm -rf xla_dump)
  log "stream profile with command buffers off"
  XLA_FLAGS="--xla_gpu_enable_command_buffer=" timeout ${T_SPROF:-200} python3 benchmarks/profile_streams.py \
    --out profile_streams_nocmdbuf_h200 2>&1 | grep -v "^W1" | tail -4
  cp benchmarks/results/profile_streams_nocmdbuf_h200.json "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",train,"* ]]; then
  log "benchmark training step"
  timeout ${T_TRAIN:-500} python3 benchmarks/train_step.py ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train_step.log" | tail -15
  cp benchmarks/results/train_step*_h200.* "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",trainflags,"* ]]; then
  # The train step under XLA flag sets (session 7's A/B): XLA's defaults, command buffers off,
  # runtime.xla_flags(), and that plus while-loop double buffering.
  rt=$(python3 -c "from jax_moe_ffi import runtime; print(' '.join(runtime.xla_flags()))" 2>/dev/null)
  for cfg in "a|" "b|--xla_gpu_enable_command_buffer=" "c|$rt" "d|$rt --xla_gpu_enable_while_loop_double_buffering=true"; do
    n=${cfg%%|*}; f=${cfg#*|}; log "train step, XLA_FLAGS=$f"
    XLA_FLAGS="$f" timeout ${T_TRAINFLAGS:-120} python3 benchmarks/train_step.py --variants ${TRAINFLAGS_VARIANTS:-ours_exact,ours} \
      --out train_step_flags_${n}_h200 2>&1 | grep "ms/step\|FAILED" | tee -a "$OUT/train_step_flags.log"
  done
  cp benchmarks/results/train_step_flags_*_h200.json "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",profilestep,"* ]]; then
  log "per-kernel profile of the training step, variant against variant"
  timeout ${T_PROFILESTEP:-240} python3 benchmarks/profile_step.py ${PROFILESTEP_ARGS:-} 2>&1 | tee "$OUT/profile_step.log" \
    | grep -v "^W1" | tail -60
  cp benchmarks/results/profile_step_h200.json "$OUT/" 2>/dev/null
fi
if [[ ",$what," == *",ncu,"* ]]; then
  # Nsight Compute counters (clocks left alone, METHOD.md) for one launch of each grouped GEMM kernel, ours and
  # torch._grouped_mm's, at NCU_CASES (tools/ncu_gemm_probe.py); text reports in $OUT/ncu_*.txt. Under ncu our
  # JAX process needed > 100 s to reach its second profiled kernel (session 8): give T_NCU >= 300 or profile one
  # kernel per run (--launch-skip 3/4/5 --launch-count 1: forward / dgrad / wgrad).
  IFS=';' read -ra cases <<< "${NCU_CASES:-qwen3-30b-a3b gate_up;qwen3-30b-a3b down}"
  for c in "${cases[@]}"; do
    for who in ours torch; do
      log "ncu $who $c"
      timeout ${T_NCU:-300} ncu --clock-control none --target-processes all -k regex:device_kernel --launch-skip 3 \
        --launch-count 3 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section LaunchStats --section Occupancy python3 tools/ncu_gemm_probe.py --case "$c" \
        $([ $who = torch ] && echo --torch) > "$OUT/ncu_${who}_${c// /_}.txt" 2>&1
      grep -E "device_kernel|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy" \
        "$OUT/ncu_${who}_${c// /_}.txt" | cut -c1-160 | head -40
    done
  done
fi
cp benchmarks/results/dispatch_rows_gather_h200.* "$OUT/" 2>/dev/null
log done
