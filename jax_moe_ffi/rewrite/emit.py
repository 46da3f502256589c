"""Emission: dispatch the selected (token, expert) pairs, re-emit the site's region on the grouped rows
(expert dots -> `grouped_matmul`), and combine with the weights the model computed.

Two evaluations of the region share one code path (`RowEval`):
  * pair order (one row per (token, choice) pair, P = T*k): small routing tensors -- the combine weights
    w[t, j] = gate[t, I[t, j]] (or the capacity combine tensor at the pair's (expert, slot)), the capacity
    keep mask, the slot index;
  * row order (rows sorted by expert, what `moe_dispatch` returns): the dense expert compute.
Each region value becomes [rows, *feature axes]: token/expert/slot axes are fixed by the row's
coordinates; leaves are gathered by them (tokens by the dispatch, weights by `grouped_matmul`'s groups).

The dispatch/combine backend is one seam (`route`, `combine`): the FFI ops from `jax_moe_ffi.ops.dispatch`
when importable, else a pure-JAX argsort fallback (`BACKEND = "jax"` forces it).
"""
from __future__ import annotations

import math
import os

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jax_moe_ffi.rewrite import facts as F
from jax_moe_ffi.rewrite.ir import Lit, Var
from jax_moe_ffi.rewrite.match import merged_parts, others, upstream

BACKEND = "auto"  # "auto" | "ops" | "jax"


# ---------------------------------------------------------------------------- dispatch backend seam
def _ops():
    if BACKEND == "jax":
        return None
    try:
        from jax_moe_ffi.ops import dispatch as d
        d.moe_dispatch, d.moe_combine, d.moe_routing  # noqa: B018
        return d
    except Exception:  # noqa: BLE001
        if BACKEND == "ops":
            raise
        return None


def _no_units(shape):
    return tuple(n for n in shape if n != 1)


class Routing:
    def __init__(self, row_pair, group_sizes, pos, k, native=None):
        self.row_pair = row_pair
        self.group_sizes = group_sizes
        self.pos = pos
        self.k = k
        self.native = native


def route(ids, num_experts, keep=None, x=None):
    """(rows of x or None, Routing). ids [T, k] int32; keep [T, k] bool or None; x [T, D] or None."""
    d = _ops()
    if d is not None:
        if x is not None:
            rows, gs, r = d.moe_dispatch(x, ids, num_experts, keep=keep)
        else:
            rows, r = None, d.moe_routing(ids, num_experts, keep=keep)
            gs = r.group_sizes
        return rows, Routing(r.row_pair, gs, r.pos, ids.shape[1], native=r)
    t, k = ids.shape
    p = t * k
    flat = ids.reshape(-1)
    valid = (flat >= 0) & (flat < num_experts)
    if keep is not None:
        valid = valid & keep.reshape(-1)
    key = jnp.where(valid, flat, num_experts)
    order = jnp.argsort(key, stable=True).astype(jnp.int32)
    row_pair = jnp.where(valid[order], order, -1)
    gs = jnp.zeros((num_experts,), jnp.int32).at[jnp.where(valid, flat, num_experts)].add(1, mode="drop")
    pos = jnp.zeros((p,), jnp.int32).at[order].set(jnp.arange(p, dtype=jnp.int32))
    pos = jnp.where(valid, pos, -1).reshape(t, k)
    routing = Routing(row_pair, gs, pos, k)
    return (None if x is None else dispatch_rows(x, routing)), routing


def first_choices(ids, slots=None):
    """keep[t, j]: ids[t, j] differs from the token's earlier choices ids[t, :j] (ids that may repeat: a
    repeated expert is run once, with the gate the model summed over its choices); with `slots` [T, k], the
    (expert, slot) cell differs from the earlier choices' cells."""
    k = ids.shape[1]
    earlier = jnp.arange(k)[None, :] < jnp.arange(k)[:, None]  # [j, i]: i < j
    same = ids[:, :, None] == ids[:, None, :]
    if slots is not None:
        same = same & (slots[:, :, None] == slots[:, None, :])
    return ~jnp.any(same & earlier[None], axis=-1)


def regroup(routing, k):
    """The routing seen with k choices per token (pairs are flat indices t * k + j: the same rows)."""
    native = routing.native.regroup(k) if routing.native is not None else None
    return Routing(routing.row_pair, routing.group_sizes, routing.pos.reshape(-1, k), k, native=native)


def dispatch_rows(x, routing):
    """rows[r] = x[token of row r] (zero for unused rows): the dispatch of x [T, D] by an existing routing."""
    d = _ops() if routing.native is not None else None
    if d is not None and np.dtype(x.dtype) in (np.dtype(np.float32), np.dtype("bfloat16"), np.dtype(np.float16)):
        return d.moe_dispatch_rows(x, routing.native)
    src = jnp.maximum(routing.row_pair, 0) // routing.k
    return jnp.where((routing.row_pair >= 0)[:, None], x[src], jnp.zeros((), x.dtype))


def combine(rows, routing, weights):
    """y[t] = sum_j w[t, j] * rows[pos[t, j]] over kept pairs; rows' dtype. weights=None: the plain sum (the
    weights were folded into the rows already)."""
    d = _ops()
    if d is not None and routing.native is not None and np.dtype(rows.dtype) in (
            np.dtype(np.float32), np.dtype("bfloat16"), np.dtype(np.float16)):
        return d.moe_combine(rows, routing.native, None if weights is None else weights.astype(jnp.float32))
    pos = routing.pos
    valid = pos >= 0
    g = rows[jnp.maximum(pos, 0)].astype(jnp.float32)  # [T, k, D]
    if weights is not None:
        g = weights.astype(jnp.float32)[..., None] * g
    contrib = jnp.where(valid[..., None], g, 0.0)
    return contrib.sum(axis=1).astype(rows.dtype)


# Ops between the last expert GEMM and the combined rows that commute with scaling a row by a number.
_ROW_LINEAR = {"convert_element_type", "reshape", "transpose", "squeeze", "copy", "copy_p", "alias",
               "sharding_constraint"}


def fold_target(site, prog):
    """The expert GEMM whose rows can take the combine weights before it, or None.

    sum_j w_j * (h_j @ W_e) = sum_j (w_j * h_j) @ W_e: scaling the last GEMM's lhs rows instead of its output
    lets the combine be a plain sum, whose backward is a gather of the output cotangent. The weighted
    combine's backward also reads every expert output row to form dw ([rows, D] in bf16: 268 MB at the
    Qwen3 layer shape); folded, dw = <d(w h), h> comes from the GEMM's narrower lhs (width F, not D) inside
    the backward's elementwise fusion. Only when every op from the GEMM to the combined rows is linear per
    row (a bias or activation after the GEMM would not commute) and no other op reads the values on the way.
    JAX_MOE_FFI_FOLD_COMBINE_WEIGHTS=0 turns it off (A/B runs)."""
    if os.environ.get("JAX_MOE_FFI_FOLD_COMBINE_WEIGHTS", "1") == "0":
        return None
    if site.weights_operand is None or site.rows_operand is None or site.root_kind != "dot":
        return None
    if any(L is not None and L[0] == "J" for L in site.out_labels):
        return None  # per-choice outputs: no sum over choices
    v = site.rows_operand
    for _ in range(16):
        if not isinstance(v, Var) or prog.is_output(v) or len(prog.uses(v)) != 1:
            return None  # another op reads the value: it must not see scaled rows
        e = prog.producer.get(v)
        if e is None:
            return None
        if e.name == "dot_general":
            return e if e in site.gemms and len(e.outs) == 1 else None
        if e.name not in _ROW_LINEAR or len(e.ins) != 1 or len(e.outs) != 1:
            return None
        v = e.ins[0]
    return None


# ------------------------------------------------------------------------------------ rows form
def _gather(val, lab, coords):
    """val at the row coordinates of its labeled axes: [n, *unlabeled axes] (or [1, ...] if none)."""
    nd = val.ndim
    idx_axes = [a for a in range(nd) if lab[a] is not None and not lab[a][1]]
    bc_axes = [a for a in range(nd) if lab[a] is not None and lab[a][1]]
    oth = [a for a in range(nd) if lab[a] is None]
    x = jnp.transpose(val, idx_axes + bc_axes + oth) if nd else val
    x = x.reshape(tuple(val.shape[a] for a in idx_axes) + tuple(val.shape[a] for a in oth))
    if not idx_axes:
        return x[None]
    every = getattr(coords, "every_pair", None)
    if (every is not None and [lab[a][0] for a in idx_axes] == [("T", i) for i in range(len(every[0]))]
            and tuple(val.shape[a] for a in idx_axes) == tuple(every[0])):
        # Every (token, choice) pair in pair order and a leaf indexed by the token axes alone: pair p reads
        # token p // k, i.e. each token row repeated k times. A broadcast instead of a gather, so that the
        # backward is a sum over the k choices (deterministic) rather than a scatter-add with k updates per
        # token (atomics on the GPU). The same values.
        nt = math.prod(every[0])
        x = x.reshape((nt,) + x.shape[len(idx_axes):])
        return jnp.broadcast_to(x[:, None], (nt, every[1]) + x.shape[1:]).reshape((nt * every[1],) + x.shape[1:])
    idx = tuple(jnp.clip(coords[lab[a][0]], 0, val.shape[a] - 1) for a in idx_axes)
    return x[idx]


class Coords(dict):
    """Row coordinates by label; "C+s" (a slot coordinate before a [s:] slice) is derived on demand.
    every_pair = (token shape, k) when the rows are all (token, choice) pairs in pair order (see _gather)."""

    every_pair = None

    def __missing__(self, key):
        if isinstance(key, str) and key.startswith("C+"):
            v = self["C"] + int(key[2:])
            self[key] = v
            return v
        parts = merged_parts(key)
        if parts:  # a merged axis (match.merged_parts): the row-major flat index of its parts
            v = 0
            for kind, size in parts:
                v = v * size + self[kind]
            self[key] = v
            return v
        raise KeyError(key)


def _lit_value(a):
    return np.asarray(a.val, dtype=a.dtype)


def _rhs_orders(plan):
    """(expert axis, order_kn, order_nk) of an expert GEMM's weight: its axes as [E, K..., N...] and [E, N..., K...]
    (a stacked per-expert weight, plan["virtual"], has the expert axis in front)."""
    shift, e_ax = (1, 0) if plan["virtual"] else (0, plan["e_ax"])
    wc = [a + shift for a in plan["wc"]]
    wf = [a + shift for a in plan["w_free"]]
    return e_ax, [e_ax] + wc + wf, [e_ax] + wf + wc


def stored_layout_transpose(plan):
    """transpose_rhs of the expert GEMM `plan` when it reads its weight Var as stored, [E, K, N] (False) or
    [E, N, K] (True): then the weight's FP8 quantisation (quantize_weights) can be made from the Var itself,
    e.g. once for all layers outside a scan. None when the GEMM transposes or reshapes the weight first."""
    if plan["virtual"] or plan["w"].aval.ndim != 3:
        return None
    _, kn, nk = _rhs_orders(plan)
    return False if kn == [0, 1, 2] else True if nk == [0, 1, 2] else None


class RowEval:
    def __init__(self, site, prog, read, coords, n, group_sizes=None, primary_rows=None, facts=None,
                 read_stacked=None, recipe=None, tag=None, fp8_weights=None):
        self.site = site
        self.recipe = recipe  # FP8 recipe of the expert GEMMs (optimize(recipe=...)), None: model dtype
        # {weight Var: Fp8Weights} quantised once outside the enclosing loop (interp's hoisting), or {}
        self.fp8_weights = fp8_weights or {}
        self.tag = tag  # barrier + checkpoint-name tag of the GEMM outputs (emit_site's guard), None: as they are
        self.prog = prog
        self.read = read
        self.coords = coords
        self.n = n
        self.gs = group_sizes
        self.memo = {}
        self.gemm_done = {}  # expert GEMMs already computed with a sibling sharing their lhs
        self.facts = facts
        self.read_stacked = read_stacked
        self.scale_lhs = {}  # GEMM eqn -> per-row factor [n] applied to its lhs rows (fold_target)
        self.hidden_tags = 0  # expert GEMM outputs tagged so far (their index in runtime.hidden_name)
        if primary_rows is not None and site.primary is not None:
            self.memo[site.primary] = primary_rows

    # -- helpers
    def lab(self, v):
        return self.site.labels.get(v, tuple([None] * v.ndim))

    def oth(self, v):
        return others(v, self.site.labels)

    def out_shape(self, v):
        return (self.n,) + tuple(v.shape[a] for a in self.oth(v))

    def full(self, x, v):
        shp = self.out_shape(v)
        if tuple(x.shape) == shp:
            return x
        if x.ndim != len(shp) and x.ndim and _no_units(x.shape[1:]) == _no_units(shp[1:]):
            # a size-1 axis labeled on one side and not on the other (match._merge_unit_labels): no data moves
            x = x.reshape((x.shape[0],) + tuple(shp[1:]))
        return jnp.broadcast_to(x, shp)

    def scalar(self, a):
        return _lit_value(a) if isinstance(a, Lit) else self.read(a)

    def scalar_operand(self, a, out):
        """A 0-d operand of an op whose output is `out`: a constant, or -- where it is part of the site (a
        per-expert scale `s[e]` of a loop site, or a value computed from one) -- its rows, shaped to broadcast
        against out's rows. (Reading such a value from the original program would give every expert the
        template's, expert 0's, value.)"""
        if isinstance(a, Lit) or a not in self.site.labels:
            return self.scalar(a)
        r = self.rows(a)
        if jnp.ndim(r) == 0:
            return r
        return jnp.reshape(r, (r.shape[0],) + (1,) * len(self.oth(out)))

    # -- values
    def rows(self, v):
        if isinstance(v, Lit):
            if v.ndim == 0:
                return _lit_value(v)
            lab = self.site.labels.get(v, tuple([None] * v.ndim))
            return _gather(jnp.asarray(_lit_value(v)), lab, self.coords)
        if v.ndim == 0 and v not in self.site.labels:
            return self.read(v)
        if v in self.memo:
            return self.memo[v]
        kind = self.site.kinds.get(v)
        if kind is None:
            self._eqn(self.prog.producer[v])
            return self.memo[v]
        r = self._leaf(v, kind)
        self.memo[v] = r
        return r

    def _leaf(self, v, kind):
        lab = self.lab(v)
        if kind == "iota":
            e = self.prog.producer[v]
            dim = e.params["dimension"]
            oth = self.oth(v)
            dt = e.params["dtype"]
            if lab[dim] is not None and not lab[dim][1]:
                c = self.coords[lab[dim][0]].astype(dt)
                return c.reshape((self.n,) + (1,) * len(oth))
            if lab[dim] is not None:
                return jnp.zeros((1,) + tuple(v.shape[a] for a in oth), dt)
            return lax.broadcasted_iota(dt, (1,) + tuple(v.shape[a] for a in oth), 1 + oth.index(dim))
        if kind == "vexp":
            st = self.read_stacked(v)  # [E, *v.shape]
            idx = jnp.clip(self.coords["E"], 0, st.shape[0] - 1)
            return _gather_rest(st[idx], lab)
        return _gather(self.read(v), lab, self.coords)

    # -- equations
    def _eqn(self, e):
        name = e.name
        site = self.site
        outs = e.outs
        if name == "dot_general":
            r = self._dot(e)
            self.memo[outs[0]] = r
            return
        if e in site.eslices or e in site.stack_eqns:  # W[e] / stack over experts: the row's expert's value
            x = self.full(self.rows(e.ins[0]), e.ins[0])
            self.memo[outs[0]] = x.reshape(self.out_shape(outs[0]))
            return
        ins = e.ins
        if name in F.ELEMENTWISE:
            out = outs[0]
            ops = []
            for i, a in enumerate(ins):
                if a.ndim == 0:
                    ops.append(self.scalar_operand(a, out) if (e, i) not in site.elits else
                               self.coords["E"].astype(a.dtype).reshape((self.n,) + (1,) * len(self.oth(out))))
                    continue
                ops.append(self.full(self.rows(a), out))
            if (any((e, i) in site.elits for i in range(len(ins)))):
                ops = [jnp.broadcast_to(o, self.out_shape(out)) if hasattr(o, "shape") and o.ndim else o
                       for o in ops]
            if name in ("alias", "sharding_constraint", "optimization_barrier"):
                r = ops[0]
            else:
                r = e.prim.bind(*ops, **e.prim.get_bind_params(e.params))
            self.memo[out] = r
            return
        x = self.rows(ins[0]) if ins[0].ndim else None
        v0 = ins[0]
        oth0 = self.oth(v0) if isinstance(v0, Var) else list(range(v0.ndim))
        out = outs[0]
        p = e.params
        if name == "broadcast_in_dim":
            bd = p["broadcast_dimensions"]
            oo = self.oth(out)
            nbd = (0,) + tuple(1 + oo.index(bd[i]) for i in oth0)
            if x is None:
                x = jnp.asarray(self.scalar_operand(v0, v0))
                x = x.reshape(x.shape[:1] or (1,))  # (n,) for a per-expert scalar, else (1,)
                nbd = (0,)
            r = lax.broadcast_in_dim(x, self.out_shape(out), nbd)
        elif name == "reshape":
            r = jnp.reshape(self.full(x, v0), self.out_shape(out))
        elif name == "squeeze":
            dims = [d % v0.ndim for d in p["dimensions"]]
            sq = tuple(1 + oth0.index(d) for d in dims if d in oth0)
            r = jnp.squeeze(x, sq) if sq else x
            r = r.reshape((r.shape[0],) + tuple(out.shape[a] for a in self.oth(out)))
        elif name == "transpose":
            perm = p["permutation"]
            r = jnp.transpose(x, (0,) + tuple(1 + oth0.index(perm[a]) for a in self.oth(out)))
        elif name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                      "argmax", "argmin"):
            axes = tuple(1 + oth0.index(a) for a in p["axes"])
            np_ = dict(e.prim.get_bind_params(p))
            np_["axes"] = axes
            r = e.prim.bind(x, **np_)
        elif name in F.CUMULATIVE:
            np_ = dict(p)
            np_["axis"] = 1 + oth0.index(p["axis"] % v0.ndim)
            r = e.prim.bind(self.full(x, v0), **np_)
        elif name == "slice":
            st, li, sr = p["start_indices"], p["limit_indices"], p["strides"]
            x = self.full(x, v0)
            r = lax.slice(x, (0,) + tuple(st[a] for a in oth0), (self.n,) + tuple(li[a] for a in oth0),
                          None if sr is None else (1,) + tuple(sr[a] for a in oth0))
        elif name == "dynamic_slice":
            sizes = p["slice_sizes"]
            idx = [self.scalar(a) for a in ins[1:]]
            x = self.full(x, v0)
            r = lax.dynamic_slice(x, [0] + [idx[a] for a in oth0], (self.n,) + tuple(sizes[a] for a in oth0))
        elif name == "concatenate":
            dim = p["dimension"]
            oo = self.oth(out)
            parts = [self.full(self.rows(a), a) for a in ins]
            r = lax.concatenate(parts, 1 + oo.index(dim))
        elif name == "pad":
            cfg = p["padding_config"]
            pv = self.scalar(ins[1])
            r = lax.pad(self.full(x, v0), jnp.asarray(pv, x.dtype), [(0, 0, 0)] + [tuple(cfg[a]) for a in oth0])
        elif name == "split":
            ax = p["axis"] % v0.ndim
            rs = jnp.split(self.full(x, v0), np.cumsum(p["sizes"])[:-1].tolist(), axis=1 + oth0.index(ax))
            for o, rr in zip(outs, rs):
                self.memo[o] = rr
            return
        elif name == "optimization_barrier":
            for o, a in zip(outs, ins):
                self.memo[o] = self.rows(a)
            return
        else:  # pragma: no cover - the analysis only admits the ops above
            raise NotImplementedError(name)
        self.memo[out] = r

    def _dot(self, e):
        site = self.site
        plan = site.gemms.get(e)
        if plan is not None:
            return self._gemm(e, plan)
        A, B = e.ins
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        if e is site.disp_eqn and self.facts is not None and self.facts.get(site.disp_operand).binary \
                and site.keep_is_nonzero:
            # 0/1 dispatch mask at kept pairs: the row is the token itself
            other = B if A is site.disp_operand else A
            r = self.full(self.rows(other), other)
            return r.astype(e.outs[0].dtype)
        la, lb_ = self.lab(A), self.lab(B)
        ra, rb_ = self.rows(A), self.rows(B)
        oa, ob = self.oth(A), self.oth(B)
        hasr_a = ra.shape[0] == self.n and self._coord_dep(A)
        hasr_b = rb_.shape[0] == self.n and self._coord_dep(B)
        if not hasr_a:
            ra = ra.reshape(ra.shape[1:]) if ra.shape[0] == 1 else ra[0]
        if not hasr_b:
            rb_ = rb_.reshape(rb_.shape[1:]) if rb_.shape[0] == 1 else rb_[0]
        sa, sb = int(hasr_a), int(hasr_b)
        nlc, nrc, nlb, nrb = [], [], [], []
        for i, j in zip(lc, rc):
            if la[i] is None and lb_[j] is None:
                nlc.append(sa + oa.index(i))
                nrc.append(sb + ob.index(j))
        tags = []
        if hasr_a and hasr_b:
            nlb.append(0)
            nrb.append(0)
            tags.append("R")
        # original output index of each operand axis
        lfree = [i for i in range(A.ndim) if i not in lc and i not in lb]
        rfree = [j for j in range(B.ndim) if j not in rc and j not in rb]
        out_of_a = {i: k for k, i in enumerate(lb)}
        out_of_a.update({i: len(lb) + k for k, i in enumerate(lfree)})
        out_of_b = {j: k for k, j in enumerate(rb)}
        out_of_b.update({j: len(lb) + len(lfree) + k for k, j in enumerate(rfree)})
        for i, j in zip(lb, rb):
            if la[i] is None and lb_[j] is None:
                nlb.append(sa + oa.index(i))
                nrb.append(sb + ob.index(j))
                tags.append(out_of_a[i])
        ra_axes = (["R"] if hasr_a else []) + oa
        rb_axes = (["R"] if hasr_b else []) + ob
        for k_, ax in enumerate(ra_axes):
            if k_ in nlc or k_ in nlb:
                continue
            tags.append("R" if ax == "R" else out_of_a[ax])
        for k_, ax in enumerate(rb_axes):
            if k_ in nrc or k_ in nrb:
                continue
            tags.append("R" if ax == "R" else out_of_b[ax])
        out = e.outs[0]
        pet = e.params.get("preferred_element_type")
        r = lax.dot_general(ra, rb_, ((tuple(nlc), tuple(nrc)), (tuple(nlb), tuple(nrb))),
                            precision=e.params.get("precision"), preferred_element_type=pet)
        if "R" not in tags:
            r = r[None]
            tags = ["R"] + tags
        target = ["R"] + self.oth(out)
        r = jnp.transpose(r, [tags.index(t) for t in target])
        return self.full(r, out).astype(out.dtype)

    def _coord_dep(self, v):
        if isinstance(v, Lit):
            return False
        kind = self.site.kinds.get(v)
        if kind == "free":
            return False
        if kind == "iota":
            e = self.prog.producer[v]
            L = self.lab(v)[e.params["dimension"]]
            return L is not None and not L[1]
        return True

    def _gemm_operands(self, e, plan):
        """lhs rows [n, K], stacked weight [E, K, N] (or [E, N, K] with tr), tr, preferred type, out shape."""
        W, P = plan["w"], plan["rows_from"]
        rp = self.full(self.rows(P), P)
        op = self.oth(P)
        # contracted axes first, then any uncontracted size-1 axes of the rows (match._plan_dot allows them)
        rest = [a for a in op if a not in plan["pc"]]
        rp = jnp.transpose(rp, (0,) + tuple(1 + op.index(a) for a in list(plan["pc"]) + rest))
        lhs = rp.reshape(self.n, plan["K"])
        w = self.read_stacked(W) if plan["virtual"] else self.read(W)
        e_ax, order_kn, order_nk = _rhs_orders(plan)
        wf = order_kn[1 + len(plan["wc"]):]
        ne = w.shape[e_ax]
        if order_nk == list(range(w.ndim)) and order_kn != list(range(w.ndim)):
            rhs = w.reshape(ne, plan["N"], plan["K"])
            tr = True
        else:
            rhs = jnp.transpose(w, order_kn).reshape(ne, plan["K"], plan["N"])
            tr = False
        out_dt = plan["out_dtype"]
        pet = jnp.float32 if out_dt == np.dtype(np.float32) and np.dtype(lhs.dtype) != out_dt else None
        shp = (self.n,) + tuple(w.shape[a] for a in wf)
        if rest and e.outs[0] in self.site.labels:
            shp = self.out_shape(e.outs[0])  # keeps the rows' size-1 free axes (no data) where the out has them
        return lhs, rhs, tr, pet, shp

    def _shared_lhs_gemms(self, e, plan):
        """The site's expert GEMMs whose lhs rows are built exactly as e's (same rows value, same
        contraction order): e.g. separate gate and up projections. They run as one
        `grouped_matmuls_shared_lhs` call, whose backward sums their lhs gradients in the GEMM epilogue (with
        recipe="blockwise" too: the FP8 accumulate form; mxfp8 has nothing to share)."""
        if self.recipe not in (None, "blockwise") or e in self.scale_lhs:
            return [(e, plan)]
        key = lambda p: (p["rows_from"], tuple(p["pc"]), p["K"])
        return [(e, plan)] + [(e2, p2) for e2, p2 in self.site.gemms.items()
                              if e2 is not e and e2 not in self.gemm_done and e2 not in self.scale_lhs
                              and key(p2) == key(plan)]

    def _hoisted_fp8_weights(self, plan, operands):
        """The weight's FP8 tiles quantised outside the enclosing loop (interp), or None: quantise at the call."""
        fw = self.fp8_weights.get(plan["w"]) if self.recipe == "blockwise" and not plan["virtual"] else None
        if fw is not None and (fw.shape != tuple(operands[1].shape) or fw.transpose_rhs != operands[2]):
            fw = None  # quantised for another layout of this weight: quantise here as usual
        return fw

    def _gemm(self, e, plan):
        from jax_moe_ffi.ops.grouped_gemm import grouped_matmul, grouped_matmuls_shared_lhs
        if self.gs is None:
            raise NotImplementedError("grouped GEMM in pair order")
        if e in self.gemm_done:
            return self.gemm_done.pop(e)
        group = self._shared_lhs_gemms(e, plan)
        ops = [self._gemm_operands(e_, p_) for e_, p_ in group]
        lhs = ops[0][0]
        if e in self.scale_lhs:  # the combine weights, folded (fold_target); f32 product, rounded once
            lhs = (lhs.astype(jnp.float32) * self.scale_lhs[e][:, None]).astype(lhs.dtype)
        fws = [self._hoisted_fp8_weights(p_, o) for (_, p_), o in zip(group, ops)]
        if len(group) > 1:
            outs = grouped_matmuls_shared_lhs(lhs, [o[1] for o in ops], self.gs,
                                              transpose_rhs=[o[2] for o in ops],
                                              preferred_element_type=[o[3] for o in ops], recipe=self.recipe,
                                              fp8_weights=fws if self.recipe == "blockwise" else None)
        else:
            outs = [grouped_matmul(lhs, ops[0][1], self.gs, preferred_element_type=ops[0][3],
                                   transpose_rhs=ops[0][2], recipe=self.recipe, fp8_weights=fws[0])]
        if self.tag is not None:  # what a remat policy saves / a scan stacks instead of recomputing the GEMM
            from jax_moe_ffi import runtime
            tagged = []
            for r in outs:  # one name per output (runtime.hidden_name): a policy may place each on its own;
                i = self.hidden_tags  # past the indexed names, the family name (placed with the family)
                tagged.append(self.tag(r, runtime.hidden_name(i) if i < runtime.HIDDEN_INDICES else "moe_expert_hidden"))
                self.hidden_tags += 1
            outs = tagged
        results = [r.reshape(o[4]).astype(e_.outs[0].dtype) for r, o, (e_, _) in zip(outs, ops, group)]
        for (e_, _), r in zip(group[1:], results[1:]):
            self.gemm_done[e_] = r
        return results[0]

    def root_rows(self):
        site = self.site
        root = site.root
        if site.root_kind == "chain":
            return self.full(self.rows(site.template_out), site.template_out)
        if site.root_kind == "dot":
            return self._dot(root)
        z = root.ins[0]
        oz = self.oth(z)
        rz = self.full(self.rows(z), z)
        axes = tuple(1 + oz.index(a) for a in root.params["axes"] if a in oz)
        return jnp.sum(rz, axis=axes, dtype=root.outs[0].dtype) if axes else rz.astype(root.outs[0].dtype)


def _gather_rest(x, lab):
    """x [n, *v.shape] -> [n, *unlabeled axes] (bcast-labeled axes are size 1 and dropped)."""
    oth = [a for a in range(len(lab)) if lab[a] is None]
    return x.reshape((x.shape[0],) + tuple(x.shape[1 + a] for a in oth))


# ------------------------------------------------------------------------------------------ emit
def _placed(fn, options):
    """fn on the dispatch/combine stream when optimize(streams=True) (runtime.on_stream; a no-op, said once,
    where JAX cannot annotate streams). XLA acts on the annotation only with the runtime's XLA flags."""
    if not options.get("streams"):
        return fn
    from jax_moe_ffi import runtime
    return runtime.on_stream(fn, runtime.DISPATCH_STREAM)


def _tagged(x, name, options):
    """Checkpoint-name tag for optimize(offload=...): the remat policy offloads or saves the value."""
    if x is None or not options.get("offload"):
        return x
    from jax_moe_ffi import runtime
    return runtime.tag(x, name)


def residuals_stacked(path: str) -> bool:
    """Whether a site at this plan path (e.g. "scan/", "scan/remat/") sits in a lax.scan body with no
    jax.checkpoint between the scan and the site: then, under differentiation, its GEMM outputs and dispatched
    rows are kept for the backward by stacking them into the scan's residual buffers."""
    parts = [p for p in path.split("/") if p]
    if "scan" not in parts:
        return False
    last = len(parts) - 1 - parts[::-1].index("scan")
    return "remat" not in parts[last + 1:]


def _guard_residuals(site, options) -> bool:
    """Put the site's GEMM outputs and dispatched rows behind an optimization barrier (no copy, no kernel)
    when they may be stacked as scan residuals: offload="device" / "pinned_host" saves them, and a scan body
    without jax.checkpoint keeps them. Why: XLA's GPU dynamic-slice fusion fuses the residual's
    dynamic-update-slice into the custom call that produced it by *cloning* the call when the result has
    other users too; on the H200 (jaxlib 0.11.2) the expert GEMMs and the gather then ran twice per layer in
    the forward (tools/remat_check.py: 8 GEMM calls compiled from 5 lowered). Behind the barrier the update is
    a copy into the stack. Not applied elsewhere: a barrier on every result cost ~2.8 ms of extra device
    copies per step in the remat'd train step (benchmarks/NOTES.md, session 6).
    JAX_MOE_FFI_RESIDUAL_BARRIER=0 turns it off (A/B runs)."""
    if os.environ.get("JAX_MOE_FFI_RESIDUAL_BARRIER", "1") == "0":
        return False
    return bool(options.get("offload")) or residuals_stacked(getattr(site, "path", "") or "")


def emit_site(site, prog, read, facts, mode="exact", read_stacked=None, options=None, fp8_weights=None):
    """The value of site.out computed by dispatch -> grouped GEMMs -> combine. fp8_weights: {weight Var:
    Fp8Weights} quantised outside the enclosing loop (recipe="blockwise"; interp hoists them)."""
    options = options or {}
    I = read(site.I)
    b, j = site.b_axes, site.j_axis
    tshape = site.token_shape
    t, k, ne = site.num_tokens, site.k, site.E
    ids = jnp.transpose(I, b + ([] if j is None else [j])).reshape(t, k).astype(jnp.int32)
    p = t * k
    coords_for = _pair_coords(site, ids)
    pc = coords_for(jnp.arange(p, dtype=jnp.int32))
    if os.environ.get("JAX_MOE_FFI_PAIR_BROADCAST", "1") != "0":  # =0: plain gathers (A/B on the GPU)
        pc.every_pair = (tuple(tshape), k)
    if mode == "dropless" and site.S is not None:
        read = _dropless_reader(site, prog, read)
    cap_routing = None  # exact capacity: the plan that also gives the site's drops (one plan, not two)
    if mode == "exact" and site.S is not None:
        read, cap_routing = _capacity_reader(site, prog, read, ids, facts)
    if site.S is not None:
        pc["C"] = _slot_at(read(site.S), site.s_roles, pc) - site.s_off
    pe = RowEval(site, prog, read, pc, p, facts=facts, read_stacked=read_stacked)
    keep = None
    site.keep_is_nonzero = site.S is not None
    if site.S is not None and mode == "exact" and cap_routing is None:
        keep = _exact_keep(site, pe, pc, p).reshape(t, k)
    if site.first_choice_only:
        keep = first_choices(ids) if keep is None else keep & first_choices(ids)
    if site.fixed_choice is not None and cap_routing is None:
        col = jnp.broadcast_to(jnp.arange(k) == site.fixed_choice, (t, k))
        keep = col if keep is None else keep & col
    elif site.first_cell_only and keep is not None:
        # (the model's keep rule: a dropped choice's slot may read as a cell an earlier choice holds; where the
        # plan routed with capacity=C gives the drops instead, every kept pair has a slot of its own)
        keep = keep & first_choices(ids, pc["C"].reshape(t, k))
    # weights
    if site.weights_operand is not None:
        w = pe.full(pe.rows(site.weights_operand), site.weights_operand).reshape(t, k)
    else:
        w = jnp.ones((t, k), jnp.float32)
    # dispatch
    x2d = None
    if site.primary is not None:
        xv = read(site.primary)
        lab = site.labels[site.primary]
        tax = sorted([a for a in range(xv.ndim) if lab[a] is not None], key=lambda a: lab[a][0][1])
        oth = [a for a in range(xv.ndim) if lab[a] is None]
        x2d = jnp.transpose(xv, tax + oth).reshape(t, -1)
    if cap_routing is not None:
        rows_x = None if x2d is None else _ops()._dispatch_rows(x2d, cap_routing)
        routing = Routing(cap_routing.row_pair, cap_routing.group_sizes, cap_routing.pos, k, native=cap_routing)
    else:
        rows_x, routing = route(ids, ne, keep=keep, x=x2d)
    guard = _guard_residuals(site, options)
    if guard and rows_x is not None:
        rows_x = lax.optimization_barrier(rows_x)
    rows_x = _tagged(rows_x, "moe_dispatched_rows", options)
    rp = routing.row_pair
    n = rp.shape[0]
    rc = coords_for(jnp.maximum(rp, 0))
    if site.S is not None:
        rc["C"] = pc["C"][jnp.maximum(rp, 0)]
    prim_rows = None
    if rows_x is not None:
        pv = site.primary
        prim_rows = rows_x.reshape((n,) + tuple(pv.shape[a] for a in others(pv, site.labels)))
    re = RowEval(site, prog, read, rc, n, group_sizes=routing.group_sizes, primary_rows=prim_rows,
                 facts=facts, read_stacked=read_stacked, recipe=options.get("recipe"), fp8_weights=fp8_weights,
                 tag=(lambda x, name: _tagged(lax.optimization_barrier(x), name, options)) if guard else None)
    folded = fold_target(site, prog) if site.rows_operand is not None else None
    if folded is not None:  # w at each row's pair; 0 on padding rows (their GEMM rows are zero anyway)
        re.scale_lhs[folded] = jnp.where(rp >= 0, w.astype(jnp.float32).reshape(-1)[jnp.maximum(rp, 0)], 0.0)
    if site.rows_operand is not None:
        rows = re.full(re.rows(site.rows_operand), site.rows_operand)
        if site.gather_perm is not None:
            rows = jnp.transpose(rows, [0] + [1 + i for i in site.gather_perm])
    else:
        rows = re.root_rows()
    rows = _tagged(rows, "moe_expert_out", options)
    out = site.out
    oshape = tuple(rows.shape[1:])
    olab = site.out_labels
    ushape = tuple(out.shape[a] for a in range(out.ndim) if olab[a] is None)
    if oshape != ushape and [d for d in oshape if d != 1] == [d for d in ushape if d != 1]:
        # the rows differ from the out's unlabeled axes only in size-1 axes (no data: e.g. an N=1 axis batched
        # or contracted by the root): lay them out as the out has them
        rows = rows.reshape((n,) + ushape)
        oshape = ushape
    nt = len(tshape)
    per_choice = any(L is not None and L[0] == "J" for L in olab)
    if per_choice:  # out[t, j] = w[t, j] * row of pair (t, j): a gather, no sum over choices
        pos = routing.pos
        g = rows[jnp.maximum(pos, 0)].astype(jnp.float32)  # [T, k, *oshape]
        wk = w.astype(jnp.float32).reshape((t, k) + (1,) * len(oshape))
        y = jnp.where((pos >= 0).reshape((t, k) + (1,) * len(oshape)), wk * g, 0.0).astype(rows.dtype)
        y = y.reshape(tshape + (k,) + oshape)
    else:
        if folded is not None:
            y = _placed(lambda r: combine(r, routing, None), options)(rows.reshape(n, -1))
        else:
            y = _placed(lambda r, w: combine(r, routing, w), options)(rows.reshape(n, -1), w)
        y = y.reshape(tshape + oshape)
    src = []
    u = 0
    nfix = nt + int(per_choice)
    for a in range(out.ndim):
        if olab[a] is not None:
            src.append(nt if olab[a][0] == "J" else olab[a][0][1])
        else:
            src.append(nfix + u)
            u += 1
    y = jnp.transpose(y, src)
    for a in site.extra_terms:  # a residual summed in the same chain as the per-expert terms
        y = y + (_lit_value(a) if isinstance(a, Lit) else read(a)).astype(y.dtype)
    return y.astype(out.dtype)


def capacity_plan(site, prog):
    """(matched capacity leaves or None, the report's note) for an exact-mode capacity site."""
    from jax_moe_ffi.rewrite import capacity as CAP
    if _ops() is None:  # the pure-JAX dispatch backend (tests of the pass alone): keep the model's values
        return None, "exact capacity: computed as the model computes it (pure-JAX dispatch backend)"
    found, why = CAP.capacity_shortcuts(site, prog, list(site.kinds) + [site.S])
    if found is None:
        return None, f"exact capacity: computed as the model computes it ({why})"
    return found, ("exact capacity: the model's running count is the GShard rule (checked on probe ids); "
                   "slots and drops come from the dispatch plan (capacity=C), not from its cumsum")


def _pair_coords(site, ids):
    """coords_for(pair) -> the token, choice and expert coordinates of flat pair indices (ids [T, k])."""
    ids_flat = ids.reshape(-1)
    tshape, k = site.token_shape, site.k

    def coords_for(pair):  # pair: [n] flat pair index
        c = Coords({"E": ids_flat[pair]})
        rem = pair // k
        for i in reversed(range(len(tshape))):
            c[("T", i)] = rem % tshape[i]
            rem = rem // tshape[i]
        c["J"] = pair % k
        return c

    return coords_for


def _exact_keep(site, pe, pc, p):
    """Exact mode's kept pairs: the model's dispatch mask is nonzero at the pair's (expert, slot) and the
    slot is inside the capacity."""
    dv = pe.full(pe.rows(site.disp_operand), site.disp_operand).reshape(p)
    cc = pc["C"]
    return (dv != 0) & (cc >= 0) & (cc < site.C)


class _NotAProbeLeaf(Exception):
    pass


def _capacity_reader(site, prog, read, ids, facts):
    """Exact mode: the model's capacity values (kept mask, slot) from a plan routed with capacity=C when
    they are the GShard running count (rewrite/capacity.py checks it); else `read` unchanged.

    Returns (read, routing). `routing` (that plan's) is not None when it also gives the site's drops: the
    keep rule above, evaluated on the probe ids with the matched values, equals the GShard kept mask on
    every probe. Then one plan serves both, instead of a second plan over the keep mask."""
    from jax_moe_ffi.rewrite import capacity as CAP
    found, note = capacity_plan(site, prog)
    _note_once(site, note)
    if found is None:
        return read, None
    routing = _ops().moe_routing(ids, site.E, capacity=site.C)
    same = True
    t, k = ids.shape
    for probe_I, vals, kept in CAP.probe_leaves(site, found):
        def probe_read(v, probe_I=probe_I, vals=vals):
            if v is site.I:
                return jnp.asarray(probe_I)
            if v in vals:
                return jnp.asarray(vals[v])
            raise _NotAProbeLeaf(v)
        try:
            with jax.ensure_compile_time_eval():
                pids = jnp.asarray(probe_I).reshape(t, k).astype(jnp.int32)
                pc = _pair_coords(site, pids)(jnp.arange(t * k, dtype=jnp.int32))
                pc["C"] = _slot_at(probe_read(site.S), site.s_roles, pc) - site.s_off
                pe = RowEval(site, prog, probe_read, pc, t * k, facts=facts, read_stacked=None)
                keep = np.asarray(_exact_keep(site, pe, pc, t * k)).reshape(t, k)
        except Exception:  # noqa: BLE001 - the keep rule needs more than the matched values: two plans
            same = False
            break
        if not np.array_equal(keep, kept):
            same = False
            break
    return CAP.shortcut_reader(read, site, found, routing), (routing if same else None)


def _note_once(site, text):
    if text not in site.notes:
        site.notes.append(text)


NO_SLOT = -(1 << 30)  # a slot no capacity test keeps, also after an offset is subtracted


def _slot_at(S, roles, c):
    idx = []
    for r in roles:
        idx.append(0 if r == "1" else c["J"] if r == "J" else c["E"] if r == "E" else c[r])  # "1": size-1 axis
    s = S[tuple(idx)]
    if jnp.issubdtype(s.dtype, jnp.floating):
        # a float slot index (one_hot of a float): its one-hot is all zero unless the value is an integer;
        # map every other value (fractions, NaN, +-inf, out of int32 range) to NO_SLOT
        ok = (s == jnp.floor(s)) & (jnp.abs(s) < (1 << 30))
        return jnp.where(ok, jnp.where(ok, s, 0).astype(jnp.int32), NO_SLOT)
    return s.astype(jnp.int32)


def _from_cumsum(prog, v, limit=64):
    return upstream(prog, v, lambda x, e: e is not None and e.name in F.CUMULATIVE, limit)


def _dropless_reader(site, prog, read):
    """Leaf values re-evaluated with the capacity comparisons forced to 'fits' (mode='dropless')."""
    C = site.C
    overrides = {}
    for e in prog.flat:
        if e.name not in ("lt", "le", "gt", "ge") or len(e.ins) != 2:
            continue
        a, b = e.ins
        ca = a.scalar() if isinstance(a, Lit) else None
        cb = b.scalar() if isinstance(b, Lit) else None
        caps = {c for c in (C - 1, C, C + site.s_off - 1, C + site.s_off) if c > 0}
        # a running count (cumsum) compared with the capacity: force "fits"
        if cb in caps and not isinstance(a, Lit) and _from_cumsum(prog, a):
            overrides[e] = e.name in ("lt", "le")
        elif ca in caps and not isinstance(b, Lit) and _from_cumsum(prog, b):
            overrides[e] = e.name in ("gt", "ge")
    if not overrides:
        site.notes.append("dropless: no capacity comparison found; weights as the model computes them")
        return read
    affected = set()
    for e in prog.flat:
        if e in overrides or any(isinstance(x, Var) and x in affected for x in e.ins):
            affected.update(e.outs)
    memo = {}

    def value(v):
        if isinstance(v, Lit):
            return _lit_value(v)
        if v not in affected:
            return read(v)
        if v in memo:
            return memo[v]
        e = prog.producer[v]
        if e in overrides:
            memo[v] = jnp.full(v.shape, overrides[e], bool)
            return memo[v]
        args = [value(x) for x in e.ins]
        if e.kind == "alias":
            outs = args
        else:
            r = e.prim.bind(*args, **e.prim.get_bind_params(e.params))
            outs = r if e.prim.multiple_results else [r]
        for o, val in zip(e.outs, outs):
            memo[o] = val
        return memo[v]

    return value
