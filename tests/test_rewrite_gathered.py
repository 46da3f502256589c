"""Family (6): expert weights gathered per (token, choice) -- `w[ids]`, `jnp.take(w, ids, axis=0)` -- and
contracted row by row (EasyDeL's DENSE_MOE path, models.gathered_weights_moe). The pass runs each such dot as a
grouped GEMM of the rows sorted by expert and never makes the [T, k, K, N] weight copy. Checked against the
model itself on fresh random inputs: forward and gradients, jit / scan / checkpoint, bf16, clamped and unproven
ids, and layouts it leaves alone (with the reason)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import jax_moe_ffi as jmf
from jax_moe_ffi import models as M

from helpers import cpu_lowered_text, rel, tree_rel

GG = "jax_moe_ffi_grouped_gemm"


def gathered_layer(take="index", rows="broadcast", down="after", transposed=False, bias=False, shift=0):
    """A SwiGLU MoE layer that gathers each (token, choice)'s expert weights.
    take: "index" (w[ids]: promise_in_bounds) | "take" (jnp.take: fill) | "clip" (jnp.take, mode="clip");
    rows: "broadcast" (x[:, None, :] against [T, k, D, F]) | "token" ('td,tkdf->tkf': k a free axis of the weights);
    down: "after" (per-choice outputs, then the gate) | "inside" ('tkf,tkfd,tk->td': choices summed in the einsum);
    transposed: w_down stored [E, D, F] and contracted on its last axis; bias: per-expert biases gathered too;
    shift: ids + shift (out of range for shift > 0)."""
    def gather(w, ids):
        return w[ids] if take == "index" else jnp.take(w, ids, axis=0, mode="clip" if take == "clip" else None)

    def layer(p, x):
        weights, ids, _ = M._router(p, x, p["k"].shape[0])
        ids = ids + shift
        wd = p["w_down_t"] if transposed else p["w_down"]
        if rows == "broadcast":
            a = jnp.einsum("tkd,tkdf->tkf", x[:, None, :], gather(p["w_gate"], ids))
            b = jnp.einsum("tkd,tkdf->tkf", x[:, None, :], gather(p["w_up"], ids))
        else:
            a = jnp.einsum("td,tkdf->tkf", x, gather(p["w_gate"], ids))
            b = jnp.einsum("td,tkdf->tkf", x, gather(p["w_up"], ids))
        if bias:
            a = a + gather(p["b_gate"], ids)
        h = jax.nn.silu(a) * b
        spec = "tkf,tkdf" if transposed else "tkf,tkfd"
        if down == "inside":
            return jnp.einsum(f"{spec},tk->td", h, gather(wd, ids), weights.astype(x.dtype))
        o = jnp.einsum(f"{spec}->tkd", h, gather(wd, ids))
        return jnp.sum(o * weights.astype(x.dtype)[..., None], axis=1)
    return layer


def make_params(seed, t, d, f, e, k, dtype=jnp.float32):
    key = jax.random.PRNGKey(seed)
    p = M.init_moe_params(key, d, f, e, dtype)
    p["w_down_t"] = jnp.swapaxes(p["w_down"], 1, 2)
    p["b_gate"] = jax.random.normal(jax.random.fold_in(key, 7), (e, f), dtype)
    p["k"] = jnp.zeros((k,))  # carries k as a shape (the layer reads p["k"].shape[0])
    x = jax.random.normal(jax.random.fold_in(key, 9), (t, d), dtype)
    return p, x


def _eqns(jaxpr):
    """Every equation of a jaxpr, nested calls included once per call site."""
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                    yield from _eqns(getattr(sub, "jaxpr", sub))


def weight_copies(fn, *args):
    """gathers / scatter-adds with a rank-4 float output (a per-(token, choice) weight copy, or the gradient of
    one) in the jaxpr of fn's gradient, which holds the forward too."""
    closed = jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(fn(*a) ** 2)))(*args)
    return sum(1 for e in _eqns(closed.jaxpr) if e.primitive.name in ("gather", "scatter-add", "scatter_add")
               and e.outvars[0].aval.ndim == 4 and jnp.issubdtype(e.outvars[0].aval.dtype, jnp.floating))


@settings(deadline=None, max_examples=12)
@given(st.integers(1, 40), st.integers(1, 4), st.integers(1, 9), st.integers(1, 20), st.integers(1, 20),
       st.sampled_from(["index", "take", "clip"]), st.sampled_from(["broadcast", "token"]),
       st.sampled_from(["after", "inside"]), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
def test_gathered_layers_match_the_model(t, k, e, d, f, take, rows, down, transposed, bias, seed):
    k = min(k, e)
    p, x = make_params(seed % 2**16, t, d, f, e, k)
    fn = gathered_layer(take, rows, down, transposed, bias)
    r = jmf.explain(fn, p, x)
    assert [s.family for s in r.sites] == ["gathered"] * 3 and not r.misses, f"seed={seed}\n{r}"
    fast = jmf.optimize(fn)
    assert rel(jax.jit(fast)(p, x), fn(p, x)) < 1e-5, f"seed={seed}"
    loss = lambda g: (lambda p, x: jnp.sum(jnp.sin(g(p, x))))
    g1 = jax.jit(jax.grad(loss(fast), (0, 1)))(p, x)
    g0 = jax.grad(loss(fn), (0, 1))(p, x)
    # (a leaf that is exactly zero -- the router's with k = 1, whose renormalised gate is 1 -- is compared on
    # the scale of the whole gradient)
    floor = 1e-2 * float(np.sqrt(sum(np.sum(np.square(np.asarray(v, np.float64))) for v in jax.tree.leaves(g0))))
    names = ["w_gate", "w_up", "w_down_t" if transposed else "w_down", "router"] + (["b_gate"] if bias else [])
    for a, b, name in [(g1[0][n], g0[0][n], n) for n in names] + [(g1[1], g0[1], "x")]:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.linalg.norm(a - b) <= 1e-5 * max(np.linalg.norm(b), floor), (name, seed)
    assert weight_copies(fn, p, x) >= 3 and weight_copies(fast, p, x) == 0
    assert len(re.findall(rf"target_name={GG}(?![_a-z])", str(jax.make_jaxpr(fast)(p, x)))) == 3


def test_package_model_is_rewritten_and_routes_once(monkeypatch):
    from jax_moe_ffi.ops import grouped_gemm as G
    shared = []
    real = G.grouped_matmuls_shared_lhs
    monkeypatch.setattr(G, "grouped_matmuls_shared_lhs", lambda lhs, rhss, *a, **k: shared.append(len(rhss)) or
                        real(lhs, rhss, *a, **k))
    p, x = make_params(1, 24, 16, 32, 8, 2)
    r = jmf.explain(M.gathered_weights_moe, p, x)
    assert [s.family for s in r.sites] == ["gathered"] * 3 and not r.misses, str(r)
    assert all("weight copy" in s.notes[0] and "models.py" in s.source for s in r.sites)
    fast = jmf.optimize(M.gathered_weights_moe)
    assert rel(fast(p, x), M.gathered_weights_moe(p, x)) < 1e-5
    assert shared == [2]  # the gate and up projections of the same rows: one shared-lhs call
    g1 = jax.grad(lambda p: jnp.sum(fast(p, x) ** 2))(p)
    g0 = jax.grad(lambda p: jnp.sum(M.gathered_weights_moe(p, x) ** 2))(p)
    assert tree_rel(g1, g0) < 1e-5
    # (the CPU lowering on any backend: on a GPU the program also holds the CUDA branch of each op)
    text = cpu_lowered_text(fast, p, x)
    # one routing plan for the three gathers of one id array; x dispatched once for the gate and up GEMMs
    assert text.count("custom_call @jax_moe_ffi_dispatch_plan(") == 1, text
    assert text.count("custom_call @jax_moe_ffi_dispatch(") == 2, text  # x once, h once


def test_inside_scan_over_layers_with_checkpoint():
    layers, t, d, f, e, k = 3, 20, 8, 16, 6, 2
    p, x = make_params(2, t, d, f, e, k)
    stack = {n: jnp.stack([p[n] * (1 + 0.1 * i) for i in range(layers)]) for n in ("router", "w_gate", "w_up",
                                                                                    "w_down")}
    layer = gathered_layer("index", "token", "after")

    def model(stack, x):
        def body(h, w):
            return h + layer(dict(w, k=p["k"]), h), None
        return jax.lax.scan(jax.checkpoint(body), x, stack)[0]

    fast = jmf.optimize(model)
    assert rel(jax.jit(fast)(stack, x), model(stack, x)) < 1e-5
    g1 = jax.jit(jax.grad(lambda s, x: jnp.sum(fast(s, x) ** 2)))(stack, x)
    g0 = jax.grad(lambda s, x: jnp.sum(model(s, x) ** 2))(stack, x)
    assert tree_rel(g1, g0) < 1e-5
    r = jmf.explain(model, stack, x)
    assert len(r.sites) == 3 and all(s.path == "scan/remat/" for s in r.sites), str(r)


def test_bf16_within_rounding_of_the_model():
    p, x = make_params(3, 64, 32, 48, 8, 2, jnp.bfloat16)
    fn = gathered_layer("take", "broadcast", "inside")
    want = fn(jax.tree.map(lambda v: v.astype(jnp.float32), p), x.astype(jnp.float32))
    got = jax.jit(jmf.optimize(fn))(p, x)
    assert got.dtype == jnp.bfloat16
    # as close to the float32 answer as the model's own bf16 program is (both round the same products)
    assert rel(got, want) < 2 * rel(fn(p, x), want) + 1e-3


def test_out_of_range_ids_are_clamped_as_the_gather_clamps():
    p, x = make_params(4, 30, 8, 12, 5, 2)
    fn = gathered_layer("clip", "broadcast", "after", shift=3)  # ids + 3 reaches past E - 1: clamped
    r = jmf.explain(fn, p, x)
    assert len(r.sites) == 3 and all("clamped" in s.notes[0] for s in r.sites), str(r)
    fast = jmf.optimize(fn)
    assert rel(fast(p, x), fn(p, x)) < 1e-5
    g1 = jax.grad(lambda p: jnp.sum(fast(p, x) ** 2))(p)
    g0 = jax.grad(lambda p: jnp.sum(fn(p, x) ** 2))(p)
    assert tree_rel(g1, g0) < 1e-5


@pytest.mark.parametrize("take", ["take", "index"])
def test_unproven_ids_stay_as_written(take):
    """ids + 3 may pass E - 1: jnp.take fills those rows with NaN, and w[ids] (promise_in_bounds) clamps them
    in the forward but drops them from the weight gradient. Neither is what the swap would do: left alone."""
    p, x = make_params(5, 30, 8, 12, 5, 2)
    fn = gathered_layer(take, "broadcast", "after", shift=3)
    r = jmf.explain(fn, p, x)
    assert not r.sites and r.misses, str(r)  # (one near-miss per source line: the three gathers share one)
    assert all("not proven inside [0, 5)" in m.reason for m in r.misses), str(r)
    with pytest.warns(RuntimeWarning, match="no MoE site"):
        y = jmf.optimize(fn)(p, x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(fn(p, x)))


def test_weights_contracted_on_two_axes_stay_as_written():
    """A weight gathered per (token, choice) whose dot contracts both of its matrix axes (a scalar per row) is
    not a row-times-matrix product: left alone, with the reason."""
    p, x = make_params(6, 16, 8, 8, 4, 2)

    def fn(p, x):
        weights, ids, _ = M._router(p, x, 2)
        xx = x[:, None, :, None] * x[:, None, None, :]  # [T, 1, D, D]
        s = jnp.einsum("tkde,tkde->tk", jnp.broadcast_to(xx, (16, 2, 8, 8)), p["w_gate"][ids])
        return jnp.sum(s * weights, axis=1)

    r = jmf.explain(fn, p, x)
    assert not r.sites and any("exactly one axis" in m.reason for m in r.misses), str(r)


@settings(deadline=None, max_examples=25)
@given(st.integers(2, 9), st.integers(-6, 6), st.integers(-4, 4), st.integers(0, 12),
       st.sampled_from(["shift", "clip", "clamp_by_ids", "normalised", "max_min"]), st.integers(0, 2**31 - 1))
@example(9, -6, 0, 12, "clamp_by_ids", 0)  # x below a varying lower bound: the bound's top matters
def test_id_range_bounds_hold_on_random_scores(e, s, lo, hi, form, seed):
    """gathered.int_range (what decides whether ids are proven inside [0, E)) bounds the values the program
    really computes, on random scores: a bound that is too tight would let an out-of-range id be swapped."""
    from jax_moe_ffi.rewrite import gathered as GD
    from jax_moe_ffi.rewrite.ir import program_from_closed

    def f(scores):
        ids = jax.lax.top_k(scores, 2)[1]
        if form == "shift":
            return ids + s
        if form == "clip":
            return jnp.clip(ids + s, lo, lo + hi)
        if form == "clamp_by_ids":  # the lower bound itself varies with the other choice column
            return jax.lax.clamp(ids[:, 1:] + lo, ids[:, :1] + s, jnp.int32(hi))
        if form == "normalised":  # jnp's negative-index normalisation of ids shifted by s
            i = ids + s
            return jnp.where(i < 0, i + e, i)
        return jnp.maximum(jnp.minimum(ids + s, hi), lo)

    scores = jax.random.normal(jax.random.PRNGKey(seed % 2**16), (64, e))
    prog = program_from_closed(jax.make_jaxpr(f)(scores))
    r = GD.int_range(prog.outvars[0], prog)
    assert r is not None, form
    vals = np.asarray(f(scores))
    assert r[0] <= vals.min() and vals.max() <= r[1], (form, r, vals.min(), vals.max())


@pytest.mark.gpu
def test_gpu_bf16_gathered_layer_runs_the_cuda_kernels():
    """On the H200: the gathered-weights layer in bf16 through optimize runs the CUDA grouped GEMM, with no
    per-(token, choice) weight copy in the compiled program, within bf16 rounding of the float32 answer."""
    p, x = make_params(7, 2048, 512, 256, 16, 2, jnp.bfloat16)
    fn = gathered_layer("take", "broadcast", "after")
    fast = jax.jit(jmf.optimize(fn))
    hlo = fast.lower(p, x).compile().as_text()
    assert GG in hlo and "2048,2,512,256" not in hlo.replace("x", ",")
    want = fn(jax.tree.map(lambda v: v.astype(jnp.float32), p), x.astype(jnp.float32))
    assert rel(fast(p, x), want) < 2 * rel(jax.jit(fn)(p, x), want) + 1e-3
