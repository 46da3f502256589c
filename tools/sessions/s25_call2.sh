#!/usr/bin/env bash
# Session 25, call 2 (the experiment build of call 1 as .gpu/, every shipped kernel in it): why the skewed wgrad runs
# at 0.85 of even when neither tile order / swizzle nor epilogue stages / subtiles move it (call 1). Nsight Compute
# on one launch of the qwen3-30b down wgrad, even and skewed (speed of light, warp states, scheduler, memory, SASS
# stall samples); then the per-kernel profile of the bf16 and FP8 training steps (issue 8: where FP8 loses).
set -uo pipefail
R=/tmp/r2; source tools/sessions/setup.sh
for kind in even skew; do
  timeout ${T_NCU:-170} ncu --clock-control none --target-processes all -k regex:device_kernel --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section SourceCounters \
    -o $R/ncu_wgrad_down_$kind python3 tools/ncu_gemm_probe.py --case "qwen3-30b-a3b down" --groups $kind --wgrad-only \
    > $R/ncu_wgrad_down_$kind.log 2>&1
  echo "ncu $kind rc=$?"
  ncu -i $R/ncu_wgrad_down_$kind.ncu-rep --print-details all > $R/ncu_wgrad_down_$kind.txt 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall" \
    $R/ncu_wgrad_down_$kind.txt | cut -c1-150 | head -40
  ncu -i $R/ncu_wgrad_down_$kind.ncu-rep --page source --csv --print-source sass > $R/sass_$kind.csv 2>/dev/null
  python3 tools/ncu_sass_stalls.py $R/sass_$kind.csv --top 12 2>&1 | head -45
  tar czf $OUT_DEV/results.tgz -C $R .
done
timeout ${T_PROFILESTEP:-220} python3 benchmarks/profile_step.py --variants ours_save,ours_fp8_save --steps 3 \
  > $R/profile_step.log 2>&1
echo "profile_step rc=$?"; grep -v "^W1" $R/profile_step.log | tail -45 | cut -c1-170
cp benchmarks/results/profile_step_h200.json $R/ 2>/dev/null
tar czf $OUT_DEV/results.tgz -C $R .
