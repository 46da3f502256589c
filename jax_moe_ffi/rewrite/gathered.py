"""Family (6): expert weights gathered per (token, choice) -- `w[ids]`, `jnp.take(w, ids, axis=0)` -- and
contracted with each row's activations (EasyDeL's DENSE_MOE path, many hand-written layers):

    y[b..., n] = sum_c x[b..., c] * w[ids[b...], c, n]          (w [E, K, N], or [E, N, K] contracted last)

Every (token, choice) row already meets only its own expert's weights, so no sparsity proof is needed: the
dot is a grouped matmul of the rows sorted by expert. The pass swaps it for moe_dispatch (rows sorted by the
ids) -> grouped_matmul(rows, w) -> un-sort, and never makes the naive form's [tokens, k, K, N] copy of the
weights (k weight matrices per token); the weight gradient is the grouped wgrad instead of a scatter-add of that
copy. Exact up to float32 accumulation order. The ids must be router-derived and provably inside [0, E) --
or the gather clamps them (mode clip, forward and gradient), which the swap does too; other gathers of ids not
proven in range stay as written, with the reason.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jax_moe_ffi.rewrite import facts as F
from jax_moe_ffi.rewrite.ir import Lit, Var

FAMILY = "gathered"
FLOAT = (np.dtype(np.float32), np.dtype("bfloat16"), np.dtype(np.float16))


@dataclasses.dataclass
class GatheredDot:
    eqn: object          # the dot_general
    gather: object       # the gather of the weights
    w: Var               # [E, K, N] (transpose_rhs: [E, N, K])
    idx: Var             # the gather's indices [*B, 1]
    ids: Var             # the [*B] ids they were made from (jnp's index normalisation and unit axis removed,
                         # where that is the identity): gathers of several weights by one ids share one routing
    x: object            # the other operand (activations)
    x_b: list            # the B axes x carries (batch or contracted dimensions of the dot), in B order
    x_axes: list         # x's axis for each of them; x's contracted feature axis is x_k
    x_k: int
    summed: list         # B axes the dot contracts (e.g. the choices summed inside the einsum)
    transpose_rhs: bool
    dtype: object        # the GEMM's operand dtype (the output dtype where x and w differ, as XLA converts them)
    out_perm: tuple      # [*(B axes not summed), N] -> the dot's output order
    clip: bool           # clamp ids into [0, E) (a gather in clip mode, whose gradient clamps them too)
    pet: object          # preferred element type for grouped_matmul (None: the input dtype)

    @property
    def B(self):
        return tuple(self.idx.shape[:-1])

    @property
    def rows(self):
        return int(np.prod(self.B, dtype=np.int64))

    def requires(self):
        return [v for v in (self.x, self.w, self.ids) if isinstance(v, Var)]

    def flops(self):
        k = self.w.shape[2] if self.transpose_rhs else self.w.shape[1]
        n = self.w.shape[1] if self.transpose_rhs else self.w.shape[2]
        return 2 * self.rows * k * n, k, n


def _weight_gather(q, nb):
    """Whether gather `q` takes whole [K, N] slices of its operand along axis 0, one per index (jnp.take /
    w[ids] on [E, K, N] weights), with the batch axes first."""
    w = q.ins[0]
    dn = q.params["dimension_numbers"]
    return (w.ndim == 3 and tuple(dn.collapsed_slice_dims) == (0,) and tuple(dn.start_index_map) == (0,)
            and tuple(getattr(dn, "operand_batching_dims", ())) == () and tuple(dn.offset_dims) == (nb, nb + 1)
            and tuple(q.params["slice_sizes"]) == (1,) + tuple(w.shape[1:]) and q.ins[1].shape[-1] == 1)


def int_range(v, prog, depth=0):
    """(lo, hi) bounds of an integer array's values, or None when not known: top-k indices and iota, through
    layout ops, casts, literal shifts / clamps, and jnp's negative-index normalisation
    `select_n(i < 0, i, i + n)`."""
    if isinstance(v, Lit):
        s = v.scalar()
        return None if s is None else (int(s), int(s))
    if depth > 40 or not np.issubdtype(np.dtype(v.dtype), np.integer):
        return None
    e = prog.producer.get(v)
    if e is None:
        return None
    if F.is_topk_indices(v, prog):
        return 0, F.topk_info(v, prog)[0] - 1
    if e.name == "iota":
        return 0, e.params["shape"][e.params["dimension"]] - 1
    if e.name in ("reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose", "slice", "copy", "copy_p",
                  "dynamic_slice", "reduce_max", "reduce_min", "alias"):
        return int_range(e.ins[0], prog, depth + 1)
    if e.name == "convert_element_type":
        r = int_range(e.ins[0], prog, depth + 1)
        info = np.iinfo(np.dtype(v.dtype))
        return r if r is not None and info.min <= r[0] and r[1] <= info.max else None
    if e.name == "concatenate":
        rs = [int_range(a, prog, depth + 1) for a in e.ins]
        return None if None in rs else (min(r[0] for r in rs), max(r[1] for r in rs))
    if e.name in ("add", "sub", "max", "min", "clamp"):
        rs = [int_range(a, prog, depth + 1) for a in e.ins]
        if None in rs:
            return None
        if e.name == "add":
            return rs[0][0] + rs[1][0], rs[0][1] + rs[1][1]
        if e.name == "sub":
            return rs[0][0] - rs[1][1], rs[0][1] - rs[1][0]
        if e.name == "max":
            return max(rs[0][0], rs[1][0]), max(rs[0][1], rs[1][1])
        if e.name == "min":
            return min(rs[0][0], rs[1][0]), min(rs[0][1], rs[1][1])
        lo, x, hi = rs  # clamp(lo, x, hi) = min(max(x, lo), hi), monotone in each operand
        return min(max(x[0], lo[0]), hi[0]), min(max(x[1], lo[1]), hi[1])
    if e.name == "select_n":
        return _select_range(e, prog, depth)
    return None


def _select_range(e, prog, depth):
    """select_n's range: the union of its cases', refined for `select_n(i < 0, i, i + n)`."""
    pred, cases = e.ins[0], e.ins[1:]
    p = prog.producer.get(pred) if isinstance(pred, Var) else None
    if len(cases) == 2 and p is not None and p.name == "lt" and isinstance(p.ins[1], Lit) \
            and p.ins[1].scalar() == 0 and p.ins[0] is cases[0]:
        i = cases[0]
        a = prog.producer.get(cases[1]) if isinstance(cases[1], Var) else None
        r = int_range(i, prog, depth + 1)
        if r is not None and a is not None and a.name == "add" and a.ins[0] is i and isinstance(a.ins[1], Lit) \
                and a.ins[1].scalar() is not None:
            n = int(a.ins[1].scalar())
            parts = ([(max(r[0], 0), r[1])] if r[1] >= 0 else []) + \
                    ([(r[0] + n, min(r[1], -1) + n)] if r[0] < 0 else [])
            return min(q[0] for q in parts), max(q[1] for q in parts)
    rs = [int_range(c, prog, depth + 1) for c in cases]
    return None if None in rs else (min(r[0] for r in rs), max(r[1] for r in rs))


def _source_ids(idx, E, prog):
    """The [*B] array the gather's [*B, 1] indices were made from: through the unit index axis
    (broadcast_in_dim / reshape) and `select_n(i < 0, i, i + E)` where i is proven inside [0, E); else None."""
    q = prog.producer.get(idx)
    if q is None or q.name not in ("broadcast_in_dim", "reshape") or not isinstance(q.ins[0], Var) \
            or tuple(q.ins[0].shape) != tuple(idx.shape[:-1]):
        return None
    v = q.ins[0]
    s = prog.producer.get(v)
    if s is not None and s.name == "select_n" and len(s.ins) == 3 and isinstance(s.ins[1], Var):
        r = int_range(s.ins[1], prog)
        if r is not None and 0 <= r[0] and r[1] < E and _select_range(s, prog, 0) == r:
            v = s.ins[1]
    return v


def classify(e, prog, from_router, experts):
    """(GatheredDot, None, gather) for a dot_general of gathered expert weights the swap takes; (None, reason,
    gather) for one it does not; None when `e` is not of this form at all."""
    if e.name != "dot_general":
        return None
    for side in (0, 1):
        g = e.ins[side]
        q = prog.producer.get(g) if isinstance(g, Var) else None
        if q is None or q.name != "gather" or q.ins[0].ndim != 3 or q.ins[0].shape[0] not in experts \
                or not from_router(q.ins[1]):
            continue
        nb = q.ins[1].ndim - 1
        if not _weight_gather(q, nb):
            return None, ("expert weights gathered per (token, choice) with a gather that is not whole [K, N] "
                          "slices along the expert axis: not rewritten"), q
        return _classify_dot(e, side, q, nb, prog) + (q,)
    return None


def _classify_dot(e, side, q, nb, prog):
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    gc, xc = (lc, rc) if side == 0 else (rc, lc)
    gb, xb = (lb, rb) if side == 0 else (rb, lb)
    x = e.ins[1 - side]
    w = q.ins[0]
    E = w.shape[0]
    head = "expert weights gathered per (token, choice), not rewritten: "
    feat = [(g, c) for g, c in zip(gc, xc) if g >= nb]
    if len(feat) != 1:
        return None, head + "the dot does not contract exactly one axis of each expert's weight matrix"
    if any(b >= nb for b in gb):
        return None, head + "a weight axis is a batch dimension of the dot"
    x_free = set(range(x.ndim)) - set(xb) - set(xc)
    if x_free:
        return None, head + "the activations have axes of their own (not one row per (token, choice))"
    dt = np.dtype(w.dtype)
    if dt not in FLOAT or np.dtype(x.dtype) not in FLOAT:
        return None, head + f"operands must be float (f32/bf16/f16), got {x.dtype} and {w.dtype}"
    out_dt = np.dtype(e.outs[0].dtype)
    if out_dt not in FLOAT:
        return None, head + f"output dtype {out_dt} is not a float type (f32/bf16/f16)"
    if np.dtype(x.dtype) != dt:  # mixed operands: XLA converts both to the output dtype; so does the swap
        dt = out_dt
    mode = getattr(q.params.get("mode"), "name", str(q.params.get("mode")))
    r = int_range(q.ins[1], prog)
    in_range = r is not None and r[0] >= 0 and r[1] < E
    if not in_range and mode != "CLIP":
        # (fill: NaN rows; promise_in_bounds: clamped forward but dropped from the weight gradient)
        return None, head + (f"the ids are not proven inside [0, {E}) and the gather's {mode.lower()} mode "
                             "treats out-of-range ids in a way the swap does not reproduce; ids from lax.top_k "
                             "over the experts, or jnp.take(..., mode='clip'), are")
    if int(np.prod(q.ins[1].shape[:-1], dtype=np.int64)) == 0 or 0 in w.shape:
        return None, head + "an empty operand"
    x_of_b = dict(zip(gb, xb))
    summed = sorted(g for g in gc if g < nb)
    x_of_b.update((g, c) for g, c in zip(gc, xc) if g < nb)
    present = sorted(x_of_b)
    kept = [b for b in range(nb) if b not in summed]
    free_b = [b for b in kept if b not in gb]
    out_perm = tuple(kept.index(b) for b in list(gb) + free_b) + (len(kept),)
    # float32 accumulation, rounded once to the output dtype (as XLA's dot does for a narrower output, or
    # for a sum over choices inside the dot)
    pet = None if out_dt == dt and not summed else np.dtype(np.float32)
    ids = _source_ids(q.ins[1], E, prog) if in_range else None
    return GatheredDot(eqn=e, gather=q, w=w, idx=q.ins[1], ids=ids if ids is not None else q.ins[1], x=x, x_b=present, x_axes=[x_of_b[b] for b in present],
                       x_k=feat[0][1], summed=summed, transpose_rhs=(feat[0][0] == nb + 1), dtype=dt, out_perm=out_perm,
                       clip=not in_range, pet=pet), None


class Emitter:
    """Emits the swapped dots of one program evaluation, sharing the routing of each id array and the
    dispatched rows of each (activations, ids) pair between the dots that use them; dots of one set of rows
    (e.g. an expert's gate and up projections) run as one grouped_matmuls_shared_lhs."""

    def __init__(self, dots=(), recipe=None):
        self.recipe = recipe
        self.routings = {}
        self.rows = {}
        self.done = {}  # dot Eqn -> its grouped GEMM result, computed with an earlier dot of the same rows
        self.by_rows = {}
        for g in dots:
            self.by_rows.setdefault(_rows_key(g), []).append(g)

    def _routing(self, g, read):
        from jax_moe_ffi.rewrite import emit as EM
        key = (g.ids, g.clip, g.w.shape[0])
        if key not in self.routings:
            ids = read(g.ids).reshape(g.rows, 1).astype(jnp.int32)
            if g.clip:
                ids = jnp.clip(ids, 0, g.w.shape[0] - 1)
            self.routings[key] = EM.route(ids, g.w.shape[0])[1]
        return self.routings[key]

    def _gemm(self, g, read, base):
        from jax_moe_ffi.ops.grouped_gemm import grouped_matmul, grouped_matmuls_shared_lhs
        from jax_moe_ffi.rewrite import emit as EM
        if g.eqn in self.done:
            return self.done.pop(g.eqn)
        key = _rows_key(g)
        B = g.B
        if key not in self.rows:
            x = jnp.transpose(read(g.x).astype(g.dtype), list(g.x_axes) + [g.x_k])  # [*(B axes x carries), K]
            if g.x_b == list(range(len(g.x_b))):  # x carries a prefix of B: the dispatch copies each row k times
                t = int(np.prod(B[:len(g.x_b)], dtype=np.int64))
            else:
                x = jnp.broadcast_to(jnp.expand_dims(x, [b for b in range(len(B)) if b not in g.x_b]),
                                     B + (x.shape[-1],))
                t = g.rows
            self.rows[key] = EM.dispatch_rows(x.reshape(t, x.shape[-1]), EM.regroup(base, g.rows // t))
        group = [q for q in self.by_rows.get(key, [g]) if q is g or q.eqn not in self.done]
        if len(group) == 1:
            return grouped_matmul(self.rows[key], read(g.w).astype(g.dtype), base.group_sizes,
                                  preferred_element_type=g.pet, transpose_rhs=g.transpose_rhs, recipe=self.recipe)
        ys = grouped_matmuls_shared_lhs(self.rows[key], [read(q.w).astype(q.dtype) for q in group],
                                        base.group_sizes, transpose_rhs=[q.transpose_rhs for q in group],
                                        preferred_element_type=[q.pet for q in group], recipe=self.recipe)
        for q, y in zip(group, ys):
            if q is not g:
                self.done[q.eqn] = y
        return ys[group.index(g)]

    def emit(self, g, read):
        from jax_moe_ffi.rewrite import emit as EM
        B = g.B
        base = self._routing(g, read)
        y = self._gemm(g, read, base)
        nb, s = len(B), len(g.summed)
        if g.summed == list(range(nb - s, nb)):  # the trailing axes (the choices): summed by the un-sort
            y = EM.combine(y, EM.regroup(base, int(np.prod(B[nb - s:], dtype=np.int64))), None)
        else:  # un-sorted row by row ([rows, N]: row r is (token, choice) r), then summed in float32
            y = EM.combine(y, base, None).reshape(B + (y.shape[-1],)).sum(axis=tuple(g.summed))
        kept = [n for b, n in enumerate(B) if b not in g.summed]
        return jnp.transpose(y.reshape(tuple(kept) + (y.shape[-1],)), g.out_perm).astype(g.eqn.outs[0].dtype)


def _rows_key(g):
    """Dots with one key read the same dispatched rows (activations, ids, layout, operand dtype)."""
    return (g.x, g.ids, g.clip, g.w.shape[0], tuple(g.x_axes), g.x_k, np.dtype(g.dtype))
