"""top_k (jax_moe_ffi.ops.topk): bitwise jax.lax.top_k on CPU (and on the H200, gpu-marked), ties, NaN, signed
zeros and infinities included; gradients; clear errors; the pass swaps routers' top_k for it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jax_moe_ffi as jmf
from jax_moe_ffi.ops import topk

SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)


def assert_same(ours, ref):
    for x, y in zip(ours, ref):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


def make_rows(rng, shape, dtype, ties: bool, specials: bool):
    x = rng.integers(-4, 4, shape).astype(np.float32) if ties else rng.standard_normal(shape).astype(np.float32)
    if specials:
        mask = rng.random(shape) < 0.1
        x[mask] = rng.choice(SPECIALS, size=int(mask.sum()))
    return jnp.asarray(x, dtype)


@given(rows=st.integers(1, 40), n=st.integers(1, 1024), kk=st.integers(1, 32), ties=st.booleans(),
       specials=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_bitwise_lax_top_k(rows, n, kk, ties, specials, seed):
    k = min(kk, n)
    x = make_rows(np.random.default_rng(seed), (rows, n), jnp.float32, ties, specials)
    f = jax.jit(topk.top_k, static_argnums=1)
    assert "jax_moe_ffi_top_k" in f.lower(x, k).as_text()
    assert_same(f(x, k), jax.lax.top_k(x, k))


def test_leading_dims_vmap_and_gradient():
    rng = np.random.default_rng(3)
    x = make_rows(rng, (3, 5, 128), jnp.float32, ties=True, specials=False)
    assert_same(topk.top_k(x, 8), jax.lax.top_k(x, 8))
    assert_same(jax.vmap(lambda r: topk.top_k(r, 4))(x), jax.vmap(lambda r: jax.lax.top_k(r, 4))(x))
    w = jnp.asarray(rng.standard_normal((3, 5, 8)), jnp.float32)
    g = jax.grad(lambda x: jnp.sum(topk.top_k(x, 8)[0] * w))(x)
    g_ref = jax.grad(lambda x: jnp.sum(jax.lax.top_k(x, 8)[0] * w))(x)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(g_ref))
    assert float(jnp.abs(g).sum()) > 0
    t = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)  # forward mode too
    np.testing.assert_array_equal(np.asarray(jax.jvp(lambda x: topk.top_k(x, 8)[0], (x,), (t,))[1]),
                                  np.asarray(jax.jvp(lambda x: jax.lax.top_k(x, 8)[0], (x,), (t,))[1]))


def test_lowers_to_the_kernel_and_other_rows_say_so():
    x = jnp.ones((4, 128), jnp.float32)
    assert "custom_call @jax_moe_ffi_top_k(" in jax.jit(lambda x: topk.top_k(x, 8)).lower(x).as_text()
    rng = np.random.default_rng(0)
    for other, why in ((jnp.asarray(rng.standard_normal((2, 1500)), jnp.float32), "rows of 1500"),
                       (make_rows(rng, (3, 64), jnp.bfloat16, ties=True, specials=False), "float32 only")):
        with pytest.warns(RuntimeWarning, match=f"lax.top_k runs instead.*{why}"):
            out = topk.top_k(other, 8)
        assert_same(out, jax.lax.top_k(other, 8))
        assert "jax_moe_ffi_top_k" not in jax.jit(lambda x: topk.top_k(x, 8)).lower(other).as_text()


def test_bad_arguments_name_them():
    with pytest.raises(TypeError, match="`x`"):
        topk.top_k(jnp.ones((4, 8), jnp.int32), 2)
    with pytest.raises(ValueError, match="`k`"):
        topk.top_k(jnp.ones((4, 8), jnp.float32), 9)
    with pytest.raises(ValueError, match="`k`"):
        topk.top_k(jnp.ones((4, 8), jnp.float32), -1)
    # the handler's own checks (common/topk_shapes.h, shared with CUDA), reached past the wrapper
    outs = (jax.ShapeDtypeStruct((4, 3), jnp.float32), jax.ShapeDtypeStruct((4, 3), jnp.int32))
    with pytest.raises(Exception, match="k must be in \\[1, 2\\] for N = 2"):
        jax.ffi.ffi_call(topk.TARGET, outs)(jnp.ones((4, 2), jnp.float32), k=np.int64(3))
    with pytest.raises(Exception, match="x must be float32"):
        jax.ffi.ffi_call(topk.TARGET, outs)(jnp.ones((4, 8), jnp.bfloat16), k=np.int64(3))


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(128, 8), (8, 2), (64, 6), (160, 8), (256, 8), (384, 8), (1024, 32), (33, 32)])
def test_gpu_bitwise_lax_top_k(n, k):
    """The CUDA kernel against XLA's own top_k on the same GPU, with ties and special values (float32: on the
    H200, XLA's bfloat16 top_k orders ties otherwise, 3-37% of the outputs in session 11, so bf16 stays XLA's)."""
    dtype = jnp.float32
    rng = np.random.default_rng(n * 31 + k)
    for ties, specials in ((False, False), (True, False), (True, True)):
        x = make_rows(rng, (8193, n), dtype, ties, specials)
        f = jax.jit(lambda x: topk.top_k(x, min(k, n)))
        assert 'custom_call_target="jax_moe_ffi_top_k"' in f.lower(x).compile().as_text()
        assert_same(f(x), jax.jit(lambda x: jax.lax.top_k(x, min(k, n)))(x))


def test_the_pass_swaps_router_top_k_and_nothing_changes(monkeypatch):
    """optimize(): the router's top_k of an MoE program runs on this kernel (explain says so) with the same
    outputs and gradients as with lax.top_k kept (JAX_MOE_FFI_ROUTER_TOPK=0); a program without an MoE site
    keeps lax.top_k."""
    from jax_moe_ffi import models
    p = models.init_moe_params(jax.random.PRNGKey(0), 64, 32, 8, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), (96, 64))
    f = lambda p, x: models.capacity_moe(p, x, 2, 1.25)
    loss = lambda fn: (lambda p, x: jnp.sum(fn(p, x) ** 2))

    def run():
        fast = jmf.optimize(f)
        text = jax.jit(fast).lower(p, x).as_text()
        return text, jax.jit(fast)(p, x), jax.jit(jax.grad(loss(fast)))(p, x), str(jmf.explain(f, p, x))

    text1, y1, g1, rep1 = run()
    monkeypatch.setenv("JAX_MOE_FFI_ROUTER_TOPK", "0")
    text0, y0, g0, rep0 = run()
    assert text1.count("custom_call @jax_moe_ffi_top_k(") == 1 and "jax_moe_ffi_top_k" not in text0
    assert "router top_k: 1 swapped" in rep1 and "router top_k" not in rep0
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y0))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    monkeypatch.delenv("JAX_MOE_FFI_ROUTER_TOPK")
    with pytest.warns(RuntimeWarning):  # no MoE site: behaviour-identical code, warned once
        plain = jmf.optimize(lambda x: jax.lax.top_k(x, 2))
        assert "jax_moe_ffi_top_k" not in jax.jit(plain).lower(x).as_text()


@pytest.mark.parametrize("streams", [True, False])
def test_the_pass_swaps_a_side_branch_top_k_too(streams):
    """A load-balancing loss that routes again beside the MoE layer (its own top_k): with streams=True optimize()
    evaluates it on the shared-expert stream as a side branch; its top_k is swapped there as well (before session
    27 it stayed lax.top_k, which XLA:GPU sorts), with the same loss and gradients as lax.top_k."""
    from jax_moe_ffi import models
    p = models.init_moe_params(jax.random.PRNGKey(0), 64, 32, 8, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(np.random.SeedSequence().entropy % 1000), (96, 64))

    def f(p, x):
        probs = jax.nn.softmax(x @ p["router"], axis=-1)
        _, e = jax.lax.top_k(probs, 2)  # the aux loss's own routing
        aux = jnp.sum(jnp.mean(jax.nn.one_hot(e, 8), axis=(0, 1)) * jnp.mean(probs, axis=0))
        return models.dense_moe(p, x, 2), aux

    loss = lambda fn: (lambda p, x: (lambda y, a: jnp.sum(y ** 2) + a)(*fn(p, x)))
    fast = jmf.optimize(f, mode="dropless", streams=streams)
    text = jax.jit(fast).lower(p, x).as_text()
    assert text.count("custom_call @jax_moe_ffi_top_k(") == 2, text.count("custom_call @jax_moe_ffi_top_k(")
    assert "router top_k: 2 swapped" in str(jmf.explain(f, p, x))
    y, a = jax.jit(fast)(p, x)
    ref_y, ref_a = f(p, x)
    np.testing.assert_allclose(np.asarray(a), np.asarray(ref_a), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref_y), rtol=1e-4, atol=1e-5)
    g = jax.grad(loss(fast))(p, x)
    g_ref = jax.grad(loss(f))(p, x)
    for k in g:  # dropless f32 accumulation order against the dense model's: relative to the leaf's norm
        diff = np.linalg.norm(np.asarray(g[k]) - np.asarray(g_ref[k])) / np.linalg.norm(np.asarray(g_ref[k]))
        assert diff < 1e-5, (k, diff)
