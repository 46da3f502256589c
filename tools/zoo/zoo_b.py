"""zoo_b: MoE layers in pure-JAX / Equinox / Haiku / Flax / einops / research-code styles, written from memory.

Every layer is `f(params, x) -> y` in float32. `LAYERS` maps a name to (init(key) -> (params, x), f,
expected family or None). Families: "capacity" (1), "dense" (2), "masked" (3), "loop" (4).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

try:
    import equinox as eqx
except ImportError:  # pragma: no cover
    eqx = None
try:
    import haiku as hk
except ImportError:  # pragma: no cover
    hk = None
try:
    import einops
except ImportError:  # pragma: no cover
    einops = None
try:
    import flax.linen as fnn
except ImportError:  # pragma: no cover
    fnn = None


# ----------------------------------------------------------------------------------------------- helpers
def _n(key, shape, fan_in):
    return jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)


def init_stacked(key, D, F, E, *, bias=False, shared=False, e_bias=False, scales=False):
    """Stacked SwiGLU expert weights [E, ...] + router [D, E]; optional biases, shared expert, router bias."""
    ks = jax.random.split(key, 12)
    p = {"router": _n(ks[0], (D, E), D),
         "w_gate": _n(ks[1], (E, D, F), D),
         "w_up": _n(ks[2], (E, D, F), D),
         "w_down": _n(ks[3], (E, F, D), F)}
    if bias:
        p["b_gate"] = 0.1 * jax.random.normal(ks[4], (E, F))
        p["b_up"] = 0.1 * jax.random.normal(ks[5], (E, F))
        p["b_down"] = 0.1 * jax.random.normal(ks[6], (E, D))
    if shared:
        p["s_gate"] = _n(ks[7], (D, 2 * F), D)
        p["s_up"] = _n(ks[8], (D, 2 * F), D)
        p["s_down"] = _n(ks[9], (2 * F, D), 2 * F)
    if e_bias:
        p["e_bias"] = 0.5 * jax.random.normal(ks[10], (E,))
    if scales:
        p["scale"] = 1.0 + 0.1 * jax.random.normal(ks[11], (E,))
    return p


def _x(key, *shape):
    return jax.random.normal(jax.random.fold_in(key, 999), shape, jnp.float32)


def _swiglu(p, x):
    """One expert (unstacked weights)."""
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def _softmax_topk(router, x, k, renorm=True):
    probs = jax.nn.softmax(x @ router, axis=-1)
    w, idx = lax.top_k(probs, k)
    if renorm:
        w = w / jnp.sum(w, axis=-1, keepdims=True)
    return w, idx, probs


def _expert_params(p):
    return {n: p[n] for n in ("w_gate", "w_up", "w_down")}


# ------------------------------------------------------------------------ 1. vmap over experts + scatter gate
def vmap_scatter_gate(params, x, k=2):
    """Pure-JAX research code: `jax.vmap(expert, in_axes=(0, None))(stacked, x)` -> [E, T, D]; top-k gate
    built by `jnp.zeros((T, E)).at[arange(T)[:, None], idx].set(w)`; combine `einsum('te,etd->td')`."""
    T = x.shape[0]
    E = params["router"].shape[1]
    w, idx, _ = _softmax_topk(params["router"], x, k)
    gate = jnp.zeros((T, E), x.dtype).at[jnp.arange(T)[:, None], idx].set(w)
    y = jax.vmap(_swiglu, in_axes=(0, None))(_expert_params(params), x)  # [E, T, D]
    return jnp.einsum("te,etd->td", gate, y)


def init_vmap_scatter_gate(key):
    return init_stacked(key, 16, 32, 8), _x(key, 32, 16)


# ------------------------------------------------------------ 2. python loop, boolean .any() mask + where
def _biased_expert(params, e, x):
    h = jax.nn.silu(x @ params["w_gate"][e] + params["b_gate"][e]) * (x @ params["w_up"][e] + params["b_up"][e])
    return h @ params["w_down"][e] + params["b_down"][e]


def loop_any_mask_where(params, x, k=2):
    """Research-code per-expert loop: `m = (idx == e).any(-1)`, `jnp.where(m[:, None], expert_e(x), 0) *
    probs[:, e:e+1]` accumulated; un-renormalised softmax weights (probs is dense: sparsity from the mask);
    biased experts, so expert_e(0) != 0."""
    _, idx, probs = _softmax_topk(params["router"], x, k, renorm=False)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        m = (idx == e).any(-1)
        out = out + jnp.where(m[:, None], _biased_expert(params, e, x), 0.0) * probs[:, e:e + 1]
    return out


def init_loop_any_mask_where(key):
    return init_stacked(key, 12, 24, 4, bias=True), _x(key, 24, 12)


# ------------------------------------------------------------------------------- 3. lax.fori_loop over E
def fori_loop_experts(params, x, k=2):
    """JAX-idiomatic "don't unroll" loop: `lax.fori_loop(0, E, body, zeros)` with `lax.dynamic_index_in_dim`
    of the stacked weights and a gate column `sum(where(idx == e, w, 0), -1)` (static trip count -> scan)."""
    w, idx, _ = _softmax_topk(params["router"], x, k)
    E = params["w_gate"].shape[0]

    def body(e, acc):
        pe = {n: lax.dynamic_index_in_dim(params[n], e, axis=0, keepdims=False)
              for n in ("w_gate", "w_up", "w_down")}
        g = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1)
        return acc + g[:, None] * _swiglu(pe, x)

    return lax.fori_loop(0, E, body, jnp.zeros_like(x))


def init_fori_loop_experts(key):
    return init_stacked(key, 16, 32, 4), _x(key, 16, 16)


# ------------------------------------------------------------------------- 4. lax.scan over stacked experts
def scan_experts(params, x, k=2):
    """`lax.scan` with xs = (stacked weights, arange(E)) and the output accumulated in the carry; gate
    column from a dense top-k gate matrix `one_hot(idx, E)` weighted and summed over k."""
    w, idx, _ = _softmax_topk(params["router"], x, k)
    E = params["w_gate"].shape[0]
    gate = jnp.sum(jax.nn.one_hot(idx, E, dtype=x.dtype) * w[..., None], axis=1)  # [T, E]

    def step(acc, xs):
        pe, e = xs
        g = lax.dynamic_index_in_dim(gate, e, axis=1, keepdims=True)  # [T, 1]
        return acc + g * _swiglu(pe, x), None

    out, _ = lax.scan(step, jnp.zeros_like(x), (_expert_params(params), jnp.arange(E)))
    return out


def init_scan_experts(key):
    return init_stacked(key, 8, 16, 4), _x(key, 16, 8)


# ---------------------------------------------------------------------- 5. gather the weights per token
def gather_weights(params, x, k=2):
    """"Gather the weights" naive form: `w_sel = w_gate[idx]` [T, k, D, F] and
    `einsum('td,tkdf->tkf', x, w_sel)`; top-k on the logits, softmax over the k selected logits."""
    logits = x @ params["router"]
    top, idx = lax.top_k(logits, k)
    w = jax.nn.softmax(top, axis=-1)
    wg, wu, wd = params["w_gate"][idx], params["w_up"][idx], params["w_down"][idx]
    h = jax.nn.silu(jnp.einsum("td,tkdf->tkf", x, wg)) * jnp.einsum("td,tkdf->tkf", x, wu)
    y = jnp.einsum("tkf,tkfd->tkd", h, wd)
    return jnp.einsum("tkd,tk->td", y, w)


def init_gather_weights(key):
    return init_stacked(key, 8, 16, 6), _x(key, 16, 8)


# ------------------------------------------------------------------------------------- 6. Equinox module
if eqx is not None:
    class EqxExpert(eqx.Module):
        """GELU MLP with biases (eqx.nn.Linear: weight [out, in], y = W x + b, one vector at a time)."""
        fc1: eqx.nn.Linear
        fc2: eqx.nn.Linear

        def __init__(self, key, D, F):
            k1, k2 = jax.random.split(key)
            self.fc1 = eqx.nn.Linear(D, F, key=k1)
            self.fc2 = eqx.nn.Linear(F, D, key=k2)

        def __call__(self, x):
            return self.fc2(jax.nn.gelu(self.fc1(x)))

    class EqxMoE(eqx.Module):
        router: eqx.nn.Linear
        experts: EqxExpert           # stacked: every array leaf has a leading E axis (filter_vmap init)
        num_experts: int = eqx.field(static=True)
        top_k: int = eqx.field(static=True)

        def __init__(self, key, D, F, E, top_k=2):
            kr, ke = jax.random.split(key)
            self.router = eqx.nn.Linear(D, E, use_bias=False, key=kr)
            self.experts = eqx.filter_vmap(lambda kk: EqxExpert(kk, D, F))(jax.random.split(ke, E))
            self.num_experts, self.top_k = E, top_k

        def __call__(self, x):  # x [T, D]
            logits = jax.vmap(self.router)(x)
            top, idx = lax.top_k(logits, self.top_k)
            w = jax.nn.softmax(top, axis=-1)
            gate = jnp.einsum("tk,tke->te", w, jax.nn.one_hot(idx, self.num_experts, dtype=x.dtype))
            y = eqx.filter_vmap(lambda ex: jax.vmap(ex)(x))(self.experts)  # [E, T, D]
            return jnp.einsum("etd,te->td", y, gate)


def equinox_module(model, x):
    """Equinox style: an `eqx.Module` whose experts are one stacked `EqxExpert` built with `eqx.filter_vmap`,
    applied with `eqx.filter_vmap(lambda ex: jax.vmap(ex)(x))` (weights as the lhs: W @ x per vector);
    top-k on logits then softmax; gate via einsum with one_hot."""
    return model(x)


def init_equinox_module(key):
    return EqxMoE(key, 16, 32, 4), _x(key, 24, 16)


# ---------------------------------------------------------------------------------- 7. Haiku hk.transform
def _hk_fn(x, E=6, F=32, k=2):
    D = x.shape[-1]
    logits = hk.Linear(E, with_bias=False, name="router")(x)
    scores = jax.nn.sigmoid(logits)
    w, idx = lax.top_k(scores, k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    gate = jnp.sum(jax.nn.one_hot(idx, E) * w[..., None], axis=1)  # [T, E]
    init = hk.initializers.VarianceScaling(1.0, "fan_in", "normal")
    wi = hk.get_parameter("wi", [E, D, 2 * F], init=init)  # fused gate/up
    wo = hk.get_parameter("wo", [E, F, D], init=init)
    T = x.shape[0]
    xe = jnp.broadcast_to(x[None], (E, T, D)) * (gate.T > 0)[:, :, None].astype(x.dtype)  # masked copies
    h = jnp.einsum("etd,edf->etf", xe, wi)
    g, u = jnp.split(h, 2, axis=-1)
    y = jnp.einsum("etf,efd->etd", jax.nn.silu(g) * u, wo)
    return jnp.einsum("etd,te->td", y, gate)


_hk_model = hk.without_apply_rng(hk.transform(_hk_fn)) if hk is not None else None


def haiku_masked(params, x):
    """Haiku style: `hk.transform` with `hk.Linear` router and `hk.get_parameter` stacked weights; sigmoid
    scores, top-k, renormalised; tokens broadcast to [E, T, D] and multiplied by a (gate > 0) mask; fused
    gate/up split with jnp.split."""
    return _hk_model.apply(params, x)


def init_haiku_masked(key):
    x = _x(key, 32, 16)
    return _hk_model.init(key, x), x


# --------------------------------------------------------------------------------------- 8. einops layer
def einops_geglu(params, x, k=2):
    """einops style on x [B, S, D]: `rearrange` to tokens, `einops.einsum(x, w, 't d, e d f -> e t f')`,
    exact-erf GeGLU, gate with `einops.reduce(one_hot * w, 't k e -> t e', 'sum')`, softmax over the top-k
    logits only; `rearrange` back."""
    b = x.shape[0]
    E = params["router"].shape[1]
    xt = einops.rearrange(x, "b s d -> (b s) d")
    top, idx = lax.top_k(xt @ params["router"], k)
    w = jax.nn.softmax(top, axis=-1)
    gate = einops.reduce(jax.nn.one_hot(idx, E) * w[..., None], "t k e -> t e", "sum")
    g = einops.einsum(xt, params["w_gate"], "t d, e d f -> e t f")
    u = einops.einsum(xt, params["w_up"], "t d, e d f -> e t f")
    h = jax.nn.gelu(g, approximate=False) * u
    y = einops.einsum(h, params["w_down"], "e t f, e f d -> e t d")
    out = einops.einsum(y, gate, "e t d, t e -> t d")
    return einops.rearrange(out, "(b s) d -> b s d", b=b)


def init_einops_geglu(key):
    return init_stacked(key, 16, 32, 4), _x(key, 2, 16, 16)


# ------------------------------------------------------------------------------- 9. DeepSeek-V3 router
def deepseek_sigmoid_bias(params, x, k=2, routed_scaling_factor=2.5):
    """DeepSeek-V3 style: sigmoid scores, a (stop-gradient) expert bias used for *selection only*, weights
    gathered from the unbiased scores, renormalised and scaled by routed_scaling_factor; gate by scatter-add
    `.at[].add`; all-experts dense einsums; shared expert added densely."""
    T = x.shape[0]
    scores = jax.nn.sigmoid(x @ params["router"])
    _, idx = lax.top_k(scores + lax.stop_gradient(params["e_bias"]), k)
    w = jnp.take_along_axis(scores, idx, axis=-1)
    w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20) * routed_scaling_factor
    gate = jnp.zeros_like(scores).at[jnp.arange(T)[:, None], idx].add(w)
    h = jax.nn.silu(jnp.einsum("td,edf->etf", x, params["w_gate"])) * jnp.einsum("td,edf->etf", x, params["w_up"])
    y = jnp.einsum("etf,efd->etd", h, params["w_down"])
    routed = jnp.einsum("etd,te->td", y, gate)
    shared = (jax.nn.silu(x @ params["s_gate"]) * (x @ params["s_up"])) @ params["s_down"]
    return routed + shared


def init_deepseek_sigmoid_bias(key):
    return init_stacked(key, 16, 24, 8, shared=True, e_bias=True), _x(key, 32, 16)


# --------------------------------------------------------------------- 10. sort by expert, then segment_sum
def sort_then_segment(params, x, k=2):
    """"Dropless without kernels" research code: argsort router (`argsort(-probs)[:, :k]`), flatten the
    (token, choice) pairs, `order = argsort(idx.ravel())`, gather token rows, compute each expert's rows with
    a mask (`where(sorted_e == e, expert_e(rows), 0)`) and combine with `jax.ops.segment_sum`."""
    T = x.shape[0]
    E = params["w_gate"].shape[0]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    idx = jnp.argsort(-probs, axis=-1)[:, :k]
    w = jnp.take_along_axis(probs, idx, axis=-1)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    flat_e = idx.reshape(-1)
    order = jnp.argsort(flat_e)
    tok = order // k
    se, sw = flat_e[order], w.reshape(-1)[order]
    rows = x[tok]  # [T*k, D]
    out_rows = jnp.zeros_like(rows)
    for e in range(E):
        pe = {n: params[n][e] for n in ("w_gate", "w_up", "w_down")}
        out_rows = out_rows + jnp.where((se == e)[:, None], _swiglu(pe, rows), 0.0)
    return jax.ops.segment_sum(out_rows * sw[:, None], tok, num_segments=T)


def init_sort_then_segment(key):
    return init_stacked(key, 8, 16, 4), _x(key, 16, 8)


# ------------------------------------------- 11. hand-rolled pytree class, separate experts, stack + einsum
@jax.tree_util.register_pytree_node_class
class PytreeMoE:
    """A hand-rolled pytree module (jax.tree_util.register_pytree_node_class) with a list of separate expert
    dicts, per-expert output scales, a gpt-oss-like clamped SwiGLU; approx_max_k router."""

    def __init__(self, router, experts, scale, k=2):
        self.router, self.experts, self.scale, self.k = router, experts, scale, k

    def tree_flatten(self):
        return (self.router, self.experts, self.scale), self.k

    @classmethod
    def tree_unflatten(cls, k, children):
        return cls(*children, k=k)

    def __call__(self, x):
        E = len(self.experts)
        probs = jax.nn.softmax(x @ self.router, axis=-1)
        w, idx = lax.approx_max_k(probs, self.k)
        w = w / jnp.sum(w, axis=-1, keepdims=True)
        gate = jnp.sum(jax.nn.one_hot(idx, E, dtype=x.dtype) * w[..., None], axis=1)
        outs = []
        for e, p in enumerate(self.experts):
            g = jnp.clip(x @ p["w_gate"], max=7.0)
            u = jnp.clip(x @ p["w_up"], -7.0, 7.0)
            outs.append(self.scale[e] * ((g * jax.nn.sigmoid(1.702 * g)) * (u + 1.0)) @ p["w_down"])
        y = jnp.stack(outs, axis=1)  # [T, E, D]
        return jnp.einsum("ted,te->td", y, gate)


def pytree_stack_experts(model, x):
    """Hand-rolled pytree class: per-expert Python loop over *separate* weights whose outputs are
    `jnp.stack`ed to [T, E, D] and combined by `einsum('ted,te->td', y, gate)` (no add chain)."""
    return model(x)


def init_pytree_stack_experts(key):
    p = init_stacked(key, 16, 32, 4, scales=True)
    experts = [{n: p[n][e] + 0.0 for n in ("w_gate", "w_up", "w_down")} for e in range(4)]
    return PytreeMoE(p["router"], experts, p["scale"]), _x(key, 32, 16)


# ------------------------------------------------------------- 12. Flax linen Switch (top-1 argmax, capacity)
if fnn is not None:
    class SwitchFFN(fnn.Module):
        num_experts: int = 4
        d_ff: int = 32
        capacity_factor: float = 1.0

        @fnn.compact
        def __call__(self, x):
            T, D = x.shape
            E = self.num_experts
            C = max(1, int(self.capacity_factor * T / E))
            probs = jax.nn.softmax(fnn.Dense(E, use_bias=False, name="router")(x), axis=-1)
            eidx = jnp.argmax(probs, axis=-1)
            gval = jnp.max(probs, axis=-1)
            mask = jax.nn.one_hot(eidx, E, dtype=x.dtype)               # [T, E]
            pos = (jnp.cumsum(mask, axis=0) * mask).astype(jnp.int32) - 1  # slot in the expert buffer
            keep = mask * (pos < C).astype(x.dtype)
            disp = keep[:, :, None] * jax.nn.one_hot(pos, C, dtype=x.dtype)  # [T, E, C]
            comb = disp * gval[:, None, None]
            init = fnn.initializers.lecun_normal(batch_axis=(0,))
            wi = self.param("wi", init, (E, D, self.d_ff))
            wo = self.param("wo", init, (E, self.d_ff, D))
            xin = jnp.einsum("tec,td->ecd", disp, x)
            h = jax.nn.relu(jnp.einsum("ecd,edf->ecf", xin, wi))
            yo = jnp.einsum("ecf,efd->ecd", h, wo)
            return jnp.einsum("tec,ecd->td", comb, yo)

    _switch = SwitchFFN(num_experts=4, d_ff=32, capacity_factor=1.0)


def flax_switch_capacity(params, x):
    """Flax linen Switch Transformer (T5X-like): top-1 via argmax/max of the softmax, capacity slots by
    `cumsum(mask) * mask - 1`, [T, E, C] dispatch from one_hot(pos, C), ReLU experts via self.param."""
    return _switch.apply(params, x)


def init_flax_switch_capacity(key):
    x = _x(key, 32, 16)
    return _switch.init(key, x), x


# -------------------------------------------------- 13. vmap over experts of a masked copy of the tokens
def vmap_where_masked(params, x, k=2):
    """vmap over (expert weights, mask column, gate column): each expert sees `jnp.where(m[:, None], x, 0)`
    (tokens broadcast to every expert then masked) and scales by its gate column; `.sum(0)` over experts;
    biased experts; un-renormalised softmax top-k."""
    E = params["w_gate"].shape[0]
    w, idx, _ = _softmax_topk(params["router"], x, k, renorm=False)
    sel = jnp.any(idx[:, :, None] == jnp.arange(E)[None, None, :], axis=1)  # [T, E] bool
    gate = jnp.sum(jnp.where(idx[:, :, None] == jnp.arange(E), w[..., None], 0.0), axis=1)  # [T, E]

    def one(p, m, g):
        xm = jnp.where(m[:, None], x, 0.0)
        h = jax.nn.silu(xm @ p["w_gate"] + p["b_gate"]) * (xm @ p["w_up"] + p["b_up"])
        return (h @ p["w_down"] + p["b_down"]) * g[:, None]

    ep = {n: params[n] for n in ("w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down")}
    return jax.vmap(one, in_axes=(0, 1, 1))(ep, sel, gate).sum(0)


def init_vmap_where_masked(key):
    return init_stacked(key, 16, 32, 6, bias=True), _x(key, 32, 16)


# -------------------------------------------- 14. lax.scan over experts, dynamic_slice + dynamic_update_slice
def scan_dyn_update(params, x, k=2):
    """Research code that fills a [T, E, D] buffer in a `lax.scan` over experts (dynamic_update_slice of
    each expert's output into column e), then combines with a top-k-sparse gate (`.at[].set`)."""
    T, D = x.shape
    E = params["w_gate"].shape[0]
    w, idx, _ = _softmax_topk(params["router"], x, k)
    gate = jnp.zeros((T, E), x.dtype).at[jnp.arange(T)[:, None], idx].set(w)

    def step(buf, e):
        pe = {n: lax.dynamic_index_in_dim(params[n], e, 0, keepdims=False) for n in ("w_gate", "w_up", "w_down")}
        return lax.dynamic_update_slice(buf, _swiglu(pe, x)[:, None, :], (0, e, 0)), None

    buf, _ = lax.scan(step, jnp.zeros((T, E, D), x.dtype), jnp.arange(E))
    return jnp.einsum("ted,te->td", buf, gate)


def init_scan_dyn_update(key):
    return init_stacked(key, 8, 16, 4), _x(key, 16, 8)


LAYERS = {
    "vmap_scatter_gate": (init_vmap_scatter_gate, vmap_scatter_gate, "dense"),
    "loop_any_mask_where": (init_loop_any_mask_where, loop_any_mask_where, "loop"),
    "fori_loop_experts": (init_fori_loop_experts, fori_loop_experts, "loop-in-scan (maybe near-miss)"),
    "scan_experts": (init_scan_experts, scan_experts, "loop-in-scan (maybe near-miss)"),
    "gather_weights": (init_gather_weights, gather_weights, "gathered weights (maybe none)"),
    "equinox_module": (init_equinox_module, equinox_module, "dense") if eqx is not None else None,
    "haiku_masked": (init_haiku_masked, haiku_masked, "masked") if hk is not None else None,
    "einops_geglu": (init_einops_geglu, einops_geglu, "dense") if einops is not None else None,
    "deepseek_sigmoid_bias": (init_deepseek_sigmoid_bias, deepseek_sigmoid_bias, "dense"),
    "sort_then_segment": (init_sort_then_segment, sort_then_segment, "sorted rows loop (maybe near-miss)"),
    "pytree_stack_experts": (init_pytree_stack_experts, pytree_stack_experts, "dense/loop (stacked)"),
    "flax_switch_capacity": (init_flax_switch_capacity, flax_switch_capacity, "capacity") if fnn is not None else None,
    "vmap_where_masked": (init_vmap_where_masked, vmap_where_masked, "masked"),
    "scan_dyn_update": (init_scan_dyn_update, scan_dyn_update, "dense-in-scan (maybe near-miss)"),
}
LAYERS = {k: v for k, v in LAYERS.items() if v is not None}


# ===================================================================== adversarial / diagnostic variants
def deepseek_sigmoid_bias_set(params, x, k=2, routed_scaling_factor=2.5):
    """Diagnostic twin of `deepseek_sigmoid_bias`: identical except the gate is built with `.at[].set`
    instead of `.at[].add` (isolates the scatter-add construct)."""
    T = x.shape[0]
    scores = jax.nn.sigmoid(x @ params["router"])
    _, idx = lax.top_k(scores + lax.stop_gradient(params["e_bias"]), k)
    w = jnp.take_along_axis(scores, idx, axis=-1)
    w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20) * routed_scaling_factor
    gate = jnp.zeros_like(scores).at[jnp.arange(T)[:, None], idx].set(w)
    h = jax.nn.silu(jnp.einsum("td,edf->etf", x, params["w_gate"])) * jnp.einsum("td,edf->etf", x, params["w_up"])
    y = jnp.einsum("etf,efd->etd", h, params["w_down"])
    routed = jnp.einsum("etd,te->td", y, gate)
    shared = (jax.nn.silu(x @ params["s_gate"]) * (x @ params["s_up"])) @ params["s_down"]
    return routed + shared


def adv_token_mix_in_expert(params, x, k=2):
    """Adversarial (must NOT be rewritten): vmap experts, but each expert's output is centred over the
    *token* axis (`y - y.mean(tokens)`) before the top-k gate: not pointwise in tokens."""
    T = x.shape[0]
    E = params["router"].shape[1]
    w, idx, _ = _softmax_topk(params["router"], x, k)
    gate = jnp.zeros((T, E), x.dtype).at[jnp.arange(T)[:, None], idx].set(w)
    y = jax.vmap(_swiglu, in_axes=(0, None))(_expert_params(params), x)  # [E, T, D]
    y = y - jnp.mean(y, axis=1, keepdims=True)
    return jnp.einsum("te,etd->td", gate, y)


def adv_cross_expert_centre(params, x, k=2):
    """Adversarial (must NOT be rewritten): all-experts outputs centred over the *expert* axis before the
    top-k-sparse gate: every expert's output matters for every token."""
    E = params["router"].shape[1]
    w, idx, _ = _softmax_topk(params["router"], x, k)
    gate = jnp.sum(jax.nn.one_hot(idx, E, dtype=x.dtype) * w[..., None], axis=1)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    y = y - jnp.mean(y, axis=1, keepdims=True)
    return jnp.einsum("ted,te->td", y, gate)


def adv_loop_reversed_weights(params, x, k=2):
    """Adversarial pairing: per-expert loop where gate column e multiplies the expert built from W[E-1-e]
    (a relabelled expert table). Exact only if the pass pairs columns and weight slices correctly."""
    w, idx, _ = _softmax_topk(params["router"], x, k)
    E = params["w_gate"].shape[0]
    out = jnp.zeros_like(x)
    for e in range(E):
        g = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1)
        pe = {n: params[n][E - 1 - e] for n in ("w_gate", "w_up", "w_down")}
        out = out + g[:, None] * _swiglu(pe, x)
    return out


def adv_loop_dense_residual(params, x, k=2):
    """Adversarial: `loop_any_mask_where` plus, in the same add chain, an *unmasked* 0.1 * expert_e(x) for
    every expert (dense work that must be kept)."""
    _, idx, probs = _softmax_topk(params["router"], x, k, renorm=False)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        m = (idx == e).any(-1)
        ye = _biased_expert(params, e, x)
        out = out + jnp.where(m[:, None], ye, 0.0) * probs[:, e:e + 1] + 0.1 * ye
    return out


def adv_switch_reverse_priority(params, x, capacity_factor=0.5):
    """Switch top-1 (argmax) capacity layer written in pure JAX with *reversed* priority (later tokens win
    the slots: reversed cumsum) and capacity_factor 0.5 so many tokens drop; exactness tests drop order."""
    T = x.shape[0]
    E = params["router"].shape[1]
    C = max(1, int(capacity_factor * T / E))
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    eidx = jnp.argmax(probs, axis=-1)
    gval = jnp.max(probs, axis=-1)
    mask = jax.nn.one_hot(eidx, E, dtype=x.dtype)
    pos = (jnp.cumsum(mask[::-1], axis=0)[::-1] * mask).astype(jnp.int32) - 1
    disp = (mask * (pos < C))[:, :, None] * jax.nn.one_hot(pos, C, dtype=x.dtype)
    xin = jnp.einsum("tec,td->ecd", disp, x)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xin, params["w_gate"])) * jnp.einsum("ecd,edf->ecf", xin, params["w_up"])
    yo = jnp.einsum("ecf,efd->ecd", h, params["w_down"])
    return jnp.einsum("tec,ecd->td", disp * gval[:, None, None], yo)


def init_e4(key):
    return init_stacked(key, 8, 16, 4), _x(key, 16, 8)


def init_e4_bias(key):
    return init_stacked(key, 8, 16, 4, bias=True), _x(key, 16, 8)


def init_switch_rev(key):
    return init_stacked(key, 8, 16, 4), _x(key, 32, 8)


LAYERS.update({
    "deepseek_sigmoid_bias_set": (init_deepseek_sigmoid_bias, deepseek_sigmoid_bias_set, "dense (diagnostic)"),
    "adv_token_mix_in_expert": (init_e4, adv_token_mix_in_expert, "none (must not rewrite)"),
    "adv_cross_expert_centre": (init_e4, adv_cross_expert_centre, "none (must not rewrite)"),
    "adv_loop_reversed_weights": (init_e4, adv_loop_reversed_weights, "loop (or miss), exact"),
    "adv_loop_dense_residual": (init_e4_bias, adv_loop_dense_residual, "loop w/ residual (or miss), exact"),
    "adv_switch_reverse_priority": (init_switch_rev, adv_switch_reverse_priority, "capacity, exact drops"),
})


def pytree_loop_scaled(model, x):
    """Hand-rolled pytree class (same `PytreeMoE` object as `pytree_stack_experts`), written as research code
    often does: `out = 0.0; out = out + scale[e] * expert_e(x) * gate[:, e:e+1]` over the separate expert
    dicts, per-expert scalar output scale `scale[e]` (a 0-d slice of a stacked [E] array), gpt-oss clamp."""
    E = len(model.experts)
    probs = jax.nn.softmax(x @ model.router, axis=-1)
    w, idx = lax.approx_max_k(probs, model.k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    gate = jnp.sum(jax.nn.one_hot(idx, E, dtype=x.dtype) * w[..., None], axis=1)
    out = 0.0
    for e, p in enumerate(model.experts):
        g = jnp.clip(x @ p["w_gate"], max=7.0)
        u = jnp.clip(x @ p["w_up"], -7.0, 7.0)
        y = ((g * jax.nn.sigmoid(1.702 * g)) * (u + 1.0)) @ p["w_down"]
        out = out + model.scale[e] * y * gate[:, e:e + 1]
    return out


def loop_scale_stacked(params, x, k=2):
    """Diagnostic, minimal: the loop_moe form (stacked W[e], gate from `idx == e`) times a per-expert scalar
    `params['scale'][e]` (0-d)."""
    w, idx, _ = _softmax_topk(params["router"], x, k)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        g = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1)
        pe = {n: params[n][e] for n in ("w_gate", "w_up", "w_down")}
        out = out + params["scale"][e] * g[:, None] * _swiglu(pe, x)
    return out


def loop_scale_1elem(params, x, k=2):
    """Diagnostic: `loop_scale_stacked` with the scale read as a 1-element array `scale[e:e+1]` (shape [1])
    instead of a 0-d scalar."""
    w, idx, _ = _softmax_topk(params["router"], x, k)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        g = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1)
        pe = {n: params[n][e] for n in ("w_gate", "w_up", "w_down")}
        out = out + params["scale"][e:e + 1] * g[:, None] * _swiglu(pe, x)
    return out


def init_e4_scale(key):
    return init_stacked(key, 8, 16, 4, scales=True), _x(key, 16, 8)


LAYERS.update({
    "pytree_loop_scaled": (init_pytree_stack_experts, pytree_loop_scaled, "loop"),
    "loop_scale_stacked": (init_e4_scale, loop_scale_stacked, "loop (diagnostic)"),
    "loop_scale_1elem": (init_e4_scale, loop_scale_1elem, "loop (diagnostic)"),
})
