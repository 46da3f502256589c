#!/usr/bin/env bash
# Session 28, call 5 (library of call 2): Nsight Compute on one launch each of the 1 x 128 row quantiser and the
# MXFP8 row quantiser on bf16 [65536, 2048] -- why the first runs at ~2.6 TB/s and the second at ~3.7 (occupancy,
# registers, issue slots, warp stalls by SASS opcode).
set -uo pipefail
R=/tmp/r5; source tools/sessions/setup.sh
prof() {  # name, probe args...
  local name=$1; shift
  timeout ${T_NCU:-120} ncu --clock-control none --target-processes all -k regex:rowblock_kernel --launch-skip 2 \
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
prof q_blockwise --recipe blockwise
prof q_mxfp8 --recipe mxfp8
