"""The gate and up products of a MoE layer (one lhs, two [G, K, N] weights) four ways, at the Qwen3-30B layer's shape.

Why: the benchmark table's `qwen3-30b-a3b gate_up` case is one GEMM with N = 1536 (gate and up concatenated), but
optimize() runs a model's separate gate and up weights as one *pair launch* of 2G problems with N = 768 each
(`grouped_matmuls_shared_lhs`; cooperative 128x256 tiles, cluster 1x1 since 768 is an odd number of 256-wide tiles).
Session 41's H100 layer profiles put that pair forward at 1051-1108 us (372-392 TFLOP/s) against 716-731 us on the
H200 in sessions 11-14; of the layer's other GEMMs only the other N = 768 one (the down dgrad, cluster 1x1) was
slow. This separates the causes on one card, in one process:

  pair    grouped_matmuls_shared_lhs(x, [w_gate, w_up])       one launch of 2G problems (the default)
  pair_interleave  the same with JAX_MOE_FFI_PAIR_ORDER=interleave: problems gate g, up g, ... (the lhs rows of a
                   group read once from HBM for both products; no faster on an H100, session 42)
  two     the same with JAX_MOE_FFI_PAIR_LAUNCH=0             two launches of G problems
  concat  grouped_matmul(x, concatenate([w_gate, w_up], -1))  one launch, N = 2N (the table's gate_up case;
                                                              the concatenation is outside the timing)
  dense   x[M, K] . w[K, 2N]                                   a dense matmul of equal FLOPs (anchor)

for group sizes `even`, `skew` (shapes.json's rule) and `routed` (the layer's router at profile_layer.py's
initialisation: top-k of x . router). `--passes fwd,fwd_bwd`; fwd_bwd is one forward, the lhs gradient and both
weight gradients of sum(gate * up). Each output is compared bitwise with the first variant's (`bitwise_first`: on the
GPU every form runs the same k-order per element, so equal bits are expected; on the CPU the concatenated form's lhs
gradient sums in another order). Writes benchmarks/results/<out>.{json,md,png}.

  python benchmarks/gate_up_pair.py [--groups even,skew,routed] [--passes fwd,fwd_bwd] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import _common
import jax_moe_ffi as jmf
from jax_moe_ffi import models


def routed_sizes(tokens: int, d: int, f: int, e: int, k: int) -> np.ndarray:
    """The group sizes of profile_layer.py's Qwen3 layer at initialisation (its PRNG keys): top-k of x . router."""
    pk, xk = jax.random.split(jax.random.PRNGKey(0))
    router = models.init_moe_params(pk, d, f, e, jnp.bfloat16)["router"]
    x = jax.random.normal(xk, (tokens, d), jnp.bfloat16)
    _, ids = jax.lax.top_k(x.astype(jnp.float32) @ router.astype(jnp.float32), k)
    return np.bincount(np.asarray(ids).ravel(), minlength=e).astype(np.int32)


# The switches each variant runs under. JAX_MOE_FFI_PAIR_LAUNCH is read when the op is traced, JAX_MOE_FFI_PAIR_ORDER
# by the CUDA handler when it runs (and again whenever XLA re-records its command buffer), so both are set before each
# variant's compile and each of its timings.
VARIANT_ENV = {"pair": {"JAX_MOE_FFI_PAIR_LAUNCH": "1", "JAX_MOE_FFI_PAIR_ORDER": "blocks"},
               "pair_interleave": {"JAX_MOE_FFI_PAIR_LAUNCH": "1", "JAX_MOE_FFI_PAIR_ORDER": "interleave"},
               "two": {"JAX_MOE_FFI_PAIR_LAUNCH": "0", "JAX_MOE_FFI_PAIR_ORDER": "blocks"},
               "concat": {}}


def variant_fn(variant: str, pass_: str):
    """A freshly jitted function of (x, weights, sizes) per variant (the pair-launch switch is read when the op is
    traced). weights: (w_gate, w_up), or for `concat` the one [G, K, 2N] tensor, concatenated before the timing."""
    def products(x, ws, s):
        if variant == "concat":
            out = jmf.grouped_matmul(x, ws[0], s)
            n = out.shape[-1] // 2
            return out[:, :n], out[:, n:]
        return tuple(jmf.grouped_matmuls_shared_lhs(x, list(ws), s))

    if pass_ == "fwd":
        return jax.jit(lambda x, ws, s: jnp.concatenate(products(x, ws, s), -1))

    def loss(x, ws, s):
        g, u = products(x, ws, s)
        return jnp.sum(g.astype(jnp.float32) * u.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1)))


def weights_for(variant: str, wg, wu) -> tuple:
    return (jnp.concatenate([wg, wu], -1),) if variant == "concat" else (wg, wu)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="even,skew,routed")
    ap.add_argument("--passes", default="fwd,fwd_bwd")
    ap.add_argument("--variants", default="pair,pair_interleave,two,concat")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=int, default=1, help="divide tokens, hidden and N by this (CPU smoke runs)")
    ap.add_argument("--out", default=f"gate_up_pair_{_common.machine_tag()}")
    args = ap.parse_args(argv)
    shapes = _common.load_shapes()
    case = next(c for c in shapes["moe_layers"] if "qwen3-30b" in c["name"])
    t, d, f, e, k = (case["tokens"] // args.scale, case["hidden"] // args.scale, case["moe_intermediate"] // args.scale,
                     case["experts"], case["top_k"])
    m = t * k
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, d)), jnp.bfloat16)
    wg, wu = (jnp.asarray(rng.standard_normal((e, d, f)) / np.sqrt(d), jnp.bfloat16) for _ in range(2))
    name = f"{case['name']} gate+up (N = {f} each)"
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/gate_up_pair.py"] + argv)
    meta["note"] = "variants alternate within one process; tflops count both products (fwd: 4MKN, fwd_bwd: 12MKN)"
    rows = []
    dense = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16))
    ms = _common.time_ms(dense, x, jnp.concatenate([wg[0], wu[0]], -1))
    rows.append({"case": name, "impl": "dense", "pass": "fwd", "groups": "even", "ms": ms,
                 "tflops": 4.0 * m * d * f / ms / 1e9, "M": m, "K": d, "N": f, "G": e})
    caller = {key: os.environ.get(key) for key in ("JAX_MOE_FFI_PAIR_LAUNCH", "JAX_MOE_FFI_PAIR_ORDER")}
    for kind in args.groups.split(","):
        sizes = routed_sizes(t, d, f, e, k) if kind == "routed" else _common.group_sizes(m, e, kind, shapes)
        s = jnp.asarray(sizes)
        for pass_ in args.passes.split(","):
            flops = (4.0 if pass_ == "fwd" else 12.0) * m * d * f
            fns = {}
            for v in args.variants.split(","):
                os.environ.update(VARIANT_ENV[v])
                fns[v] = variant_fn(v, pass_), weights_for(v, wg, wu)
                jax.block_until_ready(fns[v][0](x, fns[v][1], s))  # traced and compiled under its own switch
            want = None
            for r in range(args.rounds):
                for v, (fn, ws) in fns.items():
                    os.environ.update(VARIANT_ENV[v])
                    got = jax.tree.leaves(fn(x, ws, s))
                    if v == "concat" and pass_ == "fwd_bwd":  # d(w_cat) as d(w_gate), d(w_up)
                        got = [got[0], *jnp.split(got[1], 2, axis=-1)]
                    got = [np.asarray(o).view(np.uint16) for o in got]
                    want = got if want is None else want
                    bitwise = all(np.array_equal(a, b) for a, b in zip(got, want))
                    ms = _common.time_ms(fn, x, ws, s)
                    rows.append({"case": name, "impl": v, "pass": pass_, "groups": kind, "ms": ms,
                                 "tflops": flops / ms / 1e9, "round": r, "bitwise_first": bitwise,
                                 "M": m, "K": d, "N": f, "G": e, "max_group": int(sizes.max()),
                                 "min_group": int(sizes.min())})
                    print(f"{kind:>6} {pass_:>7} r{r} {v:>6} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s "
                          f"bitwise_first={bitwise}", flush=True)
    for key, value in caller.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    title = "Gate/up products: pair launch, interleaved pair, two launches, concatenated weights (TFLOP/s)"
    path = _common.write_results(args.out, meta, rows, "tflops", title, plot_groups=("even", "skew", "routed"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
