"""Expert parallelism: `ep_dispatch` / `ep_combine` across the devices of an expert mesh axis, with token
de-duplication, for use INSIDE `jax.shard_map` (issue 9).

Setting: R ranks along `axis_name` (several devices per process is fine), experts sharded contiguously
(rank r owns experts [r*E/R, (r+1)*E/R)), tokens sharded (each rank has its own T tokens and their
[T, k] expert choices). Per rank:

  rows, group_sizes, routing = ep_dispatch(x[T,D], expert_ids[T,k], E, axis_name="ep")
  out = grouped_matmul(rows, w_local[E/R, D, F], group_sizes) ...          # this rank's experts
  y[T,D'] = ep_combine(out, routing, weights[T,k])

Algorithm (de-duplicated, DeepEP-style; XLA collectives fed by the single-device permute kernels):

  dispatch  1. source: each token goes ONCE to each rank owning >= 1 of its k experts (not once per
               (token, expert) pair). `moe_dispatch`'s row-gather kernel packs the send buffer, grouped by
               destination rank in token order, together with each row's local expert ids [., k] (int8
               while E/R <= 127; -1 = that choice lives on another rank).
            2. exchange: the per-destination row counts (an `all_gather` of [R] int32: every rank learns
               the [R, R] count matrix, from which all offsets follow), then the rows and their ids.
            3. expert rank: `moe_dispatch` expands the received tokens to their local experts: rows sorted
               by local expert, stable in (source rank, token) = global token order, so rank r's rows of
               its expert e are exactly the single-device `moe_dispatch` rows of expert r*E/R + e
               (`capacity` / `align` keep their `moe_dispatch` meaning and give the same drops).
  combine   1. forward exchange of the received tokens' gate weights ([., k] float32),
            2. expert rank: `moe_combine` reduces each received token's local expert rows with their gate
               weights (float32 accumulation) into ONE partial row per (token, rank),
            3. reverse exchange of the partials, 4. source: y[t] = sum of its partials (float32).
  Partials travel in the rows' dtype (bf16 on the wire, as DeepEP) unless `partial_dtype=jnp.float32`.

Autodiff: every piece is linear in the data with an explicit adjoint: the exchange is a `custom_vjp` whose
backward is the reverse exchange; the source pack is `moe_dispatch`'s row gather (backward: per-token sum
over ranks); the expansion likewise (backward: the un-expand sum); the expert-side reduction is
`moe_combine` (backward: its fused w*dy dispatch + dweights); the source sum's backward is a gather. So
dispatch's backward = reverse exchange + un-expand sum, combine's backward = forward exchange, and
`weights` get gradients. `EpRouting` is a pytree of int32 arrays + static fields: no side effects; valid
under `jax.jit` and `jax.checkpoint` (tests/test_ep.py differentiates through a checkpointed layer).

shard_map: works with the default `check_vma=True` and with `check_vma=False` (as MaxText uses). FFI calls
type their results without shard_map's varying manual axes; `ops._common.on_platforms` casts them to vary
over the axes their operands vary over, so the platform branches agree.

Transports (static `transport=`):
  "all_to_all"  `jax.lax.all_to_all` over a *slotted* layout (slot d = rows [d*S, (d+1)*S), S = T for
                ours, T*k for the baseline): runs on every backend, CPU included, but moves every slot
                used or not: (R-1)*S rows per rank per exchange, whatever the routing.
  "ragged"      `jax.lax.ragged_all_to_all` over a *compact* layout (groups back to back): moves only the
                used rows. XLA supports it on GPU and TPU, NOT on CPU (jaxlib 0.10.2: "HLO opcode
                ragged-all-to-all is not supported by XLA:CPU ThunkEmitter").
  "auto"        (default) "all_to_all" when `jax.default_backend()` is "cpu", else "ragged" -- decided at
                trace time (the two use different buffer shapes); pass a transport explicitly for a
                program lowered for another platform than the default backend's.
  "ragged_emulated"  the documented `ragged_all_to_all` contract (offsets, sizes, untouched output rows)
                written with `all_to_all` + gathers/scatters, over the compact layout: tests the ragged
                path's offsets and sizes on CPU.

Memory per rank (dtype bytes b; defaults are the dropless worst case, never dropping):
  ours      send: R*T rows (all_to_all) | T*min(R,k) rows (ragged); receive: R*T rows (`max_recv_tokens`
            bounds it with the ragged transport; all_to_all keeps R*T slots but drops alike); expanded
            rows M = R*T*k (`max_rows` bounds it); k ids (int8 while E/R <= 127), k float32 weights a row.
  baseline  send: R*T*k rows (all_to_all) | T*k (ragged); receive = expanded rows = R*T*k (`max_rows`).
  deepseek-v3 EP8, bf16 (T=4096, D=7168, k=8): a row is 14 KiB; R*T rows = 470 MB; R*T*k rows = 3.76 GB.
  The bounds drop what does not fit, in arrival order ((source rank, token) = global token order): tokens
  past `max_recv_tokens`, (token, expert) pairs past `max_rows`; a dropped pair contributes 0 to y.

Bytes on the wire per rank, to other ranks (`ep_wire_bytes`), ragged transport:
  ours      dispatch n_out*(D*b + k*i)          combine n_back*D*b_partial + n_out*4k
  baseline  dispatch p_out*(D*b + i)            combine p_back*D*b
(i = bytes of a local expert id: 1 while E/R <= 127; 4k = the float32 gate weights sent for combine).
  all_to_all moves (R-1)*S rows per exchange whatever the routing.
n = de-duplicated (token, rank) rows, p = (token, expert) pairs. Uniform top-8 of 256 experts on 8 ranks:
a token reaches 8*(1 - C(224,8)/C(256,8)) = 5.29 ranks on average instead of 8 pair copies: n/p = 0.66.
"""
from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from jax_moe_ffi.ops import _common as c
from jax_moe_ffi.ops.dispatch import (MoeRouting, _check_ids, _combine, _combine_sum,
                                      _dispatch_rows, _routing_cotangent, _static_int, moe_routing)

TRANSPORTS = ("auto", "all_to_all", "ragged", "ragged_emulated")
_INT32_MAX = 2**31 - 1
# rows of EpRouting.plan ([6, R] int32), for this rank:
SEND_OFF, SEND_SIZE, OUT_OFF, RECV_OFF, RECV_SIZE, BACK_OFF = range(6)


# ----------------------------------------------------------------------------------------- routing
@dataclasses.dataclass(frozen=True)
class EpRouting:
    """Where each token went, both sides of the exchange. A pytree: int32 arrays + static fields.

    send:  `MoeRouting` of the source side over the send buffer: `send.pos[T, c]` is the send-buffer row of
           choice c (c = destination rank for ours, c = expert choice for the baseline), -1 if not sent.
    local: `MoeRouting` of the expert side, received rows -> expanded local rows: `local.group_sizes` feed
           grouped_matmul, `local.counts` are the true per-local-expert counts.
    plan:  [6, R] int32 exchange plan of this rank: send offsets, send sizes, where each sent slice lands
           on its destination, receive offsets, receive sizes, where each returned slice lands on its
           source (rows SEND_OFF, SEND_SIZE, OUT_OFF, RECV_OFF, RECV_SIZE, BACK_OFF). Sizes are the rows
           that actually travel (after the `max_recv_tokens` / `max_rows` bound).
    axis_name, transport ("all_to_all" | "ragged" | "ragged_emulated", resolved): static;
    kind: static, "dedup" (ep_dispatch) or "pairs" (ep_dispatch_baseline).
    """
    send: MoeRouting
    local: MoeRouting
    plan: jax.Array
    axis_name: object = "ep"
    transport: str = "all_to_all"
    kind: str = "dedup"

    @property
    def num_ranks(self) -> int:
        return self.plan.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.send.num_tokens

    @property
    def group_sizes(self) -> jax.Array:
        return self.local.group_sizes

    @property
    def counts(self) -> jax.Array:
        return self.local.counts

    @property
    def send_counts(self) -> jax.Array:
        """[R] rows this rank sends to each rank (its own included)."""
        return self.plan[SEND_SIZE]

    @property
    def recv_counts(self) -> jax.Array:
        """[R] rows this rank receives from each rank (its own included)."""
        return self.plan[RECV_SIZE]


jax.tree_util.register_dataclass(EpRouting, data_fields=["send", "local", "plan"],
                                 meta_fields=["axis_name", "transport", "kind"])


def resolve_transport(transport: str) -> str:
    """"auto" -> "all_to_all" on CPU (no ragged-all-to-all in XLA:CPU), "ragged" elsewhere."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport == "auto":
        return "all_to_all" if jax.default_backend() == "cpu" else "ragged"
    return transport


# -------------------------------------------------------------------------------------- exchange
def _plan_args(plan, reverse: bool):
    """(input_offsets, send_sizes, output_offsets, recv_sizes) of ragged_all_to_all, either direction."""
    if reverse:
        return plan[RECV_OFF], plan[RECV_SIZE], plan[BACK_OFF], plan[SEND_SIZE]
    return plan[SEND_OFF], plan[SEND_SIZE], plan[OUT_OFF], plan[RECV_SIZE]


def _exchange_raw(buf, plan, axis_name, transport: str, reverse: bool, out_rows: int, fill):
    """Moves rows of buf [N, ...] to the other ranks by the plan; returns [out_rows, ...].

    all_to_all: slotted layout, N = out_rows = R*S, slot d goes to rank d whole (rows past the sizes
    travel too: the sender keeps them zero / -1). ragged(_emulated): only the planned slices move; the
    other output rows are `fill`."""
    in_off, send_sz, out_off, recv_sz = _plan_args(plan, reverse)
    tail = buf.shape[1:]
    if transport == "all_to_all":
        assert buf.shape[0] == out_rows, (buf.shape, out_rows)
        return jax.lax.all_to_all(buf, axis_name, 0, 0, tiled=True)
    out = jax.lax.full_like(buf, fill, shape=(out_rows,) + tail)  # keeps buf's varying-axes type
    if transport == "ragged":
        return jax.lax.ragged_all_to_all(buf, out, in_off, send_sz, out_off, recv_sz, axis_name=axis_name)
    # ragged_emulated: ragged_all_to_all's documented semantics, sender and receiver side.
    n = buf.shape[0]
    i = jnp.arange(n, dtype=jnp.int32)
    ok = i[None, :] < send_sz[:, None]  # [R, N]
    src = jnp.clip(in_off[:, None] + i[None, :], 0, max(n - 1, 0))
    blocks = jnp.where(ok.reshape(ok.shape + (1,) * len(tail)), buf[src], jnp.asarray(fill, buf.dtype))
    got = jax.lax.all_to_all(blocks, axis_name, 0, 0, tiled=True)  # [R(source), N, ...]
    off = jax.lax.all_to_all(out_off, axis_name, 0, 0, tiled=True)  # where each source writes here
    dst = jnp.where(i[None, :] < recv_sz[:, None], off[:, None] + i[None, :], out_rows)
    return out.at[dst.reshape(-1)].set(got.reshape((-1,) + tail), mode="drop")


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _exchange(buf, plan, axis_name, transport, reverse, out_rows):
    """Differentiable exchange of float rows; its adjoint is the exchange in the other direction."""
    return _exchange_raw(buf, plan, axis_name, transport, reverse, out_rows, 0)


def _exchange_fwd(buf, plan, axis_name, transport, reverse, out_rows):
    # the input row count rides along as the shape of an empty residual (residuals must be arrays)
    return (_exchange(buf, plan, axis_name, transport, reverse, out_rows),
            (plan, jnp.zeros((buf.shape[0], 0), jnp.int8)))


def _exchange_bwd(axis_name, transport, reverse, out_rows, res, g):
    plan, shape_of_input = res
    dbuf = _exchange(g, plan, axis_name, transport, not reverse, shape_of_input.shape[0])
    return dbuf, c.float0_zeros(plan)


_exchange.defvjp(_exchange_fwd, _exchange_bwd)


# ---------------------------------------------------------------------------------------- planning
def _excl_cumsum(v, axis=0):
    return jnp.cumsum(v, axis=axis) - v


def _send_side(dest, num_ranks: int, axis_name, transport: str, slot: int, send_rows: int, recv_rows: int):
    """Source routing + exchange plan.

    dest[T, c] int32: destination rank of choice c of each token (-1: not sent). Rank d's choices are
    packed in flat (token, choice) order at send_off[d]: d*slot (slotted, all_to_all) or the exclusive
    prefix sum of the counts (compact, ragged). The receive buffer holds `recv_rows` rows; with the
    compact layout, sizes are clamped so that nothing lands past it (the tail is dropped)."""
    t, kk = dest.shape
    p = t * kk
    flat = dest.reshape(p)
    valid = (flat >= 0) & (flat < num_ranks)
    ranks = jnp.arange(num_ranks, dtype=jnp.int32)
    onehot = ((flat[:, None] == ranks[None, :]) & valid[:, None]).astype(jnp.int32)  # [P, R]
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)
    counts = jnp.sum(onehot, axis=0).astype(jnp.int32)
    cm = jax.lax.all_gather(counts, axis_name)  # [R(source), R(destination)]: the whole count matrix
    me = jax.lax.axis_index(axis_name).astype(jnp.int32)
    recv_counts = cm[:, me]
    if transport == "all_to_all":
        send_off = ranks * slot
        out_off = jnp.broadcast_to(me * slot, (num_ranks,))
        recv_off = ranks * slot
        back_off = out_off
        send_sz, recv_sz = counts, recv_counts
    else:
        send_off = _excl_cumsum(counts)
        out_off = _excl_cumsum(cm, axis=0)[me]  # sum over earlier sources of their rows to each destination
        recv_off = _excl_cumsum(recv_counts)
        back_off = _excl_cumsum(cm, axis=1)[:, me]  # where each source packed its rows for me
        # static receive bound: slices (or their tails) past recv_rows are not sent (both sides agree)
        send_sz = jnp.clip(recv_rows - out_off, 0, counts)
        recv_sz = jnp.clip(recv_rows - recv_off, 0, recv_counts)
    plan = jnp.stack([send_off, send_sz, out_off, recv_off, recv_sz, back_off]).astype(jnp.int32)
    pos = jnp.where(valid, send_off[jnp.clip(flat, 0, num_ranks - 1)] + position, -1).astype(jnp.int32)
    row_pair = jnp.full((send_rows,), -1, jnp.int32).at[jnp.where(valid, pos, send_rows)].set(
        jnp.arange(p, dtype=jnp.int32), mode="drop")
    send = MoeRouting(pos=pos.reshape(t, kk), row_pair=row_pair, counts=counts, group_sizes=counts)
    return send, plan


def _mask_slotted_tail(meta_recv, plan, slot: int, bound: int | None):
    """all_to_all path: drop received rows whose compact arrival position is >= bound (the same rows the
    ragged path does not send), so both transports drop alike."""
    if bound is None:
        return meta_recv
    r = plan.shape[1]
    compact_off = _excl_cumsum(plan[RECV_SIZE])  # arrival position of each source's first row
    i = jnp.arange(r * slot, dtype=jnp.int32)
    arrival = compact_off[i // slot] + i % slot
    return jnp.where((arrival < bound)[:, None], meta_recv, -1)


def _local_routing(meta_recv, e_loc: int, capacity, align: int, max_rows: int | None) -> MoeRouting:
    """Expansion of the received rows to local experts; `max_rows` keeps the first max_rows pairs in
    arrival order and bounds the expanded rows (the routing's row_pair is cut to that size)."""
    if max_rows is None:
        return moe_routing(meta_recv, e_loc, capacity=capacity, align=align)
    valid = (meta_recv >= 0) & (meta_recv < e_loc)
    run = jnp.cumsum(valid.reshape(-1).astype(jnp.int32)).reshape(valid.shape)
    keep = valid & (run <= max_rows)
    full = moe_routing(meta_recv, e_loc, keep=keep, align=align)
    m = min(full.num_rows, max_rows + min(e_loc, max_rows) * (align - 1))
    # every kept pair's row is < its padded total <= m: the rows past m are padding only
    return MoeRouting(pos=full.pos, row_pair=full.row_pair[:m], counts=full.counts,
                      group_sizes=full.group_sizes)


def _id_dtype(e_loc: int):
    """The narrowest signed integer holding local expert ids and -1 (the ids' bytes on the wire)."""
    return jnp.int8 if e_loc <= 127 else jnp.int16 if e_loc <= 32767 else jnp.int32


def _check_inputs(op, x, expert_ids, num_experts, axis_name, transport, align, capacity, bounds):
    if axis_name is None:
        raise ValueError(f"{op}: `axis_name` (the expert mesh axis of the enclosing shard_map) is required")
    if transport not in TRANSPORTS:
        raise ValueError(f"{op}: `transport` must be one of {TRANSPORTS}, got {transport!r}")
    x, expert_ids = c.check_tokens_and_ids(op, x, expert_ids)
    if expert_ids.shape[1] < 1:
        raise ValueError(f"{op}: `expert_ids` must have k >= 1 choices per token, got {tuple(expert_ids.shape)}")
    num_experts = _static_int(op, "num_experts", num_experts, 1)
    align = _static_int(op, "align", align, 1)
    if capacity is not None:
        capacity = _static_int(op, "capacity", capacity, 0)
    bounds = {k: None if v is None else _static_int(op, k, v, 1) for k, v in bounds.items()}
    if capacity is not None and bounds.get("max_rows") is not None:
        raise ValueError(f"{op}: give either `capacity` or `max_rows`, not both")
    r = jax.lax.axis_size(axis_name)
    if num_experts % r:
        raise ValueError(f"{op}: num_experts={num_experts} must be a multiple of the {r} ranks of axis "
                         f"{axis_name!r} (experts are sharded contiguously)")
    ids = _check_ids(op, expert_ids, num_experts)
    ids = jnp.where((ids >= 0) & (ids < num_experts), ids, -1)
    t, k = ids.shape
    if r * t * k > _INT32_MAX:
        raise ValueError(f"{op}: {r}*{t}*{k} received pairs do not fit int32 indices")
    return x, ids, num_experts, align, capacity, r, resolve_transport(transport), bounds


# -------------------------------------------------------------------------------------- public API
def ep_dispatch(x, expert_ids, num_experts: int, *, axis_name, capacity: int | None = None, align: int = 1,
                transport: str = "auto", max_recv_tokens: int | None = None, max_rows: int | None = None):
    """De-duplicated expert-parallel dispatch; call inside `shard_map` over the expert axis `axis_name`.

    Args:
      x: [T, D] float32/bfloat16/float16, this rank's tokens.
      expert_ids: [T, k] integer global expert ids in [0, num_experts); others are dropped.
      num_experts: E (static), a multiple of the axis size R; rank r owns experts [r*E/R, (r+1)*E/R).
      axis_name: the expert mesh axis (str or tuple of axis names).
      capacity, align: as in `moe_dispatch`, per local expert, over the received (token, expert) pairs in
        global token order (the same drops as single-device `moe_dispatch(capacity=...)`).
      transport: "auto" | "all_to_all" | "ragged" | "ragged_emulated" (module docstring).
      max_recv_tokens: static bound of the tokens received per rank (default R*T, never drops).
      max_rows: static bound of the expanded rows (default R*T*k, never drops; not with `capacity`).
    Returns:
      rows [M, D]: the (token, local expert) copies that arrived here, sorted by local expert, stable in
        global token order (M = R*T*k, or the bound; rows past the total are zero);
      group_sizes [E/R] int32 for `grouped_matmul` against this rank's expert weights;
      routing: `EpRouting`, for `ep_combine`.
    """
    op = "ep_dispatch"
    x, ids, e, align, capacity, r, transport, bounds = _check_inputs(
        op, x, expert_ids, num_experts, axis_name, transport, align, capacity,
        {"max_recv_tokens": max_recv_tokens, "max_rows": max_rows})
    t, k = ids.shape
    e_loc = e // r
    ranks = jnp.arange(r, dtype=jnp.int32)
    dest_pair = jnp.where(ids >= 0, ids // e_loc, -1)  # [T, k] rank of each choice
    on_rank = dest_pair[:, None, :] == ranks[None, :, None]  # [T, R, k]
    need = jnp.any(on_rank, axis=2)  # [T, R]: the token goes once to each rank owning one of its experts
    slotted = transport == "all_to_all"
    send_rows = r * t if slotted else t * min(r, k)
    recv_rows = r * t if slotted else min(r * t, bounds["max_recv_tokens"] or r * t)
    send, plan = _send_side(jnp.where(need, ranks[None, :], -1), r, axis_name, transport, t, send_rows, recv_rows)
    # local expert ids of each sent row on its destination (-1: that choice lives elsewhere)
    local_ids = jnp.where(on_rank, ids[:, None, :] - ranks[None, :, None] * e_loc, -1).reshape(t * r, k)
    rp = send.row_pair
    meta = jnp.where((rp >= 0)[:, None], local_ids[jnp.maximum(rp, 0)], -1).astype(_id_dtype(e_loc))  # [send_rows, k]

    buf = _dispatch_rows(x, send)  # [send_rows, D] packed per destination (unused rows zero)
    recv = _exchange(buf, plan, axis_name, transport, False, recv_rows)
    meta_recv = _exchange_raw(meta, plan, axis_name, transport, False, recv_rows, -1)
    if slotted:
        meta_recv = _mask_slotted_tail(meta_recv, plan, t, bounds["max_recv_tokens"])
    local = _local_routing(meta_recv, e_loc, capacity, align, bounds["max_rows"])
    rows = _dispatch_rows(recv, local)
    routing = EpRouting(send=send, local=local, plan=plan, axis_name=axis_name, transport=transport, kind="dedup")
    return rows, local.group_sizes, routing


def ep_dispatch_baseline(x, expert_ids, num_experts: int, *, axis_name, capacity: int | None = None,
                         align: int = 1, transport: str = "auto", max_rows: int | None = None):
    """MaxText-style expert-parallel dispatch: every (token, expert) pair is sent (k copies of a token whose
    k experts live on one rank), then sorted by local expert on arrival. Same outputs and contract as
    `ep_dispatch` (the rows are identical), more bytes. `ep_combine` brings each pair's output back and
    applies the gate weights at the source, as MaxText does. `max_rows` bounds the pairs received (the
    receive buffer and the expanded rows; default R*T*k, never drops). The benchmark's
    `ragged_all_to_all` baseline and a cross-check of `ep_dispatch`."""
    op = "ep_dispatch_baseline"
    x, ids, e, align, capacity, r, transport, bounds = _check_inputs(
        op, x, expert_ids, num_experts, axis_name, transport, align, capacity, {"max_rows": max_rows})
    t, k = ids.shape
    e_loc = e // r
    slotted = transport == "all_to_all"
    slot = t * k
    send_rows = r * slot if slotted else slot
    recv_rows = r * slot if slotted else min(r * slot, bounds["max_rows"] or r * slot)
    send, plan = _send_side(jnp.where(ids >= 0, ids // e_loc, -1), r, axis_name, transport, slot, send_rows,
                            recv_rows)
    rp = send.row_pair
    local_id = jnp.where(ids >= 0, ids % e_loc, -1).reshape(-1)
    meta = jnp.where(rp >= 0, local_id[jnp.maximum(rp, 0)], -1)[:, None].astype(_id_dtype(e_loc))  # [send_rows, 1]
    buf = _dispatch_rows(x, send)  # one copy per pair
    recv = _exchange(buf, plan, axis_name, transport, False, recv_rows)
    meta_recv = _exchange_raw(meta, plan, axis_name, transport, False, recv_rows, -1)
    if slotted:
        meta_recv = _mask_slotted_tail(meta_recv, plan, slot, bounds["max_rows"])
    local = _local_routing(meta_recv, e_loc, capacity, align, bounds["max_rows"])
    rows = _dispatch_rows(recv, local)
    routing = EpRouting(send=send, local=local, plan=plan, axis_name=axis_name, transport=transport, kind="pairs")
    return rows, local.group_sizes, routing


def ep_combine(rows, routing: EpRouting, weights, *, axis_name=None, partial_dtype=None):
    """y[t] = sum_j weights[t, j] * (output row of pair (t, j)), over the pairs the dispatch kept.

    De-duplicated routing: each expert rank reduces a token's local expert rows with their gate weights
    (float32 accumulation) into one partial row, which alone travels back; the source sums its partials
    (float32). `partial_dtype=jnp.float32` sends the partials in float32 (default: the rows' dtype).
    Baseline routing: each pair's row travels back; the source applies the weights (float32).
    Returns [T, D'] in the rows' dtype. Call inside the same shard_map as the dispatch.
    """
    op = "ep_combine"
    if not isinstance(routing, EpRouting):
        raise TypeError(f"{op}: `routing` must be the EpRouting returned by ep_dispatch, got {type(routing).__name__}")
    if axis_name is not None and axis_name != routing.axis_name:
        raise ValueError(f"{op}: axis_name={axis_name!r} differs from the dispatch's {routing.axis_name!r}")
    rows = jnp.asarray(rows)
    weights = jnp.asarray(weights)
    c.check_rank(op, "rows", rows, 2, "[M, D]")
    c.check_float(op, "rows", rows)
    c.check_rank(op, "weights", weights, 2, "[T, k]")
    c.check_float(op, "weights", weights)
    if rows.shape[0] != routing.local.num_rows:
        raise ValueError(f"{op}: `rows` {tuple(rows.shape)} must have the dispatch's M = {routing.local.num_rows} rows")
    t = routing.num_tokens
    k = routing.local.top_k if routing.kind == "dedup" else routing.send.top_k
    if weights.shape != (t, k):
        raise ValueError(f"{op}: `weights` {tuple(weights.shape)} must be [T, k] = {(t, k)}")
    w = weights.astype(jnp.float32)
    ax, tr, plan = routing.axis_name, routing.transport, routing.plan
    send_rows, recv_rows = routing.send.num_rows, routing.local.num_tokens
    if routing.kind == "pairs":
        back_local = _combine_sum(rows, routing.local)  # un-sort: one row per received pair
        back = _exchange(back_local, plan, ax, tr, True, send_rows)
        return _combine(back, routing.send, w)  # weights at the source, float32 accumulation
    w_recv = _exchange(_dispatch_rows(w, routing.send), plan, ax, tr, False, recv_rows)  # [recv, k]
    src = rows if partial_dtype is None else rows.astype(partial_dtype)
    partial_rows = _combine(src, routing.local, w_recv)  # one partial per received (token, rank)
    back = _exchange(partial_rows, plan, ax, tr, True, send_rows)
    return _combine_sum(back, routing.send).astype(rows.dtype)


def ep_wire_bytes(routing: EpRouting, hidden: int, dtype, *, partial_dtype=None) -> dict:
    """What this rank puts on the wire to OTHER ranks (call inside the shard_map).

    dispatch / combine: float32 scalars, bytes of payload + metadata the routing's transport moves
      (all_to_all: whole slots, a static number; ragged: the used rows);
    dispatch_ragged / combine_ragged: the same with a ragged transport (only the used rows);
    dispatch_rows / combine_rows: int32, rows sent to other ranks in each pass (used rows).
    """
    me = jax.lax.axis_index(routing.axis_name)
    r = routing.num_ranks
    b = jnp.dtype(dtype).itemsize
    bp = jnp.dtype(partial_dtype or dtype).itemsize
    out_rows = jnp.sum(routing.send_counts) - routing.send_counts[me]
    back_rows = jnp.sum(routing.recv_counts) - routing.recv_counts[me]
    f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    idb = jnp.dtype(_id_dtype(routing.local.num_experts)).itemsize
    if routing.kind == "dedup":
        k = routing.local.top_k
        row_d, row_c, meta_d, meta_c = hidden * b, hidden * bp, idb * k, 4 * k  # ids out; f32 weights out
        disp = f(out_rows) * (row_d + meta_d)
        comb = f(back_rows) * row_c + f(out_rows) * meta_c
    else:
        row_d, row_c, meta_d, meta_c = hidden * b, hidden * b, idb, 0
        disp = f(out_rows) * (row_d + meta_d)
        comb = f(back_rows) * row_c
    out = {"dispatch_ragged": disp, "combine_ragged": comb, "dispatch_rows": out_rows, "combine_rows": back_rows}
    if routing.transport == "all_to_all":
        slot = routing.send.num_rows // r
        out["dispatch"] = f((r - 1) * slot * (row_d + meta_d))
        out["combine"] = f((r - 1) * slot * (row_c + meta_c))
    else:
        out["dispatch"], out["combine"] = disp, comb
    return out
