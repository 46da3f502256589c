"""Family (5): `jax.lax.ragged_dot` / `ragged_dot_general` in a model is swapped for the grouped GEMM ops
(forward, transposed-rhs and ragged-contraction forms), at top level and inside scan / checkpoint / shard_map;
other layouts are left to XLA and reported. Checked against the original function on fresh random inputs."""
import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

import jax_moe_ffi as jmf
from helpers import cpu_lowered_text

WGRAD_DIMS = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([0], [0]), ([], [])),
                                               lhs_ragged_dimensions=[0], rhs_group_dimensions=[])


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def custom_calls(fn, *args):
    return collections.Counter(re.findall(r"custom_call @(\w+)", cpu_lowered_text(fn, *args)))


def sizes(rng, m, g, total):
    w = rng.random(g) * (rng.random(g) > 0.3)
    if w.sum() == 0:
        w[0] = 1
    s = np.floor(w / w.sum() * total).astype(np.int32)
    s[np.argmax(s)] += total - s.sum()
    return jnp.asarray(s)


def expert_mlp(gs, transposed_down):
    """A dropless expert MLP written with ragged_dot: up (rhs [G,K,N]), SiLU, down ([G,N,K] or [G,K,N])."""
    def f(x, w_up, w_down):
        h = jax.nn.silu(jax.lax.ragged_dot(x, w_up, gs))
        if transposed_down:
            dims = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [2]), ([], [])),
                                                     lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
            return jax.lax.ragged_dot_general(h, w_down, gs, dims)
        return jax.lax.ragged_dot(h, w_down, gs)
    return f


@given(st.integers(1, 60), st.integers(1, 24), st.integers(1, 24), st.integers(1, 6), st.integers(0, 8),
       st.booleans(), st.integers(0, 2**31 - 1))
def test_ragged_dot_mlp_is_swapped_and_matches(m, k, n, g, under, transposed, seed):
    rng = np.random.default_rng(seed)
    total = max(m - under, 0)
    gs = sizes(rng, m, g, total)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w_up = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)
    w_down = jnp.asarray(rng.standard_normal((g, k, n) if transposed else (g, n, k)), jnp.float32)
    f = expert_mlp(gs, transposed)
    fast = jmf.optimize(f)
    ref = f(x, w_up, w_down)
    out = fast(x, w_up, w_down)
    assert rel(out, ref) < 1e-5
    loss = lambda fn: (lambda *a: jnp.sum(jnp.sin(fn(*a))))
    for a, b in zip(jax.grad(loss(fast), (0, 1, 2))(x, w_up, w_down), jax.grad(loss(f), (0, 1, 2))(x, w_up, w_down)):
        if np.linalg.norm(np.asarray(b)) > 0:
            assert rel(a, b) < 1e-5
    calls = custom_calls(fast, x, w_up, w_down)
    assert calls["jax_moe_ffi_grouped_gemm"] == 2, calls
    text = cpu_lowered_text(fast, x, w_up, w_down)
    assert "ragged_dot" not in text


def test_wgrad_form_and_bf16_with_f32_output():
    rng = np.random.default_rng(3)
    m, k, n, g = 50, 16, 24, 4
    gs = sizes(rng, m, g, m - 3)
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    d = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    f = lambda a, d: jax.lax.ragged_dot_general(a, d, gs, WGRAD_DIMS, preferred_element_type=jnp.float32)
    fast = jmf.optimize(f)
    out = fast(a, d)
    assert out.dtype == jnp.float32 and out.shape == (g, k, n)
    assert rel(out, f(a, d)) < 1e-5
    assert custom_calls(fast, a, d)["jax_moe_ffi_grouped_gemm_wgrad"] == 1
    r = jmf.explain(f, a, d)
    assert len(r.sites) == 1 and r.sites[0].family == "ragged" and "wgrad" in r.sites[0].notes[0]


def test_float32_operands_with_a_bf16_output():
    """EasyDeL's STANDARD_MOE path: float32 rows and weights, preferred_element_type bfloat16. XLA accumulates in
    float32 and rounds once; the swap does the same (float32 GEMM, one rounding)."""
    rng = np.random.default_rng(9)
    m, k, n, g = 64, 32, 48, 5
    gs = sizes(rng, m, g, m - 4)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)
    f = lambda x, w: jax.lax.ragged_dot(x, w, gs, preferred_element_type=jnp.bfloat16)
    fast = jmf.optimize(f)
    out = fast(x, w)
    assert out.dtype == jnp.bfloat16
    exact = jax.lax.ragged_dot(x, w, gs, preferred_element_type=jnp.float32)
    assert rel(out, exact) < 2 ** -8 and rel(out, f(x, w)) < 2 ** -8
    assert custom_calls(fast, x, w)["jax_moe_ffi_grouped_gemm"] == 1
    g1 = jax.grad(lambda *a: jnp.sum(fast(*a).astype(jnp.float32) ** 2), (0, 1))(x, w)
    g0 = jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2), (0, 1))(x, w)
    assert all(rel(a, b) < 1e-2 for a, b in zip(g1, g0))


@pytest.mark.parametrize("out", [jnp.float32, jnp.bfloat16])
def test_mixed_operand_dtypes_are_converted_to_the_output_dtype(out):
    """EasyDeL's GPT-OSS path: bf16 rows against float32 expert weights. XLA converts both operands to the output
    dtype (f32: widened; bf16: the weights rounded); so does the swap."""
    rng = np.random.default_rng(10)
    m, k, n, g = 48, 16, 24, 4
    gs = sizes(rng, m, g, m)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)
    f = lambda x, w: jax.lax.ragged_dot(x, w, gs, preferred_element_type=out)
    fast = jmf.optimize(f)
    got = fast(x, w)
    assert got.dtype == out and custom_calls(fast, x, w)["jax_moe_ffi_grouped_gemm"] == 1
    tol = 1e-6 if out == jnp.float32 else 2 ** -8
    assert rel(got, f(x, w)) < tol and rel(got, f(x.astype(out), w.astype(out))) < tol
    if out == jnp.bfloat16:  # (not the widened product: the weights' rounding shows)
        assert rel(f(x, w), jax.lax.ragged_dot(x.astype(jnp.float32), w, gs)) > 4 * rel(got, f(x, w))
    g1 = jax.grad(lambda *a: jnp.sum(fast(*a).astype(jnp.float32) ** 2), (0, 1))(x, w)
    g0 = jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2), (0, 1))(x, w)
    assert g1[0].dtype == jnp.bfloat16 and rel(g1[0], g0[0]) < 1e-2 and rel(g1[1], g0[1]) < 1e-2


def test_inside_scan_and_checkpoint():
    rng = np.random.default_rng(4)
    m, k, n, g, layers = 32, 8, 16, 4, 3
    gs = sizes(rng, m, g, m)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    ws = (jnp.asarray(rng.standard_normal((layers, g, k, n)) / 3, jnp.float32),
          jnp.asarray(rng.standard_normal((layers, g, n, k)) / 4, jnp.float32))
    mlp = expert_mlp(gs, False)

    def f(x, ws):
        body = jax.checkpoint(lambda h, w: (h + mlp(h, *w), None))
        return jax.lax.scan(body, x, ws)[0]

    fast = jmf.optimize(f)
    assert rel(fast(x, ws), f(x, ws)) < 1e-5
    g1 = jax.grad(lambda *a: jnp.sum(fast(*a) ** 2), (0, 1))(x, ws)
    g0 = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), (0, 1))(x, ws)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        assert rel(a, b) < 1e-5
    assert "ragged_dot" not in cpu_lowered_text(fast, x, ws)
    assert len(jmf.explain(f, x, ws).sites) == 2


def test_inside_shard_map():
    from jax.sharding import AxisType, PartitionSpec as P
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(5)
    m, k, n, g = 40, 16, 24, 5
    gs = sizes(rng, m, g, m - 5)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)
    f = lambda a, w: jax.shard_map(lambda a, w: jax.nn.relu(jax.lax.ragged_dot(a, w, gs)), mesh=mesh,
                                   in_specs=(P("x"), P()), out_specs=P("x"), check_vma=False)(a, w)
    fast = jmf.optimize(f)
    assert rel(fast(x, w), f(x, w)) < 1e-5
    g1 = jax.grad(lambda *a: jnp.sum(fast(*a) ** 2), (0, 1))(x, w)
    g0 = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), (0, 1))(x, w)
    assert all(rel(a, b) < 1e-5 for a, b in zip(g1, g0))
    assert custom_calls(fast, x, w)["jax_moe_ffi_grouped_gemm"] == 1
    r = jmf.explain(f, x, w)
    assert r.sites[0].path.startswith("shard_map")


def test_unsupported_layouts_are_left_to_xla_and_reported():
    rng = np.random.default_rng(6)
    b, m, k, n, g = 2, 12, 8, 8, 3
    gs = jnp.asarray([[4, 4, 4], [2, 5, 5]], jnp.int32)
    lhs = jnp.asarray(rng.standard_normal((b, m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((b, g, k, n)), jnp.float32)
    dims = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([2], [2]), ([0], [0])),
                                             lhs_ragged_dimensions=[1], rhs_group_dimensions=[1])
    f = lambda a, w: jax.lax.ragged_dot_general(a, w, gs, dims)
    r = jmf.explain(f, lhs, rhs)
    assert not r.sites and any("batch dimensions" in mm.reason for mm in r.misses), str(r)
    with pytest.warns(RuntimeWarning, match="no MoE site"):
        out = jmf.optimize(f)(lhs, rhs)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(f(lhs, rhs)))


def test_the_packages_own_ops_are_not_sites():
    # grouped_matmul is a custom_vjp whose XLA fallback branch is a ragged_dot: bound whole, never a site.
    x, w, gs = jnp.ones((16, 8)), jnp.ones((2, 8, 4)), jnp.asarray([8, 8], jnp.int32)
    r = jmf.explain(lambda x, w: jmf.grouped_matmul(x, w, gs), x, w)
    assert not r.sites and not r.misses, str(r)


@pytest.mark.gpu
def test_gpu_bf16_ragged_dot_mlp_runs_the_cuda_kernels():
    """On the H200: a bf16 expert MLP written with ragged_dot, through optimize, runs our CUDA grouped GEMM
    (no XLA ragged_dot left in the compiled executable) and matches XLA's answer in f32 to bf16 tolerance."""
    rng = np.random.default_rng(8)
    m, k, n, g = 8192, 1024, 512, 32
    gs = sizes(rng, m, g, m - 100)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w_up = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    w_down = jnp.asarray(rng.standard_normal((g, n, k)) / np.sqrt(n), jnp.bfloat16)
    f = expert_mlp(gs, False)
    fast = jax.jit(jmf.optimize(f))
    ref = jax.jit(lambda *a: f(*(t.astype(jnp.float32) for t in a)))(x, w_up, w_down)
    assert rel(fast(x, w_up, w_down), ref) < 1e-2
    compiled = fast.lower(x, w_up, w_down).compile().as_text()
    assert "jax_moe_ffi_grouped_gemm" in compiled and not re.search(r"\bragged-dot\(", compiled)
    g1 = jax.jit(jax.grad(lambda *a: jnp.sum(jmf.optimize(f)(*a).astype(jnp.float32)), (0, 1, 2)))(x, w_up, w_down)
    g0 = jax.jit(jax.grad(lambda *a: jnp.sum(f(*(t.astype(jnp.float32) for t in a))), (0, 1, 2)))(x, w_up, w_down)
    assert all(rel(a, b) < 2e-2 for a, b in zip(g1, g0))
