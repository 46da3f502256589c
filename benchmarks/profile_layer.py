"""Where the MoE layer's time goes: per-kernel GPU time of the optimized Qwen3-30B-A3B-shaped layer
(forward and forward+backward), from a JAX profiler trace (CUPTI; nsys is not on the H200 image).

  python benchmarks/profile_layer.py [--impl ours|naive] [--steps 10]

Prints the kernels sorted by total time per call, the idle time on the stream before each (where launch
gaps sit), and writes benchmarks/results/profile_layer_<machine>.json (rows: pass, kernel, us_per_call,
share, idle_before_us).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi import models  # noqa: E402


def kernel_times(fn, args, steps: int) -> tuple[dict[str, float], dict[str, float], float]:
    """Per call: device time (us) per kernel name; idle time (us) on the stream before each kernel name
    (the gap after the previous kernel ended, within a call); and the span (us) from the first kernel's
    start to the last one's end, averaged over `steps` calls run back to back."""
    total, idle = collections.Counter(), collections.Counter()
    events = []
    for name, evs in _common.gpu_stream_events(fn, args, steps).items():
        print(f"profile line {name}")
        for start, end, kernel in evs:
            total[kernel] += (end - start) / 1e3
            events.append((start, end, kernel))
    events.sort()
    span = (events[-1][1] - events[0][0]) / 1e3 if events else 0.0
    for (s0, e0, _), (s1, _, n1) in zip(events, events[1:]):
        gap = (s1 - e0) / 1e3
        if gap > 0:  # one stream: consecutive kernels; gaps between calls are counted too (host side)
            idle[n1] += gap
    scale = 1.0 / steps
    return ({k: v * scale for k, v in total.items()}, {k: v * scale for k, v in idle.items()}, span * scale)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="ours", choices=("ours", "ours_dropless", "naive"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cpu-scale", type=int, default=0)
    args = ap.parse_args(argv)
    case = next(c for c in _common.load_shapes()["moe_layers"] if "qwen3-30b" in c["name"])
    t, d, f, e, k = case["tokens"], case["hidden"], case["moe_intermediate"], case["experts"], case["top_k"]
    if args.cpu_scale:
        t, d, f = t // args.cpu_scale, d // args.cpu_scale, f // args.cpu_scale
    cf = case["capacity_factor"]
    pk, xk = jax.random.split(jax.random.PRNGKey(0))
    params = models.init_moe_params(pk, d, f, e, jnp.bfloat16)
    x = jax.random.normal(xk, (t, d), jnp.bfloat16)
    naive = lambda p, x: models.capacity_moe(p, x, k, cf)
    fn = {"naive": naive, "ours": jmf.optimize(naive, mode="exact"),
          "ours_dropless": jmf.optimize(naive, mode="dropless")}[args.impl]

    def loss(p, x):
        return jnp.sum(fn(p, x).astype(jnp.float32) ** 2)

    passes = {"fwd": jax.jit(fn), "fwd_bwd": jax.jit(jax.value_and_grad(loss, (0, 1)))}
    rows = []
    for pname, f_ in passes.items():
        times, idle, span = kernel_times(f_, (params, x), args.steps)
        whole = sum(times.values())
        print(f"\n== {args.impl} {pname}: {whole:.1f} us of kernels per call ({len(times)} kernels), "
              f"{span:.1f} us span per call, {sum(idle.values()):.1f} us idle on the stream")
        for name, us in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{us:9.1f} us {100 * us / whole:5.1f}%  idle before {idle.get(name, 0.0):7.1f} us  {name[:100]}")
            rows.append({"impl": args.impl, "pass": pname, "kernel": name, "us_per_call": us,
                         "share": us / whole, "idle_before_us": idle.get(name, 0.0)})
        print("largest idle gaps before:", ", ".join(f"{n[:40]} {us:.1f} us" for n, us in
                                                   sorted(idle.items(), key=lambda kv: -kv[1])[:8]))
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/profile_layer.py"] + argv)
    path = _common.RESULTS / f"profile_layer_{_common.machine_tag()}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
