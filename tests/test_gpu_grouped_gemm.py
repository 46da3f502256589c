"""GPU (H200) checks of the CUDA grouped GEMM: benchmark shapes and random shapes against XLA in f32,
determinism, zero rows/groups, clear errors. Run on the device with `pytest -m gpu`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_moe_ffi as jmf
from jax_moe_ffi import _registry

pytestmark = pytest.mark.gpu

SHAPES = [(65536, 2048, 1536, 128), (65536, 768, 2048, 128), (32768, 7168, 4096, 32),
          (32768, 2048, 7168, 32), (32768, 4096, 3072, 16)]


def rel(out, ref):
    out = jnp.asarray(out, jnp.float32)
    ref = jnp.asarray(ref, jnp.float32)
    assert bool(jnp.all(jnp.isfinite(out)))
    return float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))


def sizes_for(rng, m, g, total, kind):
    if kind == "even":
        s = np.full(g, total // g)
        s[: total - s.sum()] += 1
    else:
        w = rng.dirichlet(np.full(g, 0.5)) * (rng.random(g) > 0.2)
        if w.sum() == 0:
            w[0] = 1
        s = np.floor(w / w.sum() * total).astype(np.int64)
        s[np.argmax(s)] += total - s.sum()
    return jnp.asarray(s, jnp.int32)


# References: XLA's own ragged_dot on the same 16-bit inputs with float32 accumulation and output (products of
# 16-bit floats are exact in f32): an independent implementation.
def ragged_f32(lhs, rhs, gs):
    return jax.jit(lambda a, b, s: jax.lax.ragged_dot(a, b, s, preferred_element_type=jnp.float32))(lhs, rhs, gs)


# The wgrad reference is one masked dense dot per group (lax.map), not XLA's ragged_dot_general: that one
# materialises both operands per group ([G, M, K] and [G, M, N] in bf16: 59 GB on the 65536 x 2048 x 1536 x 128
# shape), which ran out of memory on an 80 GB H100 (session 34) while our kernel's outputs were right.
def wgrad_f32(lhs, dout, gs):
    def per_group(a, d, s):
        ends = jnp.cumsum(s)
        row_group = jnp.searchsorted(ends, jnp.arange(a.shape[0]), side="right")

        def one(e):
            keep = (row_group == e)[:, None].astype(a.dtype)   # 0/1 in bf16: the masked product stays exact
            return jnp.dot((a * keep).T, d, preferred_element_type=jnp.float32)
        return jax.lax.map(one, jnp.arange(s.shape[0]))
    return jax.jit(per_group)(lhs, dout, gs)


def test_cuda_library_loaded():
    assert "jax_moe_ffi_grouped_gemm" in _registry.cuda_targets, _registry.cuda_load_error
    assert "jax_moe_ffi_grouped_gemm_wgrad" in _registry.cuda_targets


def test_custom_call_is_in_the_gpu_executable():
    lhs = jnp.ones((256, 64), jnp.bfloat16)
    rhs = jnp.ones((4, 64, 32), jnp.bfloat16)
    gs = jnp.asarray([64] * 4, jnp.int32)
    text = jax.jit(jmf.grouped_matmul).lower(lhs, rhs, gs).compile().as_text()
    assert 'custom_call_target="jax_moe_ffi_grouped_gemm"' in text


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["even", "skew"])
def test_benchmark_shapes_fwd_dgrad_wgrad(shape, kind):
    m, k, n, g = shape
    key = jax.random.PRNGKey(hash((shape, kind)) % 2**31)
    k1, k2, k3 = jax.random.split(key, 3)
    lhs = jax.random.normal(k1, (m, k), jnp.bfloat16)
    rhs = (jax.random.normal(k2, (g, k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    dout = jax.random.normal(k3, (m, n), jnp.bfloat16)
    gs = sizes_for(np.random.default_rng(g), m, g, m, kind)
    out = jmf.grouped_matmul(lhs, rhs, gs)
    assert out.dtype == jnp.bfloat16
    assert rel(out, ragged_f32(lhs, rhs, gs)) < 1e-2
    dl = jmf.grouped_matmul(dout, rhs, gs, transpose_rhs=True)
    assert rel(dl, ragged_f32(dout, jnp.swapaxes(rhs, 1, 2), gs)) < 1e-2
    dw = jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=jnp.float32)
    assert rel(dw, wgrad_f32(lhs, dout, gs)) < 1e-2


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("dtype,out_f32", [(jnp.bfloat16, False), (jnp.bfloat16, True),
                                           (jnp.float16, False), (jnp.float16, True)])
def test_random_shapes_empty_groups_sum_below_m(seed, dtype, out_f32):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 3000))
    k = 8 * int(rng.integers(1, 80))
    n = 8 * int(rng.integers(1, 80))
    g = int(rng.integers(1, 40))
    total = int(rng.integers(0, m + 1)) if seed % 3 else m
    gs = sizes_for(rng, m, g, total, "skew")
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), dtype)
    dout = jnp.asarray(rng.standard_normal((m, n)), dtype)
    pet = jnp.float32 if out_f32 else None
    out = jmf.grouped_matmul(lhs, rhs, gs, preferred_element_type=pet)
    ref = ragged_f32(lhs, rhs, gs)
    assert bool(jnp.all(out[total:] == 0)), "rows past the total must be zero"
    if total:
        assert rel(out, ref) < 1e-2
    dw = jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=pet)
    empty = np.flatnonzero(np.asarray(gs) == 0)
    assert bool(jnp.all(dw[empty] == 0)), "empty groups must be zero"
    if total:
        assert rel(dw, wgrad_f32(lhs, dout, gs)) < 1e-2
        dl = jmf.grouped_matmul(dout, rhs, gs, transpose_rhs=True, preferred_element_type=pet)
        assert rel(dl, ragged_f32(dout, jnp.swapaxes(rhs, 1, 2), gs)) < 1e-2


@pytest.mark.parametrize("g,n,rows", [(300, 2048, 40), (1000, 520, 40), (257, 136, 40), (150, 2048, 160)])
def test_many_groups_each_with_its_own_descriptors(g, n, rows):
    """More groups than SMs, a fifth of them empty and the rest of uneven sizes: every persistent CTA moves to another
    group on nearly every tile, so each tile's loads and stores go through the per-group TMA descriptors that
    BuildGroupTensormapsKernel wrote before the GEMM (group_tensormaps.cuh). A wrong or missing descriptor puts a
    tile's rows in another group's place or leaves them unwritten. Forward and dgrad (`rows` a group on average: 40
    runs the 64-row ping-pong kernel, 160 the 128x256 1x2 kernel with 128x64 subtiles), wgrad (cooperative 128x256 2x1;
    empty groups zero) and the accumulate form (its epilogue reads C through CUTLASS's per-SM descriptors, its mainloop through the
    prebuilt ones) against XLA in f32."""
    rng = np.random.default_rng(g)
    k = 264
    m = rows * g + 77
    w = rng.dirichlet(np.full(g, 0.7)) * (rng.random(g) > 0.2)
    gs = np.floor(w / w.sum() * (m - 77)).astype(np.int32)  # the last 77 rows (and the floors' rest) past the total
    total = int(gs.sum())
    gs = jnp.asarray(gs)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    out = jmf.grouped_matmul(lhs, rhs, gs)
    assert bool(jnp.all(out[total:] == 0))
    assert rel(out, ragged_f32(lhs, rhs, gs)) < 1e-2
    dl = jmf.grouped_matmul(dout, rhs, gs, transpose_rhs=True)
    assert rel(dl, ragged_f32(dout, jnp.swapaxes(rhs, 1, 2), gs)) < 1e-2
    dw = jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=jnp.float32)
    assert bool(jnp.all(dw[np.flatnonzero(np.asarray(gs) == 0)] == 0))
    assert rel(dw, wgrad_f32(lhs, dout, gs)) < 1e-2
    addend = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    acc = jax.jit(lambda a, b, s, c: jmf.grouped_matmul_acc(a, b, s, c))(lhs, rhs, gs, addend)
    assert bool(jnp.all(acc[total:] == addend[total:]))
    assert rel(acc, ragged_f32(lhs, rhs, gs) + addend.astype(jnp.float32)) < 1e-2


def _on_stale_memory(fn, shape, dtype):
    """fn() right after freeing a NaN-filled buffer of its output's size, so that the allocator is likely to
    hand that memory to fn's output: whatever the kernels do not write then reads NaN, not a fresh zero page.
    Returns (output, whether the output got the freed buffer)."""
    jax.block_until_ready(fn())  # compiled, its own temporaries allocated once
    junk = jax.block_until_ready(jnp.full(shape, jnp.nan, dtype))
    where = junk.unsafe_buffer_pointer()
    junk.delete()
    out = jax.block_until_ready(fn())
    return out, out.unsafe_buffer_pointer() == where


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_zeroed_regions_on_reused_memory(dtype):
    """Rows past the sum (forward, dgrad) and empty groups (wgrad) are zeroed by the setup kernel's launch
    (grouped_gemm_run.cuh, Zero), not left to the allocator: checked on memory that held NaNs. At least one of
    the three outputs must have landed on the freed buffer, else the check proves nothing and fails."""
    rng = np.random.default_rng(21)
    m, k, n, g = 3000, 264, 520, 12
    gs = jnp.asarray([300, 0, 451, 0, 0, 127, 640, 1, 0, 333, 0, 200], jnp.int32)  # sum 2052 < M
    total = int(np.asarray(gs).sum())
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    pet = jnp.float32 if dtype == jnp.float32 else None
    fwd = jax.jit(lambda: jmf.grouped_matmul(lhs, rhs, gs, preferred_element_type=pet))
    dgrad = jax.jit(lambda: jmf.grouped_matmul(dout, rhs, gs, transpose_rhs=True, preferred_element_type=pet))
    wgrad = jax.jit(lambda: jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=pet))
    reused = []
    out, r = _on_stale_memory(fwd, (m, n), dtype)
    reused.append(r)
    assert bool(jnp.all(out[total:] == 0)) and bool(jnp.all(jnp.isfinite(out[:total])))
    assert rel(out[:total], ragged_f32(lhs, rhs, gs)[:total]) < 1e-2
    out, r = _on_stale_memory(dgrad, (m, k), dtype)
    reused.append(r)
    assert bool(jnp.all(out[total:] == 0)) and bool(jnp.all(jnp.isfinite(out[:total])))
    dw, r = _on_stale_memory(wgrad, (g, k, n), dtype)
    reused.append(r)
    empty = np.flatnonzero(np.asarray(gs) == 0)
    assert bool(jnp.all(dw[empty] == 0)) and bool(jnp.all(jnp.isfinite(dw)))
    assert rel(dw, wgrad_f32(lhs, dout, gs)) < 1e-2
    assert any(reused), "no output reused the freed NaN buffer: the zeroing was not exercised"


def test_negative_and_oversized_sizes_follow_the_cpu_rule():
    rng = np.random.default_rng(5)
    lhs = jnp.asarray(rng.standard_normal((300, 64)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((4, 64, 96)), jnp.bfloat16)
    dout = jnp.asarray(rng.standard_normal((300, 96)), jnp.bfloat16)
    for sizes in ([-5, 100, 400, 7], [300, 300, 300, 300], [-1, -1, -1, -1], [0, 0, 0, 1000]):
        gs = jnp.asarray(sizes, jnp.int32)
        gpu = jmf.grouped_matmul(lhs, rhs, gs, preferred_element_type=jnp.float32)
        cpu = jax.jit(jmf.reference.grouped_matmul, static_argnames=("preferred_element_type",))(
            lhs, rhs, gs, preferred_element_type=jnp.float32)
        np.testing.assert_allclose(np.asarray(gpu), np.asarray(cpu), rtol=2e-2, atol=2e-2)
        w = jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=jnp.float32)
        wr = jmf.reference.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=jnp.float32)
        np.testing.assert_allclose(np.asarray(w), np.asarray(wr), rtol=2e-2, atol=5e-2)


def test_bitwise_deterministic():
    rng = np.random.default_rng(9)
    m, k, n, g = 8192, 1024, 768, 16
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)), jnp.bfloat16)
    dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    gs = sizes_for(rng, m, g, m - 100, "skew")
    f = jax.jit(lambda a, b, d: (jmf.grouped_matmul(a, b, gs), jmf.grouped_matmul_wgrad(a, d, gs)))
    a1, w1 = f(lhs, rhs, dout)
    a2, w2 = f(lhs, rhs, dout)
    assert bool(jnp.all(a1 == a2)) and bool(jnp.all(w1 == w2))


def test_grad_under_jit_matches_xla():
    rng = np.random.default_rng(11)
    m, k, n, g = 4096, 512, 256, 8
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    gs = sizes_for(rng, m, g, m, "skew")
    cot = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    ours = jax.jit(jax.grad(lambda a, b: jnp.sum(jmf.grouped_matmul(a, b, gs, preferred_element_type=jnp.float32)
                                                 * cot), (0, 1)))(lhs, rhs)
    ref = jax.grad(lambda a, b: jnp.sum(jax.lax.ragged_dot(a, b, gs, preferred_element_type=jnp.float32) * cot),
                   (0, 1))(lhs.astype(jnp.float32), rhs.astype(jnp.float32))
    assert rel(ours[0], ref[0]) < 1e-2 and rel(ours[1], ref[1]) < 1e-2


def test_unaligned_k_is_a_clear_error():
    lhs = jnp.ones((64, 12), jnp.bfloat16)
    rhs = jnp.ones((2, 12, 16), jnp.bfloat16)
    with pytest.raises(Exception, match="multiple of 8"):
        jax.block_until_ready(jmf.grouped_matmul(lhs, rhs, jnp.asarray([32, 32], jnp.int32)))


@pytest.mark.parametrize("seed", range(8))
def test_accumulate_form_random_shapes(seed):
    # out = addend + product (forward and transposed/dgrad layouts), rows past the total keep the addend.
    rng = np.random.default_rng(100 + seed)
    m = int(rng.integers(1, 3000))
    k = 8 * int(rng.integers(1, 80))
    n = 8 * int(rng.integers(1, 80))
    g = int(rng.integers(1, 40))
    total = int(rng.integers(0, m + 1)) if seed % 3 else m
    gs = sizes_for(rng, m, g, total, "skew")
    dtype = jnp.bfloat16 if seed % 2 else jnp.float16
    add_dt = jnp.float32 if seed % 4 == 3 else dtype
    tr = bool(seed % 2)
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((g, n, k) if tr else (g, k, n)) / np.sqrt(k), dtype)
    addend = jnp.asarray(rng.standard_normal((m, n)), add_dt)
    out = jax.jit(lambda a, b, s, c: jmf.grouped_matmul_acc(a, b, s, c, transpose_rhs=tr))(lhs, rhs, gs, addend)
    assert out.dtype == addend.dtype
    ref = ragged_f32(lhs, jnp.swapaxes(rhs, 1, 2) if tr else rhs, gs) + addend.astype(jnp.float32)
    assert bool(jnp.all(out[total:] == addend[total:])), "rows past the total must keep the addend"
    assert rel(out, ref) < 1e-2


def test_shared_lhs_pair_at_qwen3_shape_matches_xla():
    # The gate/up pair of the Qwen3-30B layer: dlhs accumulated in the second dgrad's epilogue.
    rng = np.random.default_rng(21)
    m, k, n, g = 65536, 2048, 768, 128
    gs = sizes_for(rng, m, g, m - 1000, "skew")
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    wg = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    wu = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    c1 = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    c2 = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)

    def ours(a, u, v):
        y1, y2 = jmf.grouped_matmuls_shared_lhs(a, (u, v), gs)
        return jnp.sum(y1.astype(jnp.float32) * c1) + jnp.sum(y2.astype(jnp.float32) * c2)

    dl = jax.jit(jax.grad(ours))(lhs, wg, wu)
    ref = ragged_f32(c1, jnp.swapaxes(wg, 1, 2), gs) + ragged_f32(c2, jnp.swapaxes(wu, 1, 2), gs)
    assert rel(dl, ref) < 1e-2
    assert bool(jnp.all(dl[m - 1000:] == 0))


# Shapes with more than 128 rows per group, so the 128-row tiles run (not the 64-row ones): N with an
# odd number of 256-wide tiles (c1x1; 768: the default's 128x192 tiles since session 43), an even number (c1x2;
# 1536: also an even number of 192-wide tiles, n192all's case), and a partial last tile; group sizes that
# are not multiples of 128, so most groups have an odd tile count (a 2-CTA cluster along M would pad
# them). Run once per JAX_MOE_FFI_GEMM_TILES value on the device (tools/device_session.sh tiletests).
@pytest.mark.parametrize("n", [520, 768, 776, 1536, 2048])
@pytest.mark.parametrize("tr", [False, True])
def test_large_tile_configs_uneven_groups(n, tr):
    rng = np.random.default_rng(n + tr)
    m, k, g = 5000, 264, 7
    total = m - 333
    gs = sizes_for(rng, m, g, total, "skew")
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, n, k) if tr else (g, k, n)) / np.sqrt(k), jnp.bfloat16)
    ref = ragged_f32(lhs, jnp.swapaxes(rhs, 1, 2) if tr else rhs, gs)
    out = jax.jit(lambda a, b: jmf.grouped_matmul(a, b, gs, transpose_rhs=tr))(lhs, rhs)
    assert bool(jnp.all(out[total:] == 0)), "rows past the total must be zero"
    assert rel(out, ref) < 1e-2
    addend = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    acc = jax.jit(lambda a, b, c: jmf.grouped_matmul_acc(a, b, gs, c, transpose_rhs=tr))(lhs, rhs, addend)
    assert rel(acc, ref + addend.astype(jnp.float32)) < 1e-2
    assert bool(jnp.all(acc[total:] == addend[total:]))


# Wgrad tile configs (JAX_MOE_FFI_WGRAD_TILES=pingpong|coop|c2x2; c2x2 is bf16 -> bf16 only): K and N with
# an even number of 128-wide tiles (no cluster padding) and with odd counts / partial tiles (a 2x2 cluster
# pads them: the padded tiles must be clipped, not written), empty groups, sum < M. Run once per value
# on the device (tools/device_session.sh tiletests).
@pytest.mark.parametrize("k,n", [(768, 2048), (2048, 768), (264, 520), (392, 136)])
def test_wgrad_tile_configs_uneven_groups(k, n):
    rng = np.random.default_rng(k * 7 + n)
    m, g = 6000, 9
    total = m - 517
    gs = np.array(sizes_for(rng, m, g, total, "skew"))
    gs[3] = 0  # an empty group
    gs[4] += total - gs.sum()
    gs = jnp.asarray(gs, jnp.int32)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    dw = jax.jit(lambda a, d: jmf.grouped_matmul_wgrad(a, d, gs))(lhs, dout)
    assert dw.dtype == jnp.bfloat16
    assert bool(jnp.all(dw[3] == 0)), "empty groups must be zero"
    assert rel(dw, wgrad_f32(lhs, dout, gs)) < 1e-2


# The device-side cluster pick (JAX_MOE_FFI_GEMM_TILES=pick, opt-in; bf16 -> bf16, 128-row tiles; run with and
# without it: tools/device_session.sh tiletests): the 2x1-cluster kernel runs when at most
# 1/64 of the row tiles are padding (groups with an odd number of 128-row tiles), else the host's 1x2 / 1x1
# kernel; both are launched and the one not picked gets no tiles. Cases on both sides of the threshold:
# tiles 28 / padded 0 (paired), 65 / 1 (paired: a padded tile is computed on zero rows and clipped),
# 63 / 1 and a skewed draw (not paired), each with empty groups and rows past the total. The accumulate
# form fails if both kernels of the pair ran (the addend would be added twice) or neither did.
@pytest.mark.parametrize("sizes", [
    [256, 512, 0, 768, 256, 1024, 512, 256],
    [128, 2048, 2048, 2048, 2048, 0, 0, 0],
    [100, 2048, 2048, 2048, 1792, 0, 0, 0],
    "skew",
], ids=["t28p0", "t65p1", "t63p1", "skew"])
@pytest.mark.parametrize("n", [768, 2048])
@pytest.mark.parametrize("tr", [False, True])
def test_paired_cluster_pick(sizes, n, tr):
    rng = np.random.default_rng(n + tr + len(str(sizes)))
    g, k = 8, 264
    if sizes == "skew":
        gs = np.array(sizes_for(rng, 5000, g, 4700, "skew"))
    else:
        gs = np.array(sizes)
    total = int(gs.sum())
    m = total + 300
    gs = jnp.asarray(gs, jnp.int32)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, n, k) if tr else (g, k, n)) / np.sqrt(k), jnp.bfloat16)
    ref = ragged_f32(lhs, jnp.swapaxes(rhs, 1, 2) if tr else rhs, gs)
    out = jax.jit(lambda a, b, s: jmf.grouped_matmul(a, b, s, transpose_rhs=tr))(lhs, rhs, gs)
    assert bool(jnp.all(out[total:] == 0)), "rows past the total must be zero"
    assert rel(out, ref) < 1e-2
    addend = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    acc = jax.jit(lambda a, b, s, c: jmf.grouped_matmul_acc(a, b, s, c, transpose_rhs=tr))(lhs, rhs, gs, addend)
    assert rel(acc, ref + addend.astype(jnp.float32)) < 1e-2
    assert bool(jnp.all(acc[total:] == addend[total:]))


# The cluster split (opt-in, JAX_MOE_FFI_GEMM_TILES=split; bf16 -> bf16, 128-row tiles): a 2x1-cluster
# kernel computes each group's whole pairs of 128-row tiles, then the host's 1x2 / 1x1 kernel the last tile of each
# group with an odd count. Both kernels run the same 128x256x64 tile and k order, so the result must be bitwise
# the host's kernel alone (`static`), plain and accumulate forms, forward and dgrad. Group sizes cover even and odd
# tile counts, a partial last tile in either part, tile counts 1 (only the second kernel) and 2, empty groups, rows
# past the total.
_SPLIT_SCRIPT = """
import sys
import jax, jax.numpy as jnp, numpy as np
import jax_moe_ffi as jmf
where = sys.argv[1]
d = np.load(where + "/in.npz")
gs = jnp.asarray(d["gs"])
for tr in (False, True):
    lhs = jnp.asarray(d["lhs"]).view(jnp.bfloat16)
    rhs = jnp.asarray(d["rhs_t" if tr else "rhs"]).view(jnp.bfloat16)
    add = jnp.asarray(d["add"]).view(jnp.bfloat16)
    out = jax.jit(lambda a, b, s: jmf.grouped_matmul(a, b, s, transpose_rhs=tr))(lhs, rhs, gs)
    acc = jax.jit(lambda a, b, s, c: jmf.grouped_matmul_acc(a, b, s, c, transpose_rhs=tr))(lhs, rhs, gs, add)
    np.save(where + "/out%d.npy" % tr, np.asarray(out.view(jnp.uint16)))
    np.save(where + "/acc%d.npy" % tr, np.asarray(acc.view(jnp.uint16)))
"""


# CUDA graphs on for one custom call alone: XLA then captures the handler (and a split's side-stream fork / join).
_GRAPH_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"


def _run_gemm_tiles(where, tiles, launch="serial", graphs=False):
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_MOE_FFI_GEMM_TILES=tiles, JAX_MOE_FFI_SECOND_LAUNCH=launch)
    if graphs:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + _GRAPH_FLAGS).strip()
    subprocess.run([sys.executable, "-c", _SPLIT_SCRIPT, str(where)], env=env, check=True, timeout=240)
    return {f"{kind}{tr}": np.load(where / f"{kind}{tr}.npy") for kind in ("out", "acc") for tr in (0, 1)}


@pytest.mark.parametrize("n", [768, 2048])
@pytest.mark.parametrize("tiles,launch,graphs", [("split", "serial", False), ("tail64", "serial", False),
                                                 ("tail64", "stream", False), ("tail64", "stream", True),
                                                 ("split", "stream", True)])
def test_row_split_is_bitwise_the_host_kernel(tmp_path, n, tiles, launch, graphs):
    """The two-kernel row splits (SplitRows: the cluster split, and the short-tail split whose last <= 64 rows of a
    group run on 64-row tiles) give the host's single kernel's bits, zero rows past the total, the addend kept by the
    accumulate form; the second kernel serial or on a side stream (ForkJoin), also with XLA's command buffers on for
    the custom call (CUSTOM_CALL, minimum graph size 1), where the handler and its fork / join run under capture."""
    rng = np.random.default_rng(n)
    g, k = 9, 264
    # 128-row tiles 2,3,0,1,2,5,1,6,3; last-tile rows 0,44,-,0,1,0,37,127,0 (short tails: 300, 129 and 37 rows)
    gs = np.array([256, 300, 0, 128, 129, 640, 37, 512 + 255, 384], np.int32)
    total = int(gs.sum())
    m = total + 200
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    rhs = (rng.standard_normal((g, k, n)) / np.sqrt(k)).astype(np.float32)
    add = rng.standard_normal((m, n)).astype(np.float32)
    bits = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16).view(jnp.uint16))
    np.savez(tmp_path / "in.npz", lhs=bits(lhs), rhs=bits(rhs), rhs_t=bits(np.swapaxes(rhs, 1, 2)), add=bits(add),
             gs=gs)
    host = _run_gemm_tiles(tmp_path, "static")
    ref = np.asarray(ragged_f32(jnp.asarray(lhs, jnp.bfloat16), jnp.asarray(rhs, jnp.bfloat16), jnp.asarray(gs)))
    split = _run_gemm_tiles(tmp_path, tiles, launch, graphs)
    for key in host:
        got = jnp.asarray(split[key]).view(jnp.bfloat16).astype(jnp.float32)
        want = ref + (np.asarray(jnp.asarray(add, jnp.bfloat16), np.float32) if key.startswith("acc") else 0.0)
        assert rel(got[:total], want[:total]) < 1e-2, (tiles, key)
        if key.startswith("out"):
            assert bool(jnp.all(got[total:] == 0)), (tiles, key)
        assert np.array_equal(host[key], split[key]), (tiles, key, int(np.sum(host[key] != split[key])))


@pytest.mark.parametrize("n", [768, 520])
@pytest.mark.parametrize("tr", [False, True])
def test_pair_launch_bitwise_equals_two_launches(n, tr, monkeypatch):
    """JAX_MOE_FFI_PAIR_LAUNCH=1: the gate/up-style pair's forward (and, without transpose, its two weight
    gradients) as one launch of 2G problems. Every tile runs the same kernel as in two launches, so outputs and
    gradients are bitwise equal, zero rows and empty groups included; the compiled program has the pair calls."""
    rng = np.random.default_rng(41)
    m, k, g = 6000, 1024, 24
    gs = sizes_for(rng, m, g, m - 300, "skew")
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    shape = (g, n, k) if tr else (g, k, n)
    u = jnp.asarray(rng.standard_normal(shape) / np.sqrt(k), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal(shape) / np.sqrt(k), jnp.bfloat16)
    c1 = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)

    def loss(a, u, v):
        y1, y2 = jmf.grouped_matmuls_shared_lhs(a, (u, v), gs, transpose_rhs=(tr, tr))
        return jnp.sum(y1.astype(jnp.float32) * c1 * y2.astype(jnp.float32)), (y1, y2)

    def run():
        f = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))
        return f(a, u, v), f.lower(a, u, v).compile().as_text()

    monkeypatch.setenv("JAX_MOE_FFI_PAIR_LAUNCH", "0")
    single, text0 = run()
    monkeypatch.setenv("JAX_MOE_FFI_PAIR_LAUNCH", "1")
    paired, text1 = run()
    assert 'custom_call_target="jax_moe_ffi_grouped_gemm_pair"' in text1
    assert ('custom_call_target="jax_moe_ffi_grouped_gemm_wgrad_pair"' in text1) == (not tr)
    assert "jax_moe_ffi_grouped_gemm_pair" not in text0
    for x, y in zip(jax.tree.leaves(paired), jax.tree.leaves(single)):
        np.testing.assert_array_equal(np.asarray(x.view(jnp.uint16) if x.dtype == jnp.bfloat16 else x),
                                      np.asarray(y.view(jnp.uint16) if y.dtype == jnp.bfloat16 else y))
    (_, (y1, y2)), _ = paired
    total = int(np.asarray(gs).sum())
    assert bool(jnp.all(y1[total:] == 0)) and bool(jnp.all(y2[total:] == 0))
    ref = ragged_f32(a, jnp.swapaxes(v, 1, 2) if tr else v, gs)
    assert rel(y2, ref) < 1e-2


@pytest.mark.parametrize("m,k,n,g,kind", [
    (65536, 768, 2048, 128, "even"),   # the Qwen3 layer's gate/up dgrad (coop 128x256, 1x2 cluster)
    (6000, 776, 768, 24, "skew"),      # K not a multiple of 64 (each product's last k-tile zero-filled), 1x1
    (6000, 64, 2048, 24, "skew"),      # one k-tile per product
    (1500, 520, 264, 40, "skew"),      # short groups: the 64-row ping-pong tiles
])
def test_gpu_sum_dgrad_vs_float32_reference(m, k, n, g, kind):
    """jax_moe_ffi_grouped_gemm_sum (two products, one K loop, TwoProductMainloop) against XLA's float32
    ragged_dot of the same bf16 operands: the first product alone or a wrong second-product pairing would be
    off by O(1); rows no group covers are zero; two runs are bitwise equal."""
    from jax_moe_ffi.ops import grouped_gemm as gg
    rng = np.random.default_rng(43)
    gs = sizes_for(rng, m, g, m - 257, kind)
    a0 = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    a1 = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    b0 = jnp.asarray(rng.standard_normal((g, n, k)) / np.sqrt(k), jnp.bfloat16)
    b1 = jnp.asarray(rng.standard_normal((g, n, k)) / np.sqrt(k), jnp.bfloat16)
    f = jax.jit(gg._sum_call)
    assert 'custom_call_target="jax_moe_ffi_grouped_gemm_sum"' in f.lower(a0, b0, a1, b1, gs).compile().as_text()
    out = f(a0, b0, a1, b1, gs)
    ref = ragged_f32(a0, jnp.swapaxes(b0, 1, 2), gs) + ragged_f32(a1, jnp.swapaxes(b1, 1, 2), gs)
    assert rel(out, ref) < 8e-3  # one bf16 rounding of the float32 sum
    only_first = ragged_f32(a0, jnp.swapaxes(b0, 1, 2), gs)
    assert rel(only_first, ref) > 0.5  # the test can tell a missing second product
    total = int(np.asarray(gs).sum())
    assert bool(jnp.all(out[total:] == 0))
    np.testing.assert_array_equal(np.asarray(out.view(jnp.uint16)), np.asarray(f(a0, b0, a1, b1, gs).view(jnp.uint16)))


def test_gpu_sum_dgrad_in_the_pair_backward(monkeypatch):
    """JAX_MOE_FFI_SUM_DGRAD=1 in grouped_matmuls_shared_lhs' backward: the lhs gradient matches the default
    (dgrad + accumulating dgrad) within the bf16 rounding it saves; the weight gradients are bitwise equal."""
    rng = np.random.default_rng(47)
    m, k, n, g = 6000, 1024, 768, 24
    gs = sizes_for(rng, m, g, m - 300, "skew")
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    u = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
    c1 = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)

    def loss(a, u, v):
        y1, y2 = jmf.grouped_matmuls_shared_lhs(a, (u, v), gs)
        return jnp.sum(y1.astype(jnp.float32) * c1 * y2.astype(jnp.float32))

    def run():
        f = jax.jit(jax.grad(loss, (0, 1, 2)))
        return f(a, u, v), f.lower(a, u, v).compile().as_text()

    monkeypatch.setenv("JAX_MOE_FFI_SUM_DGRAD", "0")
    default, text0 = run()
    monkeypatch.setenv("JAX_MOE_FFI_SUM_DGRAD", "1")
    summed, text1 = run()
    assert 'custom_call_target="jax_moe_ffi_grouped_gemm_sum"' in text1
    assert "jax_moe_ffi_grouped_gemm_sum" not in text0
    assert rel(summed[0], default[0]) < 1e-2
    for x, y in zip(summed[1:], default[1:]):
        np.testing.assert_array_equal(np.asarray(x.view(jnp.uint16)), np.asarray(y.view(jnp.uint16)))


_GRID_SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import jax_moe_ffi as jmf
rng = np.random.default_rng(5)
m, k, n, g = 9000, 520, 776, 13
w = rng.dirichlet(np.full(g, 0.5)); w[2] = 0
gs = np.floor(w / w.sum() * (m - 211)).astype(np.int32); gs[np.argmax(gs)] += (m - 211) - gs.sum()
gs = jnp.asarray(gs)
a = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
b = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
d = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
f = jax.jit(lambda a, b, d: (jmf.grouped_matmul(a, b, gs), jmf.grouped_matmul(d, b, gs, transpose_rhs=True),
                             jmf.grouped_matmul_wgrad(a, d, gs),
                             *jmf.grouped_matmuls_shared_lhs(a, (b, b[::-1]), gs),
                             *jmf.ops.grouped_gemm._wgrad_pair(a, d, d[::-1], gs, jnp.bfloat16)))
np.savez(sys.argv[1], *[np.asarray(x.astype(jnp.float32)) for x in f(a, b, d)])
"""


@pytest.mark.parametrize("var,value", [("JAX_MOE_FFI_GEMM_GRID", "0.5"), ("JAX_MOE_FFI_GEMM_GRID", "3"),
                                       ("JAX_MOE_FFI_WGRAD_ORDER", "groups"), ("JAX_MOE_FFI_WGRAD_ORDER", "mixed"),
                                       ("JAX_MOE_FFI_WGRAD_SCHEDULE", "n4"),
                                       ("JAX_MOE_FFI_WGRAD_SCHEDULE", "m2"),
                                       ("JAX_MOE_FFI_PAIR_ORDER", "interleave")])
def test_env_knobs_are_bitwise_the_default(var, value, tmp_path):
    """JAX_MOE_FFI_GEMM_GRID (read once per process, so one subprocess per value): a smaller persistent grid
    (SMs left to other streams) or an oversubscribed one computes every tile exactly once with the same
    kernel, so forward, dgrad, wgrad and the pair launch are bitwise the default grid's, zero rows and the
    empty group included. A tile skipped or computed twice would differ. JAX_MOE_FFI_WGRAD_ORDER=groups / mixed: the
    wgrad's problems in group order, or largest / smallest interleaved, instead of largest group first (the
    default) only move tiles between CTAs, so again bitwise; a group's pointers or shape in another group's slot
    would not be.
    JAX_MOE_FFI_WGRAD_SCHEDULE (tiles along N, or swizzled): the same tiles in another order; K = 520 and N = 776
    are 5 and 7 tiles, so the swizzle's rounding adds padded tiles, which must write nothing.
    JAX_MOE_FFI_PAIR_ORDER=interleave: a pair launch's problems (forward and weight gradients) as gate g, up g, ...
    instead of all gates then all ups; a problem written into the other product's slot would differ."""
    import os
    import subprocess
    import sys
    outs = {}
    for name, val in (("default", None), ("scaled", value)):
        env = dict(os.environ)
        env.pop(var, None)
        if val is not None:
            env[var] = val
        path = tmp_path / f"{name}.npz"
        run = subprocess.run([sys.executable, "-c", _GRID_SCRIPT, str(path)], env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        outs[name] = np.load(path)
    for key in outs["default"].files:
        assert np.any(outs["default"][key] != 0)
        np.testing.assert_array_equal(outs["scaled"][key], outs["default"][key])


_PDL_SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import jax_moe_ffi as jmf
rng = np.random.default_rng(6)
m, k, n, g = 9000, 1024, 776, 13
w = rng.dirichlet(np.full(g, 0.5)); w[2] = 0
gs = np.floor(w / w.sum() * (m - 211)).astype(np.int32); gs[np.argmax(gs)] += (m - 211) - gs.sum()
gs = jnp.asarray(gs)
a = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
b = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
d = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
def fp8_loss(a, b):
    return jnp.vdot(jmf.grouped_matmul(a, b, gs, recipe="blockwise", fp8_wgrad=True).astype(jnp.float32),
                    d.astype(jnp.float32))
f = jax.jit(lambda a, b, d: (jmf.grouped_matmul(a, b, gs), jmf.grouped_matmul(d, b, gs, transpose_rhs=True),
                             jmf.grouped_matmul_wgrad(a, d, gs),
                             *jmf.grouped_matmuls_shared_lhs(a, (b, b[::-1]), gs),
                             jmf.grouped_matmul(a, b, gs, recipe="blockwise"),
                             *jax.grad(fp8_loss, argnums=(0, 1))(a, b)))
outs = [[np.asarray(x.astype(jnp.float32)) for x in f(a, b, d)] for _ in range(int(sys.argv[2]))]
for rep in outs[1:]:  # every repeat within the process equals the first
    for x, y in zip(rep, outs[0]):
        np.testing.assert_array_equal(x, y)
np.savez(sys.argv[1], *outs[0])
"""


@pytest.mark.parametrize("command_buffers", [True, False], ids=["graphs", "streams"])
def test_dependent_launch_is_bitwise_serial_launch(command_buffers, tmp_path):
    """JAX_MOE_FFI_PDL=1 (cc/cuda/dependent_launch.cuh) lets the descriptor kernel, the FP8 scale repack and zero
    kernels and the GEMM start before the kernel ahead of them ends; each waits for it before touching memory. A
    missing wait would read the setup kernel's arrays (or the repacked scales) before they are written: garbage
    shapes, pointers or scales, i.e. outputs that differ from a serial launch's, or between repeats. So bf16
    forward, dgrad, wgrad and the pair launch, the FP8 forward and its gradients (repack, zero rows, the FP8
    wgrad's empty-group zeros) must be bitwise the serial launch's, in each of 8 repeats, through XLA's command
    buffers (stream capture) and without them."""
    import os
    import subprocess
    import sys
    outs = {}
    for pdl in ("0", "1"):
        env = dict(os.environ, JAX_MOE_FFI_PDL=pdl)
        if not command_buffers:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()
        path = tmp_path / f"pdl{pdl}.npz"
        run = subprocess.run([sys.executable, "-c", _PDL_SCRIPT, str(path), "8"], env=env, capture_output=True,
                             text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-2000:]
        outs[pdl] = np.load(path)
    for key in outs["0"].files:
        assert np.any(outs["0"][key] != 0)
        np.testing.assert_array_equal(outs["1"][key], outs["0"][key])
