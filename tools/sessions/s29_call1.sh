#!/usr/bin/env bash
# Session 29, call 1 (prepared in session 28; shipped library of 95ca8b1 or later): where the FP8 step's quantisation
# stands after session 28's row quantiser -- the step profile (rowblock rows against session 28's 2.04 ms, band_kernel
# 2.90 ms) -- and Nsight Compute on the weights' 128 x 128 tile quantiser (band_kernel: 3.3 TB/s in the step against
# the AdamW fusions' 4.3 TB/s) and on the new row quantiser (rowblock16_kernel).
set -uo pipefail
R=/tmp/r1; source tools/sessions/setup.sh
prof() {  # name, kernel regex, probe args...
  local name=$1; shift
  local kernel=$1; shift
  timeout ${T_NCU:-120} ncu --clock-control none --target-processes all -k regex:$kernel --launch-skip 2 \
    --launch-count 1 --import-source no --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section Occupancy --section LaunchStats -o $R/$name -f python3 tools/ncu_quantize_probe.py "$@" > $R/$name.log 2>&1
  echo "$name rc=$?"
  if [ -f $R/$name.ncu-rep ]; then
    ncu -i $R/$name.ncu-rep --page details --print-details all > $R/$name.details.txt 2>&1
    ncu -i $R/$name.ncu-rep --page source --csv --print-source sass > $R/$name.sass.csv 2>&1
    python3 tools/ncu_sass_stalls.py $R/$name.sass.csv --top 30 > $R/$name.stalls.txt 2>&1
    grep -E "rowblock|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issue Slots Busy|Issued Ipc|No Eligible|Warp Cycles Per Issued|Grid Size|Waves" \
      $R/$name.details.txt | cut -c1-150 | head -30
    head -24 $R/$name.stalls.txt | cut -c1-150
    rm -f $R/$name.sass.csv $R/$name.ncu-rep
  fi
  tar czf $OUT_DEV/results.tgz -C $R .
}
timeout 100 python3 benchmarks/profile_step.py --variants ours_save_noinit,ours_fp8_save_noinit --steps 3 \
  > $R/profile_fp8.log 2>&1
echo "profile rc=$?"; grep -A14 "ours_fp8_save_noinit - ours_save_noinit" $R/profile_fp8.log
cp benchmarks/results/profile_step_h200.json $R/profile_step_fp8_s29_h200.json 2>/dev/null
prof q_weights band_kernel --weights
prof q_rows16 rowblock16_kernel --recipe blockwise
