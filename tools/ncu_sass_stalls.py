"""Sum the warp-stall samples of an Nsight Compute report by SASS opcode (where a kernel's warps wait).

  ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv
  python3 tools/ncu_sass_stalls.py sass.csv [--top 40]

Prints the share of all samples per opcode (HGMMA = tensor-core issue, WARPGROUP.DEPBAR = waiting for wgmma results,
SYNCS = mbarrier waits on TMA loads / pipeline slots, BAR = named barriers, STS / F2FP / UTMASTG = the epilogue's
shared-memory staging and TMA stores, FFMA / FMUL = the FP8 promotion), then the instructions with the most samples.
The column names are read from the CSV header (they differ between ncu versions), and printed.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        lines = [ln for ln in f if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if "Source" in ln and "Address" in ln)
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys()) if rows else []
    print("columns:", cols)
    sample_cols = sorted((c for c in cols if "Sampling" in c), key=lambda c: "All" not in c)  # "All" first
    if not sample_cols:
        sys.exit("no warp-stall sampling column in this report (profile with --section SourceCounters)")
    col = sample_cols[0]
    total = sum(_num(r[col]) for r in rows) or 1.0
    by_op = Counter()
    for r in rows:
        op = re.split(r"[\s.]", re.sub(r"^@!?U?P[T0-9]+\s+", "", r["Source"].strip()))[0] or "?"
        by_op[op] += _num(r[col])
    print(f"{col}: {total:.0f} samples")
    for op, v in by_op.most_common(25):
        print(f"  {op:<16} {100 * v / total:5.1f}%")
    print("top instructions:")
    for r in sorted(rows, key=lambda r: -_num(r[col]))[: args.top]:
        extra = "  ".join(f"{c.split('(')[0].strip()[:22]}={r[c]}" for c in sample_cols[1:3])
        print(f"  {r['Address']:>8} {100 * _num(r[col]) / total:5.1f}%  {r['Source'].strip()[:70]:<70} {extra}")


if __name__ == "__main__":
    main()
