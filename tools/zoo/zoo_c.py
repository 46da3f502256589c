"""zoo_c: a third set of MoE layers the pass had never seen (session 30), written from memory in the styles of
HF-style Mixtral / Qwen2-MoE / DeepSeek-V3 / Llama-4 / Shazeer-2017 code, plus routings that are *not*
token-choice MoE (expert choice, Soft MoE) and adversarial gates (ties, choice-major capacity priority).

Every layer is `f(params, x) -> y` (a pytree of arrays for `aux_loss_tuple`). `LAYERS` maps a name to
(init(key) -> (params, x), f, expected, tol). Families: "capacity" (1), "dense" (2), "masked" (3), "loop" (4);
"none" means the pass must leave the layer as written (a rewrite is only allowed if it is exact).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from zoo_b import _n, _swiglu, _x, init_stacked

from jax_moe_ffi import models as M


def _experts(p):
    return {n: p[n] for n in ("w_gate", "w_up", "w_down")}


def _expert_e(p, e, x):
    return _swiglu({n: p[n][e] for n in ("w_gate", "w_up", "w_down")}, x)


# ------------------------------------------------------------------ 1. HF-style Mixtral block, JAX port
def hf_mixtral_loop(params, x, k=2):
    """Mixtral as ported from PyTorch: softmax in f32, top-k, renormalise, `expert_mask = one_hot(ids, E)`
    ([T, k, E]); per expert `w_e = sum(w * expert_mask[..., e], -1)`; `out += w_e[:, None] * expert_e(x)`."""
    E = params["w_gate"].shape[0]
    probs = jax.nn.softmax((x @ params["router"]).astype(jnp.float32), axis=-1)
    w, ids = lax.top_k(probs, k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    expert_mask = jax.nn.one_hot(ids, E, dtype=w.dtype)
    out = jnp.zeros_like(x)
    for e in range(E):
        w_e = jnp.sum(w * expert_mask[..., e], axis=-1)
        out = out + w_e[:, None] * _expert_e(params, e, x)
    return out


# --------------------------------------------------- 2. Qwen2-MoE: no renorm, E as a free dim, gated shared
def qwen2_shared_gate(params, x, k=2):
    """Qwen2-MoE: softmax top-k without renormalisation; all experts as `einsum('td,edf->tef')` (E the second
    free dim of the output), combined by `einsum('ted,te->td')`; a shared expert scaled by
    `sigmoid(x @ w_sg)` ([T, 1])."""
    T, E = x.shape[0], params["router"].shape[1]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    w, ids = lax.top_k(probs, k)
    gate = jnp.sum(jax.nn.one_hot(ids, E, dtype=x.dtype) * w[..., None], axis=1)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum("td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    routed = jnp.einsum("ted,te->td", y, gate)
    shared = (jax.nn.silu(x @ params["s_gate"]) * (x @ params["s_up"])) @ params["s_down"]
    return routed + jax.nn.sigmoid(x @ params["w_sg"]) * shared


def init_qwen2(key):
    p = init_stacked(key, 16, 24, 8, shared=True)
    p["w_sg"] = _n(jax.random.fold_in(key, 5), (16, 1), 16)
    return p, _x(key, 32, 16)


# ------------------------------------------------ 3. DeepSeek-V3 group-limited routing (noaux_tc)
def deepseek_v3_grouped(params, x, k=2, n_group=4, topk_group=2, scale=2.5):
    """DeepSeek-V3 router: sigmoid scores + a selection-only bias; group score = sum of each group's top-2;
    keep the best `topk_group` groups (others set to 0.0 by a group mask); top-k over the masked biased scores;
    weights gathered from the unbiased scores, renormalised, scaled; dense experts; scatter gate `.at[].set`."""
    T, E = x.shape[0], params["router"].shape[1]
    scores = jax.nn.sigmoid(x @ params["router"])
    biased = scores + lax.stop_gradient(params["e_bias"])
    grouped = biased.reshape(T, n_group, E // n_group)
    group_scores = jnp.sum(lax.top_k(grouped, 2)[0], axis=-1)            # [T, n_group]
    _, gidx = lax.top_k(group_scores, topk_group)
    gmask = jnp.sum(jax.nn.one_hot(gidx, n_group, dtype=x.dtype), axis=1)  # [T, n_group]
    smask = jnp.repeat(gmask, E // n_group, axis=-1)                      # [T, E]
    _, ids = lax.top_k(jnp.where(smask > 0, biased, 0.0), k)
    w = jnp.take_along_axis(scores, ids, axis=-1)
    w = scale * w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
    gate = jnp.zeros((T, E), x.dtype).at[jnp.arange(T)[:, None], ids].set(w)
    h = jax.nn.silu(jnp.einsum("td,edf->etf", x, params["w_gate"])) * jnp.einsum("td,edf->etf", x, params["w_up"])
    y = jnp.einsum("etf,efd->etd", h, params["w_down"])
    return jnp.einsum("etd,te->td", y, gate)


def init_deepseek_v3(key):
    return init_stacked(key, 16, 24, 8, e_bias=True), _x(key, 32, 16)


# --------------------------------------------------------------- 4. expert choice (not token choice)
def expert_choice(params, x, capacity=6):
    """Expert-choice routing (Zhou et al. 2022): each expert takes its top-`capacity` tokens by score
    (`top_k(scores.T, c)`), computes them, scatter-adds back weighted. A token may get 0 or E experts: this is
    not token-choice MoE and must keep its meaning."""
    T, D = x.shape
    scores = jax.nn.softmax(x @ params["router"], axis=-1)     # [T, E]
    g, tok = lax.top_k(scores.T, capacity)                    # [E, c]
    xin = x[tok]                                              # [E, c, D]
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xin, params["w_gate"])) * jnp.einsum("ecd,edf->ecf", xin, params["w_up"])
    y = jnp.einsum("ecf,efd->ecd", h, params["w_down"]) * g[..., None]
    return jnp.zeros((T, D), x.dtype).at[tok.reshape(-1)].add(y.reshape(-1, D))


def expert_choice_dense(params, x, capacity=6):
    """Expert choice written densely: a [T, E] gate that is sparse along *tokens* (top-k over axis 0),
    all-experts einsums, `einsum('etd,te->td')`. The gate is top-k sparse, but not per token: a token can
    have more than k nonzero gates, so a token-choice rewrite would be wrong."""
    T = x.shape[0]
    scores = jax.nn.softmax(x @ params["router"], axis=-1)
    g, tok = lax.top_k(scores.T, capacity)                    # [E, c]
    gate = jnp.zeros_like(scores).at[tok, jnp.arange(scores.shape[1])[:, None]].set(g)
    h = jax.nn.silu(jnp.einsum("td,edf->etf", x, params["w_gate"])) * jnp.einsum("td,edf->etf", x, params["w_up"])
    y = jnp.einsum("etf,efd->etd", h, params["w_down"])
    return jnp.einsum("etd,te->td", y, gate)


# -------------------------------------------------------------------------------------- 5. Soft MoE
def soft_moe(params, x, slots=2):
    """Soft MoE (Puigcerver et al. 2023): every slot is a softmax-over-tokens mix of all tokens, every token a
    softmax-over-slots mix of all slot outputs. Dense, no top-k: must keep its meaning."""
    E = params["w_gate"].shape[0]
    logits = x @ params["phi"]                                  # [T, E*S]
    dispatch = jax.nn.softmax(logits, axis=0)
    combine = jax.nn.softmax(logits, axis=1)
    xs = (dispatch.T @ x).reshape(E, slots, -1)                  # [E, S, D]
    h = jax.nn.silu(jnp.einsum("esd,edf->esf", xs, params["w_gate"])) * jnp.einsum("esd,edf->esf", xs, params["w_up"])
    ys = jnp.einsum("esf,efd->esd", h, params["w_down"]).reshape(E * slots, -1)
    return combine @ ys


def init_soft_moe(key):
    p = init_stacked(key, 16, 24, 4)
    p["phi"] = _n(jax.random.fold_in(key, 7), (16, 4 * 2), 16)
    return p, _x(key, 32, 16)


# ------------------------------------------------------------ 6. argsort "top-k" and one-hot gate sum
def argsort_topk_dense(params, x, k=2):
    """Top-k by `argsort(-probs)[:, :k]` (no lax.top_k), weights by take_along_axis, gate
    `sum(one_hot(ids) * w[..., None], 1)`, dense experts."""
    E = params["router"].shape[1]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    ids = jnp.argsort(-probs, axis=-1)[:, :k]
    w = jnp.take_along_axis(probs, ids, axis=-1)
    gate = jnp.sum(jax.nn.one_hot(ids, E, dtype=x.dtype) * w[..., None], axis=1)
    y = jax.vmap(_swiglu, in_axes=(0, None))(_experts(params), x)   # [E, T, D]
    return jnp.einsum("te,etd->td", gate, y)


# ------------------------------------------------ 7. top-k as a threshold mask (ties select more than k)
def threshold_topk_mask(params, x, k=2):
    """Gate by threshold: `kth = top_k(logits, k)[0][:, -1:]`, `mask = logits >= kth`, softmax over the
    masked logits. With ties more than k experts pass the mask, so the gate is not provably k-sparse."""
    logits = x @ params["router"] + params["r_bias"]
    kth = lax.top_k(logits, k)[0][:, -1:]
    mask = logits >= kth
    gate = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
    y = jax.vmap(_swiglu, in_axes=(0, None))(_experts(params), x)
    return jnp.einsum("te,etd->td", gate, y)


def init_threshold(key):
    p = init_stacked(key, 16, 24, 8)
    p["r_bias"] = jnp.zeros((8,))
    return p, _x(key, 32, 16)


def init_ties(key):
    """Router columns 1 and 2 identical with a large bias: experts 1 and 2 tie for first place on every token,
    so with k = 1 the mask passes both."""
    p = init_stacked(key, 16, 24, 6)
    p["router"] = p["router"].at[:, 2].set(p["router"][:, 1])
    p["r_bias"] = jnp.zeros((6,)).at[1].set(10.0).at[2].set(10.0)
    return p, _x(key, 32, 16)


def threshold_top1_ties(params, x):
    """`threshold_topk_mask` with k = 1 on a router whose two best experts always tie."""
    return threshold_topk_mask(params, x, k=1)


# --------------------------------------------------------------- 8. Switch top-1, no capacity (dropless)
def switch_top1_nocap(params, x):
    """Switch without capacity: `argmax` expert, `max(probs)` gate, `one_hot(argmax) * max` as the [T, E]
    gate, experts with biases and GELU (non-GLU FFN), weights laid out [D, E, F] / [E, F, D]."""
    E = params["router"].shape[1]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    gate = jax.nn.one_hot(jnp.argmax(probs, -1), E, dtype=x.dtype) * jnp.max(probs, -1, keepdims=True)
    h = jax.nn.gelu(jnp.einsum("td,def->tef", x, params["wi"]) + params["bi"])
    y = jnp.einsum("tef,efd->ted", h, params["wo"]) + params["bo"][None]
    return jnp.einsum("ted,te->td", y, gate)


def init_switch_nocap(key):
    ks = jax.random.split(key, 5)
    D, F, E = 16, 24, 4
    p = {"router": _n(ks[0], (D, E), D), "wi": _n(ks[1], (D, E, F), D), "wo": _n(ks[2], (E, F, D), F),
         "bi": 0.1 * jax.random.normal(ks[3], (E, F)), "bo": 0.1 * jax.random.normal(ks[4], (E, D))}
    return p, _x(key, 32, 16)


# ------------------------------------------------------------------ 9. Shazeer 2017 noisy top-k gating
def noisy_topk(params, x, k=2):
    """Noisy top-k (Shazeer et al. 2017): logits + noise * softplus(x @ w_noise) (noise a fixed input here),
    top-k of the noisy logits, softmax over the k kept values, scattered into a zero [T, E] gate; experts with
    E as the batch dim and the weight as the *left* operand (`einsum('edf,td->etf')`)."""
    T, E = x.shape[0], params["router"].shape[1]
    noisy = x @ params["router"] + params["noise"] * jax.nn.softplus(x @ params["w_noise"])
    top_v, ids = lax.top_k(noisy, k)
    w = jax.nn.softmax(top_v, axis=-1)
    gate = jnp.zeros((T, E), x.dtype).at[jnp.arange(T)[:, None], ids].set(w)
    h = jax.nn.silu(jnp.einsum("edf,td->etf", params["w_gate"], x)) * jnp.einsum("edf,td->etf", params["w_up"], x)
    y = jnp.einsum("efd,etf->etd", params["w_down"], h)
    return jnp.einsum("te,etd->td", gate, y)


def init_noisy(key):
    p = init_stacked(key, 16, 24, 8)
    p["w_noise"] = _n(jax.random.fold_in(key, 3), (16, 8), 16)
    p["noise"] = jax.random.normal(jax.random.fold_in(key, 4), (32, 8))
    return p, _x(key, 32, 16)


# ------------------------------------------------ 10. output pytree with load-balancing and z losses
def aux_loss_tuple(params, x, k=2):
    """Returns (y, aux): Switch-style load-balancing loss E * sum(f_e * P_e) from one_hot counts of the top-k
    ids and the mean router probabilities, plus a router z-loss; dense experts weighted by the gate."""
    E = params["router"].shape[1]
    logits = x @ params["router"]
    probs = jax.nn.softmax(logits, axis=-1)
    w, ids = lax.top_k(probs, k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    onehot = jax.nn.one_hot(ids, E, dtype=x.dtype)                 # [T, k, E]
    gate = jnp.einsum("tke,tk->te", onehot, w)
    y = jnp.einsum("te,etd->td", gate, jax.vmap(_swiglu, in_axes=(0, None))(_experts(params), x))
    frac = jnp.mean(jnp.sum(onehot, axis=1), axis=0) / k
    lb = E * jnp.sum(frac * jnp.mean(probs, axis=0))
    z = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    return y, {"load_balance": lb, "z_loss": z}


# ------------------------------------------------------------------- 11. [B, S, D] tokens, no reshape
def batched_tokens_3d(params, x, k=2):
    """Tokens kept as [B, S, D] throughout: router [B, S, E], top-k on the last axis, experts
    `einsum('bsd,edf->bsef')`, combine `einsum('bsed,bse->bsd')`."""
    E = params["router"].shape[1]
    probs = jax.nn.softmax(jnp.einsum("bsd,de->bse", x, params["router"]), axis=-1)
    w, ids = lax.top_k(probs, k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    gate = jnp.sum(jax.nn.one_hot(ids, E, dtype=x.dtype) * w[..., None], axis=-2)
    h = jax.nn.silu(jnp.einsum("bsd,edf->bsef", x, params["w_gate"])) * jnp.einsum("bsd,edf->bsef", x, params["w_up"])
    y = jnp.einsum("bsef,efd->bsed", h, params["w_down"])
    return jnp.einsum("bsed,bse->bsd", y, gate)


def init_3d(key):
    return init_stacked(key, 16, 24, 8), _x(key, 2, 16, 16)


# -------------------------------------------------------------------------- 12. bf16 parameters
def bf16_mixed(params, x, k=2):
    """bf16 weights and activations, router in f32, expert einsums with preferred_element_type=f32 and a
    cast back to bf16 between them (the usual mixed-precision layer)."""
    E = params["router"].shape[1]
    probs = jax.nn.softmax(x.astype(jnp.float32) @ params["router"].astype(jnp.float32), axis=-1)
    w, ids = lax.top_k(probs, k)
    w = (w / jnp.sum(w, axis=-1, keepdims=True)).astype(x.dtype)
    gate = jnp.zeros((x.shape[0], E), x.dtype).at[jnp.arange(x.shape[0])[:, None], ids].set(w)
    f32 = jnp.float32
    g = jnp.einsum("td,edf->etf", x, params["w_gate"], preferred_element_type=f32)
    u = jnp.einsum("td,edf->etf", x, params["w_up"], preferred_element_type=f32)
    h = (jax.nn.silu(g) * u).astype(x.dtype)
    y = jnp.einsum("etf,efd->etd", h, params["w_down"], preferred_element_type=f32).astype(x.dtype)
    return jnp.einsum("te,etd->td", gate, y)


def init_bf16(key):
    p, x = init_stacked(key, 16, 24, 8), _x(key, 32, 16)
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16), p), x.astype(jnp.bfloat16)


# ------------------------------------------------------ 13. Llama-4: the gate scales the expert *input*
def llama4_input_gate(params, x):
    """Llama-4 style top-1: the sigmoid of the chosen logit scales the token *before* the expert
    (`expert(x * g)`, not `g * expert(x)`); tokens routed elsewhere enter an expert as zeros, and a bias-free
    SwiGLU maps zero to zero, so the all-experts sum equals the routed expert's output."""
    T, E = x.shape[0], params["router"].shape[1]
    logits = x @ params["router"]
    top_v, ids = lax.top_k(logits, 1)
    scores = jnp.full((T, E), -jnp.inf).at[jnp.arange(T)[:, None], ids].set(top_v)
    gate = jax.nn.sigmoid(scores)                                 # [T, E], zero off the chosen expert
    xin = x[None, :, :] * gate.T[:, :, None]                      # [E, T, D]
    h = jax.nn.silu(jnp.einsum("etd,edf->etf", xin, params["w_gate"])) * jnp.einsum("etd,edf->etf", xin, params["w_up"])
    return jnp.einsum("etf,efd->td", h, params["w_down"])


# ---------------------------------------------- 14. GShard top-2 with choice-major capacity priority
def gshard_choice_major(params, x, k=2, capacity_factor=1.0):
    """GShard-style top-k capacity where *all first choices* take slots before any second choice
    (choice-major priority: cumsum over the flattened [k*T] order). Different drops from token-major."""
    T, E = x.shape[0], params["router"].shape[1]
    C = max(1, int(capacity_factor * T * k / E))
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    w, ids = lax.top_k(probs, k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    mask = jax.nn.one_hot(ids.T.reshape(-1), E, dtype=x.dtype)    # [k*T, E], choice-major
    pos = (jnp.cumsum(mask, axis=0) * mask).astype(jnp.int32) - 1
    keep = mask * (pos < C)
    disp = (keep[:, :, None] * jax.nn.one_hot(pos, C, dtype=x.dtype)).reshape(k, T, E, C).sum(0)  # [T, E, C]
    comb = (keep[:, :, None] * jax.nn.one_hot(pos, C, dtype=x.dtype) * w.T.reshape(-1)[:, None, None]
            ).reshape(k, T, E, C).sum(0)
    xin = jnp.einsum("tec,td->ecd", disp, x)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xin, params["w_gate"])) * jnp.einsum("ecd,edf->ecf", xin, params["w_up"])
    yo = jnp.einsum("ecf,efd->ecd", h, params["w_down"])
    return jnp.einsum("tec,ecd->td", comb, yo)


# ------------------------------------------------ 15. per-expert loop over gathered rows (nonzero)
def loop_nonzero_gather(params, x, k=2):
    """Per-expert Python loop that gathers its tokens with `jnp.nonzero(mask_e, size=T, fill_value=T)` from
    x padded by one zero row, computes only those rows and scatter-adds them back weighted (a jit-friendly
    port of PyTorch's index_add loop)."""
    T, D = x.shape
    E = params["w_gate"].shape[0]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    w, ids = lax.top_k(probs, k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    xp = jnp.concatenate([x, jnp.zeros((1, D), x.dtype)])
    out = jnp.zeros((T + 1, D), x.dtype)
    for e in range(E):
        we = jnp.sum(jnp.where(ids == e, w, 0.0), axis=-1)
        (rows,) = jnp.nonzero(we > 0, size=T, fill_value=T)
        ye = _expert_e(params, e, xp[rows]) * jnp.append(we, 0.0)[rows][:, None]
        out = out.at[rows].add(ye)
    return out[:T]


# ------------------------------------------------ 16. top-k ids via approx_max_k on logits, renorm via softmax
def approx_logits_softmax_k(params, x, k=2):
    """`lax.approx_max_k` on the *logits*, softmax over the k kept values, gate `.at[].add`, experts by
    `vmap` over a per-expert function with biases (expert(0) != 0, so the sparsity must come from the gate)."""
    T, E = x.shape[0], params["router"].shape[1]
    v, ids = lax.approx_max_k(x @ params["router"], k)
    w = jax.nn.softmax(v, axis=-1)
    gate = jnp.zeros((T, E), x.dtype).at[jnp.arange(T)[:, None], ids].add(w)

    def one(wg, wu, wd, bg, bu, bd):
        return (jax.nn.silu(x @ wg + bg) * (x @ wu + bu)) @ wd + bd

    y = jax.vmap(one)(params["w_gate"], params["w_up"], params["w_down"], params["b_gate"], params["b_up"],
                      params["b_down"])
    return jnp.einsum("te,etd->td", gate, y)


def _e8(key):
    return init_stacked(key, 16, 24, 8), _x(key, 32, 16)


def _e8_bias(key):
    return init_stacked(key, 16, 24, 8, bias=True), _x(key, 32, 16)


LAYERS = {
    "hf_mixtral_loop": (_e8, hf_mixtral_loop, "loop", 1e-5),
    "qwen2_shared_gate": (init_qwen2, qwen2_shared_gate, "dense", 1e-5),
    "deepseek_v3_grouped": (init_deepseek_v3, deepseek_v3_grouped, "dense", 1e-5),
    "expert_choice": (_e8, expert_choice, "none (must keep meaning)", 1e-5),
    "expert_choice_dense": (_e8, expert_choice_dense, "none (must keep meaning)", 1e-5),
    "soft_moe": (init_soft_moe, soft_moe, "none (must keep meaning)", 1e-5),
    "argsort_topk_dense": (_e8, argsort_topk_dense, "dense (or near-miss)", 1e-5),
    "threshold_topk_mask": (init_threshold, threshold_topk_mask, "near-miss (ties)", 1e-5),
    "threshold_top1_ties": (init_ties, threshold_top1_ties, "near-miss (ties); exact", 1e-5),
    "switch_top1_nocap": (init_switch_nocap, switch_top1_nocap, "dense", 1e-5),
    "noisy_topk": (init_noisy, noisy_topk, "dense", 1e-5),
    "aux_loss_tuple": (_e8, aux_loss_tuple, "dense", 1e-5),
    "batched_tokens_3d": (init_3d, batched_tokens_3d, "dense", 1e-5),
    "bf16_mixed": (init_bf16, bf16_mixed, "dense", 2e-2),
    "llama4_input_gate": (_e8, llama4_input_gate, "masked (or near-miss)", 1e-5),
    "gshard_choice_major": (_e8, gshard_choice_major, "capacity (exact) or near-miss", 1e-5),
    "loop_nonzero_gather": (_e8, loop_nonzero_gather, "loop (or near-miss)", 1e-5),
    "approx_logits_softmax_k": (_e8_bias, approx_logits_softmax_k, "dense", 1e-5),
}


# ============================================================ adversarial gates: must never be silently wrong
def _dense_all(params, x):
    return jax.vmap(_swiglu, in_axes=(0, None))(_experts(params), x)   # [E, T, D]


def _topk_gate(params, x, k=2):
    E = params["router"].shape[1]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    w, ids = lax.top_k(probs, k)
    return jnp.sum(jax.nn.one_hot(ids, E, dtype=x.dtype) * w[..., None], axis=1), probs, ids


def adv_gate_plus_dense(params, x):
    """A top-k gate plus 1% of the dense probabilities: every expert weighs in (dense), must not be sparsified."""
    gate, probs, _ = _topk_gate(params, x)
    return jnp.einsum("te,etd->td", gate + 0.01 * probs, _dense_all(params, x))


def adv_gate_pow0(params, x):
    """`gate ** 0` is 1 everywhere (0 ** 0 == 1): a dense all-ones gate built from a sparse one."""
    gate, _, _ = _topk_gate(params, x)
    return jnp.einsum("te,etd->td", gate ** 0 * 0.5, _dense_all(params, x))


def adv_gate_reversed_tokens(params, x):
    """The gate of token T-1-t weights token t's expert outputs (`gate[::-1]`): sparse per token, but in the
    experts of another token."""
    gate, _, _ = _topk_gate(params, x)
    return jnp.einsum("te,etd->td", gate[::-1], _dense_all(params, x))


def adv_shifted_ids(params, x):
    """One-hot gate over `(ids + 1) % E`: k distinct experts per token, but not the top-k ones."""
    E = params["router"].shape[1]
    _, probs, ids = _topk_gate(params, x)
    w = jnp.take_along_axis(probs, ids, axis=-1)
    gate = jnp.sum(jax.nn.one_hot((ids + 1) % E, E, dtype=x.dtype) * w[..., None], axis=1)
    return jnp.einsum("te,etd->td", gate, _dense_all(params, x))


def adv_expert_mixes_tokens(params, x):
    """Each expert's hidden state is a running mean over the tokens (`cumsum(h, 0) / t`): an expert's output
    at token t depends on tokens it was not routed; dropping them changes the answer."""
    gate, _, _ = _topk_gate(params, x)
    h = jax.nn.silu(jnp.einsum("td,edf->etf", x, params["w_gate"])) * jnp.einsum("td,edf->etf", x, params["w_up"])
    h = jnp.cumsum(h, axis=1) / jnp.arange(1, x.shape[0] + 1, dtype=x.dtype)[None, :, None]
    return jnp.einsum("te,etd->td", gate, jnp.einsum("etf,efd->etd", h, params["w_down"]))


def adv_ranks_topk(params, x, k=2):
    """Top-k by ranks: `ranks = argsort(argsort(-probs))`, `mask = ranks < k`, gate = probs * mask. Exactly k
    experts per token (ranks are a permutation), so a rewrite is allowed if exact."""
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    ranks = jnp.argsort(jnp.argsort(-probs, axis=-1), axis=-1)
    gate = jnp.where(ranks < k, probs, 0.0)
    return jnp.einsum("te,etd->td", gate, _dense_all(params, x))


LAYERS.update({
    "adv_gate_plus_dense": (_e8, adv_gate_plus_dense, "none (dense gate)", 1e-5),
    "adv_gate_pow0": (_e8, adv_gate_pow0, "none (dense gate)", 1e-5),
    "adv_gate_reversed_tokens": (_e8, adv_gate_reversed_tokens, "none, or exact", 1e-5),
    "adv_shifted_ids": (_e8, adv_shifted_ids, "none, or exact", 1e-5),
    "adv_expert_mixes_tokens": (_e8, adv_expert_mixes_tokens, "none (token mixing in the expert)", 1e-5),
    "adv_ranks_topk": (_e8, adv_ranks_topk, "dense (exact) or near-miss", 1e-5),
})


# ------------------------------------------------ 17. DBRX-style fused expert weights reshaped in the layer
def dbrx_fused_weights(params, x, k=2):
    """DBRX-style storage: the experts' weights as 2-D [E * F, D] matrices, reshaped to [E, F, D] inside the
    layer; w1 / v1 used transposed (`einsum('td,efd->tef')`), w2 not; softmax top-k renormalised by its L1 norm."""
    E = params["router"].shape[1]
    D = x.shape[1]
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    w, ids = lax.top_k(probs, k)
    w = w / jnp.sum(jnp.abs(w), axis=-1, keepdims=True)
    gate = jnp.sum(jax.nn.one_hot(ids, E, dtype=x.dtype) * w[..., None], axis=1)
    w1 = params["w1"].reshape(E, -1, D)
    v1 = params["v1"].reshape(E, -1, D)
    w2 = params["w2"].reshape(E, -1, D)
    h = jax.nn.silu(jnp.einsum("td,efd->tef", x, w1)) * jnp.einsum("td,efd->tef", x, v1)
    return jnp.einsum("tef,efd,te->td", h, w2, gate)


def init_dbrx(key):
    p = init_stacked(key, 16, 24, 8)
    return {"router": p["router"], "w1": jnp.swapaxes(p["w_gate"], 1, 2).reshape(8 * 24, 16),
            "v1": jnp.swapaxes(p["w_up"], 1, 2).reshape(8 * 24, 16), "w2": p["w_down"].reshape(8 * 24, 16)}, \
        _x(key, 32, 16)


LAYERS["dbrx_fused_weights"] = (init_dbrx, dbrx_fused_weights, "dense", 1e-5)


# ------------------------------------------- 18. list of expert modules, reciprocal-mask trick on the logits
# Community Flax style: separate biased ReLU experts, the k-hot mask turned into a logit penalty by
# `logits - (1 / mask - 1)`, `jnp.split` gate columns, a Python `sum`. Found silent here in session 30; the layer
# now lives in jax_moe_ffi.models as the regression test's model (same parameter names as init_stacked's).
reciprocal_mask_experts = M.loop_moe_reciprocal_mask

LAYERS["reciprocal_mask_experts"] = (_e8_bias, reciprocal_mask_experts, "loop", 1e-5)
