"""Do the streams overlap? Per-stream GPU busy time of the runtime benchmark's model (benchmarks/runtime.py:
deepseek-v3-ep8-local layers with a shared expert, fwd+bwd) with optimize(streams=False) and streams=True, from a
JAX profiler trace: for each stream the busy time (union of its kernels), the time two or more streams are
busy at once (the overlap streams can buy), and the step span.

  python benchmarks/profile_streams.py [--layers 4] [--steps 3] [--no-scan --out NAME]

Writes benchmarks/results/profile_streams_<machine>.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import runtime as runtime_bench  # noqa: E402  (benchmarks/runtime.py)

from jax_moe_ffi import runtime  # noqa: E402


def union_us(intervals):
    total, end = 0.0, None
    start = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total / 1e3


def stream_times(fn, args, steps):
    per_stream = {name: [(s, e) for s, e, _ in evs] for name, evs in _common.gpu_stream_events(fn, args, steps).items()}
    everything = [iv for ivs in per_stream.values() for iv in ivs]
    busy = {name: union_us(ivs) / steps for name, ivs in per_stream.items()}
    any_busy = union_us(everything) / steps
    span = (max(e for _, e in everything) - min(s for s, _ in everything)) / 1e3 / steps
    return {"streams": busy, "busy_any_us": any_busy, "overlap_us": sum(busy.values()) - any_busy, "span_us": span}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--case", default="deepseek-v3-ep8-local")
    ap.add_argument("--no-scan", action="store_true", help="layers unrolled in Python instead of lax.scan")
    ap.add_argument("--out", default="", help="result name (default profile_streams_<machine>)")
    args = ap.parse_args(argv)
    flags = runtime.apply_xla_flags()
    import jax
    variant, stacked, x = runtime_bench.build_model(args.case, args.layers, no_scan=args.no_scan)
    rows = []
    for name, streams in (("ours", False), ("ours_streams", True)):
        step = jax.jit(jax.value_and_grad(variant(streams, None), (0, 1)))
        r = stream_times(step, (stacked, x), args.steps)
        print(f"{name:>13}: span {r['span_us'] / 1e3:8.2f} ms, busy {r['busy_any_us'] / 1e3:8.2f} ms, "
              f"overlap {r['overlap_us'] / 1e3:7.3f} ms; per stream (ms): "
              + ", ".join(f"{k}: {v / 1e3:.2f}" for k, v in r["streams"].items()), flush=True)
        rows.append({"impl": name, **r})
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/profile_streams.py"] + argv)
    meta["xla_flags"] = flags
    meta["scan"] = not args.no_scan
    path = _common.RESULTS / f"{args.out or 'profile_streams_' + _common.machine_tag()}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
