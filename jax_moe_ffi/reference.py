"""Pure-JAX references of every op: the ground truth for tests, and what `explain` describes."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def clipped_group_bounds(group_sizes: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """[begin, end) rows of each group under the package's group-size rule.

    Negative sizes count as 0; groups run back to back from row 0 and are clipped to [0, m).
    """
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    end = jnp.minimum(jnp.cumsum(sizes), m)
    begin = jnp.concatenate([jnp.zeros((1,), end.dtype), end[:-1]])
    return begin, end


def row_group_ids(group_sizes: jax.Array, m: int) -> jax.Array:
    """Group id of each of the m rows; rows past the clipped total get id G (no group)."""
    _, end = clipped_group_bounds(group_sizes, m)
    return jnp.searchsorted(end, jnp.arange(m), side="right").astype(jnp.int32)


def grouped_matmul(lhs, rhs, group_sizes, *, transpose_rhs=False, preferred_element_type=None):
    """out[i] = lhs[i] @ rhs[g(i)] (or rhs[g(i)].T), rows in no group are zero. Dense: G x the FLOPs."""
    out_dtype = preferred_element_type or lhs.dtype
    m = lhs.shape[0]
    g = rhs.shape[0]
    ids = row_group_ids(group_sizes, m)
    w = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    onehot = (ids[:, None] == jnp.arange(g)[None, :]).astype(jnp.float32)
    per_group = jnp.einsum("mk,gkn->gmn", lhs.astype(jnp.float32), w.astype(jnp.float32),
                           precision=jax.lax.Precision.HIGHEST)
    out = jnp.einsum("mg,gmn->mn", onehot, per_group, precision=jax.lax.Precision.HIGHEST)
    return out.astype(out_dtype)


def grouped_matmul_wgrad(lhs, dout, group_sizes, *, preferred_element_type=None):
    """out[g] = lhs[rows_g].T @ dout[rows_g]; empty groups are zero."""
    out_dtype = preferred_element_type or lhs.dtype
    m = lhs.shape[0]
    g = group_sizes.shape[0]
    ids = row_group_ids(group_sizes, m)
    onehot = (ids[:, None] == jnp.arange(g)[None, :]).astype(jnp.float32)
    out = jnp.einsum("mg,mk,mn->gkn", onehot, lhs.astype(jnp.float32), dout.astype(jnp.float32),
                     precision=jax.lax.Precision.HIGHEST)
    return out.astype(out_dtype)


# ------------------------------------------------------------------------------ dispatch / combine
def _dispatch_num_rows_reference(t: int, k: int, e: int, capacity, align: int) -> int:
    """R of moe_dispatch: T*k + min(E, T*k)*(align-1), capped at E*round_up(C, align) with capacity."""
    p = t * k
    r = p + min(e, p) * (align - 1)
    if capacity is not None:
        r = min(r, e * (-(-capacity // align) * align))
    return r


def moe_routing_reference(expert_ids, num_experts: int, *, capacity=None, keep=None, align: int = 1):
    """The routing of `moe_dispatch`, written as the GShard/Switch one-hot cumsum (O(T*k*E) memory).

    A pair (t, j) is a candidate when 0 <= expert_ids[t, j] < E (and keep[t, j] when given); its
    position is the running count of earlier candidates of its expert in flat (token-major,
    choice-minor) order; it is kept unless position >= capacity. Groups are laid out by expert,
    each padded to a multiple of `align`. Returns a `MoeRouting`.
    """
    from jax_moe_ffi.ops.dispatch import MoeRouting

    ids = jnp.asarray(expert_ids)
    t, k = ids.shape
    p = t * k
    e = num_experts
    r = _dispatch_num_rows_reference(t, k, e, capacity, align)
    flat = ids.reshape(p)
    cand = (flat >= 0) & (flat < e)
    if keep is not None:
        cand = cand & jnp.asarray(keep).reshape(p).astype(bool)
    onehot = ((flat[:, None] == jnp.arange(e)[None, :]) & cand[:, None]).astype(jnp.int32)  # [P, E]
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)  # [P]
    kept = cand if capacity is None else cand & (position < capacity)
    counts = jnp.sum(onehot * kept[:, None].astype(jnp.int32), axis=0).astype(jnp.int32)
    group_sizes = ((counts + align - 1) // align * align).astype(jnp.int32)
    offsets = jnp.cumsum(group_sizes) - group_sizes
    row = offsets[jnp.clip(flat, 0, e - 1)] + position
    pos = jnp.where(kept, row, -1).astype(jnp.int32)
    row_pair = jnp.full((r,), -1, jnp.int32).at[jnp.where(kept, row, r)].set(
        jnp.arange(p, dtype=jnp.int32), mode="drop")
    return MoeRouting(pos=pos.reshape(t, k), row_pair=row_pair, counts=counts, group_sizes=group_sizes)


def moe_dispatch_reference(x, expert_ids, num_experts: int, *, capacity=None, keep=None, align: int = 1):
    """(rows[R, D], group_sizes[E], routing) of `moe_dispatch`: rows[r] = x[token of row r], zero rows
    for padding and past the padded total."""
    routing = moe_routing_reference(expert_ids, num_experts, capacity=capacity, keep=keep, align=align)
    k = routing.pos.shape[1]
    rp = routing.row_pair
    rows = jnp.where((rp >= 0)[:, None], x[jnp.maximum(rp, 0) // k], jnp.zeros((), x.dtype))
    return rows, routing.group_sizes, routing


def moe_combine_reference(rows, routing, weights):
    """y[t] = sum_j weights[t, j] * rows[pos[t, j]] over kept pairs (pos >= 0), float32, rows' dtype."""
    pos = routing.pos
    r = rows.shape[0]
    if r == 0:  # nothing kept (capacity 0): no row to gather from
        return jnp.zeros((pos.shape[0], rows.shape[1]), rows.dtype)
    kept = pos >= 0
    gathered = rows.at[jnp.where(kept, pos, r)].get(mode="fill", fill_value=0).astype(jnp.float32)
    contrib = jnp.where(kept[..., None], weights.astype(jnp.float32)[..., None] * gathered, 0.0)
    return jnp.sum(contrib, axis=1).astype(rows.dtype)
