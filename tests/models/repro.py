"""Minimal plain-JAX reproducers of what the rewrite pass fails on in the third-party model group.

Each function is a self-contained copy (jax + numpy only) of the failing pattern; `python tests/models/repro.py`
prints what `explain`/`optimize` make of each. The tests that hit these failures were xfailed with the same
reason (tests/models/test_maxtext.py); both are fixed now and kept as regression reproducers.

1. `maxtext_inference_capacity`: MaxText RoutedMoE.dense_matmul with capacity_factor > 0 in
   model_call_mode="inference" (generate_masks_subgroup): dispatch/combine masks laid out [B, N, S, E, C] with
   N = context partitions (1 on one device), einsums 'BNSM,BNSEC -> EBNCM', 'EBNCM,EMH -> EBNCH',
   'EBNCH,EHM -> EBNCM', 'EBNCM,BNSEC -> BNSM'; combine weights are the full softmax times the kept-choice mask.
   No site; near-misses (jax_moe_ffi at the time of writing):
     C=3 (capacity_factor=1.0): "value float32[2,1,12,8,3] is used with inconsistent token/expert axes
       ([T0,_,T1,E,_] vs [T0,_,_,E,_])", blocked at the `combine_mask` line of generate_masks_subgroup, plus
       "expert-stacked contraction whose reduction over experts is not provably weighted by a top_k-sparse gate"
       on the dispatch, wi_0, wi_1 and wo einsums;
     C=1 (capacity_factor=0.5): "the token-side operand of an expert GEMM has free feature axes" (blocked at the
       wi_0 einsum) plus the same four "not provably weighted" near-misses.
   `capacity_with_size1_group_axis` isolates the cause: the training-layout masks of MaxText's generate_masks
   ([B, S, E, C], which the pass rewrites) with a size-1 axis inserted after B ([B, 1, S, E, C], as the
   inference path has) are not rewritten ("the token-side operand of an expert GEMM has free feature axes");
   the same function without the size-1 axis is rewritten and exact. Whether the combine weights are the full
   softmax or the top-k weights makes no difference. FIXED (a size-1 axis is now a free axis of extent 1
   throughout: match._roles gives the slot index's N axis role "1" (read at 0), match._plan_dot and the combine
   peephole accept uncontracted / batched size-1 unlabeled axes, emit keeps them as size-1 axes); both are
   rewritten and exact, and test_dense_matmul_capacity_inference_mode checks them fully.

2. `scan_over_moe_layers`: on jax >= 0.11 (the version MaxText 0.2.5 needs; jax 0.11.2 here) the `scan`
   primitive's params are {reverse, length, jaxpr, ft_in, ft_out, unroll} -- no `num_consts` / `num_carry`.
   `explain` found the site inside the scan, but running `optimize(fn)` raised KeyError: 'num_consts' in
   the scan case of jax_moe_ffi/rewrite/interp.py. FIXED (ir.scan_split reads `ft_in` on jax >= 0.11; the
   rolled-loop reading in ir._unroll_scan still read num_consts until session 33);
   kept as a regression reproducer, and test_capacity_path_under_jit_scan_and_remat now checks it fully.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

E, K, D, F = 8, 2, 16, 32


def init_params(key, stacked_layers=None):
    k = jax.random.split(key, 4)
    lead = () if stacked_layers is None else (stacked_layers,)
    return {"gate": jax.random.normal(k[0], lead + (D, E)),
            "wi_0": jax.random.normal(k[1], lead + (E, D, F)) / 4,
            "wi_1": jax.random.normal(k[2], lead + (E, D, F)) / 4,
            "wo": jax.random.normal(k[3], lead + (E, F, D)) / 6}


def maxtext_inference_capacity(p, x, capacity_factor=1.0, cp=1):
    """1. MaxText RoutedMoE.dense_matmul, model_call_mode='inference', capacity_factor > 0 (plain-JAX copy of
    generate_masks_subgroup and the BNSEC einsums). x: [B, S, D]."""
    B, S, _ = x.shape
    logits = jnp.einsum("bsd,de->bse", x, p["gate"])
    _, top_i = jax.lax.top_k(logits, K)
    probs = jax.nn.softmax(logits, axis=-1)  # the inference path combines with the full softmax
    sub = S // cp
    top_i = top_i.reshape(B, cp, sub, K)
    C = int(max(math.ceil(sub * K / E) * capacity_factor, capacity_factor))
    em = jax.nn.one_hot(top_i, E, dtype=jnp.int32)  # B N S K E
    emf = em.reshape(B, cp, sub * K, E)
    cnt_f = jnp.cumsum(emf, axis=2)
    cnt = cnt_f.reshape(B, cp, sub, K, E)
    kept = jnp.sum(em * (cnt <= C), axis=3)  # B N S E
    probs = probs.reshape(B, cp, sub, E) * kept
    pos = jnp.sum((emf * cnt_f).reshape(B, cp, sub, K, E), axis=3) * kept
    combine = (probs[..., None] * jax.nn.one_hot(pos, C + 1, dtype=jnp.int32))[..., 1:]  # B N S E C
    dispatch = combine.astype(bool)
    xin = x.reshape(B, cp, sub, D)
    d = jnp.einsum("BNSM,BNSEC -> EBNCM", xin, dispatch)
    h0 = jnp.einsum("EBNCM,EMH -> EBNCH", d, p["wi_0"])
    h1 = jnp.einsum("EBNCM,EMH -> EBNCH", d, p["wi_1"])
    o = jnp.einsum("EBNCH,EHM -> EBNCM", jax.nn.silu(h0) * h1, p["wo"])
    y = jnp.einsum("EBNCM,BNSEC -> BNSM", o, combine)
    return y.reshape(B, S, D)


def capacity_with_size1_group_axis(p, x, capacity_factor=1.0, size1_axis=True):
    """1, minimal: MaxText's training-layout capacity masks (generate_masks, top-k softmax weights), with a
    size-1 axis after the batch axis when size1_axis (not rewritten) or without it (rewritten, exact)."""
    B, S, _ = x.shape
    logits = jnp.einsum("bsd,de->bse", x, p["gate"])
    top_w, top_i = jax.lax.top_k(logits, K)
    w = jax.nn.softmax(top_w, axis=-1)
    gate = jnp.zeros((B, S, E)).at[jnp.arange(B)[:, None, None], jnp.arange(S)[:, None], top_i].set(w)
    C = int(max(math.ceil(S * K / E) * capacity_factor, capacity_factor))
    em = jax.nn.one_hot(top_i, E, dtype=jnp.int32)
    emf = em.reshape(B, S * K, E)
    cnt_f = jnp.cumsum(emf, axis=1)
    kept = jnp.sum(em * (cnt_f.reshape(B, S, K, E) <= C), axis=2)
    pos = jnp.sum((emf * cnt_f).reshape(B, S, K, E), axis=2) * kept
    combine = ((gate * kept)[..., None] * jax.nn.one_hot(pos, C + 1, dtype=jnp.int32))[..., 1:]  # B S E C
    dispatch = combine.astype(bool)
    if size1_axis:
        x, dispatch, combine = x[:, None], dispatch[:, None], combine[:, None]
        d = jnp.einsum("BNSM,BNSEC -> EBNCM", x, dispatch)
        h = jax.nn.silu(jnp.einsum("EBNCM,EMH -> EBNCH", d, p["wi_0"])) * \
            jnp.einsum("EBNCM,EMH -> EBNCH", d, p["wi_1"])
        o = jnp.einsum("EBNCH,EHM -> EBNCM", h, p["wo"])
        return jnp.einsum("EBNCM,BNSEC -> BNSM", o, combine).reshape(B, S, D)
    d = jnp.einsum("BSM,BSEC -> EBCM", x, dispatch)
    h = jax.nn.silu(jnp.einsum("EBCM,EMH -> EBCH", d, p["wi_0"])) * jnp.einsum("EBCM,EMH -> EBCH", d, p["wi_1"])
    o = jnp.einsum("EBCH,EHM -> EBCM", h, p["wo"])
    return jnp.einsum("EBCM,BSEC -> BSM", o, combine)


def _dense_moe(p, x):
    """Mixtral-style all-experts layer weighted by a top-k gate. x: [T, D]."""
    logits = x @ p["gate"]
    w, idx = jax.lax.top_k(logits, K)
    w = jax.nn.softmax(w, axis=-1)
    gate = jnp.sum(jax.nn.one_hot(idx, E) * w[..., None], axis=1)  # T E
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, p["wi_0"])) * jnp.einsum("td,edf->tef", x, p["wi_1"])
    y = jnp.einsum("tef,efd->ted", h, p["wo"])
    return jnp.einsum("ted,te->td", y, gate)


def scan_over_moe_layers(stacked, x):
    """2. Layers stacked on a leading axis and run with lax.scan (as MaxText's and Flax's scanned decoders do).
    On jax >= 0.11: optimize(...) raises KeyError: 'num_consts'."""
    def body(h, p):
        return h + _dense_moe(p, h), None
    h, _ = jax.lax.scan(body, x, stacked)
    return h


def main():
    from functools import partial

    import numpy as np

    import jax_moe_ffi as jmf

    def rel(a, b):
        return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))

    print("jax", jax.__version__)
    p = init_params(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 12, D))
    cases = [(f"maxtext_inference_capacity cf={cf}", partial(maxtext_inference_capacity, capacity_factor=cf))
             for cf in (1.0, 0.5)]
    cases += [(f"capacity_with_size1_group_axis size1_axis={a}", partial(capacity_with_size1_group_axis,
                                                                         size1_axis=a)) for a in (True, False)]
    for name, f in cases:
        r = jmf.explain(f, p, x)
        res = f"rewritten, rel err {rel(jmf.optimize(f)(p, x), f(p, x)):.1e}" if r.sites else \
            f"NOT rewritten: {sorted({m.reason for m in r.misses})}"
        print(f"{name}: {len(r.sites)} site(s); {res}")
    ps = init_params(jax.random.key(2), stacked_layers=2)
    xt = jax.random.normal(jax.random.key(3), (24, D))
    r = jmf.explain(scan_over_moe_layers, ps, xt)
    try:
        y = jmf.optimize(scan_over_moe_layers)(ps, xt)
        res = f"ran, rel err {rel(y, scan_over_moe_layers(ps, xt)):.1e}"
    except Exception as e:  # noqa: BLE001 - a reproducer reports whatever it hits
        res = f"optimize raised {type(e).__name__}: {e}"
    print(f"scan_over_moe_layers: {len(r.sites)} site(s) at {[s.path for s in r.sites]}; {res}")


if __name__ == "__main__":
    main()
