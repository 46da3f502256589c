"""One all-experts tensor read once per choice: `sum_j w_j * einsum('te,ted->td', one_hot(ids[:, j]), y)`,
`w[:, j] * y[t, ids[:, j]]` (a gather per id column), or per separate argmax.

Each reduction (or gather) is a site of its own over one choice column. They share the expert compute, so each
runs it for its own pairs (column j's only: match.Site.fixed_choice) and the dense [T, E, ...] tensor is no longer
computed; a site stays only when every other use of the shared tensor is replaced too (match._drop_unshared).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_moe_ffi as jmf
from jax_moe_ffi import models as M

from helpers import assert_stays_as_written, rel, tree_rel
from test_rewrite_repeating_ids import _all_experts, _argmaxes, _params, _two_argmax

GG = "jax_moe_ffi_grouped_gemm"


def einsum_per_column(p, x, k=2):
    w, ids, _ = M._router(p, x, k)
    y = _all_experts(p, x)
    e = p["w_gate"].shape[0]
    return sum(w[:, j:j + 1] * jnp.einsum("te,ted->td", jax.nn.one_hot(ids[:, j], e), y) for j in range(k))


def gather_per_column(p, x, k=2):
    w, ids, _ = M._router(p, x, k)
    y = _all_experts(p, x)
    t = jnp.arange(x.shape[0])
    return sum(w[:, j:j + 1] * y[t, ids[:, j]] for j in range(k))


def einsum_per_argmax(p, x):
    ws, ids = _argmaxes(p, x, True)  # the even tokens choose one expert twice
    y = _all_experts(p, x)
    return sum(w[:, None] * jnp.einsum("te,ted->td", jax.nn.one_hot(i, p["w_gate"].shape[0]), y)
               for w, i in zip(ws, ids))


def gather_per_repeating_column(p, x):
    w, ids = _two_argmax(p, x, True)  # [T, 2] ids, equal in the even tokens
    y = _all_experts(p, x)
    t = jnp.arange(x.shape[0])
    return w[:, 0:1] * y[t, ids[:, 0]] + w[:, 1:2] * y[t, ids[:, 1]]


def stacked_loop_per_repeating_column(p, x):
    """Each expert run on every token in a Python loop, stacked to [T, E, D], one take_along_axis per id column."""
    w, ids = _two_argmax(p, x, True)
    outs = jnp.stack([(jax.nn.silu(x @ p["w_gate"][e]) * (x @ p["w_up"][e])) @ p["w_down"][e]
                      for e in range(p["w_gate"].shape[0])], axis=1)
    return sum(w[:, j, None] * jnp.take_along_axis(outs, ids[:, j, None, None], axis=1)[:, 0] for j in range(2))


FORMS = {"einsum_per_column": einsum_per_column, "einsum_per_column_k3": lambda p, x: einsum_per_column(p, x, 3),
         "gather_per_column": gather_per_column, "einsum_per_argmax": einsum_per_argmax,
         "gather_per_repeating_column": gather_per_repeating_column,
         # per-expert outputs of a Python loop, stacked, then one jnp.take_along_axis per id column
         "stacked_loop_per_column": lambda p, x: M.stacked_outputs_moe(p, x, pick="column"),
         "stacked_loop_per_column_k3": lambda p, x: M.stacked_outputs_moe(p, x, top_k=3, pick="column"),
         "stacked_loop_per_repeating_column": stacked_loop_per_repeating_column}


@pytest.mark.parametrize("name", list(FORMS))
def test_shared_all_experts_tensor_rewritten_exactly(name):
    fn = FORMS[name]
    seed = int(np.random.SeedSequence().entropy % (2**31))
    p, x = _params(seed)
    r = jmf.explain(fn, p, x)
    k = 3 if name.endswith("k3") else 2
    assert len(r.sites) == k and not r.misses, str(r)
    assert all(any("shared with" in n for n in s.notes) for s in r.sites), str(r)
    # each site runs one pair per token, and the dense tensor's FLOPs are counted once over the sites
    (t, d), (e, _, f) = x.shape, p["w_gate"].shape
    assert all(s.flops_after == 2 * t * 3 * d * f for s in r.sites), str(r)
    assert 2 * t * e * 3 * d * f <= sum(s.flops_before for s in r.sites) <= 2 * t * e * (3 * d * f + d), str(r)
    of = jax.jit(jmf.optimize(fn))
    jaxpr = str(jax.make_jaxpr(of)(p, x))
    assert GG in jaxpr
    # the dense all-experts tensor [T, E, ...] is gone: the only dot left is the router's
    assert not any(f"f32[{x.shape[0]},{e},{d}]" in jaxpr for d in (p["w_gate"].shape[2], x.shape[1])), jaxpr
    assert rel(of(p, x), fn(p, x)) < 1e-5, seed
    g1 = jax.grad(lambda p, x: jnp.sum(of(p, x) ** 2), argnums=(0, 1))(p, x)
    g0 = jax.grad(lambda p, x: jnp.sum(fn(p, x) ** 2), argnums=(0, 1))(p, x)
    assert tree_rel(g1, g0) < 1e-5, seed


def test_each_site_runs_its_column_only(monkeypatch):
    """The pairs of other columns are zero at a column's root (distinct ids) or the same term again (repeats): a
    site runs its column only. Routed with every pair instead, the repeated ids' site counts a token twice."""
    from jax_moe_ffi.rewrite import emit
    p, x = _params(21)
    fn = gather_per_repeating_column
    assert rel(jax.jit(jmf.optimize(fn))(p, x), fn(p, x)) < 1e-5
    routed = []
    real_route = emit.route

    def spy(ids, num_experts, keep=None, x=None):
        routed.append(None if keep is None else np.asarray(keep))
        return real_route(ids, num_experts, keep=keep, x=x)
    monkeypatch.setattr(emit, "route", spy)
    jmf.optimize(fn)(p, x)
    assert len(routed) == 2 and all(kp is not None for kp in routed)
    assert sorted(int(kp[:, 1].sum()) for kp in routed) == [0, x.shape[0]]  # one site per column, whole column
    assert all(int(kp.sum()) == x.shape[0] for kp in routed)


def test_a_dense_use_left_keeps_the_tensor():
    """The all-experts tensor also summed densely: no site (the tensor is needed anyway), with the reason."""
    def fn(p, x):
        w, ids, _ = M._router(p, x, 2)
        y = _all_experts(p, x)
        return jnp.einsum("te,ted->td", jax.nn.one_hot(ids[:, 0], p["w_gate"].shape[0]), y) + 1e-3 * y.sum(1)
    p, x = _params(2)
    assert_stays_as_written(fn, p, x, reason="also used outside the MoE region")


def test_gather_at_a_fixed_token_stays():
    """Every token picks token 0's choice (`y[t, ids[0, j]]`): not the token's own expert."""
    def fn(p, x):
        w, ids, _ = M._router(p, x, 2)
        y = _all_experts(p, x)
        t = jnp.arange(x.shape[0])
        return w[:, 0:1] * y[t, jnp.broadcast_to(ids[0, 0], t.shape)]
    p, x = _params(6)
    r = jmf.explain(fn, p, x)
    assert not r.sites, str(r)
    np.testing.assert_array_equal(np.asarray(jmf.optimize(fn)(p, x)), np.asarray(fn(p, x)))


def test_stacked_outputs_used_densely_stay():
    """Per-expert outputs stacked and picked per id column, but the stack is also summed over the experts: the
    dense tensor is needed anyway, so nothing is rewritten, with the reason."""
    def fn(p, x):
        w, ids, _ = M._router(p, x, 2)
        outs = jnp.stack([(jax.nn.silu(x @ p["w_gate"][e]) * (x @ p["w_up"][e])) @ p["w_down"][e]
                          for e in range(p["w_gate"].shape[0])], axis=1)
        picked = sum(w[:, j, None] * jnp.take_along_axis(outs, ids[:, j, None, None], axis=1)[:, 0] for j in range(2))
        return picked + 1e-3 * outs.sum(1)
    p, x = _params(4)
    assert_stays_as_written(fn, p, x, reason="also used outside the MoE region")
