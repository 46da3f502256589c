"""Exact mode's capacity shortcut (rewrite/capacity.py): the model's running count is replaced by the plan's
only when it is the GShard token-major rule; other priority orders and per-group counts keep the model's own."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
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


def _t5x_top1_layer(params, x, capacity_factor, slot_scale=1.0, squeeze="index"):
    """T5X / Switch style, written the way einsum-everything code writes it: top_k(k=1) with its choice axis
    dropped (`[..., 0]` or a reshape), a *float* running count (cumsum of the float one-hot) and a float
    slot index one-hot'ed into [S, B, E, C]. slot_scale != 1 makes some slot values fractional: their
    one-hot is all zero (the token is dropped), which the rewrite must reproduce."""
    s, b, d = x.shape
    e = params["router"].shape[-1]
    cap = max(1, int(round(s * capacity_factor / e)))
    probs = jax.nn.softmax(jnp.einsum("sbd,de->sbe", x, params["router"]), axis=-1)
    gate, idx = jax.lax.top_k(probs, 1)  # [S, B, 1]
    top1 = idx[..., 0] if squeeze == "index" else idx.reshape(s, b)
    mask = jax.nn.one_hot(top1, e, dtype=x.dtype)  # [S, B, E]
    pos = jnp.cumsum(mask, axis=0) - 1.0  # token-major running count per batch column
    slot_val = jnp.sum(pos * mask, axis=-1) * slot_scale
    slot = jax.nn.one_hot(slot_val, cap, dtype=x.dtype)  # [S, B, C]
    disp = mask[..., None] * slot[..., None, :] * (pos < cap)[..., None]
    comb = disp * gate[..., None]
    xe = jnp.einsum("sbec,sbd->ecbd", disp, x)
    h = jax.nn.gelu(jnp.einsum("ecbd,efd->ecbf", xe, params["wi_t"]))
    ye = jnp.einsum("ecbf,def->ecbd", h, params["wo_t"])
    return jnp.einsum("sbec,ecbd->sbd", comb, ye)


@settings(max_examples=4, deadline=None)
@given(s=st.integers(6, 40), b=st.integers(1, 3), e=st.sampled_from([2, 4, 5]),
       cf=st.sampled_from([0.5, 1.0, 2.0]), slot_scale=st.sampled_from([1.0, 0.5]),
       squeeze=st.sampled_from(["index", "reshape"]), seed=st.integers(0, 2 ** 31 - 1))
def test_t5x_top1_float_slots_rewritten_exactly(s, b, e, cf, slot_scale, squeeze, seed):
    """top_k(k=1)[..., 0] is a top-1 router like argmax; a float slot index is a one-hot coordinate (values
    that are no integer select no slot). Forward and gradients must equal the model's, drops included."""
    rng = np.random.default_rng(seed)
    d, f = 8, 12
    params = {"router": jnp.asarray(rng.standard_normal((d, e)), jnp.float32),
              "wi_t": jnp.asarray(rng.standard_normal((e, f, d)) / np.sqrt(d), jnp.float32),
              "wo_t": jnp.asarray(rng.standard_normal((d, e, f)) / np.sqrt(f), jnp.float32)}
    x = jnp.asarray(rng.standard_normal((s, b, d)), jnp.float32)
    naive = lambda p, x: _t5x_top1_layer(p, x, cf, slot_scale, squeeze)
    report = jax_moe_ffi.explain(naive, params, x)
    assert len(report.sites) == 1 and report.sites[0].k == 1 and report.sites[0].capacity is not None, report
    opt = jax_moe_ffi.optimize(naive, mode="exact")
    assert "jax_moe_ffi_grouped_gemm" in str(jax.make_jaxpr(opt)(params, x))
    _assert_same_fn(naive, opt, params, x)


def test_float_slot_values_that_are_no_integer_select_no_slot():
    """emit._slot_at on a float slot array: integers are slots; fractions, NaN, +-inf and values past int32 are
    NO_SLOT (their one-hot is all zero), never a truncated neighbour slot."""
    from jax_moe_ffi.rewrite import emit
    rng = np.random.default_rng()
    ints = rng.integers(0, 50, 6).astype(np.float32)
    vals = np.concatenate([ints, ints[:3] + 0.5, [np.nan, np.inf, -np.inf, 3e9, -0.25]]).astype(np.float32)
    rng.shuffle(vals)
    got = np.asarray(emit._slot_at(jnp.asarray(vals), ("E",), {"E": jnp.arange(vals.size)}))
    want = np.where(np.isfinite(vals) & (vals == np.floor(vals)) & (np.abs(vals) < 2 ** 30),
                    np.nan_to_num(vals), emit.NO_SLOT).astype(np.int64)
    np.testing.assert_array_equal(got, want)
    assert (got[~np.isin(vals, ints)] == emit.NO_SLOT).all()


def _flaxformer_style_layer(params, x, k, capacity_factor, offset=1.0, vmap_experts=True):
    """flaxformer's masked routing, written the way its TokensChooseMaskedRouter + MoeLayer write it:
    expert ids [G, S, K] swapped to [G, K*S] (choice-major priority), an int one-hot, priority
    `cumsum(mask) * mask - offset` reshaped back to [G, S, K, E] and max-reduced over K (so -1 where the token
    did not choose the expert), a bool one_hot(priority, C) dispatch mask [G, S, E, C], experts run on
    [E, G*C, D] (vmap over E, a reshape that merges groups and slots). offset != 1 is not flaxformer: with
    offset 0 every unchosen expert's priority is 0, a valid slot, so the dispatch is not sparse over experts
    and the layer must keep its meaning."""
    g, s, d = x.shape
    e = params["router"].shape[-1]
    cap = max(1, int(round(k * s * capacity_factor / e)))
    probs = jax.nn.softmax(jnp.einsum("gsd,de->gse", x, params["router"]), axis=-1)
    gate, idx = jax.lax.top_k(probs, k)  # [G, S, K]
    idx_t = jnp.swapaxes(idx, 1, 2).reshape(g, -1)  # [G, K*S]
    mask = jax.nn.one_hot(idx_t, e, dtype=jnp.int32)
    prio = jnp.cumsum(mask, axis=1) * mask - offset
    prio = jnp.max(jnp.swapaxes(prio.reshape(g, k, s, e), 1, 2), axis=2)  # [G, S, E]
    dispatch = jax.nn.one_hot(prio, cap, dtype=jnp.bool_)  # [G, S, E, C]
    combine = jnp.einsum("gse,gsec->gsec", probs, dispatch)
    xe = jnp.einsum("gsd,gsec->egcd", x, dispatch.astype(x.dtype))  # [E, G, C, D]

    def mlp(p, h):  # one expert on [G*C, D]
        return jax.nn.gelu(h @ p["wi"] + p["bi"]) @ p["wo"]

    if vmap_experts:
        h = jax.vmap(mlp)({n: params[n] for n in ("wi", "bi", "wo")}, xe.reshape(e, g * cap, d))
        ye = h.reshape(e, g, cap, d)
    else:
        ye = jax.nn.gelu(jnp.einsum("egcd,edf->egcf", xe, params["wi"]) + params["bi"][:, None, None])
        ye = jnp.einsum("egcf,efd->egcd", ye, params["wo"])
    return jnp.einsum("egcd,gsec->gsd", ye, combine)


def _flaxformer_params(rng, d, f, e):
    return {"router": jnp.asarray(rng.standard_normal((d, e)), jnp.float32),
            "wi": jnp.asarray(rng.standard_normal((e, d, f)) / np.sqrt(d), jnp.float32),
            "bi": jnp.asarray(0.1 * rng.standard_normal((e, f)), jnp.float32),
            "wo": jnp.asarray(rng.standard_normal((e, f, d)) / np.sqrt(f), jnp.float32)}


def _assert_same_fn(naive, opt, params, x, tol=1e-5):
    # Everything jitted: op-by-op these small layers spent most of CI's time compiling one primitive at a time.
    assert _rel(jax.jit(opt)(params, x), jax.jit(naive)(params, x)) <= tol
    loss = lambda fn: (lambda p, x: jnp.sum(jnp.sin(fn(p, x))))
    g_opt = jax.jit(jax.grad(loss(opt), argnums=(0, 1)))(params, x)
    g_ref = jax.jit(jax.grad(loss(naive), argnums=(0, 1)))(params, x)
    for a, r in zip(jax.tree.leaves(g_opt), jax.tree.leaves(g_ref)):
        r = np.asarray(r, np.float64)
        assert np.linalg.norm(np.asarray(a, np.float64) - r) <= tol * max(1.0, np.linalg.norm(r))


@settings(max_examples=4, deadline=None)
@given(gs=st.sampled_from([(1, 12), (2, 16), (3, 10)]), e=st.sampled_from([3, 4, 6]), k=st.sampled_from([1, 2]),
       cf=st.sampled_from([0.5, 1.0, 2.0]), offset=st.sampled_from([1, 1.0]), vmap_experts=st.booleans(),
       seed=st.integers(0, 2 ** 31 - 1))
def test_flaxformer_masked_routing_rewritten_exactly(gs, e, k, cf, offset, vmap_experts, seed):
    """The priority is -1 (int or float) at the experts a token did not choose, so one_hot(priority) is sparse
    over experts though no one-hot of the expert ids reaches it directly; the ids are merged to [G, K*S] and
    split back; the experts may run on [E, G*C, D]. Rewritten, exact with drops, gradients included.
    (Not covered: capacity C = 1 with the [E, G*C, D] reshape, a near-miss; G = 1 is, since session 15.)"""
    g, s = gs
    assume(not (vmap_experts and max(1, int(round(k * s * cf / e))) == 1))
    rng = np.random.default_rng(seed)
    d, f = 8, 12
    params = _flaxformer_params(rng, d, f, e)
    x = jnp.asarray(rng.standard_normal(gs + (d,)), jnp.float32)
    naive = lambda p, x: _flaxformer_style_layer(p, x, k, cf, offset, vmap_experts)
    report = jax_moe_ffi.explain(naive, params, x)
    assert len(report.sites) == 1 and report.sites[0].k == k, report
    opt = jax_moe_ffi.optimize(naive, mode="exact")
    assert "jax_moe_ffi_grouped_gemm" in str(jax.make_jaxpr(opt)(params, x))
    _assert_same_fn(naive, opt, params, x)


@pytest.mark.parametrize("k", [1, 2])
def test_flaxformer_one_group_on_the_merged_expert_input(k):
    """G = 1 with the experts on [E, G*C, D]: the reshape drops the size-1 group axis, so one use of the
    dispatch mask labels it and the other cannot (match._merge_unit_labels); rewritten, exact with drops."""
    rng = np.random.default_rng()
    params = _flaxformer_params(rng, 8, 12, 4)
    x = jnp.asarray(rng.standard_normal((1, 14, 8)), jnp.float32)
    naive = lambda p, x: _flaxformer_style_layer(p, x, k, 0.75, 1, True)
    report = jax_moe_ffi.explain(naive, params, x)
    assert len(report.sites) == 1 and report.sites[0].k == k, report
    opt = jax_moe_ffi.optimize(naive, mode="exact")
    assert "jax_moe_ffi_grouped_gemm" in str(jax.make_jaxpr(opt)(params, x))
    _assert_same_fn(naive, opt, params, x)


@pytest.mark.parametrize("offset", [0, -1, 2, 2.0])
def test_priority_fill_that_is_a_slot_keeps_its_meaning(offset):
    """Soundness: with `- 0` (or `+ 1`) the unchosen experts' priority is a valid slot and the dispatch reaches
    every expert: no site. With `- 2` (int or float) it is no slot, and the first two tokens of each expert
    get none either. Whatever the pass decides, the result must be the model's."""
    rng = np.random.default_rng()
    params = _flaxformer_params(rng, 8, 12, 4)
    x = jnp.asarray(rng.standard_normal((2, 12, 8)), jnp.float32)
    naive = lambda p, x: _flaxformer_style_layer(p, x, 2, 1.0, offset)
    report = jax_moe_ffi.explain(naive, params, x)
    if offset in (0, -1):
        assert report.sites == [], report  # the dispatch mask is dense over experts: not token-choice sparse
    _assert_same_fn(naive, jax_moe_ffi.optimize(naive, mode="exact"), params, x)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", ["flaxformer", "t5x"])
def test_gpu_new_capacity_forms_run_the_cuda_kernels(layer):
    """On the H200, the forms added in session 14 (flaxformer's masked routing with a [E, G*C, D] expert input,
    T5X's top_k(k=1)[..., 0] with a float slot index) in bf16: the compiled program calls the CUDA grouped
    GEMM, and the result matches the model's own bf16 program (XLA's einsums) within bf16 rounding."""
    _check_bf16_capacity_form(layer)


@pytest.mark.parametrize("layer", ["flaxformer", "t5x"])
def test_new_capacity_forms_in_bf16(layer):
    """The same in bf16 on any backend (a bf16 float slot index is a slot coordinate too: bfloat16 is no numpy
    floating subtype, the analysis must still see it as a float)."""
    _check_bf16_capacity_form(layer)


def _check_bf16_capacity_form(layer):
    rng = np.random.default_rng()
    d, f, e = 64, 128, 8
    params = _flaxformer_params(rng, d, f, e)
    if layer == "flaxformer":
        x = rng.standard_normal((2, 64, d))
        naive = lambda p, x: _flaxformer_style_layer(p, x, 2, 1.0)
    else:
        params = {"router": params["router"], "wi_t": jnp.swapaxes(params["wi"], 1, 2),
                  "wo_t": jnp.transpose(params["wo"], (2, 0, 1))}
        x = rng.standard_normal((64, 2, d))
        naive = lambda p, x: _t5x_top1_layer(p, x, 1.0)
    p16 = jax.tree.map(lambda a: jnp.asarray(a, jnp.bfloat16), params)
    x16 = jnp.asarray(x, jnp.bfloat16)
    opt = jax.jit(jax_moe_ffi.optimize(naive, mode="exact"))
    hlo = opt.lower(p16, x16).compile().as_text()
    assert 'custom_call_target="jax_moe_ffi_grouped_gemm' in hlo
    # the reference: the model as written, in bf16 too, so that both route the same tokens (a float32 router
    # would break near-ties otherwise and move whole tokens)
    ref = np.asarray(jax.jit(naive)(p16, x16), np.float32)
    out = opt(p16, x16)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    assert _rel(np.asarray(out, np.float32), ref) <= 2e-2


def test_unit_label_merge_only_for_token_coordinates():
    """match._merge_unit_labels: a size-1 axis left unlabeled by one use takes the other use's token label
    (its coordinate has one value); an expert or slot label on a size-1 axis (a loop site's w[e] slice) or two
    different labels stay a conflict (None), and so does a missing label on an axis longer than 1."""
    from jax_moe_ffi.rewrite.match import _merge_unit_labels
    t0, e_, c_ = (("T", 0), False), ("E", False), ("C", False)
    assert _merge_unit_labels((None, e_), (t0, e_), (1, 4)) == (t0, e_)
    assert _merge_unit_labels((t0, e_), (None, e_), (1, 4)) == (t0, e_)
    assert _merge_unit_labels((None, e_), (t0, e_), (3, 4)) is None
    assert _merge_unit_labels((None, None), (e_, None), (1, 4)) is None
    assert _merge_unit_labels((None, None), (c_, None), (1, 4)) is None
    assert _merge_unit_labels(((("T", 1), False), e_), (t0, e_), (1, 4)) is None
