#!/usr/bin/env bash
# Session 22, call 1 (shipped build of d1dcf20; no new kernel): Nsight Compute on one launch each of the FP8 forward
# (auto: 128x256 tiles, one 128-column slice per warp group at K <= 2048) at qwen3-30b gate_up and down, and of the
# bf16 forward at qwen3-30b gate_up -- where the warps stall (SASS-level samples, tools/ncu_sass_stalls.py), tensor-pipe
# and memory throughput. Question: what the per-tile cost at short K is (epilogue staging / TMA stores, pipeline
# waits, promotion), before another mainloop variant.
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
export XLA_FLAGS="--xla_gpu_autotune_level=0"
prof() {  # name, probe args...
  local name=$1; shift
  timeout ${T_NCU:-170} ncu --clock-control none --target-processes all -k regex:device_kernel --launch-skip 2 \
    --launch-count 1 --import-source no --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section Occupancy --section LaunchStats -o $R/$name -f python3 tools/ncu_gemm_probe.py "$@" > $R/$name.log 2>&1
  echo "$name rc=$?"
  if [ -f $R/$name.ncu-rep ]; then
    ncu -i $R/$name.ncu-rep --page details --print-details all > $R/$name.details.txt 2>&1
    ncu -i $R/$name.ncu-rep --page source --csv --print-source sass > $R/$name.sass.csv 2>&1
    python3 tools/ncu_sass_stalls.py $R/$name.sass.csv --top 30 > $R/$name.stalls.txt 2>&1
    grep -E "device_kernel|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Registers Per|Dynamic Shared|Issue Slots Busy|Issued Ipc|No Eligible|Tensor|Warp Cycles Per Issued" \
      $R/$name.details.txt | cut -c1-150 | head -30
    head -28 $R/$name.stalls.txt | cut -c1-150
    rm -f $R/$name.sass.csv $R/$name.ncu-rep
  fi
  tar czf $OUT_DEV/results.tgz -C $R .
}
prof fp8_qwen3_gate_up --case "qwen3-30b-a3b gate_up" --recipe blockwise
prof fp8_qwen3_down --case "qwen3-30b-a3b down" --recipe blockwise
prof bf16_qwen3_gate_up --case "qwen3-30b-a3b gate_up" --fwd-only
