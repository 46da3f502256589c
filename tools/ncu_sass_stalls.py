"""Sum the warp-stall samples of an Nsight Compute report by SASS opcode (where a kernel's warps wait).

  ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv
  python3 tools/ncu_sass_stalls.py sass.csv [--top 40]

Prints the share of all samples per opcode (HGMMA = tensor-core issue, WARPGROUP.DEPBAR = waiting for wgmma results,
SYNCS = mbarrier waits on TMA loads / pipeline slots, BAR = named barriers, STS / F2FP / UTMASTG = the epilogue's
shared-memory staging and TMA stores, FFMA / FMUL = the FP8 promotion), then the instructions with the most samples.
The column names are read from the CSV header (they differ between ncu versions), and printed.

  python3 tools/ncu_sass_stalls.py skew.csv --against even.csv   # the same kernel in two runs

--against: the instructions whose samples grew most from the other report to this one (matched by offset from the
kernel's first instruction, so the two reports must hold the same binary), with both runs' executed counts.
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


def _rows(path):
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if "Source" in ln and "Address" in ln)
    return list(csv.DictReader(lines[start:]))


def _diff(rows, other, col, top):
    """Per-instruction samples of `rows` minus `other`'s, by offset from each kernel's first instruction."""
    base, obase = int(rows[0]["Address"], 16), int(other[0]["Address"], 16)
    theirs = {int(r["Address"], 16) - obase: r for r in other}
    ex = "Instructions Executed"
    print(f"samples: this {sum(_num(r[col]) for r in rows):.0f}, other {sum(_num(r[col]) for r in other):.0f}")
    d = []
    for r in rows:
        off = int(r["Address"], 16) - base
        o = theirs.get(off)
        if o is None or o["Source"].split()[:1] != r["Source"].split()[:1]:
            sys.exit(f"--against: instruction at +{off:#x} differs between the reports (not the same binary)")
        d.append((_num(r[col]) - _num(o[col]), off, r, o))
    print("largest increases (this - other), offset, samples, executed this / other, instruction:")
    for delta, off, r, o in sorted(d, key=lambda x: -x[0])[:top]:
        print(f"  {delta:+7.0f} +{off:#07x} {_num(r[col]):6.0f} / {_num(o[col]):6.0f}"
              f"  {_num(r.get(ex, '0')):9.0f} / {_num(o.get(ex, '0')):9.0f}  {r['Source'].strip()[:70]}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--against", default="", help="a second report's CSV of the same kernel: print the difference")
    args = ap.parse_args(argv)
    rows = _rows(args.csv)
    cols = list(rows[0].keys()) if rows else []
    print("columns:", cols)
    sample_cols = sorted((c for c in cols if "Sampling" in c), key=lambda c: "All" not in c)  # "All" first
    if not sample_cols:
        sys.exit("no warp-stall sampling column in this report (profile with --section SourceCounters)")
    col = sample_cols[0]
    if args.against:
        _diff(rows, _rows(args.against), col, args.top)
        return
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
