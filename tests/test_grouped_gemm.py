"""grouped_matmul / grouped_matmul_wgrad against jax.lax.ragged_dot and a float64 NumPy reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

import jax_moe_ffi as jmf

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def rel_err(out, ref):
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite values in the output"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def np_group_rows(sizes, m):
    """Reference of the package's group-size rule in plain Python."""
    rows, start = [], 0
    for s in sizes:
        b = min(start, m)
        e = min(b + max(int(s), 0), m)
        rows.append((b, e))
        start = e
    return rows


def np_gmm(lhs, rhs, sizes, transpose_rhs=False):
    lhs = np.asarray(lhs, np.float64)
    rhs = np.asarray(rhs, np.float64)
    w = np.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    out = np.zeros((lhs.shape[0], w.shape[2]))
    for g, (b, e) in enumerate(np_group_rows(sizes, lhs.shape[0])):
        out[b:e] = lhs[b:e] @ w[g]
    return out


def np_wgrad(lhs, dout, sizes):
    lhs = np.asarray(lhs, np.float64)
    dout = np.asarray(dout, np.float64)
    out = np.zeros((len(sizes), lhs.shape[1], dout.shape[1]))
    for g, (b, e) in enumerate(np_group_rows(sizes, lhs.shape[0])):
        out[g] = lhs[b:e].T @ dout[b:e]
    return out


def random_sizes(rng, m, g, total=None, empty_frac=0.3):
    """Random group sizes summing to `total` (<= m), with some empty groups."""
    total = m if total is None else total
    w = rng.random(g) * (rng.random(g) > empty_frac)
    if w.sum() == 0:
        w[rng.integers(g)] = 1.0
    sizes = np.floor(w / w.sum() * total).astype(np.int32)
    sizes[np.argmax(sizes)] += total - sizes.sum()
    return sizes


def rand(rng, shape, dtype):
    return jnp.asarray(rng.standard_normal(shape), dtype)


shapes = st.fixed_dictionaries({
    "m": st.integers(0, 70), "k": st.integers(1, 40), "n": st.integers(1, 40), "g": st.integers(1, 6),
    "under": st.integers(0, 10), "seed": st.integers(0, 2**31 - 1),
    "dtype": st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]),
})


@given(shapes)
def test_forward_matches_ragged_dot_and_numpy(p):
    rng = np.random.default_rng(p["seed"])
    total = max(p["m"] - p["under"], 0)
    sizes = random_sizes(rng, p["m"], p["g"], total)
    lhs = rand(rng, (p["m"], p["k"]), p["dtype"])
    rhs = rand(rng, (p["g"], p["k"], p["n"]), p["dtype"])
    gs = jnp.asarray(sizes)
    out = jmf.grouped_matmul(lhs, rhs, gs, preferred_element_type=jnp.float32)
    ref = np_gmm(lhs, rhs, sizes)
    assert out.shape == ref.shape and out.dtype == jnp.float32
    if ref.size:
        assert rel_err(out, ref) < 1e-5  # f32 accumulation of exactly-representable products
        xla = jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32)
        assert rel_err(out, xla) < 1e-5
    # rows past the total are exactly zero
    assert np.all(np.asarray(out[total:]) == 0)


@given(shapes)
def test_output_dtype_rounding(p):
    rng = np.random.default_rng(p["seed"])
    sizes = random_sizes(rng, p["m"], p["g"])
    lhs = rand(rng, (p["m"], p["k"]), p["dtype"])
    rhs = rand(rng, (p["g"], p["k"], p["n"]), p["dtype"])
    out = jmf.grouped_matmul(lhs, rhs, jnp.asarray(sizes))
    assert out.dtype == p["dtype"]
    ref = np_gmm(lhs, rhs, sizes)
    if np.linalg.norm(ref) > 0:
        assert rel_err(out, ref) < TOL[p["dtype"]]


@given(shapes)
def test_transposed_rhs_is_dgrad_form(p):
    rng = np.random.default_rng(p["seed"])
    sizes = random_sizes(rng, p["m"], p["g"], max(p["m"] - p["under"], 0))
    lhs = rand(rng, (p["m"], p["k"]), jnp.float32)
    rhs_t = rand(rng, (p["g"], p["n"], p["k"]), jnp.float32)  # [G, N, K]
    out = jmf.grouped_matmul(lhs, rhs_t, jnp.asarray(sizes), transpose_rhs=True)
    ref = np_gmm(lhs, rhs_t, sizes, transpose_rhs=True)
    if ref.size and np.linalg.norm(ref) > 0:
        assert rel_err(out, ref) < 1e-5


@given(shapes)
def test_wgrad_matches_numpy_and_ragged_dot_general(p):
    rng = np.random.default_rng(p["seed"])
    total = max(p["m"] - p["under"], 0)
    sizes = random_sizes(rng, p["m"], p["g"], total)
    lhs = rand(rng, (p["m"], p["k"]), p["dtype"])
    dout = rand(rng, (p["m"], p["n"]), p["dtype"])
    out = jmf.grouped_matmul_wgrad(lhs, dout, jnp.asarray(sizes), preferred_element_type=jnp.float32)
    ref = np_wgrad(lhs, dout, sizes)
    for g in np.flatnonzero(sizes == 0):
        assert np.all(np.asarray(out[g]) == 0), "empty groups must be zero"
    if np.linalg.norm(ref) > 0:
        assert rel_err(out, ref) < 1e-5
        dims = jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
        xla = jax.lax.ragged_dot_general(lhs, dout, jnp.asarray(sizes), dims,
                                         preferred_element_type=jnp.float32)
        assert rel_err(out, xla) < 1e-5


@given(shapes)
def test_gradients_match_ragged_dot(p):
    rng = np.random.default_rng(p["seed"])
    m = max(p["m"], 1)
    sizes = jnp.asarray(random_sizes(rng, m, p["g"], max(m - p["under"], 0)))
    lhs = rand(rng, (m, p["k"]), jnp.float32)
    rhs = rand(rng, (p["g"], p["k"], p["n"]), jnp.float32)
    cot = rand(rng, (m, p["n"]), jnp.float32)

    def loss(f):
        return lambda a, b: jnp.sum(f(a, b, sizes) * cot)

    ours = jax.grad(loss(jmf.grouped_matmul), (0, 1))(lhs, rhs)
    ref = jax.grad(loss(jax.lax.ragged_dot), (0, 1))(lhs, rhs)
    for o, r in zip(ours, ref):
        if np.linalg.norm(np.asarray(r)) > 0:
            assert rel_err(o, r) < 1e-5


def test_second_order_through_wgrad():
    """The wgrad op has its own VJP: grad of a function of the weight gradient."""
    rng = np.random.default_rng(0)
    sizes = jnp.asarray([3, 0, 5], jnp.int32)
    lhs, rhs = rand(rng, (10, 6), jnp.float32), rand(rng, (3, 6, 4), jnp.float32)

    def inner(f):
        return lambda a, b: jnp.sum(jnp.sin(f(a, b, sizes)))

    def outer(f):
        return lambda a, b: jnp.sum(jax.grad(inner(f), 1)(a, b) ** 2)

    ours = jax.grad(outer(jmf.grouped_matmul), (0, 1))(lhs, rhs)
    # ragged_dot has no second-order rule; the dense pure-JAX reference does.
    ref = jax.grad(outer(jmf.reference.grouped_matmul), (0, 1))(lhs, rhs)
    for o, r in zip(ours, ref):
        assert rel_err(o, r) < 1e-4


def test_bf16_gradients_keep_dtypes():
    rng = np.random.default_rng(1)
    sizes = jnp.asarray([5, 7, 0, 4], jnp.int32)
    lhs, rhs = rand(rng, (20, 16), jnp.bfloat16), rand(rng, (4, 16, 24), jnp.bfloat16)
    f = lambda a, b: jnp.sum(jmf.grouped_matmul(a, b, sizes, preferred_element_type=jnp.float32) ** 2)
    dl, dr = jax.grad(f, (0, 1))(lhs, rhs)
    assert dl.dtype == jnp.bfloat16 and dr.dtype == jnp.bfloat16
    r = lambda a, b: jnp.sum(jax.lax.ragged_dot(a, b, sizes, preferred_element_type=jnp.float32) ** 2)
    rl, rr = jax.grad(r, (0, 1))(lhs.astype(jnp.float32), rhs.astype(jnp.float32))
    assert rel_err(dl, rl) < 2e-2 and rel_err(dr, rr) < 2e-2


# ---------------------------------------------------------------- composability

def _problem(seed=0, m=24, k=8, n=12, g=3):
    rng = np.random.default_rng(seed)
    sizes = jnp.asarray(random_sizes(rng, m, g, m - 2), jnp.int32)
    return rand(rng, (m, k), jnp.float32), rand(rng, (g, k, n), jnp.float32), sizes


def test_jit_and_grad_in_jit():
    lhs, rhs, gs = _problem()
    f = jax.jit(jax.value_and_grad(lambda a, b, s: jnp.sum(jmf.grouped_matmul(a, b, s) ** 2), (0, 1)))
    r = jax.value_and_grad(lambda a, b, s: jnp.sum(jax.lax.ragged_dot(a, b, s) ** 2), (0, 1))
    (v, g), (rv, rg) = f(lhs, rhs, gs), r(lhs, rhs, gs)
    assert rel_err(v, rv) < 1e-5 and all(rel_err(x, y) < 1e-5 for x, y in zip(g, rg))


def test_vmap_batches_sequentially():
    rng = np.random.default_rng(3)
    lhs = rand(rng, (4, 24, 8), jnp.float32)
    rhs = rand(rng, (4, 3, 8, 12), jnp.float32)
    gs = jnp.asarray(np.stack([random_sizes(rng, 24, 3, 20 + i) for i in range(4)]), jnp.int32)
    out = jax.vmap(jmf.grouped_matmul)(lhs, rhs, gs)
    for i in range(4):
        assert rel_err(out[i], np_gmm(lhs[i], rhs[i], np.asarray(gs[i]))) < 1e-5


def test_scan_and_checkpoint():
    lhs, rhs, gs = _problem(1)
    w = jnp.stack([rhs[..., :8], 0.5 * rhs[..., :8]])  # two "layers" of [G, K, K]

    def model(mm, x, ws):
        def layer(h, wl):
            return jnp.tanh(jax.checkpoint(lambda h, wl: mm(h, wl, gs))(h, wl)), None
        return jnp.sum(jax.lax.scan(layer, x, ws)[0] ** 2)

    ours = jax.jit(jax.grad(lambda x, ws: model(jmf.grouped_matmul, x, ws), (0, 1)))(lhs, w)
    ref = jax.grad(lambda x, ws: model(jax.lax.ragged_dot, x, ws), (0, 1))(lhs, w)
    assert all(rel_err(o, r) < 1e-5 for o, r in zip(ours, ref))


def test_export_round_trip():
    lhs, rhs, gs = _problem(2)
    f = jax.jit(lambda a, b, s: jmf.grouped_matmul(a, b, s))
    exp = jax.export.export(f, disabled_checks=jmf.export_disabled_checks())(lhs, rhs, gs)
    blob = exp.serialize()
    again = jax.export.deserialize(blob)
    out = again.call(lhs, rhs, gs)
    assert "jax_moe_ffi_grouped_gemm" in exp.mlir_module()
    assert rel_err(out, np_gmm(lhs, rhs, np.asarray(gs))) < 1e-5


def test_lowered_hlo_uses_the_custom_call():
    lhs, rhs, gs = _problem()
    text = jax.jit(jax.grad(lambda a, b: jnp.sum(jmf.grouped_matmul(a, b, gs) ** 2), (0, 1))).lower(lhs, rhs).as_text()
    assert text.count("@jax_moe_ffi_grouped_gemm(") >= 2  # forward and dgrad
    assert "transpose_rhs = true" in text  # dgrad uses the kernel flag...
    assert "stablehlo.transpose" not in text  # ...and no materialised transpose
    assert text.count("@jax_moe_ffi_grouped_gemm_wgrad(") == 1


# ---------------------------------------------------------------- bad input

def test_bad_shapes_and_dtypes_name_the_argument():
    lhs, rhs, gs = _problem()
    with pytest.raises(ValueError, match="`lhs` must be rank 2"):
        jmf.grouped_matmul(lhs[None], rhs, gs)
    with pytest.raises(ValueError, match="`rhs` must be rank 3"):
        jmf.grouped_matmul(lhs, rhs[0], gs)
    with pytest.raises(ValueError, match="contraction sizes differ"):
        jmf.grouped_matmul(lhs[:, :5], rhs, gs)
    with pytest.raises(ValueError, match="`group_sizes` must have shape \\(3,\\)"):
        jmf.grouped_matmul(lhs, rhs, gs[:2])
    with pytest.raises(TypeError, match="`group_sizes` must be an integer"):
        jmf.grouped_matmul(lhs, rhs, gs.astype(jnp.float32))
    with pytest.raises(TypeError, match="same dtype"):
        jmf.grouped_matmul(lhs, rhs.astype(jnp.bfloat16), gs)
    with pytest.raises(TypeError, match="`lhs` must be float32"):
        jmf.grouped_matmul(lhs.astype(jnp.int32), rhs, gs)
    with pytest.raises(TypeError, match="preferred_element_type"):
        jmf.grouped_matmul(lhs, rhs, gs, preferred_element_type=jnp.float16)
    with pytest.raises(ValueError, match="same M"):
        jmf.grouped_matmul_wgrad(lhs, lhs[:3], gs)
    with pytest.raises(ValueError, match="recipe"):
        jmf.grouped_matmul(lhs, rhs, gs, recipe="nvfp4")


@pytest.mark.parametrize("sizes", [[-5, 10, 30], [30, 30, 30], [-1, -1, -1], [0, 0, 100], [24, -3, 7]])
def test_negative_and_oversized_group_sizes_are_clipped(sizes):
    """Documented rule: negative sizes count as 0; groups are clipped to the M rows. Never out of bounds."""
    lhs, rhs, _ = _problem(4)
    gs = jnp.asarray(sizes, jnp.int32)
    out = jmf.grouped_matmul(lhs, rhs, gs)
    ref = np_gmm(lhs, rhs, sizes)
    assert rel_err(out, ref) < 1e-5 or np.linalg.norm(ref) == 0 and np.all(np.asarray(out) == 0)
    dout = rand(np.random.default_rng(5), (lhs.shape[0], rhs.shape[2]), jnp.float32)
    w = jmf.grouped_matmul_wgrad(lhs, dout, gs)
    wref = np_wgrad(lhs, dout, sizes)
    for g in range(3):
        if np.linalg.norm(wref[g]) == 0:
            assert np.all(np.asarray(w[g]) == 0)
        else:
            assert rel_err(w[g], wref[g]) < 1e-5
    # the pure-JAX reference follows the same rule
    assert rel_err(jmf.reference.grouped_matmul(lhs, rhs, gs), ref) < 1e-5 or np.linalg.norm(ref) == 0


def test_reference_matches_numpy():
    rng = np.random.default_rng(7)
    sizes = random_sizes(rng, 30, 4, 26)
    lhs, rhs = rand(rng, (30, 9), jnp.float32), rand(rng, (4, 9, 5), jnp.float32)
    dout = rand(rng, (30, 5), jnp.float32)
    assert rel_err(jmf.reference.grouped_matmul(lhs, rhs, jnp.asarray(sizes)), np_gmm(lhs, rhs, sizes)) < 1e-5
    assert rel_err(jmf.reference.grouped_matmul_wgrad(lhs, dout, jnp.asarray(sizes)),
                   np_wgrad(lhs, dout, sizes)) < 1e-5


def test_import_does_not_initialise_a_backend():
    import subprocess, sys
    code = ("import jax_moe_ffi, jax._src.xla_bridge as xb; "
            "import sys; sys.exit(0 if not xb._backends else 3)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- accumulate form and the shared-lhs pair (the gate/up dgrads summed in the second GEMM's epilogue)

@given(shapes, st.booleans(), st.booleans())
def test_accumulate_form_matches_numpy(p, transpose_rhs, addend_f32):
    rng = np.random.default_rng(p["seed"])
    total = max(p["m"] - p["under"], 0)
    sizes = random_sizes(rng, p["m"], p["g"], total)
    lhs = rand(rng, (p["m"], p["k"]), p["dtype"])
    rhs = rand(rng, (p["g"], p["n"], p["k"]) if transpose_rhs else (p["g"], p["k"], p["n"]), p["dtype"])
    add_dt = jnp.float32 if addend_f32 else p["dtype"]
    addend = rand(rng, (p["m"], p["n"]), add_dt)
    gs = jnp.asarray(sizes)
    out = jax.jit(lambda a, b, s, c: jmf.grouped_matmul_acc(a, b, s, c, transpose_rhs=transpose_rhs))(
        lhs, rhs, gs, addend)
    assert out.dtype == addend.dtype and out.shape == addend.shape
    ref = np_gmm(lhs, rhs, sizes, transpose_rhs) + np.asarray(addend, np.float64)
    assert rel_err(out, ref) <= TOL[add_dt] * 2
    # rows in no group are the addend's, unchanged
    np.testing.assert_array_equal(np.asarray(out[total:], np.float32), np.asarray(addend[total:], np.float32))
    ref_jax = jmf.reference.grouped_matmul_acc(lhs, rhs, gs, addend, transpose_rhs=transpose_rhs)
    assert rel_err(out, np.asarray(ref_jax, np.float64)) <= TOL[add_dt] * 2


@given(shapes)
def test_shared_lhs_pair_gradients_match_ragged_dot(p):
    rng = np.random.default_rng(p["seed"])
    total = max(p["m"] - p["under"], 0)
    sizes = jnp.asarray(random_sizes(rng, p["m"], p["g"], total))
    dt = p["dtype"]
    lhs = rand(rng, (p["m"], p["k"]), dt)
    w1 = rand(rng, (p["g"], p["k"], p["n"]), dt)
    w2 = rand(rng, (p["g"], p["n"], p["k"]), dt)  # the second one in the transposed layout
    c1 = jnp.asarray(rng.standard_normal((p["m"], p["n"])), jnp.float32)
    c2 = jnp.asarray(rng.standard_normal((p["m"], p["n"])), jnp.float32)

    def ours(a, u, v):
        y1, y2 = jmf.grouped_matmuls_shared_lhs(a, (u, v), sizes, transpose_rhs=(False, True),
                                                preferred_element_type=jnp.float32)
        return jnp.sum(y1 * c1) + jnp.sum(y2 * c2)

    def ref(a, u, v):
        y1 = jax.lax.ragged_dot(a, u, sizes, preferred_element_type=jnp.float32)
        y2 = jax.lax.ragged_dot(a, jnp.swapaxes(v, 1, 2), sizes, preferred_element_type=jnp.float32)
        return jnp.sum(y1 * c1) + jnp.sum(y2 * c2)

    f32 = lambda *xs: [x.astype(jnp.float32) for x in xs]
    g_ours = jax.jit(jax.grad(ours, (0, 1, 2)))(lhs, w1, w2)
    g_ref = jax.grad(ref, (0, 1, 2))(*f32(lhs, w1, w2))
    for name, a, b in zip(("lhs", "w1", "w2"), g_ours, g_ref):
        assert a.dtype == dt, name
        if np.linalg.norm(np.asarray(b)) > 0:
            assert rel_err(a, b) <= 2 * TOL[dt], name


def test_shared_lhs_backward_uses_the_accumulate_call_not_an_add(monkeypatch):
    """With the two-product dgrad off (JAX_MOE_FFI_SUM_DGRAD=0; test_sum_dgrad_* covers it on), the second
    dgrad of a pair accumulates into the first in place."""
    monkeypatch.setenv("JAX_MOE_FFI_SUM_DGRAD", "0")
    lhs, rhs, gs = _problem()
    rhs2 = rhs * 2

    def loss(a, u, v):
        y1, y2 = jmf.grouped_matmuls_shared_lhs(a, (u, v), gs)
        return jnp.sum(y1 * y2)

    text = jax.jit(jax.grad(loss)).lower(lhs, rhs, rhs2).as_text()
    acc_calls = [line for line in text.splitlines() if "custom_call @jax_moe_ffi_grouped_gemm_acc(" in line]
    assert len(acc_calls) == 1, text
    # out aliases the addend (operand 3), so the sum is written in place
    assert "output_operand_alias<output_tuple_indices = [], operand_index = 3," in acc_calls[0]


def test_accumulate_bad_addend_names_the_argument():
    lhs, rhs, gs = _problem()
    with pytest.raises(ValueError, match="addend"):
        jmf.grouped_matmul_acc(lhs, rhs, gs, jnp.zeros((lhs.shape[0], rhs.shape[2] + 1), lhs.dtype))
    with pytest.raises(TypeError, match="`addend` must have the input dtype"):
        jmf.grouped_matmul_acc(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), gs,
                               jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float16))
    with pytest.raises(ValueError, match="rhss"):
        jmf.grouped_matmuls_shared_lhs(lhs, (), gs)


@pytest.mark.parametrize("dt", [jnp.float32, jnp.bfloat16])
def test_pair_launch_gives_the_same_values_and_lowers_to_the_pair_targets(dt, monkeypatch):
    """JAX_MOE_FFI_PAIR_LAUNCH=1: a shared-lhs pair of one layout runs its forward and its two weight gradients as
    one call each (jax_moe_ffi_grouped_gemm_pair / _wgrad_pair, one CUDA launch of 2G problems). On CPU the pair
    is the two single calls, so values and gradients (second order included) equal the unpaired op's exactly;
    lowered for CUDA, the pair targets replace the single forward and wgrad calls."""
    rng = np.random.default_rng(31)
    m, k, n, g = 40, 16, 24, 5
    gs = jnp.asarray([9, 0, 13, 7, 4], jnp.int32)  # sum 33 < M, an empty group
    a, u, v = rand(rng, (m, k), dt), rand(rng, (g, k, n), dt), rand(rng, (g, k, n), dt)
    c1 = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)

    def loss(a, u, v):
        y1, y2 = jmf.grouped_matmuls_shared_lhs(a, (u, v), gs)
        return jnp.sum(y1.astype(jnp.float32) * c1 * y2.astype(jnp.float32))

    def run():
        val, grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(a, u, v)
        hvp = jax.jit(jax.grad(lambda a: jnp.sum(jax.grad(loss, 1)(a, u, v).astype(jnp.float32) ** 2)))(a)
        fwd = jax.jit(lambda a, u, v: jmf.grouped_matmuls_shared_lhs(a, (u, v), gs))(a, u, v)
        return [val, *grads, hvp, *fwd]

    from jax_moe_ffi import _registry
    from jax_moe_ffi.ops import grouped_gemm as gg

    def cuda_text():  # lowered for CUDA as if the CUDA library were loaded (lowering needs no GPU)
        with monkeypatch.context() as mp:
            mp.setattr(_registry, "cuda_targets", tuple(_registry.CUDA_SYMBOLS))
            return jax.jit(jax.grad(loss, (0, 1, 2))).trace(a, u, v).lower(lowering_platforms=("cuda",)).as_text()

    monkeypatch.setenv("JAX_MOE_FFI_SUM_DGRAD", "0")  # the dgrads as counted below (the sum: its own test)
    monkeypatch.setenv("JAX_MOE_FFI_PAIR_LAUNCH", "0")
    single = run()
    text0 = cuda_text()
    monkeypatch.setenv("JAX_MOE_FFI_PAIR_LAUNCH", "1")
    paired = run()
    text1 = cuda_text()
    assert gg.PAIR_TARGET in _registry.CUDA_SYMBOLS and gg.WGRAD_PAIR_TARGET in _registry.CUDA_SYMBOLS
    for x, y in zip(paired, single):
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    ref = jax.lax.ragged_dot(a.astype(jnp.float32), u.astype(jnp.float32), gs)
    assert rel_err(paired[5], ref) <= 2 * TOL[dt]
    count = lambda t, name: t.count(f"custom_call @{name}(")
    pairs = lambda t: (count(t, "jax_moe_ffi_grouped_gemm_pair"), count(t, "jax_moe_ffi_grouped_gemm_wgrad_pair"))
    assert pairs(text0) == (0, 0)
    if dt == jnp.float32:  # the CUDA kernels take 16-bit operands: XLA's ragged_dot there, paired or not
        assert pairs(text1) == (0, 0) and count(text1, "jax_moe_ffi_grouped_gemm") == 0
        return
    # unpaired: 2 forwards + the first dgrad, the second dgrad accumulating into it, 2 wgrads
    assert [count(text0, t) for t in ("jax_moe_ffi_grouped_gemm", "jax_moe_ffi_grouped_gemm_acc",
                                      "jax_moe_ffi_grouped_gemm_wgrad")] == [3, 1, 2], text0
    assert pairs(text1) == (1, 1), text1
    assert [count(text1, t) for t in ("jax_moe_ffi_grouped_gemm", "jax_moe_ffi_grouped_gemm_acc",
                                      "jax_moe_ffi_grouped_gemm_wgrad")] == [1, 1, 0], text1


@pytest.mark.parametrize("dt", [jnp.float32, jnp.bfloat16])
def test_sum_dgrad_matches_float64_and_lowers_to_the_sum_target(dt, monkeypatch):
    """JAX_MOE_FFI_SUM_DGRAD=1: a shared-lhs pair's lhs gradient dout0 . rhs0^T + dout1 . rhs1^T is one call
    (jax_moe_ffi_grouped_gemm_sum: on CUDA one K loop over both products). Its value (one rounding of the float32
    sum) against a float64 reference of the same operands, rows no group covers zero; the other gradients and a
    second-order gradient through it equal the default path's; lowered for CUDA, the sum target replaces the
    dgrad and the accumulating dgrad."""
    rng = np.random.default_rng(37)
    m, k, n, g = 40, 16, 24, 5
    sizes = np.array([9, 0, 13, 7, 4])  # sum 33 < M, an empty group
    gs = jnp.asarray(sizes, jnp.int32)
    a, u, v = rand(rng, (m, k), dt), rand(rng, (g, k, n), dt), rand(rng, (g, k, n), dt)
    c1 = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    c2 = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)

    def loss(a, u, v):
        y1, y2 = jmf.grouped_matmuls_shared_lhs(a, (u, v), gs)
        return jnp.sum(y1.astype(jnp.float32) * c1 + (y2.astype(jnp.float32) ** 2) * c2)

    def run():
        grads = jax.jit(jax.grad(loss, (0, 1, 2)))(a, u, v)
        hvp = jax.jit(jax.grad(lambda u: jnp.sum(jax.grad(loss, 0)(a, u, v).astype(jnp.float32) ** 2)))(u)
        return [*grads, hvp]

    from jax_moe_ffi import _registry
    from jax_moe_ffi.ops import grouped_gemm as gg

    def cuda_text():
        with monkeypatch.context() as mp:
            mp.setattr(_registry, "cuda_targets", tuple(_registry.CUDA_SYMBOLS))
            return jax.jit(jax.grad(loss, (0, 1, 2))).trace(a, u, v).lower(lowering_platforms=("cuda",)).as_text()

    monkeypatch.setenv("JAX_MOE_FFI_PAIR_LAUNCH", "0")  # single forward calls, as counted below
    monkeypatch.setenv("JAX_MOE_FFI_SUM_DGRAD", "0")
    default = run()
    text0 = cuda_text()
    monkeypatch.setenv("JAX_MOE_FFI_SUM_DGRAD", "1")
    summed = run()
    text1 = cuda_text()
    assert gg.SUM_TARGET in _registry.CUDA_SYMBOLS
    # float64 reference of the lhs gradient from the same (rounded) cotangents the op receives
    y2 = np.asarray(jmf.grouped_matmul(a, v, gs), np.float64)
    d1 = np.asarray(np.asarray(c1, np.float32).astype(dt), np.float64)
    d2 = np.asarray(np.asarray(2 * y2 * np.asarray(c2), np.float32).astype(dt), np.float64)
    ref = np.zeros((m, k))
    uu, vv = np.asarray(u, np.float64), np.asarray(v, np.float64)
    for gi, (b, e) in enumerate(zip(np.cumsum(sizes) - sizes, np.cumsum(sizes))):
        ref[b:e] = d1[b:e] @ uu[gi].T + d2[b:e] @ vv[gi].T
    assert rel_err(summed[0], ref) <= TOL[dt]
    assert np.all(np.asarray(summed[0], np.float32)[sizes.sum():] == 0)
    assert rel_err(summed[0], default[0]) <= 2 * TOL[dt]
    for x, y in zip(summed[1:3], default[1:3]):  # weight gradients do not go through the sum
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    assert rel_err(summed[3], default[3]) <= 4 * TOL[dt]
    count = lambda t, name: t.count(f"custom_call @{name}(")
    assert count(text0, gg.SUM_TARGET) == 0
    if dt == jnp.float32:  # 16-bit operands only on CUDA: XLA's ragged_dot there
        assert count(text1, gg.SUM_TARGET) == 0
        return
    # default: y2's forward (y1 is only used linearly: XLA drops its forward), the first dgrad and the second
    # accumulating into it; summed: the forward and the one sum call
    assert [count(text0, t) for t in ("jax_moe_ffi_grouped_gemm", "jax_moe_ffi_grouped_gemm_acc")] == [2, 1], text0
    assert count(text1, gg.SUM_TARGET) == 1, text1
    assert [count(text1, t) for t in ("jax_moe_ffi_grouped_gemm", "jax_moe_ffi_grouped_gemm_acc")] == [1, 0], text1
