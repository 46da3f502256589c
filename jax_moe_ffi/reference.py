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
