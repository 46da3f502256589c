"""Token dispatch and combine for MoE on one device: `moe_dispatch` / `moe_combine` as XLA FFI calls
with `jax.custom_vjp`.

Contract (DESIGN.md "Op contracts", issue 4):

* `moe_dispatch(x[T,D], expert_ids[T,k], num_experts, *, capacity=None, keep=None, align=1)
  -> (rows[R,D], group_sizes[E], routing)`. The T*k (token, choice) pairs are sorted by expert,
  stable in token order then choice index (flat pair index p = t*k + j). `group_sizes` (padded to a
  multiple of `align`) and `rows` feed `grouped_matmul` directly; `routing.counts` are the true kept
  counts. Padding rows and rows past the padded total are zero.
* Drops: a pair is *dropped* (not dispatched; combine gives it 0, its gradients are 0) when
  - its expert id is out of [0, num_experts) -- documented behaviour for bad ids, never an
    out-of-bounds access; it does not take a capacity slot;
  - `keep` is given and `keep[t, j]` is False (an explicit mask: reproduces any library's priority
    order, e.g. choice-major GShard top-2 or MaxText's token-major one);
  - `capacity=C` is given and the pair's position -- the running count of earlier in-range pairs
    of the same expert in token-major, choice-minor order -- is >= C (the GShard/Switch cumsum rule).
  `capacity` and `keep` are alternatives: give at most one.
* Static row count R (an upper bound of the padded total):
  dropless / keep:  R = T*k + min(E, T*k) * (align - 1)
  capacity C:       R = min(T*k + min(E, T*k) * (align - 1), E * round_up(C, align))
  i.e. capacity mode uses the same compact expert-sorted layout holding only the kept pairs (not an
  [E, C] slab), so the same grouped GEMM consumes it. See `dispatch_num_rows`.
* `moe_combine(rows[R,D], routing, weights[T,k]) -> y[T,D]`: y[t] = sum_j w[t,j] * rows[pos[t,j]]
  over the kept pairs, float32 accumulation in j order (deterministic, no atomics), output dtype =
  rows dtype.
* Gradients: dispatch's backward is an un-weighted combine (each token sums the cotangents of its
  rows); combine's backward is a dispatch of w[t,j] * dy[t] to each pair's row plus
  dweights[t,j] = <dy[t], rows[pos[t,j]]> (0 for dropped pairs), fused in one FFI call.

`routing` (`MoeRouting`) is a registered pytree dataclass of int32 arrays only, so it crosses
`jax.jit` / `jax.checkpoint` / `lax.scan` boundaries and can be saved or recomputed freely.

FFI targets (same names on CPU and CUDA):
  jax_moe_ffi_dispatch_plan  expert_ids[T,k] s32, keep[T,k] pred | [0]
                             -> pos[T,k], row_pair[R], counts[E], group_sizes[E], workspace[W] (s32)
                             attrs capacity (i64, -1 = none), align (i64), chunk (i64)
  jax_moe_ffi_dispatch       x[T,D], pos[T,k] s32, row_pair[R] s32, scale[T,k] f32 | [0] -> rows[R,D];
                             attr top_k (row r holds pair row_pair[r] only where pos agrees, else zeros)
  jax_moe_ffi_combine        rows[R,D], pos[T,k] s32, weights[T,k] f32 -> y[T,D]
  jax_moe_ffi_combine_bwd    dy[T,D], rows[R,D], row_pair[R] s32, weights[T,k] f32
                             -> drows[R,D], dweights[T,k] f32
"""
from __future__ import annotations

import dataclasses
import operator

import jax
import jax.numpy as jnp
import numpy as np

from jax_moe_ffi.ops import _common as c

PLAN_TARGET = "jax_moe_ffi_dispatch_plan"
DISPATCH_TARGET = "jax_moe_ffi_dispatch"
COMBINE_TARGET = "jax_moe_ffi_combine"
COMBINE_BWD_TARGET = "jax_moe_ffi_combine_bwd"

_INT32_MAX = 2**31 - 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MoeRouting:
    """Where each (token, choice) pair went. Arrays only (a pytree); shapes carry T, k, R and E.

    pos:         [T, k] int32, row of `rows` holding pair (t, j), or -1 when the pair is dropped.
    row_pair:    [R] int32, flat pair index t*k + j held by each row, or -1 (padding / unused).
    counts:      [E] int32, kept pairs per expert (the true counts).
    group_sizes: [E] int32, counts rounded up to a multiple of `align` (what grouped_matmul takes).
    """
    pos: jax.Array
    row_pair: jax.Array
    counts: jax.Array
    group_sizes: jax.Array

    @property
    def num_tokens(self) -> int:
        return self.pos.shape[0]

    @property
    def top_k(self) -> int:
        return self.pos.shape[1]

    @property
    def num_rows(self) -> int:
        return self.row_pair.shape[0]

    @property
    def num_experts(self) -> int:
        return self.counts.shape[0]

    def regroup(self, top_k: int) -> "MoeRouting":
        """The same routing seen as [T * k / top_k, top_k] pairs: pairs are numbered t * k + j, so any split of
        that flat index into (token, choice) names the same rows (e.g. k choices of T tokens, or T * k
        one-choice rows)."""
        pairs = self.pos.size
        if top_k < 1 or pairs % top_k:
            raise ValueError(f"MoeRouting.regroup: top_k={top_k} must divide the {pairs} (token, choice) pairs")
        return dataclasses.replace(self, pos=self.pos.reshape(pairs // top_k, top_k))

    @property
    def kept(self) -> jax.Array:
        """[T, k] bool: which pairs were dispatched."""
        return self.pos >= 0

    @property
    def token_of_row(self) -> jax.Array:
        """[R] int32: token of each row, -1 for padding rows."""
        return jnp.where(self.row_pair >= 0, self.row_pair // self.top_k, -1)


def _round_up(v: int, a: int) -> int:
    return -(-v // a) * a


def dispatch_num_rows(num_tokens: int, top_k: int, num_experts: int, capacity: int | None = None,
                      align: int = 1) -> int:
    """The static row count R of `moe_dispatch` (an upper bound of sum(group_sizes))."""
    p = num_tokens * top_k
    r = p + min(num_experts, p) * (align - 1)
    if capacity is not None:
        r = min(r, num_experts * _round_up(capacity, align))
    return r


def _plan_chunk(p: int) -> int:
    """Pairs per chunk of the CUDA plan's ranking pass (a multiple of 32; at most ~1024 chunks)."""
    return max(256, _round_up(-(-p // 1024), 32))


# ----------------------------------------------------------------------------- platform routing
def _on_platforms(ffi_fn, fallback_fn, target: str, *args):
    return c.ffi_on_platforms(target, ffi_fn, fallback_fn, *args)


# ------------------------------------------------------------------------------------ FFI calls
def _plan_call(expert_ids, keep, num_experts: int, capacity: int | None, align: int, num_rows: int):
    t, k = expert_ids.shape
    p = t * k
    chunk = _plan_chunk(p)
    workspace = -(-p // chunk) * num_experts + num_experts + 1  # histograms, offsets, a ticket
    i32 = jnp.int32
    out_types = (jax.ShapeDtypeStruct((t, k), i32), jax.ShapeDtypeStruct((num_rows,), i32),
                 jax.ShapeDtypeStruct((num_experts,), i32), jax.ShapeDtypeStruct((num_experts,), i32),
                 jax.ShapeDtypeStruct((workspace,), i32))
    call = jax.ffi.ffi_call(PLAN_TARGET, out_types, vmap_method="sequential")
    has_keep = keep is not None
    keep_arg = keep if has_keep else jnp.zeros((0,), jnp.bool_)

    def ffi_fn(ids, kp):
        outs = call(ids, kp, capacity=np.int64(-1 if capacity is None else capacity),
                    align=np.int64(align), chunk=np.int64(chunk))
        return tuple(outs[:4])

    def xla_fn(ids, kp):
        from jax_moe_ffi import reference
        r = reference.moe_routing_reference(ids, num_experts, capacity=capacity,
                                            keep=kp if has_keep else None, align=align)
        return r.pos, r.row_pair, r.counts, r.group_sizes

    pos, row_pair, counts, group_sizes = _on_platforms(ffi_fn, xla_fn, PLAN_TARGET, expert_ids, keep_arg)
    return MoeRouting(pos=pos, row_pair=row_pair, counts=counts, group_sizes=group_sizes)


def _dispatch_call(x, pos, row_pair, scale, top_k: int, quant=None):
    """rows[r] = x[p // top_k] (times scale[p] when given) for p = row_pair[r] when pos[p] == r; else zero.

    A plan's pos and row_pair always agree; the check makes a hand-made routing that does not give zero
    rows (not stale memory) on every platform. The CUDA gather is token-major: it reads pos.

    `quant` is the seam for fused FP8 quantisation of the dispatched rows (the FP8 issue): it will
    select a quantising store in the kernels and add data/scale results; only None for now.
    """
    if quant is not None:
        raise NotImplementedError(f"moe_dispatch: fused quantisation {quant!r} is not implemented yet")
    r = row_pair.shape[0]
    t, d = x.shape
    call = jax.ffi.ffi_call(DISPATCH_TARGET, jax.ShapeDtypeStruct((r, d), x.dtype), vmap_method="sequential")
    scaled = scale is not None
    scale_arg = scale.reshape(-1) if scaled else jnp.zeros((0,), jnp.float32)

    def ffi_fn(xx, ps, rp, sc):
        return call(xx, ps, rp, sc, top_k=np.int64(top_k))

    def xla_fn(xx, ps, rp, sc):
        return _dispatch_xla(xx, ps, rp, sc if scaled else None, top_k)

    return _on_platforms(ffi_fn, xla_fn, DISPATCH_TARGET, x, pos, row_pair, scale_arg)


def _dispatch_xla(x, pos, row_pair, scale, top_k: int):
    """The dispatch target's rule in XLA ops (the GPU fallback; tested against the CPU target)."""
    t, d = x.shape
    r = row_pair.shape[0]
    if t == 0:
        return jnp.zeros((r, d), x.dtype)
    valid = (row_pair >= 0) & (row_pair < t * top_k)
    src = jnp.where(valid, row_pair, 0)
    valid = valid & (pos.reshape(-1)[src] == jnp.arange(r, dtype=pos.dtype))
    g = x[src // top_k]
    if scale is not None:
        g = (g.astype(jnp.float32) * scale.reshape(-1)[src][:, None]).astype(x.dtype)
    return jnp.where(valid[:, None], g, jnp.zeros((), x.dtype))


def _combine_call(rows, pos, weights):
    t, k = pos.shape
    call = jax.ffi.ffi_call(COMBINE_TARGET, jax.ShapeDtypeStruct((t, rows.shape[1]), rows.dtype),
                            vmap_method="sequential")

    def xla_fn(rr, ps, w):
        if rr.shape[0] == 0:
            return jnp.zeros((t, rr.shape[1]), rr.dtype)
        valid = (ps >= 0) & (ps < rr.shape[0])
        g = rr[jnp.where(valid, ps, 0)].astype(jnp.float32)  # [T, k, D]
        contrib = jnp.where(valid[..., None], w[..., None] * g, 0.0)
        return contrib.sum(axis=1).astype(rr.dtype)

    return _on_platforms(call, xla_fn, COMBINE_TARGET, rows, pos, weights)


def _combine_bwd_call(dy, rows, row_pair, weights):
    t, k = weights.shape
    call = jax.ffi.ffi_call(COMBINE_BWD_TARGET,
                            (jax.ShapeDtypeStruct(rows.shape, rows.dtype),
                             jax.ShapeDtypeStruct((t, k), jnp.float32)),
                            vmap_method="sequential")

    def xla_fn(g, rr, rp, w):
        if t == 0:
            return jnp.zeros(rr.shape, rr.dtype), jnp.zeros((t, k), jnp.float32)
        valid = (rp >= 0) & (rp < t * k)
        src = jnp.where(valid, rp, 0)
        gy = g[src // k].astype(jnp.float32)  # [R, D]
        drows = jnp.where(valid[:, None], gy * w.reshape(-1)[src][:, None], 0.0).astype(rr.dtype)
        dots = jnp.where(valid, jnp.sum(gy * rr.astype(jnp.float32), axis=1), 0.0)
        dw = jnp.zeros((t * k,), jnp.float32).at[jnp.where(valid, rp, t * k)].set(dots, mode="drop")
        return drows, dw.reshape(t, k)

    return _on_platforms(call, xla_fn, COMBINE_BWD_TARGET, dy, rows, row_pair, weights)


# ----------------------------------------------------------------------------------- custom_vjp
def _routing_cotangent(routing: MoeRouting) -> MoeRouting:
    return jax.tree.map(c.float0_zeros, routing)


@jax.custom_vjp
def _dispatch_rows(x, routing):
    return _dispatch_call(x, routing.pos, routing.row_pair, None, routing.top_k)


def _dispatch_rows_fwd(x, routing):
    return _dispatch_rows(x, routing), routing


def _dispatch_rows_bwd(routing, drows):
    # Un-weighted combine: each token sums the cotangents of its kept rows (padding rows are ignored).
    return _combine_sum(drows, routing), _routing_cotangent(routing)


_dispatch_rows.defvjp(_dispatch_rows_fwd, _dispatch_rows_bwd)


@jax.custom_vjp
def _combine_sum(rows, routing):
    """The un-weighted combine; its backward is the dispatch gather of the cotangent (the two are adjoint),
    with no read of `rows` (the weighted combine's backward reads them for dw)."""
    return _combine_call(rows, routing.pos, jnp.ones(routing.pos.shape, jnp.float32))


def _combine_sum_fwd(rows, routing):
    return _combine_sum(rows, routing), routing


def _combine_sum_bwd(routing, dy):
    return _dispatch_rows(dy, routing), _routing_cotangent(routing)


_combine_sum.defvjp(_combine_sum_fwd, _combine_sum_bwd)


@jax.custom_vjp
def _combine(rows, routing, weights):
    return _combine_call(rows, routing.pos, weights)


def _combine_fwd(rows, routing, weights):
    return _combine(rows, routing, weights), (rows, routing, weights)


def _combine_bwd(res, dy):
    rows, routing, weights = res
    drows, dw = _combine_bwd_call(dy.astype(rows.dtype), rows, routing.row_pair, weights)
    return drows, _routing_cotangent(routing), dw


_combine.defvjp(_combine_fwd, _combine_bwd)


# ---------------------------------------------------------------------------------- public API
def _static_int(op: str, name: str, v, minimum: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"{op}: `{name}` must be a static Python int, got {type(v).__name__} {v!r}") from None
    v = int(v)
    if v < minimum:
        raise ValueError(f"{op}: `{name}` must be >= {minimum}, got {v}")
    return v


def _check_ids(op: str, expert_ids, num_experts: int):
    if not jnp.issubdtype(expert_ids.dtype, jnp.integer):
        raise TypeError(f"{op}: `expert_ids` must be an integer array, got {expert_ids.dtype}")
    if expert_ids.dtype == jnp.int32:
        return expert_ids
    # Map ids a cast to int32 could wrap into range onto -1 first (out of range stays out of range).
    bad = (expert_ids < 0) | (expert_ids >= num_experts)
    return jnp.where(bad, -1, expert_ids).astype(jnp.int32)


def moe_routing(expert_ids, num_experts: int, *, capacity: int | None = None, keep=None,
                align: int = 1) -> MoeRouting:
    """The routing of `moe_dispatch` alone (which row each pair goes to, group sizes), no data moved."""
    op = "moe_dispatch"
    expert_ids = jnp.asarray(expert_ids)
    num_experts = _static_int(op, "num_experts", num_experts, 1)
    align = _static_int(op, "align", align, 1)
    if capacity is not None:
        capacity = _static_int(op, "capacity", capacity, 0)
    c.check_rank(op, "expert_ids", expert_ids, 2, "[T, k]")
    if expert_ids.shape[1] < 1:
        raise ValueError(f"{op}: `expert_ids` must have k >= 1 choices per token, got shape {tuple(expert_ids.shape)}")
    ids = _check_ids(op, expert_ids, num_experts)
    if keep is not None:
        if capacity is not None:
            raise ValueError(f"{op}: give either `capacity` or `keep`, not both")
        keep = jnp.asarray(keep)
        if keep.shape != expert_ids.shape:
            raise ValueError(f"{op}: `keep` must have the shape of `expert_ids` {tuple(expert_ids.shape)}, "
                             f"got {tuple(keep.shape)}")
        if keep.dtype != jnp.bool_:
            raise TypeError(f"{op}: `keep` must be a bool mask, got {keep.dtype}")
    t, k = ids.shape
    r = dispatch_num_rows(t, k, num_experts, capacity, align)
    if r > _INT32_MAX or t * k > _INT32_MAX:
        raise ValueError(f"{op}: {r} rows / {t * k} pairs do not fit int32 indices")
    return _plan_call(ids, keep, num_experts, capacity, align, r)


def moe_dispatch(x, expert_ids, num_experts: int, *, capacity: int | None = None, keep=None,
                 align: int = 1, recipe=None):
    """Sorts token copies by expert: returns `(rows[R, D], group_sizes[E], routing)`.

    Args:
      x: [T, D] float32/bfloat16/float16 tokens.
      expert_ids: [T, k] integer, the chosen experts of each token (duplicates allowed: each pair is
        dispatched; ids outside [0, num_experts) are dropped).
      num_experts: E, static.
      capacity: static int C >= 0: pairs at position >= C of their expert (token-major, choice-minor
        running count) are dropped. None: dropless.
      keep: [T, k] bool, an explicit keep mask instead of `capacity`.
      align: pad each group with zero rows to a multiple of `align` (e.g. 16, 128).
      recipe: the seam for fused FP8 quantisation of the rows (FP8 issue); only None for now.
    Returns:
      rows [R, D] sorted by expert (stable in token, then choice order), zero past each group's kept
      rows; group_sizes [E] int32 (padded) for `grouped_matmul`; routing (`MoeRouting`).
      R = `dispatch_num_rows(T, k, E, capacity, align)`.
    """
    op = "moe_dispatch"
    x, expert_ids = c.check_tokens_and_ids(op, x, expert_ids)
    if recipe is not None:
        raise NotImplementedError(f"{op}: recipe={recipe!r} (fused FP8 dispatch) is not implemented yet (only None)")
    routing = moe_routing(expert_ids, num_experts, capacity=capacity, keep=keep, align=align)
    rows = _dispatch_rows(x, routing)
    return rows, routing.group_sizes, routing


def moe_dispatch_rows(x, routing: MoeRouting):
    """The rows of `x[T, D]` for a routing made earlier (`moe_routing`, `moe_dispatch`): what `moe_dispatch`
    returns as rows, without planning again -- e.g. a second activation sent where the tokens went, or the same
    routing seen with another k (`MoeRouting.regroup`). Its backward is the un-weighted combine."""
    x = _routed_operand("moe_dispatch_rows", "x", x, routing, "T", routing.num_tokens if
                        isinstance(routing, MoeRouting) else 0, "tokens")
    return _dispatch_rows(x, routing)


def _routed_operand(op, name, v, routing, axis, n, what):
    """`routing` is a MoeRouting and `v` a float [n, D] array (n = the routing's T or R), else a clear error."""
    if not isinstance(routing, MoeRouting):
        raise TypeError(f"{op}: `routing` must be the MoeRouting of moe_routing / moe_dispatch, got "
                        f"{type(routing).__name__}")
    v = jnp.asarray(v)
    c.check_rank(op, name, v, 2, f"[{axis}, D]")
    c.check_float(op, name, v)
    if v.shape[0] != n:
        raise ValueError(f"{op}: `{name}` {tuple(v.shape)} must have the routing's {axis} = {n} {what}")
    return v


def moe_combine(rows, routing: MoeRouting, weights):
    """y[t] = sum_j weights[t, j] * rows[routing.pos[t, j]] over kept pairs: [T, D], rows' dtype.

    float32 accumulation in choice order, deterministic; dropped pairs contribute 0. ``weights=None``: the
    plain sum (weights already applied to the rows); its backward is the dispatch gather of the cotangent
    and reads no rows.
    """
    op = "moe_combine"
    rows = _routed_operand(op, "rows", rows, routing, "R", routing.num_rows if isinstance(routing, MoeRouting)
                           else 0, "rows")
    if weights is None:
        return _combine_sum(rows, routing)
    weights = jnp.asarray(weights)
    c.check_rank(op, "weights", weights, 2, "[T, k]")
    c.check_float(op, "weights", weights)
    if weights.shape != routing.pos.shape:
        raise ValueError(f"{op}: `weights` {tuple(weights.shape)} must be [T, k] = {tuple(routing.pos.shape)}")
    y = _combine(rows, routing, weights.astype(jnp.float32))
    return y
