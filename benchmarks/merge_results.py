"""Merges several benchmark runs (JSON files written by grouped_gemm.py) into one result set.

Each row keeps the run it came from (`run`) and that run's JAX_MOE_FFI_* overrides (`env`), and ratios in the markdown are only taken between rows of
the same run, so every comparison is a same-run comparison.

  python benchmarks/merge_results.py --out grouped_gemm_h200 --commit <sha> benchmarks/results/runs/grouped_gemm_h200_run*.json

`--commit` records the code the runs measured when they ran on a machine without the git metadata
(the device machine gets a copy of the working tree without .git).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="")
    ap.add_argument("--title", default="Grouped GEMM, bf16, H200 (TFLOP/s)")
    ap.add_argument("--value", default="tflops")
    args = ap.parse_args()
    rows, runs = [], []
    for i, f in enumerate(args.files, 1):
        d = json.loads(Path(f).read_text())
        meta = d["meta"]
        if args.commit and len(meta.get("git_commit", "")) < 40:
            meta["git_commit"] = args.commit
        runs.append({"run": i, "file": str(Path(f).name), **meta})
        env = ",".join(f"{k.replace('JAX_MOE_FFI_', '')}={v}" for k, v in sorted((meta.get("jmf_env") or {}).items()))
        for r in d["rows"]:
            rows.append({**r, "run": i, **({"env": env} if env else {})})
    first = runs[0]
    meta = {**first, "command": " ; ".join(r["command"] for r in runs), "runs": runs,
            "merged_by": "python benchmarks/merge_results.py --out " + args.out + " " +
                         " ".join(Path(f).name for f in args.files)}
    path = _common.write_results(args.out, meta, rows, args.value, args.title)
    # same-run ratios of `ours` against every other impl
    lines = ["", "## Same-run ratios (ours / peer)", "", "| run | case | pass | groups | peer | ours | peer value | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["impl"] != "ours":
            continue
        for o in rows:
            if (o["run"], o["case"], o["pass"], o["groups"]) == (r["run"], r["case"], r["pass"], r["groups"]) \
                    and o["impl"] not in ("ours", "copy") and o.get(args.value):
                lines.append(f"| {r['run']} | {r['case']} | {r['pass']} | {r['groups']} | {o['impl']} | "
                             f"{r[args.value]:.0f} | {o[args.value]:.0f} | {r[args.value] / o[args.value]:.2f} |")
        if r["groups"] == "skew":
            even = next((o for o in rows if (o["run"], o["case"], o["pass"], o["groups"], o["impl"]) ==
                         (r["run"], r["case"], r["pass"], "even", "ours")), None)
            if even:
                lines.append(f"| {r['run']} | {r['case']} | {r['pass']} | skew/even | ours (even) | "
                             f"{r[args.value]:.0f} | {even[args.value]:.0f} | {r[args.value] / even[args.value]:.2f} |")
    md = path.with_suffix(".md")
    md.write_text(md.read_text() + "\n".join(lines) + "\n")
    print(md.read_text())


if __name__ == "__main__":
    main()
