"""Analysis plans and the interpreter that evaluates a program with its sites rewritten.

The interpreter binds primitives one by one (like `jax.core.eval_jaxpr`), so the rewritten function
composes with jit/grad/vmap; `scan`/`remat`/`cond`/`while`/`shard_map` whose bodies hold sites are rebuilt
with `lax.scan`/`jax.checkpoint`/`lax.switch`/`lax.while_loop`/`jax.shard_map` around the rewritten body. Units
(custom_jvp/vjp calls) are bound whole, keeping their derivative rules, unless a site needs their inside.
Only what the outputs need is evaluated, so the dense expert compute a site replaces never runs.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from jax import lax
from jax._src import source_info_util as siu

from jax_moe_ffi.ops import topk as TK
from jax_moe_ffi.rewrite import emit as EM
from jax_moe_ffi.rewrite import gathered as GD
from jax_moe_ffi.rewrite import ragged as RG
from jax_moe_ffi.rewrite import facts as F
from jax_moe_ffi.rewrite.facts import Facts
from jax_moe_ffi.rewrite.ir import MAX_UNROLL, Lit, Var, program_from_closed, scan_split, source_line
from jax_moe_ffi.rewrite.match import Analyzer, upstream


class Plan:
    def __init__(self, prog, mode, path="", options=None, in_unit=False, loop_body=False, outer_router=False):
        self.prog = prog
        self.mode = mode
        self.path = path
        self.loop_body = loop_body  # the body of a scan or while loop (see remat_prevent_cse)
        self.options = dict(options or {})  # streams / offload, read by emit
        self.facts = Facts(prog)
        self.outer_router = outer_router
        an = Analyzer(prog, self.facts, mode, outer_router)
        self.sites, self.misses = an.run()
        if an.loop_scans:
            self._try_unrolled(an.loop_scans)
        prog = self.prog
        for s in self.sites:
            s.path = path
        for m in self.misses:
            m["path"] = path
        # family (5): ragged_dot equations the interpreter binds -- not inside a custom_jvp/vjp unit, which is
        # bound whole with its own derivative rule (e.g. this package's ops, whose XLA fallback is a ragged_dot)
        self.ragged = {}
        for e in ([] if in_unit else prog.eqns):
            if e.kind == "prim" and e.name == RG.PRIMITIVE:
                mode_, why = RG.classify(e)
                if mode_ is not None:
                    self.ragged[e] = mode_
                else:
                    self.misses.append({"reason": why, "source": source_line(e), "op": e.name, "at": None,
                                        "shapes": [tuple(v.shape) for v in e.ins], "path": path})
        self.gathered = {} if in_unit else self._gathered_dots()
        self.subplans = {}
        routed = outer_router or any(F.is_router_eqn(e, prog) for e in prog.flat)
        for e in prog.flat:
            if e.subs and e.kind in ("scan", "remat", "cond", "while", "shard_map"):
                _link_outer_values(e, prog)
                self.subplans[e] = [Plan(sp, mode, f"{path}{e.kind}[{i}]/" if len(e.subs) > 1 else
                                         f"{path}{e.kind}/", self.options, in_unit or e.unit is not None,
                                         e.kind in ("scan", "while"), routed)
                                    for i, sp in enumerate(e.subs)]
        self.expanded = set()
        self.site_at = {}
        for s in list(self.sites):
            units = set()
            for e in s.region + [s.root]:
                units |= _chain(e.unit)
            for v in self.site_requires(s):
                pe = prog.producer.get(v)
                if pe is not None and pe.unit is not None and v not in pe.unit.outs:
                    units |= _chain(pe.unit)
            bad = [u for u in units if u.name == "custom_vjp_call"]
            if bad:
                self.sites.remove(s)
                self.misses.append({"reason": "the site needs values inside a custom_vjp function (its gradient "
                                              "rule would be lost)", "source": s.source, "op": s.root.name,
                                    "at": None, "shapes": [], "path": path})
        for s in self.sites:
            self.site_at[s.root] = s
            for e in s.region + [s.root]:
                self._expand(e.unit)
            for v in self.site_requires(s):
                pe = prog.producer.get(v)
                if pe is not None and pe.unit is not None and v not in pe.unit.outs:
                    self._expand(pe.unit)

    def _try_unrolled(self, cands):
        """Scans / fori_loops over the experts, and conds on the router's choices whose other branch is zeros,
        translated again: the loops unrolled, the conds as their nonzero branch. That program is the one
        rewritten when its sites read each loop's iterations as their experts, no expert GEMM of these forms
        is left to run, and each cond's branch is zero wherever its predicate `any(ids == e)` is false (so the
        cond is the branch itself); otherwise they stay as written and their near-miss says why."""
        for e in cands:
            if e.kind == "scan" and e.params["length"] > MAX_UNROLL:
                self._amend_scan_miss(e, f"{e.params['length']} iterations, more than the {MAX_UNROLL} the pass "
                                         "unrolls")
        keys = {e.orig: e for e in cands if e.kind == "cond" or e.params["length"] <= MAX_UNROLL}
        if not keys or self.prog.source is None:
            return
        for _ in range(2):  # a cond inside an unrolled loop is seen (and added) in the second round
            cands = list(keys.values())
            prog2 = program_from_closed(*self.prog.source, unroll=frozenset(keys))
            facts2 = Facts(prog2)
            an2 = Analyzer(prog2, facts2, self.mode, self.outer_router)
            sites2, misses2 = an2.run()
            more = {e.orig: e for e in an2.loop_scans if e.kind == "cond" and e.orig not in keys}
            if not more:
                break
            keys.update(more)
        left = [q for q in _still_evaluated(prog2, sites2) if q.unrolled in keys and q.name == "dot_general"]
        read = [_iterations_read_as_experts(s, prog2, keys) for s in sites2]
        loops = {k_ for k_, e in keys.items() if e.kind == "scan"}
        conds_ok = all(_zero_unless_chosen(an2, pred, outs) for _, pred, outs in prog2.inlined_conds)
        inlined = {cid for cid, _, _ in prog2.inlined_conds}
        if sites2 and not left and None not in read and set().union(*read) == loops and conds_ok \
                and set(keys) - loops <= inlined:
            self.prog, self.facts, self.sites, self.misses = prog2, facts2, sites2, misses2
            for s in sites2:
                touched = {q.unrolled for q in s.region + [s.root] if q.unrolled in keys}
                for k_ in sorted(touched & loops, key=list(keys).index):
                    s.notes.append(f"the lax.scan / fori_loop over the experts at {source_line(keys[k_])} "
                                   f"({keys[k_].params['length']} iterations) is read as the unrolled loop it "
                                   "computes: the same operations in the same order")
            if prog2.inlined_conds and sites2:
                sites2[0].notes.append(f"{len(prog2.inlined_conds)} lax.cond(any(ids == e), expert e, zeros) read as "
                                       "the expert's branch: it is zero wherever no token chose expert e (its gate "
                                       "column), so the cond only skipped work the rewrite skips anyway")
            return
        src = {source_line(q) for q in prog2.flat if q.unrolled in keys}
        why = [m["reason"] for m in misses2 if m["source"] in src]
        if not conds_ok:
            why = ["a cond's branch is not zero wherever its predicate is false (not `any(ids == e)` on the ids "
                   "that gate it)"] + why
        for e in cands:
            if e.kind == "cond" and e.orig not in inlined:
                self._amend_scan_miss(e, "not read as its expert branch: its first branch is not zeros, or the "
                                         "second has side effects")
                continue
            self._amend_scan_miss(e, ("read as its unrolled iterations, it is not a per-expert loop the pass "
                                      "rewrites" if e.kind == "scan" else "read as its expert branch, not rewritten")
                                  + (f": {why[0]}" if why else ""))

    def _gathered_dots(self):
        """Family (6): dot_generals of expert weights gathered per (token, choice) by the router's ids, swapped
        for a grouped matmul of the rows sorted by expert. The gather's near-miss (match._unsupported_forms) is
        dropped when every use of the gathered copy is swapped, and says why where one is not."""
        prog = self.prog
        experts = F.router_sizes(prog)
        if not experts:
            return {}
        covered = {q for s in self.sites for q in s.region + [s.root]}

        def from_router(v):
            return upstream(prog, v, lambda x, e: F.is_topk_indices(x, prog), 200)

        out, why = {}, {}
        for e in prog.eqns:
            if e.kind != "prim" or e in covered:
                continue
            r = GD.classify(e, prog, from_router, experts)
            if r is None:
                continue
            g, reason, q = r
            if g is not None:
                out[e] = g
            else:
                why.setdefault(q, reason)
        # a swapped dot is no near-miss of another family either (e.g. a [T, k, K, N] copy whose sizes happen to
        # match the router's E reads as expert-stacked)
        swapped_src = {source_line(e) for e in out}
        kept_src = {source_line(e) for e in prog.flat if e.name == "dot_general" and e not in out}
        self.misses = [m for m in self.misses if not (m["op"] == "dot_general" and m["source"] in swapped_src
                                                      and m["source"] not in kept_src)]
        for q in {g.gather for g in out.values()} | set(why):
            src = source_line(q)
            swapped = all(u in out for u in prog.uses(q.outs[0])) and q not in why
            for m in list(self.misses):
                if m["op"] == "gather" and m["source"] == src:
                    if swapped:
                        self.misses.remove(m)
                    elif q in why:
                        m["reason"] = why[q]
        return out

    def _amend_scan_miss(self, e, why):
        src = source_line(e)
        for m in self.misses:
            if m["source"] == src and m["op"] == e.name:
                m["reason"] += f"; {why}"

    def _expand(self, u):
        while u is not None:
            self.expanded.add(u)
            u = u.unit

    def site_requires(self, s):
        return site_requires(s)

    def has_sites(self):
        return bool(self.sites or self.ragged or self.gathered) or \
            any(p.has_sites() for ps in self.subplans.values() for p in ps)

    def all_plans(self):
        """This plan and its sub-plans (scan / remat / cond bodies), depth first."""
        out = [self]
        for ps in self.subplans.values():
            for p in ps:
                out += p.all_plans()
        return out

    def all_sites(self):
        return [s for p in self.all_plans() for s in p.sites]

    def all_misses(self):
        return [m for p in self.all_plans() for m in p.misses]


def _link_outer_values(e, prog):
    """Marks a structured node's body inputs that are its operands unchanged (facts.outer_value): every input of
    a jax.checkpoint body, a cond branch's operands (after the branch index), a scan's constants. Not a scan's
    carry or sliced inputs, a while loop's or a shard_map's (a per-device block)."""
    if e.kind == "remat":
        pairs = [(e.subs[0], e.ins)]
    elif e.kind == "cond":
        pairs = [(sp, e.ins[1:]) for sp in e.subs]
    elif e.kind == "scan":
        pairs = [(e.subs[0], e.ins[:scan_split(e.params, e.ins)[0]])]
    else:
        return
    for sp, outer in pairs:
        for inner, v in zip(sp.invars, outer):
            if isinstance(v, Var) and tuple(inner.shape) == tuple(v.shape) and inner.dtype == v.dtype:
                sp.outer[inner] = (v, prog)


def site_requires(s):
    """The values a site's emitted code reads (what the dense region it replaces needed from outside)."""
    req = [s.I] + ([s.S] if s.S is not None else [])
    req += [v for v, kd in s.kinds.items() if kd not in ("iota", "vexp")]
    req += [v for v in s.extra_terms if isinstance(v, Var)]
    for v, kd in s.kinds.items():
        if kd == "vexp":
            st = s.stacked[v]
            req += st[1] if st[0] == "list" else [st[1]]
    return [v for v in req if isinstance(v, Var)]


def _iterations_read_as_experts(site, prog, keys):
    """The unrolled loops (keys) whose iterations the site reads as its experts: some per-expert value list of
    the site (a loop site's terms, a stack's pieces) holds one value from every iteration of the loop, in
    order. None if the site touches an unrolled loop without reading it so. (A scan over layers that happens
    to have E iterations, each layer with its own MoE site, is not a loop over the experts: it stays rolled,
    and the sites inside its body are rewritten there.)"""
    def iteration(v, key):
        q = prog.producer.get(v)
        return q.iteration if q is not None and q.unrolled == key else None

    lists = [st[1] for st in site.stacked.values() if st[0] == "list"]
    out = set()
    loops = {k_ for k_, e in keys.items() if e.kind == "scan"}
    for key in {q.unrolled for q in site.region + [site.root]} & loops:
        every = list(range(keys[key].params["length"]))
        if not any([iteration(v, key) for v in vs] == every for vs in lists):
            return None
        out.add(key)
    return out


def _zero_unless_chosen(an, pred, outs):
    """Can each output stand for the cond's (zero) value wherever `pred` is false? pred must be `any(ids == e)`
    over all of the top-k id array `ids` (a literal e), and each output zero unless expert e is among a token's
    choices (a column constraint of the same ids and e), or only used multiplied by such a value (the gate
    column applied after the cond): if no token chose e, the cond's zeros and the branch give the same."""
    from jax_moe_ffi.rewrite import loops as LP
    prog = an.prog

    def producer(v, name):
        q = prog.producer.get(v) if isinstance(v, Var) else None
        return q if q is not None and q.name == name else None

    q = producer(pred, "convert_element_type")
    q = producer(q.ins[0], "reduce_or") if q is not None else None
    if q is None or tuple(sorted(q.params["axes"])) != tuple(range(q.ins[0].ndim)):
        return False
    q = producer(q.ins[0], "eq")
    if q is None:
        return False
    ids, lit = (q.ins[0], q.ins[1]) if isinstance(q.ins[1], Lit) else (q.ins[1], q.ins[0])
    if not isinstance(lit, Lit) or lit.ndim != 0 or not isinstance(ids, Var):
        return False
    e = lit.scalar()

    def zero_unless_chosen(v):
        col = LP._col(an, v)
        return col is not None and col[0] is ids and col[1] == e

    for v in outs:
        if isinstance(v, Lit) and not np.any(np.asarray(v.val)):
            continue
        # the branch is zero, or every use multiplies it into such a value (the gate column applied after the
        # cond): then the product is zero for the branch, as it is for the cond's zeros (times a finite gate)
        if zero_unless_chosen(v):
            continue
        uses = prog.uses(v)
        if prog.is_output(v) or not uses or not all(u.name == "mul" and zero_unless_chosen(u.outs[0]) for u in uses):
            return False
    return True


def _still_evaluated(prog, sites):
    """The equations of prog (analysis view) that the outputs still need once `sites` are rewritten."""
    at = {s.root: s for s in sites}
    needed = {v for v in prog.outvars if isinstance(v, Var)}
    out = []
    for e in reversed(prog.flat):
        s = at.get(e)
        if not (e.effects or any(o in needed for o in ([s.out] if s is not None else e.outs))):
            continue
        if s is None:
            out.append(e)
        needed.update(v for v in (site_requires(s) if s is not None else e.ins) if isinstance(v, Var))
    return out


def _chain(u):
    out = set()
    while u is not None:
        out.add(u)
        u = u.unit
    return out


def bind(e, vals):
    if e.kind == "alias":
        return list(vals)
    params = e.prim.get_bind_params(e.params)
    name_stack = siu.current_name_stack() + e.src.name_stack
    with siu.user_context(e.src.traceback, name_stack=name_stack), e.ctx.manager:
        r = e.prim.bind(*vals, **params)
    return list(r) if e.prim.multiple_results else [r]


def schedule(plan):
    """The nodes run() evaluates, in program order: units the sites need are expanded, and only what the
    outputs (or effects) need is kept -- so the dense compute a site replaces is dropped."""
    prog = plan.prog
    nodes = []

    def add(eqns):
        for e in eqns:
            if e.kind == "unit" and e in plan.expanded:
                add(e.body)
            else:
                nodes.append(e)

    add(prog.eqns)
    needed = {v for v in prog.outvars if isinstance(v, Var)}
    marked = []
    for node in reversed(nodes):
        s = plan.site_at.get(node)
        produces = [s.out] if s is not None else node.outs
        if not any(o in needed for o in produces) and not (s is None and node.effects):
            continue
        marked.append(node)
        req = plan.site_requires(s) if s is not None else \
            plan.gathered[node].requires() if node in plan.gathered else node.ins
        needed.update(x for x in req if isinstance(x, Var))
    return list(reversed(marked))


def run(plan, args, fp8_weights=None):
    """The program's outputs with its sites rewritten. fp8_weights: {invar of plan.prog: Fp8Weights}, expert
    weights whose FP8 quantisation an enclosing scan made once for all its iterations (hoistable_fp8_inputs)."""
    fp8_weights = fp8_weights or {}
    prog = plan.prog
    env = {}
    for v, a in zip(prog.invars, args):
        env[v] = a

    def read(v):
        if isinstance(v, Lit):
            return v.val
        if v in env:
            return env[v]
        # not computed on the main path (e.g. inside a unit bound whole): compute it from its producer
        e = prog.producer[v]
        outs = bind(e, [read(x) for x in e.ins])
        for o, val in zip(e.outs, outs):
            env.setdefault(o, val)
        return env[v]

    order = schedule(plan)
    branches = side_branches(plan, order) if plan.options.get("streams") else {}
    on_branch = {n for b in branches.values() for n in b}
    gathered = GD.Emitter([plan.gathered[n] for n in order if n in plan.gathered], plan.options.get("recipe"))
    for node in order:
        s = plan.site_at.get(node)
        if s is not None:
            if node in branches:
                _run_on_stream(plan, branches[node], order, on_branch, read, env)
            read_stacked = _stacked_reader(s, read)
            env[s.out] = EM.emit_site(s, prog, read, plan.facts, plan.mode, read_stacked, plan.options, fp8_weights)
            continue
        if node in on_branch:
            continue  # evaluated on its stream, with its site
        if node in plan.gathered:  # reads the weights and ids, not the gathered copy
            env[node.outs[0]] = gathered.emit(plan.gathered[node], read)
            continue
        vals = [read(x) for x in node.ins]
        subs = plan.subplans.get(node)
        if node in plan.ragged:
            outs = [RG.emit(node, plan.ragged[node], vals, plan.options.get("recipe"))]
        elif router_topk(plan, node):
            outs = _swapped_top_k(node, vals)
        elif subs is not None and any(p.has_sites() for p in subs):
            fp8_in = {i: fp8_weights[v] for i, v in enumerate(node.ins) if isinstance(v, Var) and v in fp8_weights}
            outs = _structured(node, subs, vals, plan.loop_body, fp8_in)
        else:
            outs = bind(node, vals)
        for o, val in zip(node.outs, outs):
            env[o] = val
    return [read(v) for v in prog.outvars]


def router_topk(plan, node) -> bool:
    """Whether `node` is a top_k over the last axis, in a program with MoE sites, that the jax_moe_ffi top_k
    kernel takes (in practice the routers'; any other top_k there is swapped too, which is harmless). The kernel
    gives lax.top_k's values and indices bitwise (ops/topk.py), so the routing is unchanged, where XLA would
    sort every row of a router's narrow [tokens, experts] scores. JAX_MOE_FFI_ROUTER_TOPK=0 keeps lax.top_k."""
    if node.kind != "prim" or node.name != "top_k" or not (plan.sites or plan.ragged or plan.gathered):
        return False
    if os.environ.get("JAX_MOE_FFI_ROUTER_TOPK", "1") == "0":
        return False
    x = node.ins[0]
    return node.params.get("axis", x.ndim - 1) in (-1, x.ndim - 1) and \
        TK.supported(x.shape, x.dtype, node.params["k"]) is None


# Ops that change only an array's layout, dtype or annotations: the tokens before and after are the same tokens.
_LAYOUT_OPS = {"reshape", "convert_element_type", "squeeze", "expand_dims", "copy", "copy_p", "name",
               "sharding_constraint", "transpose"}


def side_branches(plan, order):
    """Per site node: the nodes of `order` that compute from the site's tokens but neither feed any site nor use
    any site's output -- e.g. a shared expert, which runs beside the routed experts -- when they hold a
    dot_general (real work worth a stream). optimize(streams=True) evaluates them as one function on
    runtime.SHARED_EXPERT_STREAM just before the site, so XLA can overlap them with dispatch and the grouped
    GEMMs. Nodes with effects, ragged_dots being swapped (family 5) and structured nodes whose bodies hold sites
    stay on the main stream."""
    producer = {}
    for n in order:
        s = plan.site_at.get(n)
        for o in ([s.out] if s is not None else n.outs):
            producer[o] = n
    site_nodes = [n for n in order if n in plan.site_at]

    def ins_of(n):
        s = plan.site_at.get(n)
        return plan.site_requires(s) if s is not None else [v for v in n.ins if isinstance(v, Var)]

    ancestors = set()  # of any site
    stack = [n for n in site_nodes]
    while stack:
        n = stack.pop()
        for v in ins_of(n):
            pn = producer.get(v)
            if pn is not None and pn not in ancestors:
                ancestors.add(pn)
                stack.append(pn)

    def descendants(start_vars):
        vars_, out = set(start_vars), set()
        for n in order:
            if any(v in vars_ for v in ins_of(n)):
                out.add(n)
                s = plan.site_at.get(n)
                vars_.update([s.out] if s is not None else n.outs)
        return out

    after_sites = descendants([plan.site_at[n].out for n in site_nodes])
    branches = {}
    taken = set()
    for sn in site_nodes:
        s = plan.site_at[sn]
        if s.primary is None:
            continue
        # the tokens as the model holds them: a site may read a reshaped / cast copy (e.g. [B*S, D]) while a
        # shared expert reads the original [B, S, D]
        tokens = [s.primary]
        while tokens[-1] in producer and producer[tokens[-1]].name in _LAYOUT_OPS and producer[tokens[-1]].ins \
                and isinstance(producer[tokens[-1]].ins[0], Var):
            tokens.append(producer[tokens[-1]].ins[0])
        from_tokens = descendants(tokens)
        b = [n for n in order if n in from_tokens and n not in ancestors and n not in after_sites
             and n not in plan.site_at and n not in taken and not n.effects and n not in plan.ragged
             and n not in plan.gathered
             and not any(p.has_sites() for p in plan.subplans.get(n, []))]
        if any(n.name == "dot_general" or any(e.name == "dot_general" for e in getattr(n, "body", []) or [])
               for n in b):
            branches[sn] = b
            taken.update(b)
    return branches


def _swapped_top_k(node, vals):
    return list(TK.top_k(vals[0], node.params["k"]))


def _run_on_stream(plan, branch, order, on_branch, read, env):
    """Evaluates `branch` (nodes in order) as one function under runtime.on_stream; writes its outputs that
    other nodes or the program's outputs use into env. A top_k in it (e.g. a load-balancing loss's own routing)
    is swapped as on the main stream."""
    from jax_moe_ffi import runtime
    prog = plan.prog
    inside = {o for n in branch for o in n.outs}
    ext_in = []
    for n in branch:
        for v in n.ins:
            if isinstance(v, Var) and v not in inside and v not in ext_in:
                ext_in.append(v)
    used_outside = {v for n in order if n not in on_branch for v in n.ins if isinstance(v, Var)}
    used_outside |= {v for v in prog.outvars if isinstance(v, Var)}
    ext_out = [o for n in branch for o in n.outs if o in used_outside]

    def fn(*vals):
        local = dict(zip(ext_in, vals))
        for n in branch:
            args = [local[x] if isinstance(x, Var) else x.val for x in n.ins]
            outs = _swapped_top_k(n, args) if router_topk(plan, n) else bind(n, args)
            local.update(zip(n.outs, outs))
        return [local[o] for o in ext_out]

    outs = runtime.on_stream(fn, runtime.SHARED_EXPERT_STREAM)(*[read(v) for v in ext_in])
    env.update(zip(ext_out, outs))


def _stacked_reader(site, read):
    cache = {}

    def read_stacked(v):
        if v in cache:
            return cache[v]
        kind, val = site.stacked[v][:2]
        if kind == "base":
            import jax.numpy as jnp
            w = read(val)
            ax = site.stacked[v][2]
            r = jnp.moveaxis(w, ax, 0).reshape((w.shape[ax],) + tuple(v.shape))
        else:
            import jax.numpy as jnp
            r = jnp.stack([read(x) if isinstance(x, Var) else x.val for x in val])
        cache[v] = r
        return r

    return read_stacked


def remat_prevent_cse(model_prevent_cse: bool, in_loop_body: bool, options) -> bool:
    """prevent_cse for a jax.checkpoint region the pass rebuilds. JAX implements prevent_cse=True with an
    optimization barrier on every input of the backward's recompute; in a scanned layer those inputs include
    the layer's weights, which XLA slices out of the stacked weights, so the barrier makes it copy them
    (on the Qwen3 train step: three 403 MB expert weights a layer) where the grouped GEMMs would otherwise
    read the slice in place (XLA's dynamic-slice fusion). Directly in a loop body the barrier has nothing to
    prevent -- the forward and the recompute are in different loops, so XLA cannot merge them; jax.checkpoint's
    documentation names scan as the case for prevent_cse=False -- so the rebuilt region drops it there, unless
    optimize(keep_prevent_cse=True)."""
    if options.get("keep_prevent_cse") or not in_loop_body:
        return model_prevent_cse
    return False


def hoistable_fp8_inputs(plan) -> dict:
    """{index into plan.prog.invars: transpose_rhs} of the inputs that some blockwise-FP8 expert GEMM of the plan
    (or of a jax.checkpoint region in it) reads as its weight, as stored (emit.stored_layout_transpose). A scan
    whose body this is quantises those once for all its iterations (_hoisted_fp8_weights) instead of once per
    layer inside the body (and again in the backward's recompute). An input read in both orientations is left out."""
    if plan.options.get("recipe") != "blockwise" or not plan.options.get("hoist_fp8_weights", True):
        return {}  # JAX_MOE_FFI_HOIST_FP8_WEIGHTS=0 when optimize() was called: quantised in the body (an A/B)
    index = {v: i for i, v in enumerate(plan.prog.invars)}
    found, clash = {}, set()

    def note(v, tr):
        i = index.get(v)
        if i is None or tr is None:
            return
        if found.setdefault(i, tr) != tr:
            clash.add(i)

    for s in plan.sites:
        for gp in s.gemms.values():
            note(gp["w"], EM.stored_layout_transpose(gp))
    for e, subs in plan.subplans.items():
        if e.kind == "remat":
            for j, tr in hoistable_fp8_inputs(subs[0]).items():
                if isinstance(e.ins[j], Var):
                    note(e.ins[j], tr)
    return {i: tr for i, tr in found.items() if i not in clash}


def _hoisted_fp8_weights(stacked, transpose_rhs):
    """quantize_weights of every slice along the leading (scan) axis of stacked [L, E, A, B], made in one pass:
    (pair leaves each [L, E, ...], their treedef). 128 x 128 tiles never cross an expert's [A, B] matrix, so
    the slices are bitwise what quantize_weights(stacked[l]) gives."""
    from jax_moe_ffi.ops.grouped_gemm_fp8 import quantize_weights
    L, E = stacked.shape[:2]
    fw = quantize_weights(stacked.reshape((L * E,) + tuple(stacked.shape[2:])), transpose_rhs=transpose_rhs)
    leaves, tree = jax.tree.flatten(fw.pairs)
    return [x.reshape((L, E) + x.shape[1:]) for x in leaves], tree


def _structured(e, subs, vals, in_loop_body=False, fp8_in=None):
    """Rebuilds a structured node whose bodies hold sites. fp8_in: {position in vals: Fp8Weights} quantised by
    an enclosing scan, passed on to the body's invars."""
    p = e.params
    fp8_in = fp8_in or {}
    if e.kind == "scan":
        from jax_moe_ffi.ops.grouped_gemm_fp8 import Fp8Weights, quantize_weights
        sp = subs[0]
        nc, nk = scan_split(p, vals)
        consts, init, xs = vals[:nc], vals[nc:nc + nk], vals[nc + nk:]
        hoist = hoistable_fp8_inputs(sp)
        const_fp8 = {}  # body invar index -> Fp8Weights: a const weight, quantised once
        xs_fp8 = []  # (body invar index, leaves [L, E, ...], treedef, [E, A, B], transpose_rhs): stacked weights
        for i, tr in sorted(hoist.items()):
            if i < nc:  # the same weight in every iteration: quantised once (or already, further out)
                const_fp8[i] = fp8_in[i] if i in fp8_in else quantize_weights(vals[i], transpose_rhs=tr)
            elif i >= nc + nk:
                leaves, tree = _hoisted_fp8_weights(vals[i], tr)
                xs_fp8.append((i, leaves, tree, tuple(vals[i].shape[1:]), tr))
            # a weight in the carry changes every iteration: quantised in the body as before
        invars = sp.prog.invars

        def body(carry, x):
            x, xf = x[:len(xs)], x[len(xs):]
            fw = {invars[i]: w for i, w in const_fp8.items()}
            at = 0
            for i, leaves, tree, shape, tr in xs_fp8:
                fw[invars[i]] = Fp8Weights(jax.tree.unflatten(tree, xf[at:at + len(leaves)]), shape, tr)
                at += len(leaves)
            outs = run(sp, list(consts) + list(carry) + list(x), fw)
            return list(outs[:nk]), list(outs[nk:])

        extra = [leaf for _, leaves, _, _, _ in xs_fp8 for leaf in leaves]
        carry, ys = lax.scan(body, list(init), list(xs) + extra, length=p["length"], reverse=p["reverse"],
                             unroll=p["unroll"])
        return list(carry) + list(ys)
    if e.kind == "remat":
        sp = subs[0]
        policy = p["policy"]
        if sp.options.get("offload"):
            # optimize(offload=...): the model's own checkpoint also saves (offload="device") or offloads
            # (offload="pinned_host") the MoE intermediates tagged inside it; its policy decides the rest
            from jax_moe_ffi import runtime
            policy = runtime.moe_remat_policy(sp.options["offload"], base=policy)
        pos = sorted(fp8_in)  # hoisted FP8 weights enter the region as inputs (nothing of them to save)

        def region(*a):
            fw = {sp.prog.invars[i]: w for i, w in zip(pos, a[len(vals):])}
            return run(sp, list(a[:len(vals)]), fw)

        f = jax.checkpoint(region, policy=policy,
                           prevent_cse=remat_prevent_cse(p["prevent_cse"], in_loop_body, sp.options))
        return list(f(*vals, *[fp8_in[i] for i in pos]))
    if e.kind == "cond":
        branches = [(lambda sp: (lambda *a: run(sp, list(a))))(sp) for sp in subs]
        return list(lax.switch(vals[0], branches, *vals[1:]))
    if e.kind == "shard_map":
        # the same mesh, specs and manual axes around the rewritten per-shard body
        sp = subs[0]
        f = jax.shard_map(lambda *a: tuple(run(sp, list(a))), mesh=p["mesh"], in_specs=tuple(p["in_specs"]),
                          out_specs=tuple(p["out_specs"]), check_vma=p.get("check_vma", True),
                          axis_names=set(p.get("newly_manual_axes", p["mesh"].axis_names)))
        return list(f(*vals))
    if e.kind == "while":
        cp, bp = subs
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, init = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
        out = lax.while_loop(lambda c: run(cp, list(cconsts) + list(c))[0],
                             lambda c: run(bp, list(bconsts) + list(c)), list(init))
        return list(out)
    return bind(e, vals)
