"""Axis maps of primitives and the forward facts of the pass (an abstract interpretation).

Axis map: for each output axis of an equation, how it relates to operand axes:
  ("pt", {operand: (axis, bcast)})  the same index (pointwise); bcast=True when that operand has size 1 there
  ("new", {})                       the value is constant along this axis (broadcast)
  ("mix", {})                       the value mixes positions along this axis (cumsum, partial slice, ...)
plus, per operand, the axes it reduces or contracts.

Facts (per variable):
  view  (X, xmap)   int value equal to X[coords[xmap]]: a broadcast/transposed view of index array X
  iota  a           value equal to its coordinate along axis a
  const c           every element equals the scalar c
  cons  {Con}       *sparsity*: the value is zero wherever a constraint fails. Con(cat, src, xmap): the
                    coordinate along axis `cat` (or the fixed column ('col', e)) must equal src[...] where
                    src's axes are indexed by value axes (ints) or by existentially bound axes (Bound:
                    summed away, e.g. the choice axis j of top_k after `sum_j one_hot(I)[t,j,e] * w[t,j]`)
  binary            values are in {0, 1}
  neg   {Con}       the value is hugely negative (-inf, -1e9) wherever a constraint fails (masked logits),
                    at most `negb` there; exp() / logistic() turn it into `cons` while negb <= HUGE_NEG
A constraint's `off` records a one-hot sliced [off:] (MaxText's (C+1)-way position one-hot). A size-1
category axis that disappears becomes a fixed column ("col", e) (family 4: `gate[:, e:e+1]`, `I == e`).
Top-k index arrays (outputs of `top_k`/`approx_top_k`, `argmax` as top-1, and a contiguous slice of
`jnp.argsort`'s permutation along the sorted axis) are the sources whose
constraints prove sparsity: their entries are distinct and in range. One-hots come from `eq(view, iota)`,
scatters of top-k choices into zeros (`zeros.at[b, s, I].set(w)`) and jnp's index fix-ups are seen through.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from jax import dtypes

from jax_moe_ffi.rewrite.ir import Lit, Var, assemble_top1

# f(0) == 0 unary ops, elementwise
ZERO_PRESERVING_UNARY = {
    "neg", "convert_element_type", "copy", "copy_p", "reduce_precision", "stop_gradient", "tanh", "sin",
    "tan", "asin", "atan", "sinh", "asinh", "atanh", "sqrt", "cbrt", "abs", "sign", "erf", "expm1", "log1p",
    "integer_pow", "square", "real", "imag", "floor", "ceil", "round", "name", "sharding_constraint",
    "optimization_barrier", "erf_inv",
}
IDENTITY_UNARY = {"copy", "copy_p", "stop_gradient", "name", "sharding_constraint", "reduce_precision",
                  "optimization_barrier", "alias"}
# ... and those of them that keep a hugely negative value hugely negative (the `neg` fact)
NEG_PRESERVING_UNARY = {"floor", "ceil", "round", "reduce_precision"}
ELEMENTWISE = ZERO_PRESERVING_UNARY | {
    "add", "sub", "mul", "div", "rem", "pow", "max", "min", "nextafter", "atan2", "is_finite", "exp",
    "exp2", "log", "logistic", "cos", "acos", "cosh", "acosh", "rsqrt", "erfc", "lgamma", "digamma",
    "and", "or", "not", "xor", "eq", "ne", "lt", "le", "gt", "ge", "select_n", "clamp", "conj",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count", "clz", "igamma",
    "igammac", "random_gamma_grad", "bessel_i0e", "bessel_i1e", "alias", "add_any",
}
REDUCES = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
           "argmax", "argmin"}
CUMULATIVE = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"}
TOPK = ("top_k", "approx_top_k")
HUGE_NEG = -1e3  # exp(), logistic() of anything at or below this are exactly 0 in f32 and f64 (and below)


class Bound:
    """An existentially bound (summed-away) axis; identity is what matters."""
    __slots__ = ()

    def __repr__(self):
        return f"b{id(self) % 997}"


@dataclasses.dataclass(frozen=True)
class Fixed:
    """A fixed coordinate of an index array's axis: the value reads X at that index there (one choice column,
    `ids[:, j]`, is a view of ids with Fixed(j) on the choice axis)."""
    index: int


@dataclasses.dataclass(frozen=True)
class Con:
    cat: object  # int axis, or ("col", e)
    src: Var
    xmap: tuple  # per src axis: int value axis | Bound
    off: int = 0  # coordinate + off == src[...] (a one-hot sliced [off:])

    def remap(self, fn_axis, bound_for, shape=None):
        """fn_axis(ax) -> new axis | None (gone) ; bound_for(ax) -> Bound | None (mixed/dropped).
        A size-1 category axis that goes away (squeeze, broadcast) leaves a fixed column: ("col", off)."""
        cat = self.cat
        off = self.off
        if isinstance(cat, int):
            nc = fn_axis(cat)
            if nc is None:
                if shape is not None and shape[cat] == 1 and bound_for(cat) is None:
                    cat, off = ("col", self.off), 0
                else:
                    return None
            else:
                cat = nc
        xm = []
        for a in self.xmap:
            if isinstance(a, (Bound, Fixed)):
                xm.append(a)
                continue
            na = fn_axis(a)
            if na is None:
                b = bound_for(a)
                if b is None:
                    return None
                xm.append(b)
            else:
                xm.append(na)
        return Con(cat, self.src, tuple(xm), off)


@dataclasses.dataclass
class Fact:
    view: tuple | None = None  # (X, xmap)
    iota: int | None = None
    const: object = None
    cons: frozenset = frozenset()
    binary: bool = False
    neg: frozenset = frozenset()  # constraints outside which the value is hugely negative (-inf, -1e9)
    negb: float = float("-inf")  # ... namely at most this there (a literal shift or division moves it)
    # the value equals `fill` wherever a constraint of `fcons` fails (flaxformer's priority
    # `cumsum(mask) * mask - 1`: -1 at the experts a token did not choose; its one-hot is zero there)
    fill: object = None
    fcons: frozenset = frozenset()

    def empty(self):
        return self.view is None and self.iota is None and self.const is None and not self.cons \
            and not self.neg and not self.binary and not self.fcons


EMPTY = Fact()


# ------------------------------------------------------------------------------------------ axis maps
def _shape(a):
    return tuple(a.shape)


def axis_map(eqn):
    """(outs, reduced): outs[o][a] = (kind, {operand: (axis, bcast)}); reduced[i] = set of reduced axes."""
    name = eqn.name
    p = eqn.params
    ins = eqn.ins
    reduced = {}
    if name in ELEMENTWISE:
        out = eqn.outs[0]
        m = []
        for a in range(out.ndim):
            d = {}
            for i, x in enumerate(ins):
                if x.ndim == out.ndim:
                    d[i] = (a, x.shape[a] != out.shape[a])
            m.append(("pt", d))
        return [m], reduced
    if name == "optimization_barrier":
        return [[("pt", {i: (a, False)}) for a in range(o.ndim)] for i, o in enumerate(eqn.outs)], reduced
    if name == "broadcast_in_dim":
        out = eqn.outs[0]
        bd = tuple(p["broadcast_dimensions"])
        op = ins[0]
        m = []
        for a in range(out.ndim):
            if a in bd:
                i = bd.index(a)
                m.append(("pt", {0: (i, op.shape[i] != out.shape[a])}))
            else:
                m.append(("new", {}))
        return [m], reduced
    if name == "reshape":
        return [_reshape_map(ins[0].shape, eqn.outs[0].shape, p.get("dimensions"))], reduced
    if name == "squeeze":
        dims = {d % ins[0].ndim for d in p["dimensions"]}
        keep = [a for a in range(ins[0].ndim) if a not in dims]
        return [[("pt", {0: (i, False)}) for i in keep]], reduced
    if name == "expand_dims":
        return None, None
    if name == "transpose":
        return [[("pt", {0: (i, False)}) for i in p["permutation"]]], reduced
    if name in REDUCES:
        axes = set(p["axes"])
        keep = [a for a in range(ins[0].ndim) if a not in axes]
        reduced[0] = axes
        return [[("pt", {0: (i, False)}) for i in keep]], reduced
    if name in CUMULATIVE:
        ax = p["axis"] % ins[0].ndim
        return [[("mix", {}) if a == ax else ("pt", {0: (a, False)}) for a in range(ins[0].ndim)]], reduced
    if name == "dot_general":
        (lc, rc), (lb, rb) = p["dimension_numbers"]
        lhs, rhs = ins
        m = [("pt", {0: (i, False), 1: (j, False)}) for i, j in zip(lb, rb)]
        m += [("pt", {0: (i, False)}) for i in range(lhs.ndim) if i not in lc and i not in lb]
        m += [("pt", {1: (j, False)}) for j in range(rhs.ndim) if j not in rc and j not in rb]
        reduced[0] = set(lc)
        reduced[1] = set(rc)
        return [m], reduced
    if name == "slice":
        op = ins[0]
        st, li, sr = p["start_indices"], p["limit_indices"], p["strides"]
        m = []
        for a in range(op.ndim):
            full = st[a] == 0 and li[a] == op.shape[a] and (sr is None or sr[a] == 1)
            m.append(("pt", {0: (a, False)}) if full else ("mix", {}))
        return [m], reduced
    if name == "dynamic_slice":
        op = ins[0]
        sizes = p["slice_sizes"]
        return [[("pt", {0: (a, False)}) if sizes[a] == op.shape[a] else ("mix", {})
                 for a in range(op.ndim)]], reduced
    if name == "concatenate":
        dim = p["dimension"]
        out = eqn.outs[0]
        return [[("mix", {}) if a == dim else ("pt", {i: (a, False) for i in range(len(ins))})
                 for a in range(out.ndim)]], reduced
    if name == "pad":
        cfg = p["padding_config"]
        return [[("pt", {0: (a, False)}) if tuple(cfg[a]) == (0, 0, 0) else ("mix", {})
                 for a in range(ins[0].ndim)]], reduced
    if name == "split":
        ax = p["axis"] % ins[0].ndim
        return [[("mix", {}) if a == ax else ("pt", {0: (a, False)}) for a in range(ins[0].ndim)]
                for _ in eqn.outs], reduced
    if name == "iota":
        return [[("new", {}) for _ in range(eqn.outs[0].ndim)]], reduced
    if name in TOPK:
        op = ins[0]
        ax = _topk_axis(eqn)
        m = [("mix", {}) if a == ax else ("pt", {0: (a, False)}) for a in range(op.ndim)]
        return [m, list(m)], reduced
    if name == "sort":
        ax = p["dimension"] % ins[0].ndim
        m = [("mix", {}) if a == ax else ("pt", {i: (a, False) for i in range(len(ins))})
             for a in range(ins[0].ndim)]
        return [list(m) for _ in eqn.outs], reduced
    if name == "rev":
        dims = set(p["dimensions"])
        return [[("mix", {}) if a in dims else ("pt", {0: (a, False)}) for a in range(ins[0].ndim)]], reduced
    return None, None


def _topk_axis(eqn):
    op = eqn.ins[0]
    if eqn.name == "top_k":
        return eqn.params.get("axis", -1) % op.ndim
    return eqn.params.get("reduction_dimension", -1) % op.ndim


def _reshape_map(in_shape, out_shape, dimensions):
    n_out = len(out_shape)
    if dimensions is not None and tuple(dimensions) != tuple(range(len(in_shape))):
        return [("mix", {})] * n_out
    groups = _reshape_groups(in_shape, out_shape)
    if groups is None:
        return [("mix", {})] * n_out
    m = [("new", {}) if out_shape[a] == 1 else ("mix", {}) for a in range(n_out)]
    for gi, gj in groups:
        if len(gi) == 1 and len(gj) == 1:
            m[gj[0]] = ("pt", {0: (gi[0], False)})
    return m


def _reshape_groups(in_shape, out_shape):
    """[(input axes, output axes)] of a row-major reshape, size-1 axes left out; None if it does not split
    into such groups."""
    ins_ = [a for a in range(len(in_shape)) if in_shape[a] != 1]
    outs_ = [a for a in range(len(out_shape)) if out_shape[a] != 1]
    groups = []
    i = j = 0
    while i < len(ins_) and j < len(outs_):
        gi, gj = [ins_[i]], [outs_[j]]
        pi, pj = in_shape[ins_[i]], out_shape[outs_[j]]
        i += 1
        j += 1
        while pi != pj:
            if pi < pj:
                if i >= len(ins_):
                    return None
                gi.append(ins_[i])
                pi *= in_shape[ins_[i]]
                i += 1
            else:
                if j >= len(outs_):
                    return None
                gj.append(outs_[j])
                pj *= out_shape[outs_[j]]
                j += 1
        groups.append((gi, gj))
    if i != len(ins_) or j != len(outs_):
        return None
    return groups


def operand_to_out(omap, operand):
    """{operand axis: out axis} for non-broadcast pointwise axes."""
    r = {}
    for a, (kind, d) in enumerate(omap):
        if kind == "pt" and operand in d and not d[operand][1]:
            r[d[operand][0]] = a
    return r


# ------------------------------------------------------------------------------------- forward facts
ROUTERS = TOPK + ("argmax",)


def _through_aliases(v, prog):
    """(the variable, the equation) that computes v, past the alias equations of inlined calls (e.g.
    jnp.argsort's jit); the equation is None for inputs."""
    e = prog.producer.get(v)
    while e is not None and e.kind == "alias" and isinstance(e.ins[0], Var):
        v = e.ins[0]
        e = prog.producer.get(v)
    return v, e


def _unreversed(v, prog, ax):
    """v past any reversals along axis `ax` only: (the variable, its equation)."""
    v, e = _through_aliases(v, prog)
    while e is not None and e.name == "rev" and tuple(d % v.ndim for d in e.params["dimensions"]) == (ax,) \
            and isinstance(e.ins[0], Var):
        v, e = _through_aliases(e.ins[0], prog)
    return v, e


def _permutation_axis(v, prog):
    """The axis along which v is a permutation of 0 .. n-1: the indices output of a one-key `sort` of
    (keys, iota along the sort axis) -- what jnp.argsort lowers to -- possibly reversed along that axis
    (descending=True, [..., ::-1]); else None."""
    _, e = _through_aliases(v, prog)
    if e is not None and e.name == "rev" and len(e.params["dimensions"]) == 1:
        ax = e.params["dimensions"][0] % v.ndim
    elif e is not None and e.name == "sort":
        ax = e.params["dimension"] % v.ndim
    else:
        return None
    w, e = _unreversed(v, prog, ax)
    if e is None or e.name != "sort" or e.params.get("num_keys", 1) != 1 or len(e.ins) != 2 \
            or e.params["dimension"] % v.ndim != ax or w is not e.outs[1] or not isinstance(e.ins[1], Var):
        return None
    _, q = _unreversed(e.ins[1], prog, ax)  # the iota operand (reversed itself for descending=True)
    if q is None or q.name != "iota" or q.params.get("dimension") != ax:
        return None
    return ax


def _argsort_topk_axis(v, prog):
    """The choice axis when v is jnp.argsort's permutation sliced to a contiguous range along the sorted
    axis and kept whole along the others (`argsort(-s)[..., :k]`, `argsort(s)[..., -k:]`): like top_k's
    indices, distinct and in range. Else None."""
    e = prog.producer.get(v)
    if e is None or e.name != "slice":
        return None
    src = e.ins[0]
    ax = _permutation_axis(src, prog) if isinstance(src, Var) else None
    if ax is None:
        return None
    st, li, sr = e.params["start_indices"], e.params["limit_indices"], e.params["strides"]
    for a in range(src.ndim):
        if (sr is not None and sr[a] != 1) or (a != ax and (st[a] != 0 or li[a] != src.shape[a])):
            return None
    return ax


def _top1_squeezed(v, prog):
    """The top_k equation when v is its k = 1 indices with the choice axis squeezed or reshaped away
    (`top_k(s, 1)[1][..., 0]`, T5X / Switch style): like argmax, a top-1 index per token. Else None."""
    e = prog.producer.get(v)
    if e is None or e.name not in ("squeeze", "reshape") or not isinstance(e.ins[0], Var):
        return None
    src = e.ins[0]
    t = prog.producer.get(src)
    if t is None or t.name not in TOPK or len(t.outs) != 2 or t.outs[1] is not src:
        return None
    ax = _topk_axis(t)
    if src.shape[ax] != 1 or tuple(v.shape) != tuple(d for a, d in enumerate(src.shape) if a != ax):
        return None
    if e.name == "squeeze" and tuple(d % src.ndim for d in e.params["dimensions"]) != (ax,):
        return None
    if e.name == "reshape" and e.params.get("dimensions") is not None:
        return None
    return t


def outer_value(v, prog):
    """(value, program) of the enclosing program that a body's input `v` is, passed in unchanged (jax.checkpoint's
    inputs, a cond branch's operands, a scan's constants: Plan sets prog.outer), else None. Top-k ids made
    outside such a body and read inside it keep what makes them ids: distinct and in range."""
    return getattr(prog, "outer", {}).get(v) if isinstance(v, Var) and v not in prog.producer else None


def is_topk_indices(v, prog):
    """Indices of the k largest scores (top_k, approx_top_k; argmax = top-1; a slice of jnp.argsort;
    top_k's k = 1 indices without their choice axis): distinct, in range."""
    e = prog.producer.get(v)
    if e is None:
        o = outer_value(v, prog)
        return o is not None and is_topk_indices(*o)
    if e.name == "argmax":
        return len(e.params["axes"]) == 1
    if e.name == "slice":
        return _argsort_topk_axis(v, prog) is not None
    if e.name in ("squeeze", "reshape"):
        return _top1_squeezed(v, prog) is not None
    return e.name in TOPK and len(e.outs) == 2 and e.outs[1] is v


def _assembled(v, prog):
    """(E, axis) when v is a concatenation along `axis` of top-k index arrays with their choice axis there
    and top-1 arrays (argmax) given a size-1 axis there -- PhiMoE's SparseMixer and Praxis' top-2 (two argmaxes,
    the second over the scores with the first masked): every entry in range, but the entries of one token may
    repeat (the two argmaxes coincide when every other score is -inf). Else None."""
    e = prog.producer.get(v)
    if e is None and outer_value(v, prog) is not None:
        return _assembled(*outer_value(v, prog))
    if e is None or e.name != "concatenate" or len(e.ins) < 2:
        return None
    ax = e.params["dimension"]
    rest = tuple(d for a, d in enumerate(v.shape) if a != ax)
    sizes = set()
    for p_ in e.ins:
        if not isinstance(p_, Var):
            return None
        q = prog.producer.get(p_)
        while q is not None and q.name == "convert_element_type" and isinstance(q.ins[0], Var) \
                and np.issubdtype(np.dtype(q.ins[0].dtype), np.integer):
            p_ = q.ins[0]
            q = prog.producer.get(p_)
        if is_topk_indices(p_, prog) and topk_info(p_, prog)[1] == ax:
            sizes.add(topk_info(p_, prog)[0])
            continue
        # a top-1 array with a size-1 axis inserted at `ax` (jnp.argmax(..., keepdims=True), x[:, None])
        if q is None or q.name not in ("broadcast_in_dim", "reshape") or not isinstance(q.ins[0], Var) \
                or p_.shape[ax] != 1 or tuple(q.ins[0].shape) != rest:
            return None
        if q.name == "broadcast_in_dim" and tuple(q.params["broadcast_dimensions"]) != \
                tuple(a for a in range(p_.ndim) if a != ax):
            return None
        if q.name == "reshape" and q.params.get("dimensions") is not None:
            return None
        src = q.ins[0]
        if not is_topk_indices(src, prog) or topk_info(src, prog)[1] is not None:
            return None
        sizes.add(topk_info(src, prog)[0])
    return (sizes.pop(), ax) if len(sizes) == 1 else None


def may_repeat(v, prog):
    """Choice indices whose entries for one token may coincide (see _assembled)."""
    return _assembled(v, prog) is not None


def is_choice_indices(v, prog):
    """Top-k indices, or index arrays assembled from several (in range, possibly repeating per token)."""
    return is_topk_indices(v, prog) or may_repeat(v, prog)


def router_sizes(prog):
    """The expert counts E of the program's routers (the sizes their top-k indices range over)."""
    return {topk_info(o, prog)[0] for e in prog.flat if is_router_eqn(e, prog)
            for o in e.outs if is_topk_indices(o, prog)}


def is_router_eqn(e, prog):
    """An equation whose output is top-k indices (where the router ends)."""
    return e.name in TOPK or (e.name in ("argmax", "slice") and is_topk_indices(e.outs[0], prog))


def topk_info(v, prog):
    """(E, j_axis, b_axes) of a top_k index array (or one assembled from several); j_axis is None for argmax
    (k = 1, no choice axis)."""
    if v not in prog.producer and outer_value(v, prog) is not None:
        return topk_info(*outer_value(v, prog))
    e = prog.producer[v]
    if e.name == "concatenate":
        n, ax = _assembled(v, prog)
        return n, ax, [a for a in range(v.ndim) if a != ax]
    if e.name == "argmax":
        return e.ins[0].shape[e.params["axes"][0]], None, list(range(v.ndim))
    if e.name == "slice":
        ax = _argsort_topk_axis(v, prog)
        return e.ins[0].shape[ax], ax, [a for a in range(v.ndim) if a != ax]
    if e.name in ("squeeze", "reshape"):  # top_k(k=1) without its choice axis: top-1, as argmax
        t = _top1_squeezed(v, prog)
        return t.ins[0].shape[_topk_axis(t)], None, list(range(v.ndim))
    ax = _topk_axis(e)
    return e.ins[0].shape[ax], ax, [a for a in range(v.ndim) if a != ax]


def xj(c, j_axis):
    """The constraint's entry for the top_k choice axis (None for argmax)."""
    return None if j_axis is None else c.xmap[j_axis]


def lit_fact(a):
    if isinstance(a, Lit):
        s = a.scalar()
        if s is not None:
            return Fact(const=s, binary=s in (0, 1))
        return EMPTY
    return None


class Facts:
    def __init__(self, prog, seed=None):
        self.prog = prog
        self.f = dict(seed or {})
        for e in list(prog.flat):  # (a snapshot: _merged_top1 may insert equations)
            try:
                outs = self._eqn(e)
            except Exception:  # noqa: BLE001  (facts are best-effort; no fact = no rewrite)
                outs = None
            if outs:
                for o, fo in zip(e.outs, outs):
                    if fo is not None and not fo.empty():
                        self.f[o] = fo

    def get(self, a):
        lf = lit_fact(a)
        if lf is not None:
            return lf
        f = self.f.get(a)
        if f is None:
            if np.issubdtype(a.dtype, np.integer):
                return Fact(view=(a, tuple(range(a.ndim))))
            return EMPTY
        if f.view is None and np.issubdtype(a.dtype, np.integer):  # an int value is a view of itself
            return dataclasses.replace(f, view=(a, tuple(range(a.ndim))))
        return f

    def view(self, a):
        """(X, xmap) for integer values (a value is trivially a view of itself)."""
        if isinstance(a, Lit):
            return None
        fa = self.get(a)
        if fa.view is not None:
            return fa.view
        if np.issubdtype(a.dtype, np.integer):
            return (a, tuple(range(a.ndim)))
        return None

    # ------------------------------------------------------------------------------------------
    def _transport(self, fact, omap, operand, bounds=None, keep_view=True, shape=None, keep_fill=False):
        """Move an operand's facts to the output through the axis map."""
        o2 = operand_to_out(omap, operand)
        bounds = bounds or {}
        fn = o2.get

        def bound_for(a):
            return bounds.get(a)

        cons = set()
        for c in fact.cons:
            nc = c.remap(fn, bound_for, shape)
            if nc is not None:
                cons.add(nc)
        neg = set()
        for c in fact.neg:
            nc = c.remap(fn, lambda a: None)
            if nc is not None:
                neg.add(nc)
        nf = Fact(cons=frozenset(cons), binary=fact.binary, const=fact.const, neg=frozenset(neg),
                  negb=fact.negb)
        if keep_fill and fact.fcons:  # moves that keep values (and max / min reductions: _reduce)
            fcons = {nc for nc in (c.remap(fn, bound_for, shape) for c in fact.fcons) if nc is not None}
            if fcons:
                nf.fill, nf.fcons = fact.fill, frozenset(fcons)
        if keep_view and fact.view is not None:
            x, xm = fact.view
            if all(isinstance(a, Fixed) or a in o2 for a in xm):
                nf.view = (x, tuple(a if isinstance(a, Fixed) else o2[a] for a in xm))
        if fact.iota is not None and fact.iota in o2:
            nf.iota = o2[fact.iota]
        return nf

    def _eqn(self, e):
        outs = self._eqn_inner(e)
        if len(e.outs) == 1 and e.outs[0].dtype == np.bool_:
            if not outs or outs[0] is None:
                outs = [Fact(binary=True)]
            else:
                outs[0].binary = True
        return outs

    def _eqn_inner(self, e):
        ins_ = e.ins
        tr = self._transport

        def transport(fact, omap, operand, **kw):
            x = ins_[operand]
            return tr(fact, omap, operand, shape=tuple(x.shape), **kw)

        self._transport_e = transport
        return self._eqn_inner2(e)

    def _eqn_inner2(self, e):
        name = e.name
        if e.kind not in ("prim", "alias"):
            return None
        omaps, reduced = axis_map(e)
        if name == "iota":
            return [Fact(iota=e.params["dimension"])]
        if name in TOPK:
            return None
        ins = e.ins
        fs = [self.get(a) for a in ins]
        if name in ("scatter", "scatter-add", "scatter_add"):
            return [self._scatter(e, fs)]
        if omaps is None:
            return None
        if name in IDENTITY_UNARY or name in ("broadcast_in_dim", "reshape", "squeeze", "transpose",
                                               "convert_element_type"):
            nf = self._transport_e(fs[0], omaps[0], 0, keep_fill=True)
            if name == "reshape":
                self._rebase_split(e, fs[0], nf)
            if name == "reduce_precision" and nf.fcons:
                nf.fill, nf.fcons = None, frozenset()  # (it may round a fill onto a coordinate)
            if name == "convert_element_type" and nf.neg and not dtypes.issubdtype(e.outs[0].dtype, np.floating):
                nf.neg = frozenset()  # -inf as an int or a bool is no masked logit
            if name == "convert_element_type" and nf.fcons:
                if np.dtype(e.outs[0].dtype) == np.bool_:
                    nf.fill, nf.fcons = None, frozenset()
                elif dtypes.issubdtype(e.outs[0].dtype, np.floating):
                    nf.fill = float(np.asarray(nf.fill, dtype=e.outs[0].dtype))  # rounded as the values are
                elif np.isfinite(float(nf.fill)):
                    nf.fill = int(np.trunc(float(nf.fill)))  # float -> int conversion truncates
                else:
                    nf.fill, nf.fcons = None, frozenset()
            return [nf]
        if name == "slice":
            return [self._slice(e, fs[0], omaps[0])]
        if name == "integer_pow" and e.params["y"] <= 0:
            return None
        if name in ("exp", "exp2", "logistic") and fs[0].neg:  # all three are exactly 0 at or below HUGE_NEG
            if fs[0].negb > HUGE_NEG:
                return None
            t = self._transport_e(fs[0], omaps[0], 0)
            return [Fact(cons=t.neg)]
        if name in ("add", "sub") and any(f.neg for f in fs):
            i = 0 if fs[0].neg else 1
            o = fs[1 - i]
            if name == "sub" and fs[1].neg or (o.neg and o.neg != fs[i].neg):
                return None  # minus a hugely negative value (-inf - -inf is nan), or different masks
            t = self._transport_e(fs[i], omaps[0], i)
            b = fs[i].negb
            if o.neg:
                b = b + o.negb
            elif o.const is not None:  # a literal shift moves the bound (-1e4 + 9990 is no masked logit)
                if not isinstance(o.const, (int, float, np.number)):
                    return None
                b = b + o.const if name == "add" else b - o.const
            # (another operand of unknown values -- logits, a bias -- is taken to be moderate)
            return [Fact(neg=t.neg, negb=float(b))]
        inf_at = self._infinite_fill(name, ins, fs)
        if inf_at is not None:
            i, sign = inf_at  # logits - (+inf outside the mask): -inf there, a masked logit
            t = self._transport_e(fs[i], omaps[0], i, keep_fill=True)
            return [Fact(neg=t.fcons, negb=float("-inf"))] if sign < 0 else None
        if name in ("add", "sub") and fs[0].fcons and not fs[0].cons and fs[1].const is not None \
                and isinstance(fs[1].const, (int, float, np.number)) and tuple(ins[1].shape) == () \
                and tuple(ins[0].shape) == tuple(e.outs[0].shape):
            # (a fill shifted by a literal: `1 / mask - 1` is +inf outside the mask, as 1 / mask is)
            t = self._transport_e(fs[0], omaps[0], 0, keep_fill=True)
            c = fs[1].const if name == "add" else -fs[1].const
            return [Fact(fill=fs[0].fill + c, fcons=t.fcons)]
        if name in ("add", "sub") and fs[0].cons and fs[1].const is not None \
                and isinstance(fs[1].const, (int, float, np.number)) and tuple(ins[1].shape) == () \
                and tuple(ins[0].shape) == tuple(e.outs[0].shape):
            # x + c / x - c with x zero outside its constraints: equal to +-c there
            t = self._transport_e(fs[0], omaps[0], 0)
            c = fs[1].const if name == "add" else -fs[1].const
            return [Fact(fill=c, fcons=t.cons)]
        if name == "div" and fs[0].neg and isinstance(ins[1], Lit) and (fs[1].const or 0) > 0:
            t = self._transport_e(fs[0], omaps[0], 0)  # a temperature: -1e4 / 1e4 is no masked logit
            return [Fact(neg=t.neg, negb=float(fs[0].negb / fs[1].const))]
        if name in ZERO_PRESERVING_UNARY:
            nf = self._transport_e(fs[0], omaps[0], 0, keep_view=False)
            nf.iota = None
            nf.binary = False
            if name not in NEG_PRESERVING_UNARY:
                nf.neg = frozenset()  # tanh(-inf) = -1, sign, sin, abs, neg, square: no longer hugely negative
            if nf.const is not None:
                nf.const = None
            return [nf]
        if name == "eq":
            return [self._eq(e, ins, omaps[0])]
        if name in ("gt", "lt", "ne"):
            # A > c, c < A (c >= 0) and A != 0 are False wherever A is zero
            a_i, c_i = (0, 1) if name in ("gt", "ne") else (1, 0)
            c = fs[c_i].const
            if fs[a_i].cons and c is not None and (c == 0 if name == "ne" else c >= 0):
                t = self._transport_e(fs[a_i], omaps[0], a_i)
                return [Fact(cons=t.cons, binary=True)]
            return None
        if name in ("mul", "and"):
            cons = set()
            binary = True
            for i, f in enumerate(fs):
                t = self._transport_e(f, omaps[0], i)
                cons |= t.cons
                binary = binary and (f.binary or (f.const in (0, 1) if f.const is not None else False))
            const = None
            if any(f.const == 0 for f in fs if f.const is not None):
                const = 0
            return [Fact(cons=frozenset(cons), binary=binary, const=const)]
        if name == "div" and fs[0].const is not None and isinstance(fs[0].const, (int, float, np.number)) \
                and fs[0].const > 0 and tuple(ins[0].shape) == () and fs[1].cons and fs[1].binary:
            # c / mask with a 0 / 1 mask (+0.0 off it: one-hots, their sums and products): +inf off the mask
            t = self._transport_e(fs[1], omaps[0], 1)
            return [Fact(fill=float("inf"), fcons=t.cons)]
        if name == "div":
            t = self._transport_e(fs[0], omaps[0], 0)
            return [Fact(cons=t.cons)]
        if name in ("add", "sub", "max", "min", "or", "add_any"):
            ts = [self._transport_e(f, omaps[0], i) for i, f in enumerate(fs)]
            nonzero = [t for f, t in zip(fs, ts) if f.const != 0]
            if not nonzero:
                return [Fact(const=0)]
            c0 = nonzero[0].cons
            if c0 and all(t.cons == c0 for t in nonzero):
                return [Fact(cons=c0, binary=name in ("max", "or") and all(t.binary for t in nonzero))]
            merged = _merged_columns([t.cons for t in nonzero])
            merged = frozenset({merged}) if merged is not None else self._merged_top1([t.cons for t in nonzero])
            return None if merged is None else [Fact(cons=merged)]
        if name == "select_n":
            return [self._select(ins, fs, omaps[0])]
        if name in REDUCES:
            return [self._reduce(e, fs[0], omaps[0], reduced[0])]
        if name == "dot_general":
            return [self.dot_product_fact(e, out_space=True)]

        if name == "broadcast_in_dim":
            return [self._transport_e(fs[0], omaps[0], 0, keep_fill=True)]
        return None

    @staticmethod
    def _infinite_fill(name, ins, fs):
        """(operand, sign) for `x - v` / `x + v` with v = +-inf wherever its fill constraints fail and x of
        unknown (taken as finite) values: the result is -inf (sign -1) or +inf there."""
        if name not in ("add", "sub") or len(ins) != 2:
            return None
        for i in (0, 1):
            f, o = fs[i], fs[1 - i]
            if not f.fcons or not isinstance(f.fill, float) or not np.isinf(f.fill) or o.fcons or o.neg \
                    or o.const is not None or tuple(ins[i].shape) != tuple(ins[1 - i].shape):
                continue
            sign = np.sign(f.fill) * (-1 if name == "sub" and i == 1 else 1)
            return i, sign
        return None

    def _slice(self, e, f, omap):
        op = e.ins[0]
        st, li = e.params["start_indices"], e.params["limit_indices"]
        sr = e.params["strides"]
        cons = set()
        for c in f.cons:
            ok = True
            cat = c.cat
            off = c.off
            if isinstance(cat, int):
                full = st[cat] == 0 and li[cat] == op.shape[cat] and (sr is None or sr[cat] == 1)
                if not full:
                    if sr is None or sr[cat] == 1:
                        off = c.off + int(st[cat])  # one-hot sliced [s:]: coordinate + s == index
                    else:
                        ok = False
            for a in c.xmap:
                if isinstance(a, int) and not (st[a] == 0 and li[a] == op.shape[a]):
                    ok = False
            if ok:
                cons.add(Con(cat, c.src, c.xmap, off))
        nf = Fact(cons=frozenset(cons), binary=f.binary and bool(cons), const=f.const)
        if f.view is not None:
            xm = []
            for a in f.view[1]:
                if isinstance(a, Fixed) or (st[a] == 0 and li[a] == op.shape[a] and (sr is None or sr[a] == 1)):
                    xm.append(a)
                elif li[a] - st[a] == 1:  # one column (`ids[:, j]`): a fixed coordinate of the index array
                    xm.append(Fixed(int(st[a])))
                else:
                    break
            else:
                nf.view = (f.view[0], tuple(xm))
        return nf

    def _eq(self, e, ins, omap):
        a, b = ins
        for x, y, ix, iy in ((a, b, 0, 1), (b, a, 1, 0)):
            vx = self.view(x)
            fy = self.get(y)
            if vx is None and isinstance(x, Var) and dtypes.issubdtype(x.dtype, np.floating) \
                    and fy.iota is not None:
                # one_hot of a float index (a slot computed as sum(cumsum(mask) * mask)): still true only
                # where the coordinate equals the value; readers of such a source turn values that are no
                # integer into "no slot" (emit._slot_at)
                vx = self._float_view(x)
            if vx is None:
                continue
            src, xm = vx
            o2 = operand_to_out(omap, ix)
            if not all(isinstance(ax, Fixed) or ax in o2 for ax in xm):
                continue
            xm_out = tuple(ax if isinstance(ax, Fixed) else o2[ax] for ax in xm)
            if fy.iota is not None:
                oy = operand_to_out(omap, iy)
                if fy.iota in oy:
                    cat = oy[fy.iota]
                    if cat not in xm_out:
                        cons = {Con(cat, src, xm_out)}
                        fx = self.get(x)
                        z = fx.fill
                        if fx.fcons and z is not None and not (float(z).is_integer() and 0 <= z < y.shape[fy.iota]):
                            # x == z (no coordinate) wherever its fill constraints fail: the one-hot is zero there
                            cons |= set(self._transport_e(fx, omap, ix, keep_fill=True).fcons)
                        return Fact(cons=frozenset(cons), binary=True)
            if isinstance(y, Lit) and fy.const is not None and float(fy.const).is_integer():
                return Fact(cons=frozenset({Con(("col", int(fy.const)), src, xm_out)}), binary=True)
        return None

    def _rebase_split(self, e, f, nf):
        """At a reshape, a constraint whose index array is itself a reshape of top_k's ids is re-stated on those
        ids (through their view): flaxformer's ids [G, S, K] -> [G, K, S] -> [G, K*S] (choice-major), one-hot,
        cumsum, then [G, K*S, E] -> [G, K, S, E] splits the merged axis back; with K = 1 or G = 1 the reshapes
        only add or drop size-1 axes. The new constraint replaces the transported one (same meaning)."""
        x, out = e.ins[0], e.outs[0]
        if e.params.get("dimensions") is not None or not (f.cons or f.fcons):
            return
        groups = _reshape_groups(tuple(x.shape), tuple(out.shape))
        if groups is None:
            return
        o2 = {gi[0]: gj[0] for gi, gj in groups if len(gi) == 1 and len(gj) == 1}
        split = {gi[0]: gj for gi, gj in groups if len(gi) == 1 and len(gj) > 1}
        plain = operand_to_out(axis_map(e)[0][0], 0).get  # what _transport used
        for attr in ("cons", "fcons"):
            new = set(getattr(nf, attr))
            for c in getattr(f, attr):
                rc = self._rebased(c, o2, split, tuple(out.shape))
                if rc is not None:
                    new.discard(c.remap(plain, lambda a: None, tuple(x.shape)))
                    new.add(rc)
            setattr(nf, attr, frozenset(new))
        if nf.fcons and nf.fill is None:
            nf.fill = f.fill

    def _rebased(self, c, o2, split, out_shape):
        if is_topk_indices(c.src, self.prog):
            return None
        if isinstance(c.cat, int):
            if c.cat not in o2:
                return None
            cat = o2[c.cat]
        else:
            cat = c.cat
        r = self.prog.producer.get(c.src)
        if r is None or r.name != "reshape" or r.params.get("dimensions") is not None \
                or not isinstance(r.ins[0], Var):
            return None
        src_in = r.ins[0]
        rgroups = _reshape_groups(tuple(src_in.shape), tuple(c.src.shape))
        if rgroups is None or any(len(gj) != 1 for _, gj in rgroups):
            return None
        group_of = {gj[0]: gi for gi, gj in rgroups}  # src axis -> the src_in axes merged into it
        xm_in = [None] * src_in.ndim
        for m, a in enumerate(c.xmap):
            gi = group_of.get(m)
            if gi is None:  # a size-1 axis of the index array: nothing of src_in
                continue
            if isinstance(a, Bound) or a in o2:
                if len(gi) != 1:
                    return None
                xm_in[gi[0]] = a if isinstance(a, Bound) else o2[a]
            elif a in split and [src_in.shape[q] for q in gi] == [out_shape[p] for p in split[a]]:
                for q, p_ in zip(gi, split[a]):
                    xm_in[q] = p_
            else:
                return None
        # size-1 axes of src_in: any size-1 axis of the output indexes them exactly (one coordinate); in order,
        # so that a size-1 token or choice axis (G = 1, K = 1) keeps an axis of its own
        free = [a for a in range(len(out_shape)) if out_shape[a] == 1 and a not in xm_in]
        for q in range(src_in.ndim):
            if xm_in[q] is None:
                if src_in.shape[q] != 1:
                    return None
                xm_in[q] = free.pop(0) if free else Bound()
        X, vxm = self.view(src_in) or (src_in, tuple(range(src_in.ndim)))
        if not is_topk_indices(X, self.prog) or not all(isinstance(a, int) for a in vxm):
            return None
        return Con(cat, X, tuple(xm_in[a] for a in vxm), c.off)

    def _float_view(self, x):
        """(y, xmap) with x[coords] == y[coords[xmap]]: a float value seen through the broadcast_in_dim
        that adds its one-hot's axis (one_hot(v) is eq(v[..., None], iota))."""
        xm = tuple(range(x.ndim))
        e = self.prog.producer.get(x)
        while e is not None and e.name == "broadcast_in_dim" and isinstance(e.ins[0], Var):
            y, dims = e.ins[0], e.params["broadcast_dimensions"]
            if any(y.shape[i] != x.shape[d] for i, d in enumerate(dims)):
                break  # a real broadcast of a size-1 axis: keep x itself
            x, xm = y, tuple(xm[d] for d in dims)
            e = self.prog.producer.get(x)
        return x, xm

    def _nonneg_index(self, a):
        """An iota or a view of top_k indices (or of ids assembled from them): already in range, jnp's
        negative-index fix-up is a no-op."""
        f = self.get(a)
        if f.iota is not None:
            return True
        return f.view is not None and is_choice_indices(f.view[0], self.prog)

    def _select(self, ins, fs, omap):
        pred = ins[0]
        cases = ins[1:]
        if len(cases) != 2:
            return None
        pe = self.prog.producer.get(pred) if isinstance(pred, Var) else None
        if pe is not None and pe.name == "lt" and pe.ins[0] is cases[0] and isinstance(pe.ins[1], Lit) \
                and pe.ins[1].scalar() == 0 and self._nonneg_index(cases[0]) \
                and tuple(cases[0].shape) == tuple(cases[1].shape):
            return self._transport_e(fs[1], omap, 1)  # where(i < 0, i + n, i) with i >= 0
        tp = self._transport_e(fs[0], omap, 0)
        t0 = self._transport_e(fs[1], omap, 1)
        t1 = self._transport_e(fs[2], omap, 2)
        if fs[1].const == 0 and tp.cons:
            return Fact(cons=tp.cons | t1.cons, binary=fs[2].binary or fs[2].const == 1)
        c0 = fs[1].const
        if tp.cons and c0 is not None and isinstance(c0, (int, float)) and c0 <= HUGE_NEG:
            return Fact(neg=tp.cons, negb=float(c0))
        if fs[2].const == 0 and fs[0].cons and np.dtype(pred.dtype) == np.bool_:
            return None  # where(p, 0, x): zero where p holds; not the sparsity we track
        if t0.cons and t0.cons == t1.cons:
            return Fact(cons=t0.cons)
        return None

    def _scatter(self, e, fs):
        """zeros.at[iota_b..., I].set(w): zero except at (b, I[b, j]) -- a k-sparse gate.
        full(-inf).at[iota_b..., I].set(v) (Llama 4's router: top-k logits scattered into -inf, then a
        sigmoid or softmax): hugely negative except there."""
        op, idx, upd = e.ins[:3]
        fill = fs[0].const
        masked_logits = e.name == "scatter" and isinstance(fill, (int, float, np.number)) and fill <= HUGE_NEG
        if (fill != 0 and not masked_logits) or isinstance(idx, Lit):
            return None
        dn = e.params["dimension_numbers"]
        if tuple(dn.update_window_dims) or tuple(getattr(dn, "operand_batching_dims", ())) or \
                tuple(dn.inserted_window_dims) != tuple(range(op.ndim)):
            return None
        sdod = tuple(dn.scatter_dims_to_operand_dims)
        n = len(sdod)
        if idx.shape[-1] != n or tuple(idx.shape[:-1]) != tuple(upd.shape):
            return None
        pieces = self._index_pieces(idx, n)
        if pieces is None:
            return None
        nu = upd.ndim
        iota_of = {}  # operand dim -> update axis
        cat = src = None
        for comp, (kind, val) in enumerate(pieces):
            od = sdod[comp]
            if kind == "iota":
                iota_of[od] = val
            elif kind == "view" and is_topk_indices(val[0], self.prog) and cat is None:
                cat, src, xm = od, val[0], val[1]
            else:
                return None
        if cat is None or len(set(iota_of.values())) != len(iota_of):
            return None
        _, j_axis, b_axes = topk_info(src, self.prog)
        upd_to_od = {ua: od for od, ua in iota_of.items()}
        xmap = []
        b = Bound()
        for ax in range(src.ndim):
            ua = xm[ax]
            if ax == j_axis:
                if ua in upd_to_od:
                    return None
                xmap.append(b)
            elif ua in upd_to_od:
                xmap.append(upd_to_od[ua])
            else:
                return None
        if len(iota_of) != len(b_axes) or any(ua >= nu for ua in xm):
            return None
        con = frozenset({Con(cat, src, tuple(xmap))})
        return Fact(neg=con, negb=float(fill)) if masked_logits else Fact(cons=con)

    def _index_pieces(self, idx, n, fixed=False):
        """Components of a scatter index array [..., n]: ("iota", update axis) or ("view", (X, xmap)); with `fixed`,
        a view may also read X at a fixed coordinate (one choice column, `ids[:, j]`)."""
        nd = idx.ndim - 1
        e = self.prog.producer.get(idx)
        parts = []
        if n == 1:
            parts = [idx]
        elif e is not None and e.name == "concatenate" and e.params["dimension"] == nd and \
                all(p.shape[-1] == 1 for p in e.ins):
            parts = list(e.ins)
        else:
            return None
        out = []
        for p in parts:
            f = self.get(p)
            if f.iota is not None and f.iota < nd:
                out.append(("iota", f.iota))
            elif f.view is not None and all(isinstance(a, int) and a < nd or fixed and isinstance(a, Fixed)
                                            for a in f.view[1]):
                out.append(("view", f.view))
            else:
                return None
        return out

    def _reduce(self, e, f, omap, axes):
        bounds = {a: Bound() for a in axes}
        nf = self._transport_e(f, omap, 0, bounds=bounds, keep_view=False,
                               keep_fill=e.name in ("reduce_max", "reduce_min"))
        if e.name == "reduce_sum":
            nf.binary = f.binary and self._unique_sum(f.cons, axes)
        elif e.name in ("reduce_max", "reduce_or"):
            nf.binary = f.binary
        else:
            nf.binary = False
        if e.name in ("argmax", "argmin"):
            return None
        # (max / min keep `fill`: every term equals it where no bound choice satisfies the constraint, and so
        # does their max / min; a sum or product does not)
        nf.const = None
        return nf

    def _unique_sum(self, cons, axes):
        """At most one nonzero term along `axes`: a top_k constraint binds them with its category kept."""
        for c in cons:
            if not isinstance(c.cat, int) or c.cat in axes or not is_topk_indices(c.src, self.prog):
                continue
            _, jax_, _ = topk_info(c.src, self.prog)
            if jax_ is not None and set(axes) == {c.xmap[jax_]} and isinstance(c.xmap[jax_], int):
                return True
        return False

    def _merged_top1(self, cons_sets):
        """Terms each zero unless one top-1 array (an argmax) equals the category coordinate, a separate array per
        term (Praxis-style top-2 by two argmaxes: `g * one_hot(i1) + g * one_hot(i2)`), all over the same experts:
        the sum is zero unless some entry of the id array assembled from them (ir.assemble_top1; its entries may
        repeat, facts.may_repeat) does -- the constraint over that array with its new choice axis bound. A term
        may also carry a second constraint of its own index array on another axis (Praxis' capacity top-2: the
        expert one-hot of i_j times the slot one-hot of pos_j): those arrays are assembled alike and both merged
        constraints share the one bound choice axis (the sum is zero unless, for one choice j, both hold). A term
        already merged so (three argmaxes, added in turn) contributes its arrays. Else None."""
        if len(cons_sets) < 2 or any(len(cs) != len(cons_sets[0]) or len(cs) not in (1, 2) for cs in cons_sets):
            return None
        prog = self.prog
        roles = None  # per role (a constraint of each term): (cat, off, xm without the choice axis), sources
        for cs in cons_sets:
            term, bound = [], None
            for c in sorted(cs, key=lambda c: repr(c.cat)):
                parts = prog.assembled_parts.get(c.src)
                if parts is not None and c.xmap and isinstance(c.xmap[-1], Bound):
                    if bound is not None and c.xmap[-1] is not bound:
                        return None  # two merged constraints of one term bound separately: no shared choice
                    bound, xm = c.xmap[-1], c.xmap[:-1]
                else:
                    parts, xm = (c.src,), c.xmap
                if any(isinstance(a, (Bound, Fixed)) for a in xm) or \
                        any(isinstance(v, Lit) or v.shape != parts[0].shape for v in parts):
                    return None
                term.append(((c.cat, c.off, xm), parts))
            if bound is not None and len(term) == 2 and any(prog.assembled_parts.get(c.src) is None for c in cs):
                return None  # one constraint merged, the other not: not one choice per term
            if roles is None:
                roles = [(key, list(parts)) for key, parts in term]
            elif [key for key, _ in term] != [key for key, _ in roles]:
                return None
            else:
                for (_, srcs), (_, parts) in zip(roles, term):
                    srcs += parts
        n = len(roles[0][1])
        if len(roles) == 2 and roles[0][0][0] == roles[1][0][0]:
            return None  # both on one category axis
        # the expert role: top-1 arrays over one E, not all the same array
        experts = [i for i, (_, srcs) in enumerate(roles)
                   if all(is_topk_indices(v, prog) and topk_info(v, prog)[1] is None for v in srcs)
                   and len(set(srcs)) >= 2 and len({topk_info(v, prog)[0] for v in srcs}) == 1]
        if not experts or any(len(srcs) != n for _, srcs in roles):
            return None
        b = Bound()  # (fresh: tied to nothing but the merged constraints)
        out = []
        for (cat, off, xm), srcs in roles:
            if any(v.dtype != srcs[0].dtype or v.shape != srcs[0].shape for v in srcs):
                return None
            arr = assemble_top1(prog, srcs)
            if arr is None:
                return None
            out.append(Con(cat, arr, tuple(xm) + (b,), off))
        return frozenset(out)

    def dot_product_fact(self, e, out_space=True):
        """Facts of the dot's elementwise product (product axes = out axes + one per contracted pair),
        or (out_space) of the dot's output (contracted axes bound)."""
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        lhs, rhs = e.ins
        lf, rf = self.get(lhs), self.get(rhs)
        lfree = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
        rfree = [j for j in range(rhs.ndim) if j not in rc and j not in rb]
        n_out = len(lb) + len(lfree) + len(rfree)
        lmap, rmap = dot_axis_maps(e)
        cons = set()
        for f, m in ((lf, lmap), (rf, rmap)):
            for c in f.cons:
                nc = c.remap(m.get, lambda a: None)
                if nc is not None:
                    cons.add(nc)
        binary = (lf.binary or lf.const == 1) and (rf.binary or rf.const == 1)
        if not out_space:
            return cons, n_out, len(lc), binary
        bounds = {n_out + k: Bound() for k in range(len(lc))}
        out = set()
        for c in cons:
            nc = c.remap(lambda a: a if a < n_out else None, lambda a: bounds.get(a))
            if nc is not None:
                out.add(nc)
        contracted = set(range(n_out, n_out + len(lc)))
        if lc:
            binary = binary and self._unique_sum(frozenset(cons), contracted)
        return Fact(cons=frozenset(out), binary=binary and bool(out))

def _merged_columns(cons_sets):
    """Terms each zero unless one constraint holds, the constraints alike but for the fixed coordinate of one
    index axis (`where(ids[:, j] == e, w[:, j], 0)` for several j): the sum (max, ...) of the terms is zero unless
    the constraint holds for some coordinate there, i.e. the constraint with that axis bound. Else None."""
    if len(cons_sets) < 2 or any(len(cs) != 1 for cs in cons_sets):
        return None
    cs = [next(iter(c)) for c in cons_sets]
    c0 = cs[0]
    if any(c.cat != c0.cat or c.src is not c0.src or c.off != c0.off or len(c.xmap) != len(c0.xmap) for c in cs):
        return None
    differ = [i for i in range(len(c0.xmap)) if any(c.xmap[i] != c0.xmap[i] for c in cs)]
    if len(differ) != 1 or not all(isinstance(c.xmap[differ[0]], (Fixed, Bound)) for c in cs):
        return None
    xm = list(c0.xmap)
    xm[differ[0]] = Bound()  # (fresh: no other constraint is tied to it)
    return Con(c0.cat, c0.src, tuple(xm), c0.off)


def dot_axis_maps(e):
    """Per operand: axis -> product axis (out axes, then one per contracted pair)."""
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    lhs, rhs = e.ins
    lfree = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    rfree = [j for j in range(rhs.ndim) if j not in rc and j not in rb]
    n_out = len(lb) + len(lfree) + len(rfree)
    lmap, rmap = {}, {}
    for k, (i, j) in enumerate(zip(lb, rb)):
        lmap[i] = k
        rmap[j] = k
    for k, i in enumerate(lfree):
        lmap[i] = len(lb) + k
    for k, j in enumerate(rfree):
        rmap[j] = len(lb) + len(lfree) + k
    for k, (i, j) in enumerate(zip(lc, rc)):
        lmap[i] = n_out + k
        rmap[j] = n_out + k
    return [lmap, rmap]
