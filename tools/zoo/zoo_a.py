"""Zoo A: Flax / Praxis / T5X / flaxformer / Mesh-TensorFlow style MoE layers, written from memory.

Every layer is a pure function `f(params, x)` in float32; `LAYERS[name] = (f, init, family, note)` where
`init(key) -> (params, x)` builds small random params and inputs. Layers returning a tuple return
`(y, aux_loss)` (the aux loss is built from the same router tensors, as those libraries do).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
from flax import nnx


def _normal(key, shape, scale):
    return jax.random.normal(key, shape, jnp.float32) * scale


# ------------------------------------------------------------------------------------------------------
# Shared helpers in the libraries' own idioms
# ------------------------------------------------------------------------------------------------------
def _flaxformer_aux_losses(router_logits, router_probs, expert_index, num_experts):
    """flaxformer `_load_balancing_loss` + `_router_z_loss` (from memory)."""
    # load balancing: expert_index [G, S, K]
    expert_mask = jnp.max(jax.nn.one_hot(expert_index, num_experts, dtype=jnp.int32), axis=-2)
    tokens_per_group_and_expert = jnp.mean(expert_mask, dtype=jnp.float32, axis=-2)
    router_prob_per_group_and_expert = jnp.mean(router_probs, dtype=jnp.float32, axis=-2)
    lb = jnp.mean(tokens_per_group_and_expert * router_prob_per_group_and_expert,
                  dtype=jnp.float32) * num_experts ** 2
    num_groups, tokens_per_group, _ = router_logits.shape
    log_z = jax.nn.logsumexp(router_logits, axis=-1)
    z_loss = jnp.sum(log_z ** 2, dtype=jnp.float32) / (num_groups * tokens_per_group)
    return lb + 1e-3 * z_loss


def _flaxformer_capacity(tokens_per_group, num_experts, capacity_factor, min_expert_capacity=4):
    """flaxformer `_compute_expert_capacity`-ish: ceil, floored at a minimum, capped at the group size."""
    cap = int(round(capacity_factor * tokens_per_group / num_experts))
    cap = max(cap, min_expert_capacity)
    return min(cap, tokens_per_group)


# ======================================================================================================
# 1. flaxformer TokensChooseMaskedRouter (+ MoeLayer._mask_and_dispatch_to_experts), no BPR
# ======================================================================================================
def flaxformer_masked_router(params, x, num_selected_experts=2, capacity_factor=1.0,
                             batch_prioritized_routing=False, member_mask=False, vmap_experts=True,
                             int_priority=False):
    """flaxformer `routing.TokensChooseMaskedRouter` + `moe_layers.MoeLayer` (masked dispatch).

    x [G, S, D]. Router logits in float32 (flaxformer casts the router input to float32), softmax, lax.top_k,
    expert_index swapped to [G, K, S] so top-1 choices have priority over top-2 (choice-major), int32
    one-hot, token_priority = cumsum * mask - 1.0 (a *float* priority), max over the K axis, a boolean
    one-hot dispatch_mask [G, S, E, C], combine_array = einsum('...te,...tec->...tec', router_probs,
    dispatch_mask) (the *un-renormalised* router probability), dispatch einsum 'gtd,gtec->gecd', experts
    via jax.vmap over E of an MlpBlock (wi + bias, GELU, wo + bias) on [E, G*C, D], combine einsum
    'gecd,gtec->gtd'. Returns (y, aux) where aux = load-balance + z-loss.
    member_mask=True (not flaxformer; a variant to probe the pass): the bool dispatch mask is additionally
    AND-ed with "expert e is one of the token's top-k" (which the -1 priority already implies);
    int_priority=True: `- 1` instead of flaxformer's `- 1.0` (an int32 slot index).
    """
    g, s, d = x.shape
    e = params["router"]["kernel"].shape[-1]
    k = num_selected_experts
    expert_capacity = _flaxformer_capacity(s * k, e, capacity_factor)
    token_inputs = jax.lax.convert_element_type(x, jnp.float32)
    router_logits = jnp.einsum("gsd,de->gse", token_inputs, params["router"]["kernel"])
    router_probs = jax.nn.softmax(router_logits, axis=-1)

    expert_gate, expert_index = jax.lax.top_k(router_probs, k=k)  # [G, S, K]
    if batch_prioritized_routing:
        permutation = jnp.argsort(-expert_gate[..., 0], axis=-1)  # [G, S]
        expert_index = jnp.take_along_axis(expert_index, jnp.expand_dims(permutation, axis=-1), axis=-2)
    expert_index_t = jnp.swapaxes(expert_index, 1, 2).reshape(g, -1)  # [G, K*S]
    expert_mask = jax.nn.one_hot(expert_index_t, e, dtype=jnp.int32)  # [G, K*S, E]
    token_priority = jnp.cumsum(expert_mask, axis=1) * expert_mask - (1 if int_priority else 1.0)
    token_priority = token_priority.reshape((g, k, -1, e))
    token_priority = jnp.swapaxes(token_priority, 1, 2)  # [G, S, K, E]
    token_priority = jnp.max(token_priority, axis=2)  # [G, S, E]
    if batch_prioritized_routing:
        inv_permutation = jnp.argsort(permutation, axis=-1)
        token_priority = jnp.take_along_axis(token_priority, jnp.expand_dims(inv_permutation, axis=-1),
                                             axis=-2)
    dispatch_mask = jax.nn.one_hot(token_priority, expert_capacity, dtype=jnp.bool_)  # [G, S, E, C]
    if member_mask:
        _, idx_orig = jax.lax.top_k(router_probs, k=k) if batch_prioritized_routing else (None, expert_index)
        member = jnp.any(jax.nn.one_hot(idx_orig, e, dtype=jnp.bool_), axis=2)  # [G, S, E]
        dispatch_mask = jnp.logical_and(dispatch_mask, member[..., None])
    combine_array = jnp.einsum("...te,...tec->...tec", router_probs, dispatch_mask)
    combine_array = jax.lax.convert_element_type(combine_array, jnp.float32)
    if batch_prioritized_routing:
        # the aux loss sees the un-permuted expert index in flaxformer; recompute it from the gate.
        _, aux_index = jax.lax.top_k(router_probs, k=k)
    else:
        aux_index = expert_index
    aux = _flaxformer_aux_losses(router_logits, router_probs, aux_index, e)

    expert_inputs = jnp.einsum("gtd,gtec->gecd", x, dispatch_mask)  # bool mask promoted
    if not vmap_experts:  # experts as einsums over [G, E, C, D] (no [E, G*C, D] reshape)
        P = params["experts"]
        h = jax.nn.gelu(jnp.einsum("gecd,edf->gecf", expert_inputs, P["wi"]) + P["bi"][None, :, None],
                        approximate=True)
        expert_outputs = jnp.einsum("gecf,efd->gecd", h, P["wo"]) + P["bo"][None, :, None]
        return jnp.einsum("gecd,gtec->gtd", expert_outputs, combine_array), aux
    expert_inputs = jnp.swapaxes(expert_inputs, 0, 1).reshape(e, g * expert_capacity, d)

    def mlp_block(p, h):
        h = h @ p["wi"] + p["bi"]
        h = jax.nn.gelu(h, approximate=True)
        return h @ p["wo"] + p["bo"]

    expert_outputs = jax.vmap(mlp_block)(params["experts"], expert_inputs)  # [E, G*C, D]
    expert_outputs = jnp.swapaxes(expert_outputs.reshape(e, g, expert_capacity, d), 0, 1)  # [G, E, C, D]
    y = jnp.einsum("gecd,gtec->gtd", expert_outputs, combine_array)
    return y, aux


def flaxformer_bpr_router(params, x):
    """flaxformer TokensChooseMaskedRouter with `batch_prioritized_routing=True`: tokens sorted by their top-1
    probability (argsort of -gate), priorities computed in that order, then un-permuted (argsort of the
    permutation) before the bool one-hot. Priority is by router confidence, not token position."""
    return flaxformer_masked_router(params, x, num_selected_experts=2, capacity_factor=1.0,
                                    batch_prioritized_routing=True)


def flaxformer_member_router(params, x):
    """flaxformer TokensChooseMaskedRouter (no BPR) with the dispatch mask AND-ed with an explicit
    top-k membership mask (probe: is the -1-sentinel one-hot the only blocker?)."""
    return flaxformer_masked_router(params, x, member_mask=True, int_priority=True)


def flaxformer_member_bpr_router(params, x):
    """flaxformer batch-prioritized routing (argsort of -top1 prob, priorities in that order, inverse
    permutation by argsort) plus the explicit membership mask, so the base pattern is one the pass sees:
    BPR priority order must then be reproduced exactly, or reported as a near-miss."""
    return flaxformer_masked_router(params, x, batch_prioritized_routing=True, member_mask=True,
                                    int_priority=True)


def flaxformer_member_bpr_einsum(params, x):
    """`flaxformer_member_bpr_router` with the experts as einsums on [G, E, C, D] (no vmap reshape), so the
    only unusual construct left is batch-prioritized routing."""
    return flaxformer_masked_router(params, x, batch_prioritized_routing=True, member_mask=True,
                                    vmap_experts=False, int_priority=True)


def flaxformer_member_einsum(params, x):
    """`flaxformer_member_router` with einsum experts (control for `flaxformer_member_bpr_einsum`)."""
    return flaxformer_masked_router(params, x, member_mask=True, vmap_experts=False, int_priority=True)


def flaxformer_member_einsum_floatprio(params, x):
    """`flaxformer_member_einsum` with flaxformer's float priority (`cumsum * mask - 1.0`): isolates the
    float slot index."""
    return flaxformer_masked_router(params, x, member_mask=True, vmap_experts=False, int_priority=False)


def init_flaxformer(key, g=2, s=16, d=16, f=32, e=4):
    ks = jax.random.split(key, 6)
    params = {
        "router": {"kernel": _normal(ks[0], (d, e), 1 / math.sqrt(d))},
        "experts": {"wi": _normal(ks[1], (e, d, f), 1 / math.sqrt(d)),
                    "bi": _normal(ks[2], (e, f), 0.1),
                    "wo": _normal(ks[3], (e, f, d), 1 / math.sqrt(f)),
                    "bo": _normal(ks[4], (e, d), 0.1)},
    }
    return params, jax.random.normal(ks[5], (g, s, d), jnp.float32)


# ======================================================================================================
# 3. Praxis / GShard top2_gating_on_logits
# ======================================================================================================
def _praxis_top2_gating(logits, capacity, second_expert_policy="all", rng=None):
    """Praxis `gshard_utils.top2_gating_on_logits` (from memory). logits [G, S, E]."""
    raw_gates = jax.nn.softmax(logits, axis=-1)
    e = logits.shape[-1]
    index_1 = jnp.argmax(raw_gates, axis=-1)  # [G, S]
    mask_1 = jax.nn.one_hot(index_1, e, dtype=raw_gates.dtype)
    density_1_proxy = raw_gates
    gate_1 = jnp.einsum("GSE,GSE->GS", raw_gates, mask_1)
    gates_without_top_1 = raw_gates * (1.0 - mask_1)
    index_2 = jnp.argmax(gates_without_top_1, axis=-1)
    mask_2 = jax.nn.one_hot(index_2, e, dtype=raw_gates.dtype)
    gate_2 = jnp.einsum("GSE,GSE->GS", gates_without_top_1, mask_2)

    # load balancing loss
    density_1 = jnp.mean(mask_1, axis=-2)
    density_1_proxy = jnp.mean(density_1_proxy, axis=-2)
    aux_loss = jnp.mean(density_1_proxy * density_1) * float(e * e)

    # capacity for the first choice: exclusive cumsum over the group
    position_in_expert_1 = jnp.cumsum(mask_1, axis=-2) - mask_1
    mask_1 = mask_1 * (position_in_expert_1 < float(capacity)).astype(mask_1.dtype)
    mask_1_count = jnp.einsum("GSE->GE", mask_1)
    mask_1_flat = jnp.einsum("GSE->GS", mask_1)
    position_in_expert_1 = jnp.einsum("GSE,GSE->GS", position_in_expert_1, mask_1)

    if second_expert_policy == "random":
        # sample the second expert with probability 2 * gate_2 (Praxis "random" policy)
        sampled = jax.random.uniform(rng, gate_2.shape, dtype=gate_2.dtype) < (2.0 * gate_2)
        mask_2 = mask_2 * jnp.expand_dims(sampled.astype(mask_2.dtype), -1)

    position_in_expert_2 = jnp.cumsum(mask_2, axis=-2) - mask_2 + jnp.expand_dims(mask_1_count, -2)
    mask_2 = mask_2 * (position_in_expert_2 < float(capacity)).astype(mask_2.dtype)
    mask_2_flat = jnp.sum(mask_2, axis=-1)
    position_in_expert_2 = jnp.sum(position_in_expert_2 * mask_2, axis=-1)

    denom = gate_1 + gate_2 + 1e-9
    gate_1 = gate_1 / denom
    gate_2 = gate_2 / denom
    gate_1 = gate_1 * mask_1_flat
    gate_2 = gate_2 * mask_2_flat

    b = jax.nn.one_hot(position_in_expert_1.astype(np.int32), capacity, dtype=jnp.float32)
    a = jnp.expand_dims(gate_1 * mask_1_flat, -1) * jax.nn.one_hot(index_1, e, dtype=jnp.float32)
    first_part_of_combine_tensor = jnp.einsum("GSE,GSC->GSEC", a, b)
    b = jax.nn.one_hot(position_in_expert_2.astype(np.int32), capacity, dtype=jnp.float32)
    a = jnp.expand_dims(gate_2 * mask_2_flat, -1) * jax.nn.one_hot(index_2, e, dtype=jnp.float32)
    second_part_of_combine_tensor = jnp.einsum("GSE,GSC->GSEC", a, b)
    combine_tensor = first_part_of_combine_tensor + second_part_of_combine_tensor
    dispatch_tensor = combine_tensor.astype(bool)
    return combine_tensor, dispatch_tensor, aux_loss


def praxis_top2_moe(params, x, second_expert_policy="all"):
    """Praxis `layers.transformers.TransformerFeedForwardMoe` with GShard `top2_gating`.

    x [B, L, M] reshaped to [G, S, M]; gating logits 'GSM,ME->GSE'; top-2 by two argmaxes (the second over
    the gates with the first masked out), per-group capacity int(ceil(2 * S * cf / E)), position of choice 2
    offset by the count of choice 1 (choice-major priority), `gate_1 /= denom`, one-hot combine tensor
    [G, S, E, C], dispatch = combine.astype(bool); 'GSEC,GSM->EGCM' dispatch, expert FFN as einsums with
    per-expert bias and ReLU ('EGCM,EMH->EGCH'), 'EGCH,EHM->EGCM', combine 'GSEC,EGCM->GSM'."""
    b_, l_, m = x.shape
    num_groups = 2
    e = params["gate"].shape[-1]
    s = (b_ * l_) // num_groups
    capacity = int(math.ceil(2 * s * 1.0 / e))
    capacity = max(capacity, 1)
    reshaped_inputs = x.reshape(num_groups, s, m)
    logits = jnp.einsum("GSM,ME->GSE", reshaped_inputs, params["gate"])
    rng = jax.random.PRNGKey(1234) if second_expert_policy == "random" else None
    combine_tensor, dispatch_tensor, aux_loss = _praxis_top2_gating(logits, capacity, second_expert_policy, rng)
    expert_inputs = jnp.einsum("GSEC,GSM->EGCM", dispatch_tensor, reshaped_inputs)
    hidden = jnp.einsum("EGCM,EMH->EGCH", expert_inputs, params["wi"]) + params["bi"][:, None, None, :]
    hidden = jax.nn.relu(hidden)
    expert_output = jnp.einsum("EGCH,EHM->EGCM", hidden, params["wo"]) + params["bo"][:, None, None, :]
    combined_output = jnp.einsum("GSEC,EGCM->GSM", combine_tensor, expert_output)
    return combined_output.reshape(b_, l_, m), aux_loss


def praxis_top2_random_moe(params, x):
    """Praxis top2 gating with `second_expert_policy='random'`: the second expert is kept only with
    probability 2*gate_2 (a uniform draw from a fixed PRNG key). Deterministic given the key; the pass may
    rewrite it exactly or report a near-miss, but never be silently wrong."""
    return praxis_top2_moe(params, x, second_expert_policy="random")


def gshard_random_policy_moe(params, x, capacity_factor=1.0):
    """GShard/Praxis top-2 with `second_expert_policy='random'`, written in the choice-major top_k form:
    lax.top_k(2) on softmax gates, gate_1/gate_2 normalised by their sum, the second choice kept only where
    uniform(fixed key) < 2 * gate_2 (before its position is computed), choice-major running count
    (cumsum over [G, k*S, E] after a swapaxes) so every first choice precedes any second choice, [G,S,E,C]
    one-hot dispatch/combine einsums 'GSEC,GSM->EGCM' / 'GSEC,EGCM->GSM', ReLU FFN with biases."""
    b_, l_, m = x.shape
    g = 2
    s = (b_ * l_) // g
    e = params["gate"].shape[-1]
    k = 2
    capacity = max(1, int(math.ceil(k * s * capacity_factor / e)))
    xr = x.reshape(g, s, m)
    raw = jax.nn.softmax(jnp.einsum("GSM,ME->GSE", xr, params["gate"]), axis=-1)
    gates, idx = jax.lax.top_k(raw, k)  # [G, S, 2]
    gates = gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-9)
    u = jax.random.uniform(jax.random.PRNGKey(1234), (g, s), jnp.float32)
    keep2 = (u < 2.0 * gates[..., 1]).astype(jnp.int32)  # [G, S]
    keep_choice = jnp.stack([jnp.ones_like(keep2), keep2], axis=-1)  # [G, S, 2]
    mask = jax.nn.one_hot(idx, e, dtype=jnp.int32) * keep_choice[..., None]  # [G, S, k, E]
    mt = jnp.swapaxes(mask, 1, 2).reshape(g, k * s, e)
    pos = jnp.swapaxes((jnp.cumsum(mt, axis=1) - 1).reshape(g, k, s, e), 1, 2)
    kept = mask * (pos < capacity)
    slot_1h = jax.nn.one_hot(jnp.sum(pos * kept, axis=-1), capacity, dtype=jnp.float32)  # [G, S, k, C]
    dispatch = jnp.einsum("GSKE,GSKC->GSEC", kept.astype(jnp.float32), slot_1h)
    combine = jnp.einsum("GSKE,GSKC,GSK->GSEC", kept.astype(jnp.float32), slot_1h, gates)
    xe = jnp.einsum("GSEC,GSM->EGCM", dispatch, xr)
    h = jax.nn.relu(jnp.einsum("EGCM,EMH->EGCH", xe, params["wi"]) + params["bi"][:, None, None, :])
    ye = jnp.einsum("EGCH,EHM->EGCM", h, params["wo"]) + params["bo"][:, None, None, :]
    return jnp.einsum("GSEC,EGCM->GSM", combine, ye).reshape(b_, l_, m)


def init_praxis(key, b=2, l=16, m=16, h=32, e=4):
    ks = jax.random.split(key, 6)
    params = {"gate": _normal(ks[0], (m, e), 1 / math.sqrt(m)),
              "wi": _normal(ks[1], (e, m, h), 1 / math.sqrt(m)),
              "bi": _normal(ks[2], (e, h), 0.1),
              "wo": _normal(ks[3], (e, h, m), 1 / math.sqrt(h)),
              "bo": _normal(ks[4], (e, m), 0.1)}
    return params, jax.random.normal(ks[5], (b, l, m), jnp.float32)


# ======================================================================================================
# 5. Mesh-TensorFlow switch layer (transformer/moe.py `_switch_gating` + `transformer_moe_layer_v1`)
# ======================================================================================================
def mtf_switch_moe(params, x, capacity_factor=1.25):
    """Mesh-TF `_switch_gating`: top-1 argmax on softmax gates, exclusive cumsum position, expert_capacity =
    min(group_size, int(round(group_size * cf / E))) floored at 4, gate gathered with take_along_axis,
    bool one-hot capacity slots via jnp.where, z-loss + aux loss returned alongside. Layout [B, G, S] with
    tokens x [B, N, M] split into groups; dispatch einsum in the unusual order 'bgsm,bgsec->ebgcm' and
    combine 'ebgcm,bgsec->bgsm'; dense_relu_dense experts (no bias)."""
    bsz, n, m = x.shape
    e = params["wg"].shape[-1]
    group_size = 8
    ng = n // group_size
    xg = x.reshape(bsz, ng, group_size, m)
    expert_capacity = min(group_size, int(round((group_size * capacity_factor) / e)))
    expert_capacity = max(expert_capacity, 4)

    gate_logits = jnp.einsum("bgsm,me->bgse", xg, params["wg"])
    raw_gates = jax.nn.softmax(gate_logits, axis=-1)
    expert_index = jnp.argmax(raw_gates, axis=-1)  # [B, G, S]
    expert_mask = jax.nn.one_hot(expert_index, e, dtype=jnp.float32)
    # aux loss
    density_1 = jnp.mean(expert_mask, axis=-2)
    density_1_proxy = jnp.mean(raw_gates, axis=-2)
    loss = jnp.mean(density_1_proxy * density_1) * float(e * e)
    z_loss = jnp.sum(jnp.square(jnp.log(jnp.sum(jnp.exp(gate_logits), axis=-1)))) / float(bsz * n)
    loss = loss + 1e-3 * z_loss

    position_in_expert = (jnp.cumsum(expert_mask, axis=-2) - expert_mask) * expert_mask  # exclusive
    position_in_expert = jnp.sum(position_in_expert, axis=-1)  # [B, G, S]
    expert_gate = jnp.take_along_axis(raw_gates, expert_index[..., None], axis=-1)[..., 0]
    keep = position_in_expert < expert_capacity
    expert_gate = jnp.where(keep, expert_gate, 0.0)
    onehot_e = jax.nn.one_hot(expert_index, e, dtype=jnp.bool_)
    onehot_c = jax.nn.one_hot(position_in_expert.astype(jnp.int32), expert_capacity, dtype=jnp.bool_)
    dispatch = jnp.logical_and(jnp.logical_and(onehot_e[..., :, None], onehot_c[..., None, :]),
                               keep[..., None, None])  # [B, G, S, E, C]
    combine = jnp.where(dispatch, expert_gate[..., None, None], 0.0)

    expert_inputs = jnp.einsum("bgsm,bgsec->ebgcm", xg, dispatch.astype(xg.dtype))
    h = jax.nn.relu(jnp.einsum("ebgcm,emh->ebgch", expert_inputs, params["wi"]))
    expert_out = jnp.einsum("ebgch,ehm->ebgcm", h, params["wo"])
    y = jnp.einsum("ebgcm,bgsec->bgsm", expert_out, combine)
    return y.reshape(bsz, n, m), loss


def init_mtf(key, b=2, n=16, m=16, h=32, e=4):
    ks = jax.random.split(key, 4)
    params = {"wg": _normal(ks[0], (m, e), 1 / math.sqrt(m)),
              "wi": _normal(ks[1], (e, m, h), 1 / math.sqrt(m)),
              "wo": _normal(ks[2], (e, h, m), 1 / math.sqrt(h))}
    return params, jax.random.normal(ks[3], (b, n, m), jnp.float32)


# ======================================================================================================
# 6. Flax linen module, experts as nn.vmap over an MLP block, bf16 router, top-k -> softmax, dense gate
# ======================================================================================================
class _LinenMlp(nn.Module):
    d_ff: int
    d_model: int

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.d_ff, name="wi")(x)
        h = jnp.clip(h, -6.0, 6.0)
        h = nn.relu(h)
        return nn.Dense(self.d_model, name="wo")(h)


class LinenVmapMoE(nn.Module):
    """linen MoE: router nn.Dense in bfloat16 (params f32, computation bf16, cast to f32), lax.top_k on the
    logits, softmax over the k, the gate scattered with `.at[].set` into [T, E]; experts are
    `nn.vmap(_LinenMlp, variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=None,
    axis_size=E)` -- every expert on every token -- then 'etd,te->td'."""
    num_experts: int = 4
    d_ff: int = 32
    top_k: int = 2

    @nn.compact
    def __call__(self, x):
        t, d = x.shape
        logits = nn.Dense(self.num_experts, use_bias=False, dtype=jnp.bfloat16, name="router")(x)
        logits = logits.astype(jnp.float32)
        vals, idx = jax.lax.top_k(logits, self.top_k)
        w = jax.nn.softmax(vals, axis=-1)
        gate = jnp.zeros((t, self.num_experts), jnp.float32).at[jnp.arange(t)[:, None], idx].set(w)
        Experts = nn.vmap(_LinenMlp, variable_axes={"params": 0}, split_rngs={"params": True},
                          in_axes=None, out_axes=0, axis_size=self.num_experts)
        y = Experts(self.d_ff, d, name="experts")(x)  # [E, T, D]
        return jnp.einsum("etd,te->td", y, gate)


_LINEN_VMAP = LinenVmapMoE()


def linen_vmap_moe(params, x):
    """Flax linen `nn.Module` with `nn.vmap` experts, called via `model.apply` (see LinenVmapMoE)."""
    return _LINEN_VMAP.apply(params, x)


def init_linen_vmap(key, t=32, d=16):
    pk, xk = jax.random.split(key)
    x = jax.random.normal(xk, (t, d), jnp.float32)
    return _LINEN_VMAP.init(pk, x), x


# ======================================================================================================
# 7. Flax linen module with separate per-expert submodules (setup-style), SwiGLU, loop over experts
# ======================================================================================================
class _LinenSwiGLU(nn.Module):
    d_ff: int
    d_model: int

    def setup(self):
        self.wi_0 = nn.Dense(self.d_ff, use_bias=True)
        self.wi_1 = nn.Dense(self.d_ff, use_bias=True)
        self.wo = nn.Dense(self.d_model, use_bias=True)

    def __call__(self, x):
        return self.wo(nn.silu(self.wi_0(x)) * self.wi_1(x))


class LinenLoopMoE(nn.Module):
    """linen MoE in T5X `setup` style: `self.experts = [_LinenSwiGLU(...) for _ in range(E)]` (separate
    params 'experts_0', ...), sigmoid router with a bias, top-k via approx_max_k, renormalised; per-expert
    python loop accumulating `gate[:, e:e+1] * expert_e(x)` where gate[:, e] = sum over k of
    w * (idx == e); plus a dense shared expert."""
    num_experts: int = 4
    d_ff: int = 32
    top_k: int = 2

    def setup(self):
        self.router = nn.Dense(self.num_experts, use_bias=True)
        self.experts = [_LinenSwiGLU(self.d_ff, 16) for _ in range(self.num_experts)]
        self.shared = _LinenSwiGLU(self.d_ff, 16)

    def __call__(self, x):
        scores = jax.nn.sigmoid(self.router(x))
        w, idx = jax.lax.approx_max_k(scores, self.top_k)
        w = w / jnp.sum(w, axis=-1, keepdims=True)
        out = self.shared(x)
        for e, expert in enumerate(self.experts):
            g = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1, keepdims=True)
            out = out + g * expert(x)
        return out


_LINEN_LOOP = LinenLoopMoE()


def linen_loop_moe(params, x):
    """Flax linen setup-style module with a list of separate expert submodules (see LinenLoopMoE)."""
    return _LINEN_LOOP.apply(params, x)


def init_linen_loop(key, t=32, d=16):
    pk, xk = jax.random.split(key)
    x = jax.random.normal(xk, (t, d), jnp.float32)
    return _LINEN_LOOP.init(pk, x), x


# ======================================================================================================
# 8. flax.nnx module, stacked nnx.Param experts, argsort router, broadcast-and-mask with bool one-hot
# ======================================================================================================
class NnxMaskedMoE(nnx.Module):
    """flax.nnx MoE: nnx.Linear router, softmax, top-k via jnp.argsort(-p)[..., :k], weights with
    take_along_axis, renormalised; stacked expert weights as nnx.Param [E, D, F] (GeGLU: gate/up, exact
    GELU) with per-expert scale; tokens broadcast to every expert and masked with
    `jnp.where(one_hot(idx, E, dtype=bool).any(1).T[..., None], x[None], 0)`; combine 'etd,te->td'."""

    def __init__(self, d, f, e, k, rngs: nnx.Rngs):
        self.k = k
        self.e = e
        self.router = nnx.Linear(d, e, use_bias=False, rngs=rngs)
        init = nnx.initializers.normal(1 / math.sqrt(d))
        self.w_gate = nnx.Param(init(rngs.params(), (e, d, f), jnp.float32))
        self.w_up = nnx.Param(init(rngs.params(), (e, d, f), jnp.float32))
        self.w_down = nnx.Param(nnx.initializers.normal(1 / math.sqrt(f))(rngs.params(), (e, f, d), jnp.float32))
        self.scale = nnx.Param(1.0 + 0.1 * jax.random.normal(rngs.params(), (e,), jnp.float32))

    def __call__(self, x):
        probs = jax.nn.softmax(self.router(x), axis=-1)
        idx = jnp.argsort(-probs, axis=-1)[..., : self.k]
        w = jnp.take_along_axis(probs, idx, axis=-1)
        w = w / jnp.sum(w, axis=-1, keepdims=True)
        sel = jax.nn.one_hot(idx, self.e, dtype=jnp.bool_)  # [T, k, E]
        gate = jnp.sum(jnp.where(sel, w[..., None], 0.0), axis=1)  # [T, E]
        member = jnp.any(sel, axis=1).T  # [E, T]
        xe = jnp.where(member[..., None], x[None], 0.0)  # [E, T, D]
        h = jax.nn.gelu(jnp.einsum("etd,edf->etf", xe, self.w_gate[...]), approximate=False) * \
            jnp.einsum("etd,edf->etf", xe, self.w_up[...])
        y = jnp.einsum("etf,efd->etd", h, self.w_down[...]) * self.scale[...][:, None, None]
        return jnp.einsum("etd,te->td", y, gate)


_NNX_CACHE = {}


def _nnx_graphdef(d, f, e, k):
    if (d, f, e, k) not in _NNX_CACHE:
        m = NnxMaskedMoE(d, f, e, k, rngs=nnx.Rngs(0))
        _NNX_CACHE[(d, f, e, k)] = nnx.split(m)[0]
    return _NNX_CACHE[(d, f, e, k)]


def nnx_masked_moe(params, x):
    """flax.nnx module merged from (graphdef, state) per call: `nnx.merge(graphdef, params)(x)`."""
    d = x.shape[-1]
    e, _, f = params["w_gate"].shape
    model = nnx.merge(_nnx_graphdef(d, f, e, 2), params)
    return model(x)


def init_nnx(key, t=32, d=16, f=32, e=6):
    pk, xk = jax.random.split(key)
    m = NnxMaskedMoE(d, f, e, 2, rngs=nnx.Rngs(int(jax.random.randint(pk, (), 0, 2 ** 30))))
    _, state = nnx.split(m)
    return state, jax.random.normal(xk, (t, d), jnp.float32)


# ======================================================================================================
# 9. T5X-style "einsum everything" top-1 with [B, S, E, C] tensors, token-major capacity, bias-free
#    expert_capacity from int(round()), take_along_axis gate, unusual einsum orders, flattened groups
# ======================================================================================================
def t5x_einsum_top1_moe(params, x, capacity_factor=2.0):
    """A T5X/flaxformer-ish `ExpertsChooseMasked`-free top-1 layer written in einsum-everything style:
    x [B, S, D] with the batch as the group axis; router logits f32 'bsd,de->bse'; top-1 from
    lax.top_k(k=1); dispatch mask built as mask[..., None] * one_hot(inclusive cumsum - 1) (token-major);
    dispatch einsum with dims 'bsec,bsd->ebcd' written as 'bsec,dsb->ecbd'-like orders: here 'sbd' input
    and 'sbec' masks -> 'ecbd'; the expert FFN uses weights stored [E, F, D] (transposed, 'ecbd,efd->ecbf')
    and wo stored [D, E, F] ('ecbf,def->ecbd'); combine 'sbec,ecbd->sbd'. Output gate is the raw prob."""
    b, s, d = x.shape
    e = params["router"].shape[-1]
    cap = int(round(s * capacity_factor / e))
    xs = jnp.swapaxes(x, 0, 1)  # [S, B, D]
    logits = jnp.einsum("sbd,de->sbe", xs, params["router"])
    probs = jax.nn.softmax(logits, axis=-1)
    gate, idx = jax.lax.top_k(probs, 1)  # [S, B, 1]
    mask = jax.nn.one_hot(idx[..., 0], e, dtype=jnp.float32)  # [S, B, E]
    pos = jnp.cumsum(mask, axis=0) - 1.0  # token-major running count over S per batch row
    slot = jax.nn.one_hot(jnp.sum(pos * mask, axis=-1), cap, dtype=jnp.float32)  # [S, B, C]
    disp = mask[..., None] * slot[..., None, :] * (pos < cap)[..., None]  # [S, B, E, C]
    comb = disp * gate[..., None]
    xe = jnp.einsum("sbec,sbd->ecbd", disp, xs)
    h = jax.nn.gelu(jnp.einsum("ecbd,efd->ecbf", xe, params["wi_t"]))
    ye = jnp.einsum("ecbf,def->ecbd", h, params["wo_t"])
    y = jnp.einsum("sbec,ecbd->sbd", comb, ye)
    return jnp.swapaxes(y, 0, 1)


def init_t5x(key, b=2, s=24, d=16, f=32, e=4):
    ks = jax.random.split(key, 4)
    params = {"router": _normal(ks[0], (d, e), 1 / math.sqrt(d)),
              "wi_t": _normal(ks[1], (e, f, d), 1 / math.sqrt(d)),
              "wo_t": _normal(ks[2], (d, e, f), 1 / math.sqrt(f))}
    return params, jax.random.normal(ks[3], (b, s, d), jnp.float32)


LAYERS = {
    "flaxformer_masked_router": (flaxformer_masked_router, init_flaxformer, "capacity",
                                 "top-2 choice-major, float priority, bool one-hot, vmap experts"),
    "flaxformer_bpr_router": (flaxformer_bpr_router, init_flaxformer, "capacity (or near-miss)",
                              "batch prioritized routing: argsort by top-1 prob"),
    "flaxformer_member_router": (flaxformer_member_router, init_flaxformer, "capacity",
                                 "probe: + membership mask, int priority, vmap experts"),
    "flaxformer_member_bpr_router": (flaxformer_member_bpr_router, init_flaxformer, "capacity exact or near-miss",
                                     "probe: BPR + membership mask, int priority, vmap experts"),
    "flaxformer_member_einsum": (flaxformer_member_einsum, init_flaxformer, "capacity",
                                 "probe: membership mask, int priority, einsum experts"),
    "flaxformer_member_einsum_floatprio": (flaxformer_member_einsum_floatprio, init_flaxformer, "capacity",
                                           "probe: membership mask, einsum experts, float priority"),
    "flaxformer_member_bpr_einsum": (flaxformer_member_bpr_einsum, init_flaxformer, "capacity exact or near-miss",
                                     "probe: BPR + membership mask, int priority, einsum experts"),
    "praxis_top2": (praxis_top2_moe, init_praxis, "capacity", "two argmaxes, gate1/=denom, choice-major"),
    "praxis_top2_random": (praxis_top2_random_moe, init_praxis, "capacity exact or near-miss",
                           "second_expert_policy=random (fixed key)"),
    "gshard_random_policy": (gshard_random_policy_moe, init_praxis, "capacity exact or near-miss",
                             "top_k form, random 2nd-expert drop, choice-major"),
    "mtf_switch": (mtf_switch_moe, init_mtf, "capacity", "top-1, [B,G,S,E,C], jnp.where bool masks"),
    "linen_vmap": (linen_vmap_moe, init_linen_vmap, "dense", "nn.vmap experts, bf16 router, .at[].set gate"),
    "linen_loop": (linen_loop_moe, init_linen_loop, "loop", "separate expert submodules, sigmoid, approx_max_k"),
    "nnx_masked": (nnx_masked_moe, init_nnx, "masked", "nnx.Param stacked, argsort, where bool masks"),
    "t5x_einsum_top1": (t5x_einsum_top1_moe, init_t5x, "capacity", "[S,B,E,C], weights [E,F,D]/[D,E,F]"),
}


# ======================================================================================================
# Extra probes (found while bisecting): legitimate functions whose capacity slots can hold several tokens.
# ======================================================================================================
def einsum_group_contracted_moe(params, x):
    """'Einsum dims in unusual orders' taken one step too far (a mislabeled Mesh-TF/T5X einsum): top-1
    capacity layer on x [G, S, D] with per-group running counts over S, but the dispatch einsum is
    'gsec,gsd->ecsd' -- it contracts the group axis g and keeps s, so one (e, c, s) buffer row sums the
    tokens of all groups at position s routed to (e, c). A legitimate (if odd) function: the pass must
    reproduce it or leave it alone."""
    g, s, d = x.shape
    e = params["router"].shape[-1]
    cap = 4
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    idx = jnp.argmax(probs, -1)
    gate = jnp.max(probs, -1)
    mask = jax.nn.one_hot(idx, e, dtype=jnp.int32)
    pos = jnp.cumsum(mask, axis=1) - 1
    slot = jax.nn.one_hot(jnp.sum(pos * mask, -1), cap)
    disp = mask[..., None] * slot[..., None, :] * (pos < cap)[..., None]
    comb = disp * gate[..., None, None]
    xe = jnp.einsum("gsec,gsd->ecsd", disp, x)
    ye = jnp.einsum("ecsf,efd->ecsd", jax.nn.relu(jnp.einsum("ecsd,edf->ecsf", xe, params["wi"])), params["wo"])
    return jnp.einsum("gsec,ecsd->gsd", comb, ye)


def per_choice_cumsum_moe(params, x):
    """GShard-style top-2 capacity layer whose running count is taken per choice (cumsum over tokens of the
    [T, k, E] one-hot, without flattening (T, k) and without Praxis's mask_1_count offset): a choice-0 and
    a choice-1 pair of one expert can share a slot, and the buffer row then sums both tokens."""
    t, d = x.shape
    e = params["router"].shape[-1]
    k, cap = 2, 6
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    w, idx = jax.lax.top_k(probs, k)
    mask = jax.nn.one_hot(idx, e, dtype=jnp.int32)
    pos = jnp.cumsum(mask, axis=0) - 1
    keep = mask * (pos < cap)
    pos_1h = jax.nn.one_hot(jnp.sum(pos * keep, -1), cap)
    disp = jnp.einsum("tke,tkc->tec", keep.astype(x.dtype), pos_1h)
    comb = jnp.einsum("tke,tkc,tk->tec", keep.astype(x.dtype), pos_1h, w)
    xe = jnp.einsum("tec,td->ecd", disp, x)
    ye = jnp.einsum("ecf,efd->ecd", jax.nn.relu(jnp.einsum("ecd,edf->ecf", xe, params["wi"])), params["wo"])
    return jnp.einsum("tec,ecd->td", comb, ye)


def _init_probe(shape):
    def init(key):
        k = jax.random.split(key, 4)
        p = {"router": _normal(k[0], (8, 4), 1.0), "wi": _normal(k[1], (4, 8, 16), 1 / 3),
             "wo": _normal(k[2], (4, 16, 8), 1 / 4)}
        return p, jax.random.normal(k[3], shape, jnp.float32)
    return init


LAYERS["einsum_group_contracted"] = (einsum_group_contracted_moe, _init_probe((2, 16, 8)),
                                     "capacity exact or near-miss", "probe: dispatch contracts the group axis")
LAYERS["per_choice_cumsum"] = (per_choice_cumsum_moe, _init_probe((16, 8)), "capacity exact or near-miss",
                               "probe: per-choice running count, shared slots")
