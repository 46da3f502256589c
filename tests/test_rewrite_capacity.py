"""Exact mode's capacity shortcut (rewrite/capacity.py): the model's running count is replaced by the plan's
only when it is the GShard token-major rule; other priority orders and per-group counts keep the model's own."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax._src.interpreters import partial_eval as pe

import jax_moe_ffi
from jax_moe_ffi import models as M
from jax_moe_ffi.rewrite import capacity as CAP


def _live_cumsums(fn, *args):
    """cumsum equations that survive dead-code elimination in fn's jaxpr (what XLA would compute)."""
    jp = jax.make_jaxpr(fn)(*args)
    live, _ = pe.dce_jaxpr(jp.jaxpr, [True] * len(jp.jaxpr.outvars))
    out = []

    def walk(j):
        for e in j.eqns:
            if e.primitive.name == "cumsum":
                out.append(e.outvars[0].aval.shape)
            for p in e.params.values():
                sub = getattr(p, "jaxpr", p)
                if hasattr(sub, "eqns"):
                    walk(sub)
    walk(live)
    return out


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@settings(max_examples=30, deadline=None)
@given(t=st.integers(1, 40), k=st.integers(1, 4), e=st.integers(1, 9), c=st.integers(0, 12), seed=st.integers(0, 99))
def test_gshard_slots_matches_a_loop(t, k, e, c, seed):
    ids = np.random.default_rng(seed).integers(-2, e + 2, (t, k))  # includes out-of-range ids
    kept, slot = CAP.gshard_slots(ids, e, c)
    seen = {}
    for p, v in enumerate(ids.reshape(-1)):
        if 0 <= v < e:
            assert slot.reshape(-1)[p] == seen.get(v, 0)
            assert kept.reshape(-1)[p] == (seen.get(v, 0) < c)
            seen[v] = seen.get(v, 0) + 1
        else:
            assert not kept.reshape(-1)[p]


@pytest.mark.parametrize("t, e, k, cf", [(64, 8, 2, 1.25), (96, 6, 3, 0.5), (40, 4, 1, 2.0)])
def test_token_major_capacity_uses_the_plan(t, e, k, cf):
    rng = np.random.default_rng()
    params = M.init_moe_params(jax.random.PRNGKey(int(rng.integers(1 << 30))), 16, 8, e)
    x = jnp.asarray(rng.standard_normal((t, 16)), jnp.float32)
    naive = lambda p, x: M.capacity_moe(p, x, k, cf)
    opt = jax_moe_ffi.optimize(naive, mode="exact")
    assert _live_cumsums(naive, params, x), "the naive layer must compute its running count"
    big = [s for s in _live_cumsums(opt, params, x) if int(np.prod(s)) >= t * k]
    assert big == [], f"the model's [T*k, E] running count is still computed: {big}"
    assert _rel(jax.jit(opt)(params, x), naive(params, x)) <= 1e-5
    notes = [n for site in jax_moe_ffi.explain(naive, params, x).sites for n in site.notes]
    assert any("is the GShard rule" in n for n in notes), notes
    hlo = jax.jit(opt).lower(params, x).compile().as_text()
    assert hlo.count('custom_call_target="jax_moe_ffi_dispatch_plan"') == 1  # one plan gives slots and drops
    g_opt = jax.grad(lambda p: jnp.sum(opt(p, x) ** 2))(params)
    g_ref = jax.grad(lambda p: jnp.sum(naive(p, x) ** 2))(params)
    scale = max(np.linalg.norm(np.asarray(g_ref[n])) for n in g_ref)
    for name in ("w_gate", "w_up", "w_down", "router"):
        # relative to the largest gradient: with k=1 the router's own gradient is ~0 (cancellation noise)
        diff = np.linalg.norm(np.asarray(g_opt[name], np.float64) - np.asarray(g_ref[name], np.float64))
        assert diff <= 1e-4 * scale, name


@pytest.mark.parametrize("variant", ["choice_major", "per_group"])
def test_other_capacity_rules_keep_the_models_count(variant):
    """Choice-major priority and per-group counts are not the plan's rule: the probe check must refuse
    the shortcut, and exact mode must still reproduce the model (drops included)."""
    rng = np.random.default_rng()
    e, k = 6, 2
    params = M.init_moe_params(jax.random.PRNGKey(int(rng.integers(1 << 30))), 16, 8, e)
    if variant == "choice_major":
        x = jnp.asarray(rng.standard_normal((2, 24, 16)), jnp.float32)
        naive = lambda p, x: M.capacity_moe_bsec(p, x, k, 0.75, priority="choice")
    else:
        x = jnp.asarray(rng.standard_normal((48, 16)), jnp.float32)
        naive = lambda p, x: M.capacity_moe_grouped(p, x, k, num_groups=2, capacity_factor=0.75)
    opt = jax_moe_ffi.optimize(naive, mode="exact")
    assert any(int(np.prod(s)) >= 48 * k for s in _live_cumsums(opt, params, x))
    assert _rel(jax.jit(opt)(params, x), naive(params, x)) <= 1e-5
    notes = [n for site in jax_moe_ffi.explain(naive, params, x).sites for n in site.notes]
    assert any("computed as the model computes it" in n for n in notes), notes


@settings(max_examples=3, deadline=None)
@given(t=st.integers(8, 96), e=st.sampled_from([4, 8]), k=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 31 - 1))
def test_capacity_layer_with_aux_losses_on_the_same_router_tensors(t, e, k, seed):
    """The Switch balancing loss and a router z-loss read the mask, probabilities and logits the dispatch
    uses: the site is still rewritten, exactly (outputs, the losses and every gradient)."""
    p = M.init_moe_params(jax.random.PRNGKey(seed), 32, 16, e, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(seed + 1), (t, 32), jnp.float32)
    fn = lambda p, x: M.capacity_moe_aux_losses(p, x, k)
    rep = jax_moe_ffi.explain(fn, p, x)
    assert len(rep.sites) == 1 and not rep.misses, rep
    fast = jax_moe_ffi.optimize(fn, mode="exact")
    (y0, a0), (y1, a1) = fn(p, x), fast(p, x)
    assert _rel(y1, y0) <= 1e-5 and _rel(a1, a0) <= 1e-6
    def loss(f):
        def total(p, x):
            y, aux = f(p, x)
            return jnp.sum(jnp.sin(y)) + aux
        return jax.jit(jax.grad(total, (0, 1)))

    flat = lambda g: np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(g)])
    assert _rel(flat(loss(fast)(p, x)), flat(loss(fn)(p, x))) <= 1e-5  # f32 rounding: as the other grad tests
