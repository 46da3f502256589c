"""MoE layer benchmark: the naive GShard capacity-einsum layer as written vs the same function after
`optimize(mode="exact")` (and `mode="dropless"`), forward and forward+backward (value_and_grad w.r.t. x and
the expert weights), on the `moe_layers` shapes of shapes.json.

  python benchmarks/moe_layer.py                    # GPU, bf16
  python benchmarks/moe_layer.py --cpu-scale 16     # CPU smoke run, shapes scaled down

Writes benchmarks/results/moe_layer_<machine>.{json,md,png} (or --out NAME); the XLA_FLAGS in effect are
recorded in the metadata.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi import models  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-scale", type=int, default=0)
    ap.add_argument("--cases", default="qwen3-30b-a3b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="", help="result name (default moe_layer_<machine>)")
    ap.add_argument("--impls", default="naive,ours,ours_dropless", help="comma-separated variants to time")
    args = ap.parse_args(argv)
    shapes = _common.load_shapes()
    dtype = jnp.dtype(args.dtype)
    rows = []
    for case in shapes["moe_layers"]:
        if args.cases and not any(c in case["name"] for c in args.cases.split(",")):
            continue
        t, d, f, e, k = case["tokens"], case["hidden"], case["moe_intermediate"], case["experts"], case["top_k"]
        if args.cpu_scale:
            t, d, f = t // args.cpu_scale, d // args.cpu_scale, f // args.cpu_scale
        cf = case["capacity_factor"]
        pk, xk = jax.random.split(jax.random.PRNGKey(0))
        params = models.init_moe_params(pk, d, f, e, dtype)
        x = jax.random.normal(xk, (t, d), dtype)
        naive = lambda p, x: models.capacity_moe(p, x, k, cf)
        variants = {"naive": naive, "ours": jmf.optimize(naive, mode="exact"),
                    "ours_dropless": jmf.optimize(naive, mode="dropless")}
        variants = {n: v for n, v in variants.items() if n in args.impls.split(",")}
        print(jmf.explain(naive, params, x))
        ref = jax.jit(naive)(params, x)
        routed_flops = 2.0 * 3 * t * k * d * f  # the three expert GEMMs of the routed (token, expert) pairs
        for name, fn in variants.items():
            out = jax.jit(fn)(params, x)
            err = float(jnp.linalg.norm((out - ref).astype(jnp.float32)) / jnp.linalg.norm(ref.astype(jnp.float32)))
            fwd = jax.jit(fn)

            def loss(p, x, fn=fn):
                return jnp.sum(fn(p, x).astype(jnp.float32) ** 2)

            wrt = lambda p, x: jax.value_and_grad(
                lambda w, x: loss({**p, **w}, x), (0, 1))({kk: p[kk] for kk in ("w_gate", "w_up", "w_down")}, x)
            fwd_bwd = jax.jit(wrt)
            for pname, f_ in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
                ms = _common.time_ms(f_, params, x)
                fl = routed_flops if pname == "fwd" else 3 * routed_flops
                rows.append({"case": case["name"], "impl": name, "pass": pname, "groups": "routed", "ms": ms,
                             "tflops": fl / ms / 1e9, "rel_err_vs_naive": err})
                print(f"{case['name']:>16} {name:>14} {pname:>8} {ms:9.3f} ms  model {fl / ms / 1e9:8.2f} TFLOP/s"
                      f"  rel err vs naive {err:.2e}", flush=True)
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/moe_layer.py"] + argv)
    meta["dtype"] = str(dtype)
    meta["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    path = _common.write_results(args.out or f"moe_layer_{_common.machine_tag()}", meta, rows, "tflops",
                                 "MoE layer: naive capacity einsum vs optimize() (model TFLOP/s)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
