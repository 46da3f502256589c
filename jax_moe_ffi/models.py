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


def dense_moe(params, x, top_k: int = 2):
    """All-experts dense compute weighted by a top-k-sparse gate: E x the FLOPs of the routed work."""
    weights, experts, _ = _router(params, x, top_k)
    e = params["w_gate"].shape[0]
    gate = jnp.sum(jax.nn.one_hot(experts, e, dtype=x.dtype) * weights[..., None].astype(x.dtype), axis=1)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * jnp.einsum(
        "td,edf->tef", x, params["w_up"])
    y = jnp.einsum("tef,efd->ted", h, params["w_down"])
    return jnp.einsum("ted,te->td", y, gate)


def capacity_moe(params, x, top_k: int = 2, capacity_factor: float = 1.25):
    """GShard/Switch capacity layer: one-hot [T,E,C] dispatch/combine einsums; overflow tokens dropped."""
    t = x.shape[0]
    weights, experts, _ = _router(params, x, top_k)
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
