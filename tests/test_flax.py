"""The pass composes with Flax: linen `Module.apply` and NNX modules (split/merge, modules as pytrees,
nnx.jit / nnx.grad / nnx.scan / nnx.remat / nnx.vmap).

Each MoE layer is written the naive way, as Flax users write it (router Dense -> softmax -> top_k ->
one-hot gate, stacked expert params, all-experts einsums; or a list of expert submodules; or nn.vmap'd
experts; or GShard capacity einsums). Checks: explain finds the site, optimize reproduces the layer
(float32, rel err <= 1e-5; fresh random inputs each run, the seed is in every failure message), the
rewritten program has the jax_moe_ffi custom calls (and the original has none), and gradients match.
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax", minversion="0.12")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from helpers import cpu_lowered_text  # noqa: E402

T, D, F, E, K, L = 24, 16, 32, 8, 2, 3
TOL = 1e-5
GG = "jax_moe_ffi_grouped_gemm"


def _seed():
    return int(np.random.SeedSequence().entropy % (2**31))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def tree_rel(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return max(rel(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _gg_in_jaxpr(f, *args):
    return len(re.findall(rf"target_name={GG}(?![_a-z])", str(jax.make_jaxpr(f)(*args))))


def _check_hlo(orig, fast, *args, n=3):
    """The original program has no grouped GEMM; the optimized one has >= n (forward), in the CPU lowering (on a GPU
    these float32 models' grouped GEMMs lower to XLA's fallback: seen on an H100 in session 36)."""
    assert GG not in cpu_lowered_text(orig, *args)
    assert cpu_lowered_text(fast, *args).count(GG) >= n


def _sin_loss(f):
    return lambda params, x: jnp.sum(jnp.sin(f(params, x)) * x)


_expert_init = nn.initializers.lecun_normal(batch_axis=(0,))  # [E, in, out]: fan-in per expert


# ------------------------------------------------------------------------------------------------------
# Flax linen
# ------------------------------------------------------------------------------------------------------
def _linen_router(x, num_experts, top_k):
    """Mixtral: softmax -> top_k -> renormalise; the router is a linen Dense."""
    probs = jax.nn.softmax(nn.Dense(num_experts, use_bias=False, name="router")(x), axis=-1)
    w, idx = jax.lax.top_k(probs, top_k)
    return w / jnp.sum(w, axis=-1, keepdims=True), idx, probs


class LinenDenseMoE(nn.Module):
    """Every expert on every token ([..., E, F] einsums), weighted by a [..., E] top-k-sparse gate."""
    num_experts: int = E
    d_ff: int = F
    top_k: int = K

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        w, idx, _ = _linen_router(x, self.num_experts, self.top_k)
        gate = jnp.sum(jax.nn.one_hot(idx, self.num_experts, dtype=x.dtype) * w[..., None], axis=-2)
        wg = self.param("w_gate", _expert_init, (self.num_experts, d, self.d_ff))
        wu = self.param("w_up", _expert_init, (self.num_experts, d, self.d_ff))
        wd = self.param("w_down", _expert_init, (self.num_experts, self.d_ff, d))
        h = nn.silu(jnp.einsum("...d,edf->...ef", x, wg)) * jnp.einsum("...d,edf->...ef", x, wu)
        y = jnp.einsum("...ef,efd->...ed", h, wd)
        return jnp.einsum("...ed,...e->...d", y, gate)


class LinenCapacityMoE(nn.Module):
    """GShard/Switch one-hot [T, E, C] dispatch/combine einsums with an expert capacity (drops tokens)."""
    capacity_factor: float = 0.5

    @nn.compact
    def __call__(self, x):
        t, d = x.shape
        w, idx, _ = _linen_router(x, E, K)
        capacity = max(1, int(math.ceil(t * K / E * self.capacity_factor)))
        mask = jax.nn.one_hot(idx, E, dtype=jnp.int32)  # [T, K, E]
        pos = (jnp.cumsum(mask.reshape(t * K, E), axis=0) - 1).reshape(t, K, E)
        keep = mask * (pos < capacity)
        pos_1h = jax.nn.one_hot(jnp.sum(pos * keep, axis=-1), capacity, dtype=x.dtype)  # [T, K, C]
        dispatch = jnp.einsum("tke,tkc->tec", keep.astype(x.dtype), pos_1h)
        combine = jnp.einsum("tke,tkc,tk->tec", keep.astype(x.dtype), pos_1h, w.astype(x.dtype))
        xe = jnp.einsum("tec,td->ecd", dispatch, x)
        wg = self.param("w_gate", _expert_init, (E, d, F))
        wu = self.param("w_up", _expert_init, (E, d, F))
        wd = self.param("w_down", _expert_init, (E, F, d))
        h = nn.silu(jnp.einsum("ecd,edf->ecf", xe, wg)) * jnp.einsum("ecd,edf->ecf", xe, wu)
        return jnp.einsum("tec,ecd->td", combine, jnp.einsum("ecf,efd->ecd", h, wd))


class LinenExpert(nn.Module):
    """A SwiGLU MLP of three linen Denses."""
    d_ff: int = F

    @nn.compact
    def __call__(self, x):
        h = nn.silu(nn.Dense(self.d_ff, use_bias=False, name="gate")(x)) * \
            nn.Dense(self.d_ff, use_bias=False, name="up")(x)
        return nn.Dense(x.shape[-1], use_bias=False, name="down")(h)


class LinenListMoE(nn.Module):
    """E separate expert submodules in a python loop, each output scaled by its gate column."""

    @nn.compact
    def __call__(self, x):
        w, idx, _ = _linen_router(x, E, K)
        gate = jnp.sum(jax.nn.one_hot(idx, E, dtype=x.dtype) * w[..., None], axis=-2)
        out = jnp.zeros_like(x)
        for i in range(E):
            out = out + LinenExpert(name=f"expert_{i}")(x) * gate[..., i:i + 1]
        return out


class LinenVmapMoE(nn.Module):
    """Experts as one `nn.vmap`-ed MLP (params stacked on axis 0, the input broadcast to all experts)."""

    @nn.compact
    def __call__(self, x):
        w, idx, _ = _linen_router(x, E, K)
        gate = jnp.sum(jax.nn.one_hot(idx, E, dtype=x.dtype) * w[..., None], axis=-2)
        experts = nn.vmap(LinenExpert, variable_axes={"params": 0}, split_rngs={"params": True},
                          in_axes=None, out_axes=-2, axis_size=E)
        y = experts(name="experts")(x)  # [..., E, D]
        return jnp.einsum("...ed,...e->...d", y, gate)


class LinenAuxLossMoE(nn.Module):
    """Dense MoE that also `sow`s a Switch load-balancing loss (read with mutable=['intermediates'])."""

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        w, idx, probs = _linen_router(x, E, K)
        mask = jax.nn.one_hot(idx, E, dtype=x.dtype)  # [..., K, E]
        tok = tuple(range(x.ndim - 1))
        self.sow("intermediates", "aux_loss",
                 E * jnp.sum(jnp.mean(jnp.sum(mask, axis=-2), axis=tok) * jnp.mean(probs, axis=tok)))
        gate = jnp.sum(mask * w[..., None], axis=-2)
        wg = self.param("w_gate", _expert_init, (E, d, F))
        wu = self.param("w_up", _expert_init, (E, d, F))
        wd = self.param("w_down", _expert_init, (E, F, d))
        h = nn.silu(jnp.einsum("...d,edf->...ef", x, wg)) * jnp.einsum("...d,edf->...ef", x, wu)
        return jnp.sum(jnp.einsum("...ef,efd->...ed", h, wd) * gate[..., None], axis=-2)


class LinenBlock(nn.Module):
    """Pre-norm residual MoE block in scan form: (carry, x) -> (carry, None)."""

    @nn.compact
    def __call__(self, h, _):
        return h + LinenDenseMoE(name="moe")(nn.RMSNorm(name="norm")(h)), None


class LinenDecoder(nn.Module):
    """L blocks under `nn.scan(nn.remat(...))`: params stacked on a leading layer axis."""
    num_layers: int = L

    @nn.compact
    def __call__(self, x):
        stack = nn.scan(nn.remat(LinenBlock), variable_axes={"params": 0}, split_rngs={"params": True},
                        length=self.num_layers)
        h, _ = stack(name="layers")(x, None)
        return h


def _linen_setup(model, seed, shape):
    kx, kp = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, shape, jnp.float32)
    return model.init(kp, x), x


LINEN = [
    ("dense_td", LinenDenseMoE(), (T, D), "dense"),
    ("dense_bsd", LinenDenseMoE(), (2, T // 2, D), "dense"),
    ("capacity", LinenCapacityMoE(), (T, D), "capacity"),
    ("expert_submodules", LinenListMoE(), (T, D), "loop"),
    ("expert_submodules_bsd", LinenListMoE(), (2, T // 2, D), "loop"),
    ("nn_vmap_experts", LinenVmapMoE(), (2, T // 2, D), "dense"),
]


@pytest.mark.parametrize("name,model,shape,family", LINEN, ids=[c[0] for c in LINEN])
def test_linen_apply(name, model, shape, family):
    seed = _seed()
    variables, x = _linen_setup(model, seed, shape)
    r = jmf.explain(model.apply, variables, x)
    assert [s.family for s in r.sites] == [family], (seed, str(r))
    assert not r.misses, (seed, str(r))  # absorbed expert bodies are no near-misses
    fast = jmf.optimize(model.apply)
    y0 = model.apply(variables, x)
    y1 = fast(variables, x)
    y2 = jax.jit(fast)(variables, x)
    assert y1.shape == y0.shape and y1.dtype == y0.dtype
    assert rel(y1, y0) <= TOL, (name, seed, rel(y1, y0))
    assert rel(y2, y0) <= TOL, (name, seed, rel(y2, y0))
    _check_hlo(model.apply, fast, variables, x, n=3)
    assert _gg_in_jaxpr(fast, variables, x) >= 3

    # gradients w.r.t. the linen variables (and x), under jit
    g0 = jax.grad(_sin_loss(model.apply), argnums=(0, 1))(variables, x)
    g1 = jax.jit(jax.grad(_sin_loss(fast), argnums=(0, 1)))(variables, x)
    assert tree_rel(g1, g0) <= TOL, (name, seed, tree_rel(g1, g0))


def test_linen_capacity_drops_tokens():
    """The capacity test above is only meaningful if the layer drops tokens at this capacity factor."""
    seed = _seed()
    variables, x = _linen_setup(LinenCapacityMoE(), seed, (T, D))
    dense = LinenDenseMoE().apply(variables, x)  # same params, no capacity
    y = LinenCapacityMoE().apply(variables, x)
    assert rel(y, dense) > 1e-3, seed
    yd = jax.jit(jmf.optimize(LinenCapacityMoE().apply, mode="dropless"))(variables, x)
    assert rel(yd, dense) <= TOL, (seed, rel(yd, dense))


def test_linen_mutable_intermediates():
    """apply(..., mutable=['intermediates']) returns (y, state); the sown aux loss uses the router mask."""
    seed = _seed()
    model = LinenAuxLossMoE()
    variables, x = _linen_setup(model, seed, (2, T // 2, D))

    def fn(v, x):
        return model.apply(v, x, mutable=["intermediates"])

    assert [s.family for s in jmf.explain(fn, variables, x).sites] == ["dense"]
    fast = jmf.optimize(fn)
    (y0, st0), (y1, st1) = fn(variables, x), jax.jit(fast)(variables, x)
    assert jax.tree.structure(st0) == jax.tree.structure(st1)
    assert rel(y1, y0) <= TOL, seed
    assert tree_rel(st1, st0) <= TOL, seed
    _check_hlo(fn, fast, variables, x)

    def loss(f):
        def l(v, x):
            y, st = f(v, x)
            return jnp.sum(jnp.sin(y) * x) + 0.01 * st["intermediates"]["aux_loss"][0]
        return l

    g0 = jax.grad(loss(fn))(variables, x)
    g1 = jax.jit(jax.grad(loss(fast)))(variables, x)
    assert tree_rel(g1, g0) <= TOL, (seed, tree_rel(g1, g0))


def test_linen_scan_remat_stack():
    seed = _seed()
    model = LinenDecoder()
    variables, x = _linen_setup(model, seed, (2, T // 2, D))
    assert variables["params"]["layers"]["moe"]["w_gate"].shape == (L, E, D, F)
    r = jmf.explain(model.apply, variables, x)
    assert [(s.family, s.path) for s in r.sites] == [("dense", "scan/remat/")], (seed, str(r))
    fast = jmf.optimize(model.apply)
    y0 = model.apply(variables, x)
    assert rel(jax.jit(fast)(variables, x), y0) <= TOL, seed
    _check_hlo(model.apply, fast, variables, x)
    g0 = jax.grad(_sin_loss(model.apply), argnums=(0, 1))(variables, x)
    g1 = jax.jit(jax.grad(_sin_loss(fast), argnums=(0, 1)))(variables, x)
    assert tree_rel(g1, g0) <= TOL, (seed, tree_rel(g1, g0))
    assert cpu_lowered_text(jax.grad(_sin_loss(fast)), variables, x).count(GG) >= 3


# ------------------------------------------------------------------------------------------------------
# Flax NNX
# ------------------------------------------------------------------------------------------------------
class NnxMoE(nnx.Module):
    """top_k on the router logits, softmax over the k (Mixtral-HF / Qwen-MoE style); nnx.Param experts."""

    def __init__(self, d, f, e, k, *, rngs: nnx.Rngs):
        self.k = k
        self.router = nnx.Linear(d, e, use_bias=False, rngs=rngs)
        self.w_gate = nnx.Param(_expert_init(rngs.params(), (e, d, f)))
        self.w_up = nnx.Param(_expert_init(rngs.params(), (e, d, f)))
        self.w_down = nnx.Param(_expert_init(rngs.params(), (e, f, d)))

    def __call__(self, x):
        vals, idx = jax.lax.top_k(self.router(x), self.k)
        w = jax.nn.softmax(vals, axis=-1)
        e = self.w_gate.shape[0]
        gate = jnp.sum(jax.nn.one_hot(idx, e, dtype=x.dtype) * w[..., None], axis=-2)
        h = nnx.silu(jnp.einsum("...d,edf->...ef", x, self.w_gate[...])) * \
            jnp.einsum("...d,edf->...ef", x, self.w_up[...])
        y = jnp.einsum("...ef,efd->...ed", h, self.w_down[...])
        return jnp.einsum("...ed,...e->...d", y, gate)


class NnxExpert(nnx.Module):
    def __init__(self, rngs):
        self.gate = nnx.Linear(D, F, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(D, F, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(F, D, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.silu(self.gate(x)) * self.up(x))


class NnxListMoE(nnx.Module):
    """An nnx.List of expert modules; gate column e from `idx == e` (per-expert python loop)."""

    def __init__(self, rngs):
        self.router = nnx.Linear(D, E, use_bias=False, rngs=rngs)
        self.experts = nnx.List([NnxExpert(rngs) for _ in range(E)])

    def __call__(self, x):
        probs = jax.nn.softmax(self.router(x), axis=-1)
        w, idx = jax.lax.top_k(probs, K)
        w = w / jnp.sum(w, axis=-1, keepdims=True)
        out = jnp.zeros_like(x)
        for e, expert in enumerate(self.experts):
            g = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1)
            out = out + g[..., None] * expert(x)
        return out


class NnxBlock(nnx.Module):
    def __init__(self, rngs):
        self.norm = nnx.RMSNorm(D, rngs=rngs)
        self.moe = NnxMoE(D, F, E, K, rngs=rngs)

    def __call__(self, h):
        return h + self.moe(self.norm(h))


def nnx_decoder(blocks, x):
    """Stacked blocks (built with nnx.vmap) under nnx.scan(nnx.remat(...))."""
    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    @nnx.remat
    def body(block, h):
        return block(h)

    return body(blocks, x)


def _x(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


NNX_LAYERS = [
    ("dense", lambda s: NnxMoE(D, F, E, K, rngs=nnx.Rngs(s)), "dense"),
    ("expert_list", lambda s: NnxListMoE(nnx.Rngs(s)), "loop"),
]


@pytest.mark.parametrize("name,make,family", NNX_LAYERS, ids=[c[0] for c in NNX_LAYERS])
def test_nnx_split_merge(name, make, family):
    """graphdef, state = nnx.split(model); f(state, x) = nnx.merge(graphdef, state)(x) through the pass."""
    seed = _seed()
    model = make(seed)
    x = _x(seed + 1, (2, T // 2, D))
    graphdef, state = nnx.split(model)

    def f(state, x):
        return nnx.merge(graphdef, state)(x)

    r = jmf.explain(f, state, x)
    assert [s.family for s in r.sites] == [family], (seed, str(r))
    fast = jmf.optimize(f)
    y0 = model(x)
    assert rel(f(state, x), y0) == 0.0
    assert rel(fast(state, x), y0) <= TOL, (name, seed)
    assert rel(jax.jit(fast)(state, x), y0) <= TOL, (name, seed)
    _check_hlo(f, fast, state, x)
    g0 = jax.grad(_sin_loss(f), argnums=(0, 1))(state, x)
    g1 = jax.jit(jax.grad(_sin_loss(fast), argnums=(0, 1)))(state, x)
    assert tree_rel(g1, g0) <= TOL, (name, seed, tree_rel(g1, g0))


def test_nnx_module_as_argument_with_nnx_jit_and_grad():
    """NNX modules are pytrees: optimize takes the module itself, inside nnx.jit and nnx.grad."""
    seed = _seed()
    model = NnxMoE(D, F, E, K, rngs=nnx.Rngs(seed))
    x = _x(seed + 1, (T, D))

    def call(m, x):
        return m(x)

    assert [s.family for s in jmf.explain(call, model, x).sites] == ["dense"]
    y0 = model(x)
    fast = jmf.optimize(call)
    assert rel(fast(model, x), y0) <= TOL, seed
    assert rel(nnx.jit(fast)(model, x), y0) <= TOL, seed

    @nnx.jit
    def fwd(m, x):  # optimize applied inside an nnx.jit'd function, on split state
        graphdef, state = nnx.split(m)
        return jmf.optimize(lambda s, x: nnx.merge(graphdef, s)(x))(state, x)

    assert rel(fwd(model, x), y0) <= TOL, seed
    _check_hlo(call, fast, model, x)
    assert _gg_in_jaxpr(fwd, model, x) >= 3

    def loss(m, x):
        return jnp.sum(jnp.sin(m(x)) * x)

    g0 = nnx.grad(loss)(model, x)
    g1 = nnx.jit(nnx.grad(jmf.optimize(loss)))(model, x)
    assert isinstance(g1, nnx.State)
    assert tree_rel(g1, g0) <= TOL, (seed, tree_rel(g1, g0))


def test_nnx_scan_remat_stack():
    seed = _seed()

    @nnx.vmap(in_axes=0, out_axes=0)
    def make_blocks(key):
        return NnxBlock(nnx.Rngs(key))

    blocks = make_blocks(jax.random.split(jax.random.key(seed), L))
    assert blocks.moe.w_gate.shape == (L, E, D, F)
    x = _x(seed + 1, (2, T // 2, D))
    graphdef, state = nnx.split(blocks)

    def f(state, x):
        return nnx_decoder(nnx.merge(graphdef, state), x)

    r = jmf.explain(f, state, x)
    assert [(s.family, s.path) for s in r.sites] == [("dense", "scan/remat/")], (seed, str(r))
    fast = jmf.optimize(f)
    y0 = f(state, x)
    assert rel(jax.jit(fast)(state, x), y0) <= TOL, seed
    _check_hlo(f, fast, state, x)
    g0 = jax.grad(_sin_loss(f), argnums=(0, 1))(state, x)
    g1 = jax.jit(jax.grad(_sin_loss(fast), argnums=(0, 1)))(state, x)
    assert tree_rel(g1, g0) <= TOL, (seed, tree_rel(g1, g0))
