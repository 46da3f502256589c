"""Built-in example MoE layers, written the naive ways that real models use, plus the grouped form.

They feed the demo, the tests and (later) the rewrite pass's examples:
- `dense_moe`: Mixtral-style: every expert runs on every token, outputs weighted by a top-k-sparse gate.
- `capacity_moe`: GShard/Switch-style one-hot dispatch/combine einsums with an expert capacity.
- `grouped_moe`: the same function as `dense_moe`, written dropless on `grouped_matmul`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jax_moe_ffi.ops.grouped_gemm import grouped_matmul


def init_moe_params(key, d_model: int, d_ff: int, num_experts: int, dtype=jnp.float32):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    s_in, s_ff = 1 / math.sqrt(d_model), 1 / math.sqrt(d_ff)
    return {
        "router": jax.random.normal(k1, (d_model, num_experts), dtype) * s_in,
        "w_gate": jax.random.normal(k2, (num_experts, d_model, d_ff), dtype) * s_in,
        "w_up": jax.random.normal(k3, (num_experts, d_model, d_ff), dtype) * s_in,
        "w_down": jax.random.normal(k4, (num_experts, d_ff, d_model), dtype) * s_ff,
    }


def _router(params, x, top_k):
    """softmax -> top-k -> renormalise (Mixtral)."""
    probs = jax.nn.softmax(x.astype(jnp.float32) @ params["router"].astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts, probs


ARGSORT_FORMS = ("neg", "descending", "rev", "last")


def argsort_router(form: str = "neg"):
    """`_router` with the top-k taken by jnp.argsort, as code ported from NumPy / PyTorch writes it:
    argsort(-p)[:, :k] ("neg"), argsort(p, descending=True)[:, :k], argsort(p)[:, ::-1][:, :k] ("rev") or
    argsort(p)[:, -k:] ("last": the same experts, the largest last); "strided" is not a top-k (a near-miss)."""
    def router(params, x, top_k):
        probs = jax.nn.softmax(x.astype(jnp.float32) @ params["router"].astype(jnp.float32), axis=-1)
        experts = {"neg": lambda: jnp.argsort(-probs, axis=-1)[..., :top_k],
                   "descending": lambda: jnp.argsort(probs, axis=-1, descending=True)[..., :top_k],
                   "rev": lambda: jnp.argsort(probs, axis=-1)[..., ::-1][..., :top_k],
                   "last": lambda: jnp.argsort(probs, axis=-1)[..., -top_k:],
                   # every other one of the 2k best: distinct indices, but no top-k (the pass keeps it dense)
                   "strided": lambda: jnp.argsort(-probs, axis=-1)[..., : 2 * top_k : 2]}[form]()
        weights = jnp.take_along_axis(probs, experts, axis=-1)
        return weights / jnp.sum(weights, axis=-1, keepdims=True), experts, probs
    return router


def dense_moe(params, x, top_k: int = 2, router=_router):
    """All-experts dense compute weighted by a top-k-sparse gate: E x the FLOPs of the routed work."""
    weights, experts, _ = router(params, x, top_k)
    e = params["w_gate"].shape[0]
    gate = jnp.sum(jax.nn.one_hot(experts, e, dtype=x.dtype) * weights[..., None].astype(x.dtype), axis=1)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum(
        "td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("ted,te->td", y, gate)


def capacity_moe(params, x, top_k: int = 2, capacity_factor: float = 1.25, router=_router):
    """GShard/Switch capacity layer: one-hot [T,E,C] dispatch/combine einsums; overflow tokens dropped."""
    t = x.shape[0]
    weights, experts, _ = router(params, x, top_k)
    e = params["w_gate"].shape[0]
    capacity = max(1, int(math.ceil(t * top_k / e * capacity_factor)))
    mask = jax.nn.one_hot(experts, e, dtype=jnp.int32)  # [T, k, E]
    # position of each (token, choice) in its expert: running count in token-major, choice-minor order
    flat = mask.reshape(t * top_k, e)
    pos = (jnp.cumsum(flat, axis=0) - 1).reshape(t, top_k, e)
    keep = mask * (pos < capacity)
    pos_1h = jax.nn.one_hot(jnp.sum(pos * keep, axis=-1), capacity, dtype=x.dtype)  # [T, k, C]
    dispatch = jnp.einsum("tke,tkc->tec", keep.astype(x.dtype), pos_1h)
    combine = jnp.einsum("tke,tkc,tk->tec", keep.astype(x.dtype), pos_1h, weights.astype(x.dtype))
    xe = jnp.einsum("tec,td->ecd", dispatch, x)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xe, params["w_gate"])) * jnp.einsum(
        "ecd,edf->ecf", xe, params["w_up"])
    ye = jnp.einsum("ecf,efd->ecd", h, params["w_down"])
    return jnp.einsum("tec,ecd->td", combine, ye)


def grouped_moe(params, x, top_k: int = 2):
    """Dropless MoE on `grouped_matmul`: sort (token, choice) pairs by expert, three grouped GEMMs, combine."""
    t, d = x.shape
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    flat_e = experts.reshape(-1)
    order = jnp.argsort(flat_e, stable=True)  # stable: token-major order inside each expert
    rows = x[order // top_k]
    sizes = jnp.bincount(flat_e, length=e).astype(jnp.int32)
    h = jax.nn.silu(grouped_matmul(rows, params["w_gate"], sizes)) * grouped_matmul(rows, params["w_up"], sizes)
    y = grouped_matmul(h, params["w_down"], sizes)
    w_sorted = weights.reshape(-1)[order].astype(y.dtype)
    return jnp.zeros((t, d), y.dtype).at[order // top_k].add(y * w_sorted[:, None])


# ------------------------------------------------------------------------------------------------------
# More naive MoE layers, written the ways real models write them (examples and tests for the rewrite pass
# `jax_moe_ffi.optimize`). Each is exact: the pass must reproduce it; the last few are *not* token-choice
# MoE (expert choice, soft MoE, a dense mixture) and must be left as they are.
# ------------------------------------------------------------------------------------------------------
def init_moe_params_extra(key, d_model: int, d_ff: int, num_experts: int, dtype=jnp.float32):
    """`init_moe_params` plus biases, a fused gate/up weight, per-expert scales and a shared expert."""
    p = init_moe_params(key, d_model, d_ff, num_experts, dtype)
    ks = jax.random.split(jax.random.fold_in(key, 1), 6)
    p["b_gate"] = 0.1 * jax.random.normal(ks[0], (num_experts, d_ff), dtype)
    p["b_up"] = 0.1 * jax.random.normal(ks[1], (num_experts, d_ff), dtype)
    p["b_down"] = 0.1 * jax.random.normal(ks[2], (num_experts, d_model), dtype)
    p["w_gate_up"] = jnp.concatenate([p["w_gate"], p["w_up"]], axis=-1)  # [E, D, 2F]
    p["scale"] = 1.0 + 0.1 * jax.random.normal(ks[3], (num_experts,), dtype)
    p["shared_up"] = jax.random.normal(ks[4], (d_model, d_ff), dtype) / math.sqrt(d_model)
    p["shared_down"] = jax.random.normal(ks[5], (d_ff, d_model), dtype) / math.sqrt(d_ff)
    return p


def _gate_matrix(weights, experts, e, dtype):
    return jnp.sum(jax.nn.one_hot(experts, e, dtype=dtype) * weights[..., None].astype(dtype), axis=-2)


def dense_moe_topk_softmax(params, x, top_k: int = 2):
    """top-k on the logits, then softmax over the k selected logits (Mixtral HF / Qwen-MoE style)."""
    logits = x @ params["router"]
    vals, experts = jax.lax.top_k(logits, top_k)
    weights = jax.nn.softmax(vals, axis=-1)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("ted,te->td", y, gate)


def dense_moe_sigmoid(params, x, top_k: int = 2):
    """Sigmoid router, no renormalisation; combine written as a masked sum over experts."""
    scores = jax.nn.sigmoid(x @ params["router"])
    weights, experts = jax.lax.top_k(scores, top_k)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.sum(y * gate[:, :, None], axis=1)


def dense_moe_bias(params, x, top_k: int = 2):
    """Per-expert biases on every projection, a clamp and a per-expert output scale (gpt-oss-like)."""
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    g = jnp.einsum("td,edf->tef", x, params["w_gate"]) + params["b_gate"]
    u = jnp.einsum("td,edf->tef", x, params["w_up"]) + params["b_up"]
    g = jnp.clip(g, -7.0, 7.0)
    h = jax.nn.silu(g) * u
    y = jnp.einsum("tef,efd->ted", h, params["w_down"]) + params["b_down"][None]
    y = y * params["scale"][None, :, None]
    return jnp.einsum("ted,te->td", y, gate)


def dense_moe_geglu(params, x, top_k: int = 2):
    """GeGLU experts (tanh-approximate GELU), top_k on softmax probabilities, approx_max_k selection."""
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    weights, experts = jax.lax.approx_max_k(probs, top_k)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    h = jax.nn.gelu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("ted,te->td", y, gate)


def dense_moe_fused(params, x, top_k: int = 2):
    """Fused gate/up weight [E, D, 2F], split after the projection."""
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    gu = jnp.einsum("td,edf->tef", x, params["w_gate_up"])
    g, u = jnp.split(gu, 2, axis=-1)
    y = jnp.einsum("tef,efd->ted", jax.nn.silu(g) * u, params["w_down"])
    return jnp.einsum("ted,te->td", y, gate)


def dense_moe_lhs(params, x, top_k: int = 2):
    """Expert weights as the *lhs* of dot_general, expert-major layout [E, F, T], gate applied before the
    down projection, which contracts experts and features at once."""
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    dn = (((1,), (1,)), ((), ()))
    g = jax.lax.dot_general(params["w_gate"], x, dn)  # [E, F, T]
    u = jax.lax.dot_general(params["w_up"], x, dn)
    h = jax.nn.silu(g) * u * gate.T[:, None, :]  # gate multiplied in before w_down
    return jnp.einsum("eft,efd->td", h, params["w_down"])


def dense_moe_free_e(params, x, top_k: int = 2):
    """Weights stored [D, E, F] (E a free dim of dot_general, not a batch dim)."""
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    wg = jnp.transpose(params["w_gate"], (1, 0, 2))
    wu = jnp.transpose(params["w_up"], (1, 0, 2))
    h = jax.nn.silu(jnp.einsum("td,def->tef", x, wg)) * jnp.einsum("td,def->tef", x, wu)
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("te,ted->td", gate, y)


def masked_moe(params, x, top_k: int = 2):
    """Tokens broadcast to every expert and masked to the chosen ones, then all-experts einsums."""
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    mask = jnp.sum(jax.nn.one_hot(experts, e, dtype=x.dtype), axis=1)  # [T, E] 0/1
    gate = _gate_matrix(weights, experts, e, x.dtype)
    xe = jnp.broadcast_to(x[:, None, :], (x.shape[0], e, x.shape[1])) * mask[:, :, None]
    h = jax.nn.silu(jnp.einsum("ted,edf->tef", xe, params["w_gate"])) * jnp.einsum("ted,edf->tef", xe, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("ted,te->td", y, gate)


def masked_moe_where(params, x, top_k: int = 2):
    """Broadcast-then-mask with jnp.where and the gate folded into the input; combine = plain sum over E."""
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e, x.dtype)
    sel = gate > 0
    xe = jnp.where(sel[:, :, None], x[:, None, :], 0.0)  # [T, E, D]
    h = jax.nn.silu(jnp.einsum("ted,edf->tef", xe, params["w_gate"])) * jnp.einsum("ted,edf->tef", xe, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.sum(y * gate[:, :, None], axis=1)


def loop_moe(params, x, top_k: int = 2):
    """Per-expert python loop over slices W[e] of stacked weights; gate column from `experts == e`."""
    weights, experts, _ = _router(params, x, top_k)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        g_e = jnp.sum(jnp.where(experts == e, weights, 0.0), axis=-1).astype(x.dtype)  # [T]
        h = jax.nn.silu(x @ params["w_gate"][e]) * (x @ params["w_up"][e])
        out = out + g_e[:, None] * (h @ params["w_down"][e])
    return out


def loop_moe_reciprocal_mask(params, x, top_k: int = 2):
    """Per-expert loop in a community style: the k-hot mask made a logit penalty by `logits - (1 / mask - 1)`
    (+inf off the chosen experts), softmax, `jnp.split` of mask and gate into columns, biased ReLU experts on
    `x * mask_e`, and a Python `sum` of `expert_e(x * mask_e) * gate_e` (biases: expert_e(0) != 0, the
    sparsity comes from the gate)."""
    e_count = params["w_gate"].shape[0]
    logits = x @ params["router"]
    _, experts = jax.lax.top_k(logits, top_k)
    mask = jnp.sum(jax.nn.one_hot(experts, e_count, dtype=x.dtype), axis=-2)
    gate = jax.nn.softmax(logits - (1.0 / mask - 1.0), axis=-1)
    masks, gates = jnp.split(mask, e_count, axis=-1), jnp.split(gate, e_count, axis=-1)

    def expert(e, h):
        h = jax.nn.relu(h @ params["w_gate"][e] + params["b_gate"][e])
        return h @ params["w_down"][e] + params["b_down"][e]

    return sum(expert(e, x * m) * g for e, (m, g) in enumerate(zip(masks, gates)))


def loop_moe_scalar_scales(params, x, top_k: int = 2, separate: bool = False, on_input: bool = False):
    """Per-expert loop with a 0-d per-expert scale: `scale[e]` of a stacked [E] array (or separate scalar
    leaves with `separate`), used through a derived scalar (2 * s - 1), on the output (or on the input rows
    with `on_input`). `params["scale"]` as in `init_moe_params_extra`."""
    weights, experts, _ = _router(params, x, top_k)
    e_count = params["w_gate"].shape[0]
    scales = [params["scale"][i] + 0.0 for i in range(e_count)] if separate else params["scale"]
    out = 0.0
    for e in range(e_count):
        g_e = jnp.sum(jnp.where(experts == e, weights, 0.0), axis=-1).astype(x.dtype)  # [T]
        s = 2.0 * scales[e] - 1.0  # 0-d, differs between experts
        xe = x * s if on_input else x
        h = jax.nn.silu(xe @ params["w_gate"][e]) * (xe @ params["w_up"][e])
        y = h @ params["w_down"][e]
        out = out + (y if on_input else s * y) * g_e[:, None]
    return out


def loop_moe_shared_bias(params, x, top_k: int = 2):
    """flax-style per-expert loop (sigmoid router, approx_max_k) that starts its sum from a shared expert whose
    output bias is added as [1, D] (how flax's Dense adds it), a term of another shape in the chain."""
    scores = jax.nn.sigmoid(x @ params["router"])
    w, idx = jax.lax.approx_max_k(scores, top_k)
    w = w / jnp.sum(w, -1, keepdims=True)
    out = jax.nn.silu(x @ params["shared_up"]) @ params["shared_down"] + params["b_down"][0][None, :]
    for e in range(params["w_gate"].shape[0]):
        g = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1, keepdims=True)
        h = jax.nn.silu(x @ params["w_gate"][e] + params["b_gate"][e]) * (x @ params["w_up"][e])
        out = out + g * (h @ params["w_down"][e])
    return out


def split_expert_params(params):
    """Stacked expert weights -> a list of separate per-expert weight dicts (for `loop_moe_list`)."""
    e = params["w_gate"].shape[0]
    return {"router": params["router"],
            "experts": [{"w_gate": params["w_gate"][i] + 0, "w_up": params["w_up"][i] + 0,
                         "w_down": params["w_down"][i] + 0} for i in range(e)]}


def loop_moe_list(params, x, top_k: int = 2):
    """Per-expert loop over a list of separate expert weights; gate column e of a dense gate matrix."""
    weights, experts, _ = _router(params, x, top_k)
    e = len(params["experts"])
    gate = _gate_matrix(weights, experts, e, x.dtype)
    out = 0.0
    for i, p in enumerate(params["experts"]):
        h = jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])
        out = out + (h @ p["w_down"]) * gate[:, i:i + 1]
    return out


def shared_expert_moe(params, x, top_k: int = 2):
    """Routed experts (dense form) plus an always-on shared expert (DeepSeek/Qwen2-MoE style)."""
    shared = jax.nn.silu(x @ params["shared_up"]) @ params["shared_down"]
    return dense_moe(params, x, top_k) + shared


def moe_decoder(stacked_params, x, top_k: int = 2, remat: bool = True, moe=None):
    """A small decoder: `lax.scan` over layers of (residual) MoE blocks, each under `jax.checkpoint`.
    moe: the layer's MoE function (default dense_moe)."""
    moe = dense_moe if moe is None else moe

    def block(h, p):
        hn = h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
        return h + moe(p, hn, top_k)

    if remat:
        block = jax.checkpoint(block)

    def layer(h, p):
        return block(h, p), None

    h, _ = jax.lax.scan(layer, x, stacked_params)
    return h


def capacity_moe_aux_losses(params, x, top_k: int = 2, capacity_factor: float = 1.25):
    """`capacity_moe` that also returns its training losses from the *same* router tensors: the Switch
    load-balancing loss (E * sum_e f_e P_e, f from the top-k one-hot mask, P from the probabilities) plus a
    router z-loss (mean logsumexp(logits)^2), as Switch / ST-MoE style models write them. The pass must
    rewrite the MoE while the mask, probabilities and logits keep these other users."""
    t = x.shape[0]
    e = params["w_gate"].shape[0]
    logits = x.astype(jnp.float32) @ params["router"].astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    capacity = max(1, int(math.ceil(t * top_k / e * capacity_factor)))
    mask = jax.nn.one_hot(experts, e, dtype=jnp.int32)  # [T, k, E]
    pos = (jnp.cumsum(mask.reshape(t * top_k, e), axis=0) - 1).reshape(t, top_k, e)
    keep = mask * (pos < capacity)
    balance = e * jnp.sum(jnp.mean(mask.astype(jnp.float32), axis=(0, 1)) * jnp.mean(probs, axis=0))
    z_loss = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    pos_1h = jax.nn.one_hot(jnp.sum(pos * keep, axis=-1), capacity, dtype=x.dtype)
    dispatch = jnp.einsum("tke,tkc->tec", keep.astype(x.dtype), pos_1h)
    combine = jnp.einsum("tke,tkc,tk->tec", keep.astype(x.dtype), pos_1h, weights.astype(x.dtype))
    xe = jnp.einsum("tec,td->ecd", dispatch, x)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xe, params["w_gate"])) * jnp.einsum(
        "ecd,edf->ecf", xe, params["w_up"])
    y = jnp.einsum("tec,ecd->td", combine, jnp.einsum("ecf,efd->ecd", h, params["w_down"]))
    return y, balance + 1e-3 * z_loss


def capacity_moe_bsec(params, x, top_k: int = 2, capacity_factor: float = 1.0, priority: str = "token"):
    """GShard with groups: x [G, S, D] (a [B, S, E, C] / [G, S, E, C] dispatch tensor), capacity per group.

    priority="token": token-major, choice-minor running count; "choice": choice-major (GShard top-2:
    every token's first choice before any second choice)."""
    g, s, d = x.shape
    weights, experts, _ = _router(params, x, top_k)  # [G, S, k]
    e = params["w_gate"].shape[0]
    capacity = max(1, int(math.ceil(s * top_k / e * capacity_factor)))
    mask = jax.nn.one_hot(experts, e, dtype=jnp.int32)  # [G, S, k, E]
    if priority == "token":
        pos = (jnp.cumsum(mask.reshape(g, s * top_k, e), axis=1) - 1).reshape(g, s, top_k, e)
    else:
        mt = jnp.swapaxes(mask, 1, 2).reshape(g, top_k * s, e)
        pos = jnp.swapaxes((jnp.cumsum(mt, axis=1) - 1).reshape(g, top_k, s, e), 1, 2)
    keep = mask * (pos < capacity)
    pos_1h = jax.nn.one_hot(jnp.sum(pos * keep, axis=-1), capacity, dtype=x.dtype)  # [G, S, k, C]
    dispatch = jnp.einsum("gske,gskc->gsec", keep.astype(x.dtype), pos_1h)
    combine = jnp.einsum("gske,gskc,gsk->gsec", keep.astype(x.dtype), pos_1h, weights.astype(x.dtype))
    xe = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    h = jax.nn.silu(jnp.einsum("egcd,edf->egcf", xe, params["w_gate"])) * jnp.einsum(
        "egcd,edf->egcf", xe, params["w_up"])
    ye = jnp.einsum("egcf,efd->egcd", h, params["w_down"])
    return jnp.einsum("gsec,egcd->gsd", combine, ye)


def capacity_moe_grouped(params, x, top_k: int = 2, num_groups: int = 2, capacity_factor: float = 1.0):
    """[T, D] tokens split into groups, GShard [G, S, E, C] dispatch per group."""
    t, d = x.shape
    return capacity_moe_bsec(params, x.reshape(num_groups, t // num_groups, d), top_k,
                             capacity_factor).reshape(t, d)


def _capacity_einsums(params, x, keep, slot_1h, weights):
    """[T, k, E] kept mask and [T, k, C] slot one-hot -> GShard dispatch / combine einsums around SwiGLU experts."""
    dispatch = jnp.einsum("tke,tkc->tec", keep.astype(x.dtype), slot_1h)
    combine = jnp.einsum("tke,tkc,tk->tec", keep.astype(x.dtype), slot_1h, weights.astype(x.dtype))
    xe = jnp.einsum("tec,td->ecd", dispatch, x)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xe, params["w_gate"])) * jnp.einsum("ecd,edf->ecf", xe,
                                                                                     params["w_up"])
    return jnp.einsum("tec,ecd->td", combine, jnp.einsum("ecf,efd->ecd", h, params["w_down"]))


def capacity_moe_random_second_choice(params, x, capacity_factor: float = 1.0):
    """GShard's top-2 with the 'random' second-expert policy: the second choice is kept where a fixed-key
    uniform draw is below 2 x its weight, then a choice-major running count (every first choice before any
    second one). The slots depend on the router weights, not on the expert ids alone."""
    t = x.shape[0]
    weights, experts, _ = _router(params, x, 2)
    e = params["w_gate"].shape[0]
    capacity = max(1, int(math.ceil(t * 2 / e * capacity_factor)))
    u = jax.random.uniform(jax.random.PRNGKey(1234), (t,), jnp.float32)
    keep_choice = jnp.stack([jnp.ones((t,), jnp.int32), (u < 2.0 * weights[:, 1]).astype(jnp.int32)], -1)
    mask = jax.nn.one_hot(experts, e, dtype=jnp.int32) * keep_choice[..., None]  # [T, 2, E]
    pos = jnp.swapaxes((jnp.cumsum(jnp.swapaxes(mask, 0, 1).reshape(2 * t, e), axis=0) - 1).reshape(2, t, e), 0, 1)
    keep = mask * (pos < capacity)
    slot = jax.nn.one_hot(jnp.sum(pos * keep, -1), capacity, dtype=x.dtype)  # [T, 2, C]
    return _capacity_einsums(params, x, keep, slot, weights)


def capacity_moe_per_choice_count(params, x, top_k: int = 2, capacity_factor: float = 1.0):
    """NOT a valid capacity rule (a near-miss for exact mode): the running count runs over the tokens of each
    choice separately ([T, k, E] cumsum along T), so a first and a second choice of the same expert can get
    the same slot, and that buffer row holds the sum of two tokens."""
    t = x.shape[0]
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    capacity = max(1, int(math.ceil(t * top_k / e * capacity_factor)))
    mask = jax.nn.one_hot(experts, e, dtype=jnp.int32)  # [T, k, E]
    pos = jnp.cumsum(mask, axis=0) - 1  # per choice: collides across choices
    keep = mask * (pos < capacity)
    pos_1h = jax.nn.one_hot(jnp.sum(pos * keep, axis=-1), capacity, dtype=x.dtype)  # [T, k, C]
    return _capacity_einsums(params, x, keep, pos_1h, weights)


def capacity_moe_groups_summed(params, x, capacity: int = 3):
    """NOT a valid capacity rule (a near-miss for exact mode): top-1 on x [G, S, D] with a running count per
    group (over S), but the dispatch einsum sums over the groups ('gsec,gsd->ecsd'): tokens of different
    groups at the same position share a buffer row."""
    probs = jax.nn.softmax(x @ params["router"], axis=-1)  # [G, S, E]
    idx, gate = jnp.argmax(probs, -1), jnp.max(probs, -1)
    mask = jax.nn.one_hot(idx, params["w_gate"].shape[0], dtype=jnp.int32)
    pos = jnp.cumsum(mask, axis=1) - 1
    slot = jax.nn.one_hot(jnp.sum(pos * mask, -1), capacity, dtype=x.dtype)  # [G, S, C]
    disp = mask[..., None].astype(x.dtype) * slot[..., None, :] * (pos < capacity)[..., None]
    xe = jnp.einsum("gsec,gsd->ecsd", disp, x)
    h = jax.nn.relu(jnp.einsum("ecsd,edf->ecsf", xe, params["w_up"]))
    return jnp.einsum("gsec,ecsd->gsd", disp * gate[..., None, None], jnp.einsum("ecsf,efd->ecsd", h,
                                                                                 params["w_down"]))


SCAN_FORMS = ("scan", "fori", "scan_reverse", "fill", "while", "reversed_weights")


def scan_over_experts_moe(params, x, top_k: int = 2, form: str = "scan"):
    """Routed MoE as a loop over the stacked expert weights that JAX does not unroll, each expert run on every
    token and gated by its column of the top-k gate:
      "scan":             lax.scan over (arange(E), W_gate, W_up, W_down), the output accumulated in the carry;
      "fori":             lax.fori_loop(0, E, ...) indexing the weights with the counter (a scan underneath);
      "scan_reverse":     the scan run last expert first (reverse=True);
      "fill":             a [T, E, D] buffer filled by dynamic_update_slice at column e, then einsum with the gate;
      "while":            lax.while_loop over the experts (reported: the pass does not unroll while loops);
      "reversed_weights": expert e's gate column on the weights of expert E-1-e (a different model: the pass
                          must not read it as a per-expert loop)."""
    if form not in SCAN_FORMS:
        raise ValueError(f"form must be one of {SCAN_FORMS}, got {form!r}")
    weights, experts, _ = _router(params, x, top_k)
    e_count = params["w_gate"].shape[0]
    gate = _gate_matrix(weights, experts, e_count, x.dtype)  # [T, E]
    names = ("w_gate", "w_up", "w_down")

    def expert_out(wg, wu, wd):
        return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd

    def gated(e, w_at):
        return expert_out(*[_index0(params[n], w_at) for n in names]) * _index0(gate.T, e)[:, None]

    if form == "fori":
        return jax.lax.fori_loop(0, e_count, lambda e, acc: acc + gated(e, e), jnp.zeros_like(x))
    if form == "reversed_weights":
        return jax.lax.fori_loop(0, e_count, lambda e, acc: acc + gated(e, e_count - 1 - e), jnp.zeros_like(x))
    if form == "while":
        def body(c):
            e, acc = c
            return e + 1, acc + gated(e, e)
        return jax.lax.while_loop(lambda c: c[0] < e_count, body, (0, jnp.zeros_like(x)))[1]
    if form == "fill":
        def fill(buf, e):
            y = expert_out(*[_index0(params[n], e) for n in names])
            return jax.lax.dynamic_update_slice(buf, y[:, None, :], (0, e, 0)), None
        buf = jax.lax.scan(fill, jnp.zeros(x.shape[:1] + (e_count,) + x.shape[1:], x.dtype), jnp.arange(e_count))[0]
        return jnp.einsum("ted,te->td", buf, gate)

    def step(acc, xs):
        e, wg, wu, wd = xs
        return acc + expert_out(wg, wu, wd) * gate[:, e][:, None], None
    return jax.lax.scan(step, jnp.zeros_like(x), (jnp.arange(e_count),) + tuple(params[n] for n in names),
                        reverse=form == "scan_reverse")[0]


def _index0(a, i):
    """a[i] along axis 0 for a traced index (the fori_loop counter)."""
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


def gathered_weights_moe(params, x, top_k: int = 2):
    """Routed MoE that gathers each (token, choice)'s expert weights (`w[idx]`: [T, k, D, F]) and contracts
    per token (EasyDeL's DENSE_MOE path is written so): the pass runs each such dot as a grouped GEMM of the
    rows sorted by expert (family 6), without the weight copy."""
    weights, experts, _ = _router(params, x, top_k)
    wg, wu, wd = (params[n][experts] for n in ("w_gate", "w_up", "w_down"))
    h = jax.nn.silu(jnp.einsum("td,tkdf->tkf", x, wg)) * jnp.einsum("td,tkdf->tkf", x, wu)
    return jnp.einsum("tkf,tkfd,tk->td", h, wd, weights.astype(x.dtype))


def gathered_rows_loop_moe(params, x, top_k: int = 2):
    """A per-expert Python loop that gathers each expert's own tokens (`jnp.nonzero(gate_e > 0, size=T)` into x
    padded by a zero row), runs the expert on them and scatter-adds the weighted rows back (PyTorch's index_add
    loop ported to jit): a form the pass reports and does not rewrite."""
    weights, experts, _ = _router(params, x, top_k)
    t, d = x.shape
    xp = jnp.concatenate([x, jnp.zeros((1, d), x.dtype)])
    out = jnp.zeros((t + 1, d), x.dtype)
    for e in range(params["w_gate"].shape[0]):
        gate_e = jnp.sum(jnp.where(experts == e, weights, 0.0), axis=-1).astype(x.dtype)
        (rows,) = jnp.nonzero(gate_e > 0, size=t, fill_value=t)
        xe = xp[rows]
        ye = (jax.nn.silu(xe @ params["w_gate"][e]) * (xe @ params["w_up"][e])) @ params["w_down"][e]
        out = out.at[rows].add(ye * jnp.append(gate_e, 0.0)[rows][:, None])
    return out[:t]


def stacked_outputs_moe(params, x, top_k: int = 2, reverse: bool = False, pick: str = "gate"):
    """Every expert run on every token in a Python loop (slices W[e] of stacked weights, or the separate
    weights of `split_expert_params`), the outputs `jnp.stack`ed to [T, E, D] and combined with the top-k
    gate by `einsum('ted,te->td')` (no add chain). `reverse` stacks them last expert first and reverses the
    gate's columns to match (same values; not in expert order, a near-miss). pick="ids": each choice's output
    picked with one `take_along_axis` over the [T, k] ids, then weighted; pick="column": one take_along_axis per
    id column `ids[:, j]` (each column a site of its own, sharing the experts' compute)."""
    weights, experts, _ = _router(params, x, top_k)
    if "experts" in params:
        per_expert = params["experts"]
    else:
        per_expert = [{n: params[n][e] for n in ("w_gate", "w_up", "w_down")}
                      for e in range(params["w_gate"].shape[0])]
    gate = _gate_matrix(weights, experts, len(per_expert), x.dtype)
    outs = [(jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"] for p in per_expert]
    if reverse:
        outs, gate = outs[::-1], gate[:, ::-1]
    stacked = jnp.stack(outs, axis=1)
    if pick == "ids":
        return jnp.sum(jnp.take_along_axis(stacked, experts[..., None], axis=1) * weights[..., None], axis=1)
    if pick == "column":
        return sum(jnp.take_along_axis(stacked, experts[:, j, None, None], axis=1)[:, 0] * weights[:, j, None]
                   for j in range(top_k))
    return jnp.einsum("ted,te->td", stacked, gate)


def per_token_scan_moe(params, x, top_k: int = 2):
    """A lax.scan over the tokens: each step runs the token's k experts, indexing the stacked weights by its ids
    (one [1, D] x [D, F] product per step); reported, not rewritten."""
    weights, experts, _ = _router(params, x, top_k)

    def step(carry, row):
        xt, ids, w = row
        y = sum(w[j] * ((jax.nn.silu(xt @ params["w_gate"][ids[j]]) * (xt @ params["w_up"][ids[j]]))
                        @ params["w_down"][ids[j]]) for j in range(top_k))
        return carry, y
    return jax.lax.scan(step, None, (x, experts, weights.astype(x.dtype)))[1]


def column_gate_loop_moe(params, x, top_k: int = 2):
    """A Python loop over the experts whose gate is built one choice column at a time,
    `sum_j where(ids[:, j] == e, w[:, j], 0)` (lax.top_k ids), as `loop_moe` builds it from the whole id array
    (`sum(where(experts == e, weights, 0), -1)`). Rewritten (facts: a column of the ids is a fixed choice
    coordinate; the sum over columns binds it)."""
    weights, experts, _ = _router(params, x, top_k)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        h = jax.nn.silu(x @ params["w_gate"][e]) * (x @ params["w_up"][e])
        g = sum(jnp.where(experts[:, j] == e, weights[:, j], 0.0) for j in range(top_k))
        out = out + (h @ params["w_down"][e]) * g[:, None].astype(x.dtype)
    return out


def two_argmax_loop_moe(params, x, top_k: int = 2):
    """PhiMoE's SparseMixer routing as EasyDeL writes it (inference form): the first expert by argmax, the second
    by argmax over the scores with the first set to -inf, the ids concatenated [T, 2]; then a loop over the
    experts weighted by `sum_j where(ids[:, j] == e, w[:, j], 0)`. The two ids coincide when every other score is
    -inf, so they are not one top-k: the rewrite runs a token's first choice of each expert only (emit.first_choices),
    which is exact either way (top_k is ignored: always two)."""
    del top_k
    scores = x.astype(jnp.float32) @ params["router"].astype(jnp.float32)
    t = scores.shape[0]
    first = jnp.argmax(scores, axis=-1, keepdims=True)
    masked = scores.at[jnp.arange(t), first[:, 0]].set(-jnp.inf)
    second = jnp.argmax(masked, axis=-1, keepdims=True)
    w = jnp.concatenate([jnp.take_along_axis(jax.nn.softmax(scores, -1), first, -1),
                         jnp.take_along_axis(jax.nn.softmax(masked, -1), second, -1)], axis=-1)
    ids = jnp.concatenate([first, second], axis=-1).astype(jnp.int32)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        h = jax.nn.silu(x @ params["w_gate"][e]) * (x @ params["w_up"][e])
        g = sum(jnp.where(ids[:, j] == e, w[:, j], 0.0) for j in range(2))
        out = out + (h @ params["w_down"][e]) * g[:, None].astype(x.dtype)
    return out


def cond_skip_loop_moe(params, x, top_k: int = 2):
    """A Python loop over the experts, each expert under `lax.cond(any(ids == e), ...)` to skip experts no token
    chose (zeros otherwise). The gated branch is zero wherever no token chose e, so the pass reads each cond
    as its branch (checked) and rewrites the loop."""
    weights, experts, _ = _router(params, x, top_k)
    gate = _gate_matrix(weights, experts, params["w_gate"].shape[0], x.dtype)
    out = jnp.zeros_like(x)
    for e in range(params["w_gate"].shape[0]):
        def run(e=e):
            h = jax.nn.silu(x @ params["w_gate"][e]) * (x @ params["w_up"][e])
            return (h @ params["w_down"][e]) * gate[:, e:e + 1]
        out = out + jax.lax.cond(jnp.any(experts == e), run, lambda: jnp.zeros_like(x))
    return out


def switch_per_token_moe(params, x, top_k: int = 2):
    """Each (token, choice) runs its expert with `lax.switch` under `jax.vmap`: with a batched index JAX evaluates
    every branch and selects (here, a copy of the chosen expert's weights per token); reported, not rewritten."""
    weights, experts, _ = _router(params, x, top_k)
    branches = [(lambda e: lambda xt: (jax.nn.silu(xt @ params["w_gate"][e]) * (xt @ params["w_up"][e]))
                 @ params["w_down"][e])(e) for e in range(params["w_gate"].shape[0])]

    def token(xt, ids, w):
        return w @ jax.vmap(lambda i: jax.lax.switch(i, branches, xt))(ids)
    return jax.vmap(token)(x, experts, weights.astype(x.dtype))


def expert_choice_moe(params, x, capacity_factor: float = 1.0, argsort: bool = False, gather: bool = False):
    """Expert-choice routing (Zhou et al. 2022): each expert picks its top-C tokens. Not token choice.
    argsort=True picks them with jnp.argsort over the token axis instead of top_k; gather=True takes the
    expert's rows as `x[idx]` and scatter-adds the outputs back instead of one-hot einsums."""
    t = x.shape[0]
    e = params["w_gate"].shape[0]
    c = max(1, int(t * capacity_factor / e))
    probs = jax.nn.softmax(x @ params["router"], axis=-1)  # [T, E]
    if argsort:
        idx = jnp.argsort(-probs.T, axis=-1)[:, :c]
        vals = jnp.take_along_axis(probs.T, idx, axis=-1)
    else:
        vals, idx = jax.lax.top_k(probs.T, c)  # [E, C] token ids
    if gather:
        h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", x[idx], params["w_gate"])) * \
            jnp.einsum("ecd,edf->ecf", x[idx], params["w_up"])
        y = jnp.einsum("ecf,efd->ecd", h, params["w_down"]) * vals[..., None].astype(x.dtype)
        return jnp.zeros_like(x).at[idx.reshape(-1)].add(y.reshape(-1, x.shape[1]))
    disp = jax.nn.one_hot(idx, t, dtype=x.dtype)  # [E, C, T]
    xin = jnp.einsum("ect,td->ecd", disp, x)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xin, params["w_gate"])) * jnp.einsum("ecd,edf->ecf", xin, params["w_up"])
    y = jnp.einsum("ecf,efd->ecd", h, params["w_down"])
    return jnp.einsum("ecd,ect,ec->td", y, disp, vals)


def soft_moe(params, x, slots: int = 1):
    """Soft MoE (Puigcerver et al. 2023): dense soft dispatch/combine; every expert sees every token."""
    t, d = x.shape
    e = params["w_gate"].shape[0]
    phi = jnp.tile(params["router"], (1, slots))  # [D, E*S]
    logits = x @ phi
    disp = jax.nn.softmax(logits, axis=0)
    comb = jax.nn.softmax(logits, axis=1)
    xs = jnp.einsum("tn,td->nd", disp, x).reshape(e, slots, d)
    h = jax.nn.silu(jnp.einsum("esd,edf->esf", xs, params["w_gate"])) * jnp.einsum("esd,edf->esf", xs, params["w_up"])
    y = jnp.einsum("esf,efd->esd", h, params["w_down"]).reshape(e * slots, d)
    return jnp.einsum("tn,nd->td", comb, y)


def dense_mixture(params, x):
    """A dense layer with no gate: every expert's output summed (not MoE; must not be rewritten)."""
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    return jnp.einsum("tef,efd->td", h, params["w_down"])


def dense_softmax_mixture(params, x):
    """All experts weighted by the dense softmax router probabilities (no top-k): not sparse."""
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("ted,te->td", y, probs)


def dense_moe_masked_softmax(params, x, top_k: int = 2, squash=None, fill: float = -jnp.inf):
    """top-k on the logits, the other logits masked to -inf (or `fill`), softmax over all experts (a [T, E]
    gate that is zero outside the chosen experts because exp(-inf) = 0). `squash` applied to the masked logits
    before the softmax: a temperature (`v / 0.7`) keeps the gate sparse; tanh (tanh(-inf) = -1), or a
    division that brings the fill back to moderate values (-1e4 / 1e4), makes it dense again."""
    logits = x @ params["router"]
    _, experts = jax.lax.top_k(logits, top_k)
    e = params["w_gate"].shape[0]
    chosen = jnp.sum(jax.nn.one_hot(experts, e), axis=1) > 0
    masked = jnp.where(chosen, logits, fill)
    gate = jax.nn.softmax(masked if squash is None else squash(masked), axis=-1).astype(x.dtype)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("ted,te->td", y, gate)


def dense_moe_scattered_logits(params, x, top_k: int = 1, on_input: bool = True, gate_fn=jax.nn.sigmoid,
                               fill: float = -jnp.inf):
    """Llama 4's router: the top-k logits scattered into a -inf [T, E] array (`full(-inf).at[t, I].set(v)`),
    then `gate_fn` (sigmoid: 0 at -inf; softmax: Mixtral's renormalised top-k). With `on_input` the gate
    scales each expert's *input* (`expert(x * g)`, all experts run on zeros elsewhere: bias-free SwiGLU maps 0
    to 0), otherwise its output. A `fill` that is not hugely negative (sigmoid(-10) != 0) makes a dense gate."""
    t, e = x.shape[0], params["router"].shape[1]
    top_v, experts = jax.lax.top_k(x @ params["router"], top_k)
    scores = jnp.full((t, e), fill, x.dtype).at[jnp.arange(t)[:, None], experts].set(top_v)
    gate = gate_fn(scores).astype(x.dtype)  # [T, E]
    xin = x[None] * gate.T[:, :, None] if on_input else jnp.broadcast_to(x[None], (e,) + x.shape)
    h = jax.nn.silu(jnp.einsum("etd,edf->etf", xin, params["w_gate"])) * jnp.einsum("etd,edf->etf", xin, params["w_up"])
    if on_input:
        return jnp.einsum("etf,efd->td", h, params["w_down"])
    return jnp.einsum("etf,efd,te->td", h, params["w_down"], gate)


def dense_moe_per_choice(params, x, top_k: int = 2):
    """[B, S, D] tokens; each choice's expert output picked with a one-hot einsum (choice axis kept),
    then weighted and summed over choices."""
    weights, experts, _ = _router(params, x, top_k)  # [B, S, k]
    e = params["w_gate"].shape[0]
    h = jax.nn.silu(jnp.einsum("bsd,edf->bsef", x, params["w_gate"])) * jnp.einsum("bsd,edf->bsef", x, params["w_up"])
    y = jnp.einsum("bsef,efd->bsed", h, params["w_down"])
    picked = jnp.einsum("bske,bsed->bskd", jax.nn.one_hot(experts, e, dtype=x.dtype), y)  # [B, S, k, D]
    return jnp.einsum("bskd,bsk->bsd", picked, weights.astype(x.dtype))


def _scatter_gate(top_k_weights, top_k_indices, num_experts, dtype):
    """[B, S, k] weights scattered into a [B, S, E] gate with `.at[].set` (MaxText style)."""
    b, s, _ = top_k_weights.shape
    gate = jnp.zeros((b, s, num_experts), dtype=dtype)
    return gate.at[jnp.arange(b)[:, None, None], jnp.arange(s)[:, None], top_k_indices].set(
        top_k_weights.astype(dtype))


def dense_moe_sigmoid_bias_scatter_add(params, x, top_k: int = 2, scaling: float = 2.5):
    """DeepSeek-V3-style router: sigmoid scores, a per-expert bias used only to choose the experts, weights
    from the unbiased scores, renormalised and scaled; the [T, E] gate built with `.at[].add` (a scatter-add
    into zeros); all-experts dense compute."""
    t = x.shape[0]
    e = params["w_gate"].shape[0]
    scores = jax.nn.sigmoid(x @ params["router"])
    _, idx = jax.lax.top_k(scores + params["b_down"][:, 0], top_k)  # any [E] vector serves as the bias
    w = jnp.take_along_axis(scores, idx, axis=-1)
    w = scaling * w / jnp.sum(w, axis=-1, keepdims=True)
    gate = jnp.zeros((t, e), x.dtype).at[jnp.arange(t)[:, None], idx].add(w)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    return jnp.einsum("tef,efd,te->td", h, params["w_down"], gate)


def maxtext_style_moe(params, x, top_k: int = 2, capacity_factor: float = 0.0):
    """MaxText `RoutedMoE.dense_matmul`-style layer on x [B, S, M]: top-k on the logits, softmax over the
    k, weights scattered into [B, S, E]; capacity_factor > 0: 1-based running counts, a (C+1)-way one-hot
    sliced [..., 1:], bool dispatch mask and "BSM,BSEC->EBCM" einsums; else dropless all-experts einsums."""
    b, s, _ = x.shape
    e = params["w_gate"].shape[0]
    logits = jnp.einsum("bsm,me->bse", x, params["router"])
    top_k_weights, top_k_indices = jax.lax.top_k(logits, top_k)
    top_k_weights = jax.nn.softmax(top_k_weights.astype(jnp.float32), axis=-1).astype(x.dtype)
    weights = _scatter_gate(top_k_weights, top_k_indices, e, x.dtype)
    act = jax.nn.silu
    if capacity_factor > 0:
        capacity = int(max(math.ceil(s * top_k / e) * capacity_factor, capacity_factor))
        expert_mask = jax.nn.one_hot(top_k_indices, num_classes=e, dtype=jnp.int32)  # [B, S, k, E]
        mask_fused = jnp.reshape(expert_mask, (b, s * top_k, e))
        count_fused = jnp.cumsum(mask_fused, axis=1)
        count = jnp.reshape(count_fused, (b, s, top_k, e))
        trunc = expert_mask * jnp.less_equal(count, capacity)
        combined = jnp.sum(trunc, axis=2)  # [B, S, E]
        probs = weights * combined
        position = jnp.reshape(mask_fused * count_fused, (b, s, top_k, e))
        combined_position = jnp.sum(position, axis=2) * combined
        pos_1h = jax.nn.one_hot(combined_position, num_classes=capacity + 1, dtype=jnp.int32)
        combine_mask = (probs[..., None] * pos_1h)[..., 1:]  # [B, S, E, C]
        dispatch_mask = combine_mask.astype(bool)
        dispatch = jnp.einsum("BSM,BSEC -> EBCM", x, dispatch_mask)
        w0 = jnp.einsum("EBCM,EMH -> EBCH", dispatch, params["w_gate"])
        w1 = jnp.einsum("EBCM,EMH -> EBCH", dispatch, params["w_up"])
        inter = jnp.einsum("EBCH,EHM -> EBCM", act(w0) * w1, params["w_down"])
        return jnp.einsum("EBCM,BSEC -> BSM", inter, combine_mask)
    w0 = jnp.einsum("BSM,EMH -> BSEH", x, params["w_gate"])
    w1 = jnp.einsum("BSM,EMH -> BSEH", x, params["w_up"])
    inter = jnp.einsum("BSEH,EHM -> BSEM", act(w0) * w1, params["w_down"])
    return jnp.einsum("BSEM,BSE -> BSM", inter.astype(jnp.float32), weights.astype(jnp.float32)).astype(x.dtype)


def keras_style_moe(params, x, top_k: int = 2):
    """keras-hub `MixtralSparseMoeBlock` style: experts computed expert-major [E, T, ...] with the
    activation in float32, the [T, E] routing transposed to [E, T] and the weighted outputs summed over
    axis 0; x [B, S, D] flattened to tokens first."""
    b, s, d = x.shape
    h = jnp.reshape(x, (-1, d))
    probs = jax.nn.softmax(h @ params["router"], axis=-1)
    top_p, top_i = jax.lax.top_k(probs, top_k)
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    e = params["w_gate"].shape[0]
    one_hot = jax.nn.one_hot(top_i, e).astype(top_p.dtype)
    routing_full = jnp.transpose(jnp.sum(one_hot * top_p[..., None], axis=1), (1, 0)).astype(h.dtype)
    gate = jnp.einsum("th,ehm->etm", h, params["w_gate"]).astype(jnp.float32)
    gate = jax.nn.silu(gate).astype(h.dtype)
    inter = jnp.einsum("th,ehm->etm", h, params["w_up"])
    out = jnp.einsum("eti,eih->eth", inter * gate, params["w_down"])
    return jnp.reshape(jnp.sum(out * routing_full[:, :, None], axis=0), (b, s, d))


def gather_moe(params, x, top_k: int = 2):
    """All experts computed, then each choice's expert output picked with take_along_axis and weighted."""
    weights, experts, _ = _router(params, x, top_k)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    picked = jnp.take_along_axis(y, experts[..., None], axis=1)  # [T, k, D]
    return jnp.sum(picked * weights[..., None].astype(x.dtype), axis=1)


def switch_moe(params, x, capacity_factor: float = 1.0):
    """Switch Transformer top-1: argmax router, capacity by running count over tokens, one-hot einsums."""
    t = x.shape[0]
    e = params["w_gate"].shape[0]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    expert_index = jnp.argmax(probs, axis=-1)  # [T]
    expert_gate = jnp.max(probs, axis=-1)
    capacity = max(1, int(t / e * capacity_factor))
    mask = jax.nn.one_hot(expert_index, e, dtype=jnp.int32)  # [T, E]
    position = jnp.cumsum(mask, axis=0) * mask  # 1-based position of each token in its expert
    mask = mask * (position <= capacity)
    slot = jax.nn.one_hot(jnp.sum(position * mask, axis=-1) - 1, capacity, dtype=x.dtype)  # [T, C]
    dispatch = mask[:, :, None].astype(x.dtype) * slot[:, None, :]  # [T, E, C]
    combine = dispatch * expert_gate[:, None, None].astype(x.dtype)
    xe = jnp.einsum("tec,td->ecd", dispatch, x)
    h = jax.nn.relu(jnp.einsum("ecd,edf->ecf", xe, params["w_up"]))
    ye = jnp.einsum("ecf,efd->ecd", h, params["w_down"])
    return jnp.einsum("tec,ecd->td", combine, ye)
