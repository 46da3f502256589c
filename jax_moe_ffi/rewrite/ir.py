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
    __slots__ = ("prim", "params", "ins", "outs", "src", "ctx", "kind", "body", "subs", "unit", "id", "effects")

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

    @property
    def name(self):
        return "alias" if self.prim is None else self.prim.name

    def __repr__(self):
        return f"{self.name}({', '.join(map(repr, self.ins))}) -> {self.outs}"


class Program:
    def __init__(self, invars, outvars, eqns, flat):
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

    def uses(self, v):
        return self.consumers.get(v, [])

    def is_output(self, v):
        return any(o is v for o in self.outvars)


def program_from_closed(cj, consts=None) -> Program:
    jaxpr = cj.jaxpr if isinstance(cj, jcore.ClosedJaxpr) else cj
    consts = list(cj.consts) if isinstance(cj, jcore.ClosedJaxpr) else list(consts or [])
    invars = [Var(v.aval) for v in jaxpr.invars]
    const_atoms = [Lit(c, v.aval) for c, v in zip(consts, jaxpr.constvars)]
    exec_eqns, flat, outs = _translate(jaxpr, list(invars), const_atoms, None)
    return Program(invars, outs, exec_eqns, flat)


def _sub_jaxpr(p):
    return p.jaxpr if isinstance(p, jcore.ClosedJaxpr) else p


def _translate(jaxpr, in_atoms, const_atoms, unit):
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
            e_exec, e_flat, outs = _translate(sj, ins, sc, unit)
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
            b_exec, b_flat, b_outs = _translate(cj.jaxpr, ins, sc, ue)
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
                    se = Eqn(lax.slice_p, {"start_indices": st, "limit_indices": tuple(lim), "strides": None},
                             [ins[0]], [nv], eqn.source_info, eqn.ctx)
                    se.unit = unit
                    se.effects = False
                    exec_eqns.append(se)
                    flat.append(se)
                start += size
            continue
        outs = [Var(ov.aval) for ov in eqn.outvars]
        for ov, nv in zip(eqn.outvars, outs):
            if not isinstance(ov, jcore.DropVar):
                env[ov] = nv
        e = Eqn(eqn.primitive, params, ins, outs, eqn.source_info, eqn.ctx)
        e.unit = unit
        e.effects = bool(eqn.effects)
        if name == "scan":
            e.kind = "scan"
            e.subs = [program_from_closed(params["jaxpr"])]
        elif name in ("remat2", "checkpoint"):
            e.kind = "remat"
            e.subs = [program_from_closed(params["jaxpr"], [])]
        elif name == "cond":
            e.kind = "cond"
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


def source_line(eqn) -> str:
    """file:line (function) of the user code that made this equation."""
    from jax._src import source_info_util as siu
    try:
        return siu.summarize(eqn.src)
    except Exception:  # noqa: BLE001
        return "?"
