"""A small IR over jaxprs for the pass: renamed variables, inlined calls, two views.

* exec view (`Program.eqns`): what the interpreter binds. `jit`/`pjit`/`closed_call` bodies are inlined;
  `custom_jvp_call`/`custom_vjp_call` stay *units* (bound whole, keeping their custom derivative rules)
  unless a rewrite needs their inside; `scan`/`remat`/`cond`/`while`/`shard_map` keep their structure with their
  bodies as sub-`Program`s (rewritten independently); everything else is a primitive.
* analysis view (`Program.flat`): every unit body inlined, so facts flow through softmax/silu/relu etc.

Variables are renamed on inlining (a jitted function called twice shares one jaxpr), so every `Var` here
is produced at most once.
"""
from __future__ import annotations

import itertools

import jax
import numpy as np
from jax import lax
from jax.extend import core as jcore  # public re-exports (jax._src.core moves between versions)

INLINE_CALLS = ("jit", "pjit", "closed_call", "core_call")
UNIT_CALLS = ("custom_jvp_call", "custom_vjp_call")
STRUCTURED = ("scan", "remat2", "checkpoint", "cond", "while")

_ids = itertools.count()


class _Typed:
    """shape / dtype / ndim of something with an `aval`."""
    __slots__ = ()

    @property
    def shape(self):
        return tuple(self.aval.shape)

    @property
    def dtype(self):
        return self.aval.dtype

    @property
    def ndim(self):
        return len(self.aval.shape)


class Var(_Typed):
    __slots__ = ("aval", "id")

    def __init__(self, aval):
        self.aval = aval
        self.id = next(_ids)

    @property
    def size(self):
        return int(np.prod(self.aval.shape, dtype=np.int64))

    def __repr__(self):
        return f"v{self.id}:{self.aval.str_short()}"


class Lit(_Typed):
    """A literal or a closed-over constant (val is a scalar or an array)."""
    __slots__ = ("val", "aval")

    def __init__(self, val, aval):
        self.val = val
        self.aval = aval

    def scalar(self):
        """The Python value when this is a scalar (or all-equal) constant, else None."""
        try:
            a = np.asarray(self.val)
        except Exception:  # noqa: BLE001
            return None
        if a.size == 0:
            return None
        if a.ndim == 0:
            return a.item()
        flat = a.reshape(-1)
        if np.all(flat == flat[0]):
            return flat[0].item()
        return None

    def __repr__(self):
        return f"lit({self.scalar()})"


class Eqn:
    """kind: prim | unit | alias | scan | remat | cond | while | shard_map | opaque."""
    __slots__ = ("prim", "params", "ins", "outs", "src", "ctx", "kind", "body", "subs", "unit", "id", "effects",
                 "orig", "unrolled", "iteration", "callers")

    def __init__(self, prim, params, ins, outs, src, ctx, kind="prim"):
        self.prim = prim
        self.params = params
        self.ins = ins
        self.outs = outs
        self.src = src
        self.ctx = ctx
        self.kind = kind
        self.body = None  # unit: exec view of the inlined body
        self.subs = None  # structured: list of sub-Programs
        self.unit = None  # the innermost unit this (inlined) eqn belongs to
        self.id = next(_ids)
        self.effects = False  # has side effects: always evaluated (never dead-code eliminated)
        self.orig = None  # scan: the jaxpr equation it was translated from (the key for unrolling it)
        self.unrolled = None  # made by unrolling a scan (or inlining a cond): that scan's (cond's) `orig`
        self.iteration = None  # ... in its iteration number `iteration`
        self.callers = ()  # source infos of the inlined calls it sits in, innermost first (see source_line)

    @property
    def name(self):
        return "alias" if self.prim is None else self.prim.name

    def __repr__(self):
        return f"{self.name}({', '.join(map(repr, self.ins))}) -> {self.outs}"


class Program:
    def __init__(self, invars, outvars, eqns, flat):
        self.source = None  # (jaxpr, consts) it was translated from: to translate it again, unrolling loops
        self.inlined_conds = []  # (cond id, predicate, outputs) of the conds translated as their second branch
        self.invars = invars
        self.outvars = outvars
        self.eqns = eqns
        self.flat = flat
        self.producer = {}
        self.consumers = {}
        for e in flat:
            for o in e.outs:
                self.producer[o] = e
            for a in e.ins:
                if isinstance(a, Var):
                    self.consumers.setdefault(a, []).append(e)
        self.pos = {e: i for i, e in enumerate(flat)}
        self.assembled = {}  # tuple of top-1 index arrays -> their [..., n] concatenation (assemble_top1)
        self.outer = {}  # input Var -> (Var, Program): the enclosing program's value it is (facts.outer_value)
        self.assembled_parts = {}  # ... and back

    def uses(self, v):
        return self.consumers.get(v, [])

    def is_output(self, v):
        return any(o is v for o in self.outvars)


def assemble_top1(prog, sources):
    """The [..., n] int array with the top-1 index arrays `sources` (argmaxes, all of one shape and dtype) along a
    new last axis, made by equations inserted after the later producer, in its unit (once per program and tuple
    of sources). The pass reads a gate summed from one-hot terms of separate argmaxes (`g * one_hot(i1) + g *
    one_hot(i2)`) as one id array whose entries may repeat; the rewritten program reads that array, and the
    scheduler drops the new equations where no site does. None where the producers sit in different units."""
    key = tuple(sources)
    if key in prog.assembled:
        return prog.assembled[key]
    made_here = [q for q in (prog.producer.get(v) for v in sources) if q is not None]
    if len({q.unit for q in made_here}) > 1 or (len(made_here) < len(sources) and made_here and
                                                made_here[0].unit is not None):
        return None
    # after the later argmax; at the start where every source is an input of this (body) program
    anchor = max(made_here, key=lambda q: prog.pos[q]) if made_here else None
    exec_list = prog.eqns if anchor is None or anchor.unit is None else anchor.unit.body
    if anchor is not None and anchor not in exec_list:
        return None
    nd = sources[0].ndim
    # traced rather than written by hand: the primitives' parameters change between jax versions
    cj = jax.make_jaxpr(lambda *xs: lax.concatenate([lax.expand_dims(x, (nd,)) for x in xs], nd))(
        *[jax.ShapeDtypeStruct(v.shape, v.dtype) for v in sources])
    env = dict(zip(cj.jaxpr.invars, sources))
    made = []
    for eqn in cj.jaxpr.eqns:
        outs = [Var(o.aval) for o in eqn.outvars]
        q = Eqn(eqn.primitive, eqn.params, [env[a] for a in eqn.invars], outs,
                eqn.source_info if anchor is None else anchor.src, eqn.ctx if anchor is None else anchor.ctx)
        if anchor is not None:
            q.unit, q.callers, q.unrolled, q.iteration = anchor.unit, anchor.callers, anchor.unrolled, \
                anchor.iteration
        env.update(zip(eqn.outvars, outs))
        made.append(q)
    out = env[cj.jaxpr.outvars[0]]
    at = 0 if anchor is None else exec_list.index(anchor) + 1
    exec_list[at:at] = made
    at = 0 if anchor is None else prog.flat.index(anchor) + 1
    prog.flat[at:at] = made
    for q in made:
        for o in q.outs:
            prog.producer[o] = q
        for a in q.ins:
            prog.consumers.setdefault(a, []).append(q)
    prog.pos = {e: i for i, e in enumerate(prog.flat)}
    prog.assembled[key] = out
    prog.assembled_parts[out] = key
    return out


def program_from_closed(cj, consts=None, unroll=frozenset()) -> Program:
    """unroll: ids of `scan` equations (anywhere in cj, nested bodies included) to translate as their
    iterations one after another (see `_unroll_scan`), and of two-branch `cond`s whose first branch returns
    zeros, to translate as their second branch (see `_inline_cond`; the Plan checks that this is exact)."""
    jaxpr = cj.jaxpr if isinstance(cj, jcore.ClosedJaxpr) else cj
    consts = list(cj.consts) if isinstance(cj, jcore.ClosedJaxpr) else list(consts or [])
    invars = [Var(v.aval) for v in jaxpr.invars]
    const_atoms = [Lit(c, v.aval) for c, v in zip(consts, jaxpr.constvars)]
    ctx = _Ctx(unroll)
    exec_eqns, flat, outs = _translate(jaxpr, list(invars), const_atoms, None, ctx)
    prog = Program(invars, outs, exec_eqns, flat)
    prog.source = (jaxpr, consts)
    prog.inlined_conds = ctx.inlined_conds
    return prog


class _Ctx:
    """Translation options: which scans to unroll, and whether scalar integer arithmetic on literals is
    folded (inside an unrolled body, where the loop counter becomes a literal per iteration)."""

    def __init__(self, unroll, fold=None, inlined_conds=None):
        self.unroll = unroll
        self.fold = fold  # the id of the scan being unrolled, or None
        self.memo = {}  # (jaxpr equation, its inputs) -> outputs: what every iteration computes alike, once
        self.inlined_conds = [] if inlined_conds is None else inlined_conds  # (cond id, predicate, outputs)


def _atom_key(a):
    if isinstance(a, Var):
        return ("v", a.id)
    v = a.scalar() if a.ndim == 0 else None
    return ("l", str(a.dtype), v) if v is not None else ("l", id(a.val))


MAX_UNROLL = 256  # longest scan the pass unrolls to look for a per-expert loop (E <= 256 in today's models)
_FOLDABLE = {"add", "sub", "mul", "neg", "max", "min", "lt", "le", "gt", "ge", "eq", "ne", "select_n", "and",
             "or", "not", "convert_element_type", "rem", "div", "clamp", "squeeze", "broadcast_in_dim", "reshape"}


def _folded(name, params, prim, ins, outvars):
    """The literal outputs of a small integer / bool computation on literals, else None. Only integers:
    exact whoever evaluates them, so folding them here cannot change a result."""
    if name not in _FOLDABLE or not all(isinstance(a, Lit) for a in ins):
        return None
    if any(np.prod(v.aval.shape, dtype=np.int64) > 64 or not (np.issubdtype(v.aval.dtype, np.integer)
                                                            or v.aval.dtype == np.bool_) for v in outvars):
        return None
    with jax.ensure_compile_time_eval():
        r = prim.bind(*[a.val for a in ins], **params)
    r = r if prim.multiple_results else [r]
    return [Lit(np.asarray(x), v.aval) for x, v in zip(r, outvars)]


def _static_dynamic_slice(params, ins):
    """`dynamic_slice` whose start indices are literals, as the `slice` it is (starts clamped as
    dynamic_slice clamps them), else None."""
    idx = ins[1:]
    if not all(isinstance(a, Lit) and a.ndim == 0 for a in idx):
        return None
    shape, sizes = ins[0].shape, params["slice_sizes"]
    st = tuple(int(min(max(int(np.asarray(a.val)), 0), n - s)) for a, n, s in zip(idx, shape, sizes))
    return {"start_indices": st, "limit_indices": tuple(a + s for a, s in zip(st, sizes)), "strides": None}


def _sub_jaxpr(p):
    return p.jaxpr if isinstance(p, jcore.ClosedJaxpr) else p


def _translate(jaxpr, in_atoms, const_atoms, unit, ctx):
    env = {}

    def read(a):
        if isinstance(a, jcore.Literal):
            return Lit(a.val, a.aval)
        return env[a]

    for v, a in zip(jaxpr.constvars, const_atoms):
        env[v] = a
    for v, a in zip(jaxpr.invars, in_atoms):
        env[v] = a
    exec_eqns, flat = [], []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [read(a) for a in eqn.invars]
        params = eqn.params
        if name in INLINE_CALLS and ("jaxpr" in params or "call_jaxpr" in params):
            sub = params.get("jaxpr", params.get("call_jaxpr"))
            sj = _sub_jaxpr(sub)
            sc = [Lit(c, v.aval) for c, v in zip(getattr(sub, "consts", ()), sj.constvars)]
            e_exec, e_flat, outs = _translate(sj, ins, sc, unit, ctx)
            for q in e_flat:
                q.callers += (eqn.source_info,)
            exec_eqns += e_exec
            flat += e_flat
            for ov, a in zip(eqn.outvars, outs):
                env[ov] = a
            continue
        if name in UNIT_CALLS:
            cj = params["call_jaxpr"]
            ue = Eqn(eqn.primitive, params, ins, None, eqn.source_info, eqn.ctx, kind="unit")
            ue.unit = unit
            ue.effects = bool(eqn.effects)
            sc = [Lit(c, v.aval) for c, v in zip(cj.consts, cj.jaxpr.constvars)]
            b_exec, b_flat, b_outs = _translate(cj.jaxpr, ins, sc, ue, ctx)
            produced = {o for e in b_flat for o in e.outs}
            outs, seen = [], set()
            for ov, a in zip(eqn.outvars, b_outs):
                if isinstance(a, Var) and a in produced and a not in seen:
                    seen.add(a)
                    outs.append(a)
                else:  # pass-through input, literal or duplicate: an identity eqn
                    nv = Var(ov.aval)
                    al = Eqn(None, {}, [a], [nv], eqn.source_info, eqn.ctx, kind="alias")
                    al.unit = ue
                    b_exec.append(al)
                    b_flat.append(al)
                    outs.append(nv)
            ue.outs = outs
            ue.body = b_exec
            for ov, a in zip(eqn.outvars, outs):
                env[ov] = a
            exec_eqns.append(ue)
            flat += b_flat
            continue
        if name == "split":  # one `slice` per piece: a piece is then what `x[:, e:e+1]` is (an expert's column)
            nd, ax, start = ins[0].ndim, params["axis"] % ins[0].ndim, 0
            for ov, size in zip(eqn.outvars, params["sizes"]):
                if not isinstance(ov, jcore.DropVar):
                    nv = env[ov] = Var(ov.aval)
                    lim = list(ins[0].shape)
                    lim[ax] = start + size
                    st = tuple(start if a == ax else 0 for a in range(nd))
                    _emit(lax.slice_p, {"start_indices": st, "limit_indices": tuple(lim), "strides": None},
                          [ins[0]], [nv], eqn, unit, exec_eqns, flat)
                start += size
            continue
        if name == "cond" and id(eqn) in ctx.unroll and zero_first_branch(eqn):
            outs = _inline_cond(eqn, ins, unit, ctx, exec_eqns, flat)
            for ov, a in zip(eqn.outvars, outs):
                if not isinstance(ov, jcore.DropVar):
                    env[ov] = a
            continue
        if name == "scan" and id(eqn) in ctx.unroll:
            for ov, a in zip(eqn.outvars, _unroll_scan(eqn, ins, unit, ctx, exec_eqns, flat)):
                if not isinstance(ov, jcore.DropVar):
                    env[ov] = a
            continue
        if ctx.fold is not None:
            lits = _folded(name, params, eqn.primitive, ins, eqn.outvars)
            if lits is not None:
                for ov, a in zip(eqn.outvars, lits):
                    env[ov] = a
                continue
            if name == "dynamic_slice" and (sp := _static_dynamic_slice(params, ins)) is not None:
                nv = env[eqn.outvars[0]] = Var(eqn.outvars[0].aval)
                _emit(lax.slice_p, sp, [ins[0]], [nv], eqn, unit, exec_eqns, flat)
                continue
        key = None
        if ctx.fold is not None and not eqn.effects and name not in STRUCTURED \
                and not any(isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)) for v in params.values()):
            # loop-invariant code (`gate.T` in the body) made once, as a Python loop computing it before the
            # loop would: then every iteration slices the same array. Same inputs, same op: same values.
            key = (id(eqn), tuple(_atom_key(a) for a in ins))
            if key in ctx.memo:
                for ov, a in zip(eqn.outvars, ctx.memo[key]):
                    if not isinstance(ov, jcore.DropVar):
                        env[ov] = a
                continue
        outs = [Var(ov.aval) for ov in eqn.outvars]
        if key is not None:
            ctx.memo[key] = outs
        for ov, nv in zip(eqn.outvars, outs):
            if not isinstance(ov, jcore.DropVar):
                env[ov] = nv
        e = Eqn(eqn.primitive, params, ins, outs, eqn.source_info, eqn.ctx)
        e.unit = unit
        e.effects = bool(eqn.effects)
        if name == "scan":
            e.kind = "scan"
            e.orig = id(eqn)
            e.subs = [program_from_closed(params["jaxpr"])]
        elif name in ("remat2", "checkpoint"):
            e.kind = "remat"
            e.subs = [program_from_closed(params["jaxpr"], [])]
        elif name == "cond":
            e.kind = "cond"
            e.orig = id(eqn)
            e.subs = [program_from_closed(b) for b in params["branches"]]
        elif name == "while":
            e.kind = "while"
            e.subs = [program_from_closed(params["cond_jaxpr"]), program_from_closed(params["body_jaxpr"])]
        elif name == "shard_map" and {"mesh", "in_specs", "out_specs", "jaxpr"} <= set(params):
            e.kind = "shard_map"
            e.subs = [program_from_closed(params["jaxpr"], [])]
        elif name.startswith("scatter"):
            pass  # scatter-add / -mul / -min / -max carry their combiner as `update_jaxpr`: a plain op, not a call
        elif any(isinstance(p, (jcore.Jaxpr, jcore.ClosedJaxpr)) for p in params.values()):
            e.kind = "opaque"
        exec_eqns.append(e)
        flat.append(e)
    outs = [read(a) for a in jaxpr.outvars]
    return exec_eqns, flat, outs


def _emit(prim, params, ins, outs, eqn, unit, exec_eqns, flat):
    """Appends an equation the translation makes (a piece of `split`, an unrolled scan's slicing), with the
    source position of the jaxpr equation `eqn` it stands for."""
    q = Eqn(prim, params, ins, outs, eqn.source_info, eqn.ctx)
    q.unit = unit
    exec_eqns.append(q)
    flat.append(q)
    return q


def scan_split(params, ins):
    """(num_consts, num_carry) of a scan: explicit params up to jax 0.10, a flat-tree `ft_in` from 0.11."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = (list(t) for t in params["ft_in"].update(list(ins)).unpack())
    return len(consts), len(carry)


def _unroll_scan(eqn, ins, unit, ctx, exec_eqns, flat):
    """A `scan` translated as its iterations in order: iteration i reads row i of each xs (a `slice` +
    `squeeze`, or a literal when the xs is a literal or an `iota`, e.g. `jnp.arange(E)`), the carry flows from
    one iteration's body to the next, and the ys rows are stacked back (`concatenate`). The same operations in
    the same order as the loop, so the same values; the loop counter of a `fori_loop` becomes a literal per
    iteration, and with it the `dynamic_slice`s it indexes (folded to `slice`s): what an unrolled Python loop
    over the experts looks like."""
    p = eqn.params
    (nc, nk), length = scan_split(p, ins), p["length"]
    bj = p["jaxpr"].jaxpr
    bconsts = [Lit(c, v.aval) for c, v in zip(p["jaxpr"].consts, bj.constvars)]
    consts, carry, xs = list(ins[:nc]), list(ins[nc:nc + nk]), list(ins[nc + nk:])
    made = {o: q for q in flat for o in q.outs}
    sub = _Ctx(ctx.unroll, fold=id(eqn), inlined_conds=ctx.inlined_conds)
    ys = [[None] * length for _ in bj.outvars[nk:]]
    for i in (range(length - 1, -1, -1) if p["reverse"] else range(length)):
        row = []
        for x in xs:
            aval = x.aval.update(shape=x.shape[1:])
            q = made.get(x) if isinstance(x, Var) else None
            if isinstance(x, Lit):
                row.append(Lit(np.asarray(x.val)[i], aval))
            elif q is not None and q.name == "iota" and x.ndim == 1 and np.issubdtype(x.dtype, np.integer):
                row.append(Lit(np.asarray(i, x.dtype), aval))
            else:
                piece = Var(x.aval.update(shape=(1,) + x.shape[1:]))
                _emit(lax.slice_p, {"start_indices": (i,) + (0,) * (x.ndim - 1),
                                    "limit_indices": (i + 1,) + x.shape[1:], "strides": None},
                      [x], [piece], eqn, unit, exec_eqns, flat)
                row.append(Var(aval))
                _emit(lax.squeeze_p, {"dimensions": (0,)}, [piece], [row[-1]], eqn, unit, exec_eqns, flat)
        n0 = len(flat)
        e_exec, e_flat, outs = _translate(bj, consts + carry + row, bconsts, unit, sub)
        for q in e_flat:
            if q.unrolled is None:
                q.unrolled, q.iteration = id(eqn), i
        exec_eqns += e_exec
        flat += e_flat
        made.update({o: q for q in flat[n0:] for o in q.outs})
        carry = outs[:nk]
        for y, o in zip(ys, outs[nk:]):
            y[i] = o
    carry = [_updates_as_concatenate(c, eqn, unit, exec_eqns, flat) or c for c in carry]
    stacked = []
    for y, ov in zip(ys, eqn.outvars[nk:]):
        if isinstance(ov, jcore.DropVar):
            stacked.append(None)
            continue
        rows = []
        for o in y:
            r = Var(o.aval.update(shape=(1,) + o.shape))
            _emit(lax.broadcast_in_dim_p, {"shape": (1,) + o.shape, "broadcast_dimensions": tuple(range(1, o.ndim + 1)),
                                           "sharding": None}, [o], [r], eqn, unit, exec_eqns, flat)
            rows.append(r)
        stacked.append(Var(ov.aval))
        _emit(lax.concatenate_p, {"dimension": 0}, rows, [stacked[-1]], eqn, unit, exec_eqns, flat)
    return carry + stacked


def zero_first_branch(eqn) -> bool:
    """A two-branch `cond` (lax.cond(pred, f, g): branches (g, f)) whose first branch returns only zeros, and
    whose second has no side effects (read as that branch, it runs whatever the predicate)."""
    branches = eqn.params["branches"]
    if len(branches) != 2 or branches[1].effects or eqn.effects:
        return False
    bj = branches[0].jaxpr
    made = {o: q for q in bj.eqns for o in q.outvars}
    for v in bj.outvars:
        if isinstance(v, jcore.Literal):
            if np.any(np.asarray(v.val)):
                return False
            continue
        q = made.get(v)
        if q is None or q.primitive.name != "broadcast_in_dim" or not isinstance(q.invars[0], jcore.Literal) \
                or np.any(np.asarray(q.invars[0].val)):
            return False
    return True


def _inline_cond(eqn, ins, unit, ctx, exec_eqns, flat):
    """A `cond` whose first branch returns zeros, translated as its second branch, the predicate recorded: the
    two agree whenever the second branch's value is zero where the predicate is false (e.g. an expert's gated
    output under `any(ids == e)`), which the Plan checks before it uses this translation."""
    branch = eqn.params["branches"][1]
    bconsts = [Lit(c, v.aval) for c, v in zip(branch.consts, branch.jaxpr.constvars)]
    e_exec, e_flat, outs = _translate(branch.jaxpr, list(ins[1:]), bconsts, unit, ctx)
    if ctx.fold is None:  # (inside an unrolled loop, its equations belong to the loop's iteration)
        for q in e_flat:
            if q.unrolled is None:
                q.unrolled = id(eqn)
    exec_eqns += e_exec
    flat += e_flat
    ctx.inlined_conds.append((id(eqn), ins[0], outs))
    return outs


def _updates_as_concatenate(v, eqn, unit, exec_eqns, flat):
    """A carry that the unrolled iterations fill by `dynamic_update_slice` at literal offsets (`buf.at[:, e]
    .set(y_e)` in a scan over the experts), each piece exactly once over a buffer of zeros, is the
    `concatenate` of the pieces: returns it (the updates removed), else None."""
    made = {o: q for q in flat for o in q.outs}
    chain, cur = [], v
    while isinstance(cur, Var) and cur in made and made[cur].name == "dynamic_update_slice":
        chain.append(made[cur])
        cur = made[cur].ins[0]
    q0 = made.get(cur) if isinstance(cur, Var) else None
    zero = (isinstance(cur, Lit) and not np.any(np.asarray(cur.val))) or (
        q0 is not None and q0.name == "broadcast_in_dim" and isinstance(q0.ins[0], Lit)
        and not np.any(np.asarray(q0.ins[0].val)))
    if len(chain) < 2 or not zero:
        return None
    axes, pieces = set(), []
    for q in chain:
        upd, idx = q.ins[1], q.ins[2:]
        if not all(isinstance(a, Lit) and a.ndim == 0 for a in idx):
            return None
        st = [int(np.asarray(a.val)) for a in idx]
        part = [a for a in range(v.ndim) if upd.shape[a] != v.shape[a] or st[a] != 0]
        if len(part) != 1 or not 0 <= st[part[0]] <= v.shape[part[0]] - upd.shape[part[0]]:
            return None
        axes.add(part[0])
        pieces.append((st[part[0]], upd))
    if len(axes) != 1:
        return None
    ax = axes.pop()
    pieces.sort(key=lambda p: p[0])
    at = 0
    for st, upd in pieces:
        if st != at:
            return None  # a gap or an overwrite: not a plain concatenation
        at += upd.shape[ax]
    inner = {q.outs[0] for q in chain[1:]}
    if at != v.shape[ax] or any(a in inner for q in flat if q not in chain for a in q.ins):
        return None
    drop = set(chain)
    flat[:] = [q for q in flat if q not in drop]
    exec_eqns[:] = [q for q in exec_eqns if q not in drop]
    out = Var(v.aval)
    _emit(lax.concatenate_p, {"dimension": ax}, [u for _, u in pieces], [out], eqn, unit, exec_eqns, flat)
    return out


# frameworks' op and layer wrappers (keras.ops over jax.numpy, einops, flax / equinox / haiku layers): the
# innermost frame outside them is the model's own line
_WRAPPER_DIRS = ("/keras/src/backend/", "/keras/src/ops/", "/einops/", "/flax/linen/", "/flax/nnx/", "/flax/core/",
                 "/equinox/", "/haiku/")


def source_line(eqn) -> str:
    """file:line (function) of the user code that made this equation (past frameworks' wrappers). An equation
    inside a jitted library function (jnp.take_along_axis) may carry no user frame of its own (JAX traced the
    function once, elsewhere): then the line that called the function."""
    from jax._src import source_info_util as siu
    try:
        first = None
        for src in (eqn.src,) + tuple(eqn.callers):
            for f in siu.user_frames(src.traceback):
                first = first or f
                if not any(d in f.file_name.replace("\\", "/") for d in _WRAPPER_DIRS):
                    return _frame_line(f)
        return _frame_line(first) if first is not None else siu.summarize(eqn.src)
    except Exception:  # noqa: BLE001
        return "?"


def _frame_line(f) -> str:
    col = f":{f.start_column}" if f.start_column else ""
    return f"{f.file_name}:{f.start_line}{col} ({f.function_name})"
