"""moe_dispatch / moe_combine against the pure-JAX reference (one-hot cumsum) and a plain-Python
oracle of the GShard/Switch rule, on fresh random inputs."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jax_moe_ffi as jmf
from jax_moe_ffi import reference as ref
from jax_moe_ffi.ops.dispatch import MoeRouting, dispatch_num_rows, moe_routing

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def rel_err(out, want):
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    want = np.asarray(jnp.asarray(want, jnp.float32), np.float64)
    assert out.shape == want.shape, (out.shape, want.shape)
    assert np.all(np.isfinite(out)), "non-finite values in the output"
    return np.linalg.norm(out - want) / max(np.linalg.norm(want), 1e-30)


def np_routing(ids, num_experts, capacity=None, keep=None, align=1):
    """Plain-Python statement of the contract: (pos[T,k], counts[E], group_sizes[E], row_pair[R])."""
    ids = np.asarray(ids)
    t_count, k = ids.shape
    seen = [0] * num_experts
    rank = {}
    for t in range(t_count):
        for j in range(k):
            e = int(ids[t, j])
            if not 0 <= e < num_experts or (keep is not None and not keep[t, j]):
                continue
            r = seen[e]
            seen[e] += 1
            if capacity is not None and r >= capacity:
                continue
            rank[(t, j)] = r
    counts = np.array([min(s, capacity) if capacity is not None else s for s in seen], np.int32)
    sizes = ((counts + align - 1) // align * align).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    num_rows = dispatch_num_rows(t_count, k, num_experts, capacity, align)
    pos = np.full((t_count, k), -1, np.int32)
    row_pair = np.full((num_rows,), -1, np.int32)
    for (t, j), r in rank.items():
        pos[t, j] = offsets[ids[t, j]] + r
        row_pair[pos[t, j]] = t * k + j
    return pos, counts, sizes, row_pair


def random_ids(rng, t, k, e, bad_frac=0.0):
    ids = rng.integers(0, e, size=(t, k))
    if bad_frac:
        bad = rng.random((t, k)) < bad_frac
        ids = np.where(bad, rng.choice([-3, -1, e, e + 5], size=(t, k)), ids)
    return jnp.asarray(ids, jnp.int32)


def random_x(rng, t, d, dtype):
    return jnp.asarray(rng.standard_normal((t, d)) + 0.5, dtype)  # no zeros: a lost row shows


def assert_routing(routing, want):
    pos, counts, sizes, row_pair = want
    np.testing.assert_array_equal(np.asarray(routing.pos), pos, err_msg="pos")
    np.testing.assert_array_equal(np.asarray(routing.counts), counts, err_msg="counts")
    np.testing.assert_array_equal(np.asarray(routing.group_sizes), sizes, err_msg="group_sizes")
    np.testing.assert_array_equal(np.asarray(routing.row_pair), row_pair, err_msg="row_pair")


@partial(jax.jit, static_argnames=("e", "capacity", "align"))
def _ours_and_ref(x, ids, w, keep, e, capacity, align):
    """One compilation per shape for both implementations (keeps the random tests fast)."""
    kw = dict(capacity=capacity, keep=keep, align=align)
    rows, sizes, routing = jmf.moe_dispatch(x, ids, e, **kw)
    rows_r, sizes_r, routing_r = ref.moe_dispatch_reference(x, ids, e, **kw)
    y = jmf.moe_combine(rows, routing, w)
    y_r = ref.moe_combine_reference(rows_r, routing_r, w)
    return (rows, sizes, routing, y), (rows_r, sizes_r, routing_r, y_r)


def check_case(rng, t, k, e, d, dtype, capacity=None, keep=None, align=1, bad_frac=0.0, ids=None):
    x = random_x(rng, t, d, dtype)
    ids = random_ids(rng, t, k, e, bad_frac) if ids is None else ids
    w = jnp.asarray(rng.random((t, k)) + 0.1, jnp.float32)
    (rows, sizes, routing, y), (rows_r, sizes_r, routing_r, y_r) = _ours_and_ref(
        x, ids, w, keep, e=e, capacity=capacity, align=align)
    want = np_routing(ids, e, capacity, None if keep is None else np.asarray(keep), align)
    assert isinstance(routing, MoeRouting)
    assert rows.dtype == x.dtype and rows.shape == (dispatch_num_rows(t, k, e, capacity, align), d)
    assert_routing(routing, want)
    assert_routing(routing_r, want)
    np.testing.assert_array_equal(np.asarray(sizes), want[2])
    # The gather is a copy: bit-exact, zero rows for padding and past the padded total.
    np.testing.assert_array_equal(np.asarray(rows, np.float32), np.asarray(rows_r, np.float32))
    rp = want[3]
    xs = np.asarray(x, np.float32)
    rows_np = np.asarray(rows, np.float32)
    assert np.all(rows_np[rp < 0] == 0)
    np.testing.assert_array_equal(rows_np[rp >= 0], xs[rp[rp >= 0] // k])
    assert int(np.sum(want[2])) <= rows.shape[0]

    assert y.dtype == rows.dtype and y.shape == (t, d)
    # float64 oracle of the combine
    kept = want[0] >= 0
    y_np = np.einsum("tk,tkd->td", np.where(kept, np.asarray(w, np.float64), 0.0),
                     np.where(kept[..., None], xs.astype(np.float64)[:, None, :], 0.0))
    if np.linalg.norm(y_np) > 0:
        assert rel_err(y, y_np) <= TOL[dtype]
        assert rel_err(y, y_r) <= TOL[dtype]
    else:
        assert np.all(np.asarray(y, np.float32) == 0)
    return rows, routing


# ------------------------------------------------------------------------------ random inputs
@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 24), k=st.integers(1, 4), e=st.integers(1, 9), d=st.sampled_from([1, 3, 8, 24]),
       dtype=st.sampled_from(DTYPES), mode=st.sampled_from(["dropless", "capacity", "keep"]),
       align=st.sampled_from([1, 2, 16, 128]), bad=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 2**31))
def test_dispatch_combine_random(t, k, e, d, dtype, mode, align, bad, seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(0, max(2, t * k // e + 2))) if mode == "capacity" else None
    keep = jnp.asarray(rng.random((t, k)) < 0.7) if mode == "keep" else None
    check_case(rng, t, k, e, d, dtype, capacity=capacity, keep=keep, align=align, bad_frac=bad)


def test_dropless_larger():
    rng = np.random.default_rng()
    check_case(rng, 300, 4, 16, 40, jnp.bfloat16)
    check_case(rng, 300, 8, 64, 24, jnp.float32, align=16)


def test_capacity_drops_exact():
    # E=2, C=2, token-major / choice-minor running counts.
    ids = jnp.array([[0, 1], [0, 0], [1, 0], [1, 1]], jnp.int32)
    x = jnp.arange(1, 9, dtype=jnp.float32).reshape(4, 2)
    rows, sizes, routing = jmf.moe_dispatch(x, ids, 2, capacity=2)
    # expert 0: (0,0) r0, (1,0) r1, (1,1) r2 -> dropped, (2,1) r3 -> dropped
    # expert 1: (0,1) r0, (2,0) r1, (3,0) r2 -> dropped, (3,1) -> dropped
    np.testing.assert_array_equal(routing.pos, [[0, 2], [1, -1], [3, -1], [-1, -1]])
    np.testing.assert_array_equal(routing.counts, [2, 2])
    np.testing.assert_array_equal(sizes, [2, 2])
    np.testing.assert_array_equal(rows, x[jnp.array([0, 1, 0, 2])])
    y = jmf.moe_combine(rows, routing, jnp.full((4, 2), 0.5))
    np.testing.assert_allclose(y, [[1, 2], [1.5, 2], [2.5, 3], [0, 0]])


def test_capacity_with_drops_random():
    rng = np.random.default_rng()
    for dtype in DTYPES:
        rows, routing = check_case(rng, 64, 2, 8, 16, dtype, capacity=10)
        assert np.any(np.asarray(routing.pos) < 0), "expected drops with capacity 10 < 128/8"
        assert np.all(np.asarray(routing.counts) <= 10)


def test_capacity_zero_drops_everything():
    rng = np.random.default_rng()
    x = random_x(rng, 5, 4, jnp.float32)
    rows, sizes, routing = jmf.moe_dispatch(x, random_ids(rng, 5, 2, 3), 3, capacity=0)
    assert rows.shape == (0, 4)
    np.testing.assert_array_equal(routing.pos, -np.ones((5, 2)))
    y = jmf.moe_combine(rows, routing, jnp.ones((5, 2)))
    np.testing.assert_array_equal(y, np.zeros((5, 4)))


def test_keep_mask_choice_major_priority():
    """A GShard top-2 style choice-major priority given as a keep mask is reproduced exactly."""
    rng = np.random.default_rng()
    t, k, e, cap = 40, 2, 4, 12
    ids = np.asarray(random_ids(rng, t, k, e))
    seen = np.zeros(e, int)
    keep = np.zeros((t, k), bool)
    for j in range(k):  # choice-major: all first choices first
        for tok in range(t):
            keep[tok, j] = seen[ids[tok, j]] < cap
            seen[ids[tok, j]] += 1
    assert not keep.all() and keep.any()
    rows, routing = check_case(rng, t, k, e, 8, jnp.float32, keep=jnp.asarray(keep), ids=jnp.asarray(ids))
    np.testing.assert_array_equal(np.asarray(routing.pos) >= 0, keep)
    assert np.all(np.asarray(routing.counts) <= cap)


def test_alignment_padding():
    rng = np.random.default_rng()
    for align in (16, 128):
        rows, routing = check_case(rng, 50, 3, 6, 8, jnp.bfloat16, align=align)
        sizes = np.asarray(routing.group_sizes)
        counts = np.asarray(routing.counts)
        assert np.all(sizes % align == 0) and np.all(sizes >= counts) and np.all(sizes - counts < align)
        # padding rows inside each group are zero
        start = 0
        rows_np = np.asarray(rows, np.float32)
        for c, s in zip(counts, sizes):
            assert np.all(rows_np[start + c:start + s] == 0)
            assert np.all(np.any(rows_np[start:start + c] != 0, axis=1))
            start += s
    # capacity + align
    check_case(rng, 50, 3, 6, 8, jnp.float32, capacity=7, align=16)


def test_duplicate_experts_within_token():
    rng = np.random.default_rng()
    ids = jnp.array([[2, 2, 2], [1, 2, 1], [0, 0, 2]], jnp.int32)
    rows, routing = check_case(rng, 3, 3, 3, 5, jnp.float32, ids=ids)
    # expert 2 holds token 0 three times (choices 0, 1, 2), then token 1, then token 2
    np.testing.assert_array_equal(routing.counts, [2, 2, 5])
    np.testing.assert_array_equal(routing.row_pair, [6, 7, 3, 5, 0, 1, 2, 4, 8])
    assert rows.shape[0] == 9


def test_all_tokens_to_one_expert():
    rng = np.random.default_rng()
    t, k, e = 33, 2, 5
    ids = jnp.full((t, k), 3, jnp.int32)
    rows, routing = check_case(rng, t, k, e, 8, jnp.bfloat16, ids=ids)
    np.testing.assert_array_equal(routing.counts, [0, 0, 0, t * k, 0])
    rows, routing = check_case(rng, t, k, e, 8, jnp.float32, ids=ids, capacity=9, align=16)
    np.testing.assert_array_equal(routing.counts, [0, 0, 0, 9, 0])
    np.testing.assert_array_equal(routing.group_sizes, [0, 0, 0, 16, 0])


def test_out_of_range_ids_are_dropped():
    rng = np.random.default_rng()
    ids = jnp.array([[0, 7], [-1, 1], [1, 2], [3, -5]], jnp.int32)  # E = 3: 7, -1, 3, -5 are bad
    rows, routing = check_case(rng, 4, 2, 3, 4, jnp.float32, ids=ids, capacity=1)
    # out-of-range pairs take no capacity slot: (1,1) is expert 1's first in-range pair
    np.testing.assert_array_equal(np.asarray(routing.pos) >= 0, [[1, 0], [0, 1], [0, 1], [0, 0]])
    # a NaN weight on a dropped pair does not leak into the output
    w = jnp.where(routing.pos >= 0, 1.0, jnp.nan)
    assert np.all(np.isfinite(np.asarray(jmf.moe_combine(rows, routing, w))))
    # wider integer ids: values that would wrap into range when cast stay dropped
    ids8 = jnp.array([[0, 250], [2, 1]], jnp.uint8)
    _, _, r8 = jmf.moe_dispatch(jnp.ones((2, 3)), ids8, 3)
    np.testing.assert_array_equal(r8.pos >= 0, [[True, False], [True, True]])


# ---------------------------------------------------------------------------------- gradients
def _layer(dispatch, combine, x, w, expert_w, ids, e, **kw):
    rows, sizes, routing = dispatch(x, ids, e, **kw)
    h = jnp.tanh(jax.lax.ragged_dot(rows, expert_w, sizes, preferred_element_type=jnp.float32))
    return combine(h.astype(rows.dtype), routing, w)


@partial(jax.jit, static_argnames=("e", "capacity", "align"))
def _grads_ours_and_ref(x, w, expert_w, ids, cot, keep, e, capacity, align):
    kw = dict(capacity=capacity, keep=keep, align=align)

    def grads(dispatch, combine):
        def loss(x, w, expert_w):
            y = _layer(dispatch, combine, x, w, expert_w, ids, e, **kw)
            return jnp.sum(y.astype(jnp.float32) * cot)
        return jax.grad(loss, argnums=(0, 1, 2))(x, w, expert_w)

    return (grads(jmf.moe_dispatch, jmf.moe_combine),
            grads(ref.moe_dispatch_reference, ref.moe_combine_reference))


@settings(max_examples=20, deadline=None)
@given(t=st.integers(1, 16), k=st.integers(1, 3), e=st.integers(1, 6), d=st.sampled_from([4, 8]),
       mode=st.sampled_from(["dropless", "capacity", "keep", "align"]), seed=st.integers(0, 2**31))
def test_gradients_random(t, k, e, d, mode, seed):
    rng = np.random.default_rng(seed)
    kw = dict(capacity=None, keep=None, align=1)
    kw.update({"capacity": dict(capacity=max(1, t * k // (2 * e))), "keep": dict(keep=jnp.asarray(rng.random((t, k)) < 0.6)),
               "align": dict(align=16), "dropless": {}}[mode])
    x = random_x(rng, t, d, jnp.float32)
    w = jnp.asarray(rng.random((t, k)) + 0.1, jnp.float32)
    expert_w = jnp.asarray(rng.standard_normal((e, d, d)) / np.sqrt(d), jnp.float32)
    ids = random_ids(rng, t, k, e, 0.1)
    cot = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
    got, want = _grads_ours_and_ref(x, w, expert_w, ids, cot, e=e, **kw)
    for name, g, r in zip(("dx", "dweights", "dexpert_w"), got, want):
        assert g.shape == r.shape and g.dtype == r.dtype, name
        if np.linalg.norm(np.asarray(r)) == 0:
            assert np.all(np.asarray(g) == 0), name
        else:
            assert rel_err(g, r) <= 1e-5, name


def test_gradients_bf16_and_dropped_pairs_zero():
    rng = np.random.default_rng()
    t, k, e, d = 48, 2, 4, 16
    x = random_x(rng, t, d, jnp.bfloat16)
    w = jnp.asarray(rng.random((t, k)) + 0.1, jnp.bfloat16)
    ids = random_ids(rng, t, k, e, 0.1)
    cot = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)

    def loss(dispatch, combine):
        def f(x, w):
            rows, _, routing = dispatch(x, ids, e, capacity=8, align=16)
            return jnp.sum(combine(rows * 2, routing, w).astype(jnp.float32) * cot)
        return f

    gx, gw = jax.grad(loss(jmf.moe_dispatch, jmf.moe_combine), argnums=(0, 1))(x, w)
    rx, rw = jax.grad(loss(ref.moe_dispatch_reference, ref.moe_combine_reference), argnums=(0, 1))(x, w)
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    assert rel_err(gx, rx) <= 1e-2 and rel_err(gw, rw) <= 1e-2
    _, _, routing = jmf.moe_dispatch(x, ids, e, capacity=8)
    dropped = np.asarray(routing.pos) < 0
    assert dropped.any()
    assert np.all(np.asarray(gw, np.float32)[dropped] == 0)


def test_dispatch_backward_is_unweighted_combine():
    rng = np.random.default_rng()
    t, k, e, d = 20, 3, 5, 6
    x = random_x(rng, t, d, jnp.float32)
    ids = random_ids(rng, t, k, e, 0.1)
    rows, sizes, routing = jmf.moe_dispatch(x, ids, e, align=4)
    drows = jnp.asarray(rng.standard_normal(rows.shape), jnp.float32)
    _, vjp = jax.vjp(lambda x: jmf.moe_dispatch(x, ids, e, align=4)[0], x)
    (dx,) = vjp(drows)
    want = np.zeros((t, d))
    rp = np.asarray(routing.row_pair)
    for r in np.nonzero(rp >= 0)[0]:
        want[rp[r] // k] += np.asarray(drows[r])
    assert rel_err(dx, want) <= 1e-6


@settings(max_examples=15, deadline=None)
@given(t=st.integers(0, 24), k=st.integers(1, 3), e=st.integers(1, 6), d=st.sampled_from([1, 5, 8]),
       capacity=st.sampled_from([None, 1, 3]), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31))
def test_unweighted_combine_and_its_gather_backward(t, k, e, d, capacity, dtype, seed):
    """moe_combine(rows, routing, None) = sum over a token's kept rows; its VJP gathers the cotangent to every
    kept row (padding and dropped rows get 0); checked against loops over the plan, on fresh random inputs."""
    rng = np.random.default_rng(seed)
    x = random_x(rng, t, d, jnp.float32)
    ids = random_ids(rng, t, k, e, 0.1)
    rows, _, routing = jmf.moe_dispatch(x, ids, e, capacity=capacity, align=4)
    r = jnp.asarray(rng.standard_normal(rows.shape), dtype)
    cot = jnp.asarray(rng.standard_normal((t, d)), dtype)
    y, vjp = jax.vjp(lambda r: jmf.moe_combine(r, routing, None), r)
    (dr,) = vjp(cot)
    pos, rp = np.asarray(routing.pos), np.asarray(routing.row_pair)
    rr, cc = np.asarray(r, np.float32), np.asarray(cot, np.float32)
    want_y = np.zeros((t, d), np.float32)
    for tt in range(t):
        for j in range(k):
            if pos[tt, j] >= 0:
                want_y[tt] += rr[pos[tt, j]]
    want_dr = np.zeros(rr.shape, np.float32)
    for row in np.nonzero(rp >= 0)[0]:
        want_dr[row] = cc[rp[row] // k]
    assert y.dtype == dtype and dr.dtype == dtype
    assert rel_err(y, want_y) <= TOL[dtype]
    assert np.array_equal(np.asarray(dr, np.float32), want_dr)  # a gather: exact
    if t:
        w1 = jmf.moe_combine(r, routing, jnp.ones((t, k), jnp.float32))  # the same as weights of one
        assert rel_err(y, w1) <= TOL[dtype]


def test_scaled_dispatch_target():
    """The `scale` operand of the dispatch target (rows[r] = scale[p] * x[t]), kept for the pass and FP8."""
    from jax_moe_ffi.ops.dispatch import _dispatch_call
    rng = np.random.default_rng()
    t, k, e, d = 12, 3, 4, 10
    for dtype in DTYPES:
        x = random_x(rng, t, d, dtype)
        ids = random_ids(rng, t, k, e, 0.1)
        _, _, routing = jmf.moe_dispatch(x, ids, e, align=4)
        scale = jnp.asarray(rng.random((t, k)) + 0.5, jnp.float32)
        got = np.asarray(jax.jit(_dispatch_call, static_argnums=4)(x, routing.pos, routing.row_pair, scale, k),
                         np.float32)
        rp = np.asarray(routing.row_pair)
        want = np.zeros((rp.shape[0], d), np.float32)
        ok = rp >= 0
        want[ok] = (np.asarray(x, np.float32)[rp[ok] // k] * np.asarray(scale).reshape(-1)[rp[ok]][:, None])
        want = np.asarray(jnp.asarray(want, dtype), np.float32)  # one rounding to the row dtype
        np.testing.assert_array_equal(got, want)


def test_inconsistent_routing_gives_zero_rows():
    """A hand-made routing whose pos and row_pair disagree: rows no pair holds are zero, never stale memory."""
    from jax_moe_ffi.ops.dispatch import _dispatch_call
    rng = np.random.default_rng()
    t, k, e, d = 16, 2, 4, 12
    x = random_x(rng, t, d, jnp.float32) + 3.0  # no zero entries
    _, _, routing = jmf.moe_dispatch(x, random_ids(rng, t, k, e), e)
    pos = np.asarray(routing.pos).copy()
    broken = rng.choice(t * k, size=5, replace=False)
    pos.reshape(-1)[broken] = -1  # these pairs' rows lose their owner
    got = np.asarray(jax.jit(_dispatch_call, static_argnums=4)(x, jnp.asarray(pos), routing.row_pair, None, k))
    rp = np.asarray(routing.row_pair)
    for r in range(rp.shape[0]):
        if rp[r] in broken:
            assert np.all(got[r] == 0), r
        else:
            np.testing.assert_array_equal(got[r], np.asarray(x)[rp[r] // k])


@settings(max_examples=25, deadline=None)
@given(t=st.integers(0, 12), k=st.integers(1, 5), r=st.integers(0, 40), d=st.integers(1, 9),
       scaled=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_dispatch_rule_on_arbitrary_routings(t, k, r, d, scaled, seed):
    """Any pos/row_pair (in range, out of range, disagreeing, duplicated): the CPU target and the XLA
    fallback both give rows[r] = x[p // k] (* scale[p]) exactly where p = row_pair[r] is a pair with
    pos[p] == r, and zeros elsewhere."""
    from jax_moe_ffi.ops.dispatch import _dispatch_call, _dispatch_xla
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((t, d)) + 2.0, jnp.float32)
    pos = jnp.asarray(rng.integers(-2, r + 2, (t, k)), jnp.int32)
    row_pair = jnp.asarray(rng.integers(-2, t * k + 2, (r,)), jnp.int32)
    if t * k and r:  # make some rows agree with their pair, as a plan would
        for rr in rng.choice(r, size=min(r, t * k), replace=False)[: r // 2]:
            p = int(rng.integers(0, t * k))
            row_pair = row_pair.at[rr].set(p)
            pos = pos.reshape(-1).at[p].set(rr).reshape(t, k)
    scale = jnp.asarray(rng.random((t, k)) + 0.5, jnp.float32) if scaled else None
    want = np.zeros((r, d), np.float32)
    pf, rp = np.asarray(pos).reshape(-1), np.asarray(row_pair)
    for rr in range(r):
        p = rp[rr]
        if 0 <= p < t * k and pf[p] == rr:
            want[rr] = np.asarray(x)[p // k] * (np.asarray(scale).reshape(-1)[p] if scaled else 1.0)
    got = jax.jit(_dispatch_call, static_argnums=4)(x, pos, row_pair, scale, k)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(_dispatch_xla(x, pos, row_pair, scale, k)), want)



@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 12), k=st.integers(1, 5), r=st.integers(0, 40), d=st.integers(1, 9),
       seed=st.integers(0, 2**31 - 1))
def test_combine_fallback_matches_the_cpu_target(t, k, r, d, seed):
    """The combine's pure-JAX fallback (what a GPU without the CUDA library and other platforms run) against the
    CPU target and a NumPy sum on arbitrary positions (in range, out of range): out[t] = sum over valid pairs of
    w * rows[pos]; an invalid pair adds exactly 0, even with an infinite weight."""
    from jax_moe_ffi.ops import dispatch as D
    rng = np.random.default_rng(seed)
    rows = jnp.asarray(rng.standard_normal((r, d)), jnp.float32)
    pos = jnp.asarray(rng.integers(-2, r + 2, (t, k)), jnp.int32)
    valid = (np.asarray(pos) >= 0) & (np.asarray(pos) < r)
    w = np.asarray(rng.random((t, k)) + 0.25, np.float32)
    w[~valid] = np.inf  # a dropped pair's weight must not leak into the sum
    w = jnp.asarray(w)
    want = jax.jit(D._combine_call)(rows, pos, w)
    on_platforms = D._on_platforms
    D._on_platforms = lambda ffi_fn, xla_fn, target, *args: xla_fn(*args)  # the fallback, on this CPU
    try:
        got = jax.jit(D._combine_call)(rows, pos, w)
    finally:
        D._on_platforms = on_platforms
    ref_np = np.zeros((t, d), np.float64)
    for i in range(t):
        for j in range(k):
            if valid[i, j]:
                ref_np[i] += float(w[i, j]) * np.asarray(rows, np.float64)[int(pos[i, j])]
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got), ref_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_fallbacks_save_no_constant_token_sized_residual():
    """A scanned, checkpointed MoE layer under optimize(streams=True): the combine runs in a stream region, whose
    partial evaluation turns arrays built from constants alone into residuals (computed by an argument-less
    region that XLA hoists out of the loop), and a platform-dependent cond zero-fills the residual slots of the
    branches it does not take -- so a pure-JAX fallback that builds a [T, k, D] array from constants cost every
    GPU step a 537 MB fill (Qwen3 step, session 27) although the GPU runs the CUDA kernel. on_platforms runs every
    fallback as a checkpoint that saves nothing. Lowered for cuda here (no CUDA library on this machine: the
    fallback is the branch taken, its residuals visible)."""
    import re
    from jax_moe_ffi import examples
    t, k, d = 64, 2, 48
    fn, (stacked, x) = examples.decoder_scan(tokens=t, d_model=d, d_ff=32, experts=8, top_k=k, layers=3,
                                             dtype=jnp.bfloat16)
    fast = jmf.optimize(fn, mode="dropless", offload="device", streams=True)
    loss = lambda p, x: jnp.sum(fast(p, x).astype(jnp.float32) ** 2)
    text = jax.jit(jax.value_and_grad(loss)).trace(stacked, x).lower(lowering_platforms=("cuda",)).as_text()
    consts = [shape for _, outs in re.findall(r"func.func private @(\w+)\(\) -> \(?([^{]*)", text)
              for shape in re.findall(r"tensor<([0-9x]+)x\w+>", outs)]
    sizes = [int(np.prod([int(v) for v in shp.split("x")])) for shp in consts]
    assert sizes and max(sizes) < t * d, consts  # nothing token-sized (at most [T, k])

# ------------------------------------------------------------------------------- transformations
def test_jit_checkpoint_and_scan():
    rng = np.random.default_rng()
    t, k, e, d, layers = 24, 2, 4, 8, 3
    x = random_x(rng, t, d, jnp.float32)
    ws = jnp.asarray(rng.standard_normal((layers, e, d, d)) / np.sqrt(d), jnp.float32)
    ids = random_ids(rng, t, k, e)
    w = jnp.asarray(rng.random((t, k)), jnp.float32)

    def model(dispatch, combine, remat):
        def body(h, expert_w):
            f = lambda h: h + _layer(dispatch, combine, h, w, expert_w, ids, e, capacity=10, align=2)
            return (jax.checkpoint(f) if remat else f)(h), None
        return lambda x, ws: jnp.sum(jax.lax.scan(body, x, ws)[0] ** 2)

    want = jax.grad(model(ref.moe_dispatch_reference, ref.moe_combine_reference, False), argnums=(0, 1))(x, ws)
    for remat in (False, True):
        got = jax.jit(jax.grad(model(jmf.moe_dispatch, jmf.moe_combine, remat), argnums=(0, 1)))(x, ws)
        for g, r in zip(got, want):
            assert rel_err(g, r) <= 1e-5

    # routing crosses jit boundaries as a pytree of arrays
    rows, sizes, routing = jax.jit(lambda x: jmf.moe_dispatch(x, ids, e, capacity=10))(x)
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(routing))
    assert len(jax.tree.leaves(routing)) == 4
    y = jax.jit(jmf.moe_combine)(rows, routing, w)
    _, _, routing_r = ref.moe_dispatch_reference(x, ids, e, capacity=10)
    assert rel_err(y, ref.moe_combine_reference(rows, routing_r, w)) <= 1e-6


def test_vmap():
    rng = np.random.default_rng()
    x = jnp.stack([random_x(rng, 6, 4, jnp.float32) for _ in range(2)])
    ids = jnp.stack([random_ids(rng, 6, 2, 3) for _ in range(2)])
    rows, _, routing = jax.vmap(lambda a, b: jmf.moe_dispatch(a, b, 3))(x, ids)
    for i in range(2):
        r_rows, _, r_routing = ref.moe_dispatch_reference(x[i], ids[i], 3)
        np.testing.assert_array_equal(rows[i], r_rows)
        np.testing.assert_array_equal(routing.pos[i], r_routing.pos)


# ----------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("call, exc, needle", [
    (lambda x, i: jmf.moe_dispatch(x[0], i, 4), ValueError, "`x`"),
    (lambda x, i: jmf.moe_dispatch(x.astype(jnp.int32), i, 4), TypeError, "`x`"),
    (lambda x, i: jmf.moe_dispatch(x, i.astype(jnp.float32), 4), TypeError, "`expert_ids`"),
    (lambda x, i: jmf.moe_dispatch(x, i[:3], 4), ValueError, "`expert_ids`"),
    (lambda x, i: jmf.moe_dispatch(x, i[:, 0], 4), ValueError, "`expert_ids`"),
    (lambda x, i: jmf.moe_dispatch(x, i[:, :0], 4), ValueError, "`expert_ids`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 0), ValueError, "`num_experts`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 4.0), TypeError, "`num_experts`"),
    (lambda x, i: jmf.moe_dispatch(x, i, jnp.int32(4) + jnp.zeros((), jnp.int32)), None, None),
    (lambda x, i: jmf.moe_dispatch(x, i, 4, capacity=-1), ValueError, "`capacity`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 4, capacity=2.5), TypeError, "`capacity`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 4, align=0), ValueError, "`align`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 4, capacity=2, keep=jnp.ones(i.shape, bool)), ValueError, "`keep`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 4, keep=jnp.ones((5, 1), bool)), ValueError, "`keep`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 4, keep=jnp.ones(i.shape, jnp.int32)), TypeError, "`keep`"),
    (lambda x, i: jmf.moe_dispatch(x, i, 4, recipe="mxfp8"), NotImplementedError, "recipe"),
])
def test_bad_dispatch_inputs(call, exc, needle):
    x = jnp.ones((5, 3), jnp.float32)
    ids = jnp.zeros((5, 2), jnp.int32)
    if exc is None:  # a concrete JAX scalar works as a static int
        call(x, ids)
        return
    with pytest.raises(exc, match=needle):
        call(x, ids)


def test_bad_combine_inputs():
    x = jnp.ones((5, 3), jnp.float32)
    rows, _, routing = jmf.moe_dispatch(x, jnp.zeros((5, 2), jnp.int32), 4)
    w = jnp.ones((5, 2))
    with pytest.raises(ValueError, match="`weights`"):
        jmf.moe_combine(rows, routing, jnp.ones((5, 3)))
    with pytest.raises(TypeError, match="`weights`"):
        jmf.moe_combine(rows, routing, jnp.ones((5, 2), jnp.int32))
    with pytest.raises(ValueError, match="`rows`"):
        jmf.moe_combine(rows[:-1], routing, w)
    with pytest.raises(ValueError, match="`rows`"):
        jmf.moe_combine(rows[0], routing, w)
    with pytest.raises(TypeError, match="`rows`"):
        jmf.moe_combine(rows.astype(jnp.int32), routing, w)
    with pytest.raises(TypeError, match="`routing`"):
        jmf.moe_combine(rows, (routing.pos, routing.row_pair), w)
    with pytest.raises(TypeError, match="`num_experts`"):
        jax.jit(lambda n: jmf.moe_dispatch(x, jnp.zeros((5, 2), jnp.int32), n))(4)


@settings(deadline=None, max_examples=25)
@given(st.integers(1, 20), st.integers(1, 4), st.integers(1, 7), st.integers(1, 9), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_dispatch_rows_of_a_regrouped_routing(t, k, e, d, bad, seed):
    """One routing of the T*k pairs made once with one choice per row, seen again with k choices per token
    (MoeRouting.regroup), moves x [T, D] exactly as moe_dispatch(x, ids [T, k]) does; the un-weighted combine of
    the one-choice routing un-sorts each pair's row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(-1 if bad else 0, e + (1 if bad else 0), (t, k)).astype(np.int32)
    x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
    rows, gs, want = jmf.moe_dispatch(x, jnp.asarray(ids), e)
    flat = moe_routing(jnp.asarray(ids.reshape(t * k, 1)), e)
    routing = flat.regroup(k)
    np.testing.assert_array_equal(np.asarray(routing.pos), np.asarray(want.pos))
    np.testing.assert_array_equal(np.asarray(routing.row_pair), np.asarray(want.row_pair))
    np.testing.assert_array_equal(np.asarray(routing.group_sizes), np.asarray(gs))
    got = jmf.moe_dispatch_rows(x, routing)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(rows))
    y = np.asarray(jmf.moe_combine(got * 2.0, flat, None)).reshape(t, k, d)
    xk = np.broadcast_to(np.asarray(x)[:, None, :], (t, k, d)) * 2.0
    kept = ((ids >= 0) & (ids < e))[..., None]
    np.testing.assert_array_equal(y, np.where(kept, xk, 0.0))
    # the backward of the dispatch by a routing is the un-weighted combine: each token sums its kept rows' cotangents
    ct = jnp.asarray(rng.standard_normal(rows.shape), jnp.float32)
    gx = jax.grad(lambda v: jnp.sum(jmf.moe_dispatch_rows(v, routing) * ct))(x)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(jmf.moe_combine(ct, routing, None)), rtol=1e-6)


def test_bad_dispatch_rows_and_regroup_inputs():
    x = jnp.ones((6, 3), jnp.float32)
    _, _, routing = jmf.moe_dispatch(x, jnp.zeros((6, 2), jnp.int32), 4)
    with pytest.raises(ValueError, match="`x`.*T = 6"):
        jmf.moe_dispatch_rows(jnp.ones((5, 3)), routing)
    with pytest.raises(TypeError, match="`x`"):
        jmf.moe_dispatch_rows(x.astype(jnp.int32), routing)
    with pytest.raises(TypeError, match="`routing`"):
        jmf.moe_dispatch_rows(x, (routing.pos, routing.row_pair))
    with pytest.raises(ValueError, match="top_k=5 must divide the 12"):
        routing.regroup(5)
    assert routing.regroup(4).pos.shape == (3, 4) and routing.regroup(1).top_k == 1


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("k", [1, 8, 10, 17])  # the token-major gather takes pairs 8 at a time
def test_gpu_top_k_batches(k):
    from jax_moe_ffi.ops.dispatch import _dispatch_call
    rng = np.random.default_rng()
    t, e, d = 300, 7, 136
    ids = random_ids(rng, t, k, e, 0.05)
    x = random_x(rng, t, d, jnp.bfloat16)
    for kw in ({}, dict(capacity=2 * t * k // (3 * e), align=16)):
        rows, sizes, routing = jmf.moe_dispatch(x, ids, e, **kw)
        rows_r, sizes_r, routing_r = ref.moe_dispatch_reference(x, ids, e, **kw)
        np.testing.assert_array_equal(np.asarray(routing.pos), np.asarray(routing_r.pos))
        np.testing.assert_array_equal(np.asarray(rows, np.float32), np.asarray(rows_r, np.float32))
    scale = jnp.asarray(rng.random((t, k)) + 0.5, jnp.float32)
    got = jax.jit(_dispatch_call, static_argnums=4)(x, routing.pos, routing.row_pair, scale, k)
    rp = np.asarray(routing.row_pair)
    ok = rp >= 0
    want = np.zeros((rp.shape[0], d), np.float32)
    want[ok] = np.asarray(x, np.float32)[rp[ok] // k] * np.asarray(scale).reshape(-1)[rp[ok]][:, None]
    want = np.asarray(jnp.asarray(want, jnp.bfloat16), np.float32)  # one rounding to the row dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2048, 1000, 7])  # 16-byte vectors, 8/4-byte fallbacks, 2-byte fallback
def test_gpu_matches_reference(dtype, d):
    from jax_moe_ffi import _registry
    assert "jax_moe_ffi_dispatch" in _registry.cuda_targets, _registry.cuda_load_error
    rng = np.random.default_rng()
    t, k, e = 4096, 8, 128
    ids = random_ids(rng, t, k, e, 0.01)
    for kw in ({}, dict(capacity=300, align=128), dict(keep=jnp.asarray(rng.random((t, k)) < 0.9), align=16)):
        x = random_x(rng, t, d, dtype)
        rows, sizes, routing = jmf.moe_dispatch(x, ids, e, **kw)
        rows_r, sizes_r, routing_r = ref.moe_dispatch_reference(x, ids, e, **kw)
        for a, b in zip(jax.tree.leaves(routing), jax.tree.leaves(routing_r)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(np.asarray(rows, np.float32), np.asarray(rows_r, np.float32))
        w = jnp.asarray(rng.random((t, k)), jnp.float32)
        y = jmf.moe_combine(rows, routing, w)
        assert rel_err(y, ref.moe_combine_reference(rows_r, routing_r, w)) <= TOL[dtype]
        y2 = jmf.moe_combine(rows, routing, w)
        np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y2, np.float32))  # deterministic
        cot = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)

        def loss(dispatch, combine):
            def f(x, w):
                rows, _, routing = dispatch(x, ids, e, **kw)
                return jnp.sum(combine(rows * 2, routing, w).astype(jnp.float32) * cot)
            return f

        g = jax.grad(loss(jmf.moe_dispatch, jmf.moe_combine), argnums=(0, 1))(x, w)
        r = jax.grad(loss(ref.moe_dispatch_reference, ref.moe_combine_reference), argnums=(0, 1))(x, w)
        assert rel_err(g[0], r[0]) <= TOL[dtype] and rel_err(g[1], r[1]) <= TOL[dtype]
        # the un-weighted combine (weights folded into the rows): value, and its VJP (the dispatch gather)
        ones = jnp.ones((t, k), jnp.float32)
        ys, vjp = jax.vjp(lambda rr: jmf.moe_combine(rr, routing, None), rows)
        assert rel_err(ys, ref.moe_combine_reference(rows_r, routing_r, ones)) <= TOL[dtype]
        cot_y = cot.astype(dtype)
        (dr,) = vjp(cot_y)
        dr_ref = jax.vjp(lambda rr: ref.moe_combine_reference(rr, routing_r, ones), rows_r)[1](cot_y)[0]
        np.testing.assert_array_equal(np.asarray(dr, np.float32), np.asarray(dr_ref, np.float32))
