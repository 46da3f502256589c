"""Family (4): per-expert unrolled loops.

    out = sum_e  gate_column_e(t) * expert_e(x)[t]

A chain of `add`s whose terms each carry a *column* constraint (zero unless expert e is among the token's
top_k choices: `experts == e`, or column e of a k-sparse gate matrix). The E terms must be isomorphic:
the same ops, differing only where the expert index enters --
  * slices at index e of one stacked array (W[e], gate[:, e:e+1])   -> an "expert slice",
  * integer literals equal to e (`experts == e`)                     -> the expert coordinate,
  * different variables (separate per-expert weights)               -> stacked per call.
The template term (expert 0) then plays the role of the all-experts region with a *virtual* expert axis,
and the generic machinery emits dispatch -> grouped GEMMs (weights stacked [E, ...]) -> combine; terms
without a column constraint (a residual added in the same chain) are added back unchanged.
"""
from __future__ import annotations

import numpy as np

from jax_moe_ffi.rewrite import facts as F
from jax_moe_ffi.rewrite.ir import Lit, Var, source_line
from jax_moe_ffi.rewrite.match import REPEAT_NOTE, Miss, Site

ADDS = ("add", "add_any")


def find_loop_sites(an):
    prog = an.prog
    for root in reversed(prog.flat):
        if root.name not in ADDS or root in an.covered or root.kind != "prim":
            continue
        out = root.outs[0]
        uses = prog.uses(out)
        if len(uses) == 1 and uses[0].name in ADDS and not prog.is_output(out):
            continue  # interior of a longer chain
        chain, terms = _collect(prog, root)
        if len(terms) < 2:
            continue
        try:
            site = _attempt(an, root, chain, terms)
        except Miss as m:
            if any(_col(an, t) is not None for t in terms):
                an._miss(root, f"per-expert loop: {m.reason}", m.eqn)
            continue
        if site is not None:
            an._accept(site)
            an.covered.update(chain)
            an.covered.update(_feeding_only(prog, root, set(chain), _ancestors(prog, site.I)))


def _ancestors(prog, v):
    """Every equation that `v` depends on."""
    out, stack = set(), [v]
    while stack:
        p = prog.producer.get(stack.pop())
        if p is not None and p not in out:
            out.add(p)
            stack.extend(a for a in p.ins if isinstance(a, Var))
    return out


def _feeding_only(prog, root, inside, router):
    """The equations before `root` whose every output is used only by `inside` (grown as we go): the
    per-expert bodies of an accepted loop site. They are rewritten with it, so they are no near-misses.
    Walking backwards, users come before producers; a value used outside the site stops the walk, and so
    does the router's side (`router`: what the top_k indices depend on, the tokens and whatever made them),
    so another layer's near-misses stay reported."""
    out = set()
    idx = prog.flat.index(root)
    for e in reversed(prog.flat[:idx]):
        if e.kind != "prim" or not e.outs or e in router or any(prog.is_output(v) for v in e.outs):
            continue
        uses = [u for v in e.outs for u in prog.uses(v)]
        if uses and all(u in inside for u in uses):
            inside.add(e)
            out.add(e)
    return out


def _collect(prog, root):
    chain, terms, stack = [], [], [root]
    while stack:
        e = stack.pop()
        chain.append(e)
        for a in e.ins:
            p = prog.producer.get(a) if isinstance(a, Var) else None
            if p is not None and p.name in ADDS and len(prog.uses(a)) == 1 and not prog.is_output(a) \
                    and p.kind == "prim":
                stack.append(p)
            else:
                terms.append(a)
    return chain, terms


def _col(an, t):
    """(I, e, con) when term t is zero unless expert e is among the top_k choices."""
    if isinstance(t, Lit):
        return None
    for c in an.facts.get(t).cons:
        if isinstance(c.cat, tuple) and c.cat[0] == "col" and F.is_choice_indices(c.src, an.prog):
            return c.src, c.cat[1], c
    return None


def _attempt(an, root, chain, terms):
    prog, facts = an.prog, an.facts
    cols, extra = {}, []
    for t in terms:
        if facts.get(t).const == 0:
            continue
        c = _col(an, t)
        if c is None:
            extra.append(t)
            continue
        I, e, con = c
        if e in cols:
            raise Miss(f"two terms for expert {e}")
        cols[e] = (t, I, con)
    if not cols:
        return None
    Is = {v[1] for v in cols.values()}
    if len(Is) != 1:
        raise Miss("terms gated by different routers")
    I = Is.pop()
    E, j_axis, b_axes = F.topk_info(I, prog)
    if sorted(cols) != list(range(E)):
        raise Miss(f"the loop covers experts {sorted(cols)} of {E}")
    t0, _, con0 = cols[0]
    for a in extra:  # e.g. a shared expert's output, or its bias as flax adds it ([1, D] against [T, D])
        if a.ndim > t0.ndim or any(da not in (1, dt) for da, dt in zip(a.shape[::-1], t0.shape[::-1])):
            raise Miss("an extra term of another shape in the sum (it does not broadcast to the expert terms')")
    if j_axis is not None and not isinstance(con0.xmap[j_axis], (F.Bound, F.Fixed)):  # (Fixed: one column)
        raise Miss("the choice axis of top_k is not summed in the expert terms")
    labels0 = [None] * t0.ndim
    for i, b in enumerate(b_axes):
        a = con0.xmap[b]
        if not isinstance(a, int):
            raise Miss("the expert terms are not per token")
        labels0[a] = (("T", i), t0.shape[a] != I.shape[b])
    if any(L is not None and L[1] for L in labels0):
        raise Miss("the expert terms broadcast over tokens")
    site = Site(family="loop", root=root, out=root.outs[0], I=I, E=E, k=1 if j_axis is None else I.shape[j_axis],
                b_axes=b_axes,
                j_axis=j_axis, labels={}, kinds={}, region=[], root_kind="chain")
    virtual_expert_axis(prog, site, [cols[e][0] for e in range(E)], "expert terms")
    # each term is expert e's whole contribution (the choice axis summed inside its gate): with ids that may
    # repeat, only a token's first choice of e runs it
    site.first_choice_only = F.may_repeat(I, prog)
    if site.first_choice_only:
        site.notes.append(REPEAT_NOTE)
    site.terms = [cols[e][0] for e in range(E)]
    site.extra_terms = extra
    site.chain = set(chain)
    site.out_labels = tuple(labels0)
    an._grow(site, [(t0, tuple(labels0))])
    an._finish(site)
    site.source = source_line(prog.producer.get(t0) or root)
    return site


def virtual_expert_axis(prog, site, pieces, what):
    """Per-expert values pieces[e] (the terms of an add chain, or the operands of a `jnp.stack` over the
    experts) computed alike: piece 0 is the template, evaluated per row with the row's expert. Sets the
    site's virtual-expert bookkeeping (vE, eslices, elits, varying, stacked, template_out)."""
    t0 = pieces[0]
    pairs, eslices, elits, varying = {}, {}, {}, set()
    for e in range(1, len(pieces)):
        _iso(prog, t0, pieces[e], 0, e, pairs, eslices, elits, varying)
    template_eqns = {prog.producer[v] for v in pairs if prog.producer.get(v) is not None and v not in varying}
    # virtual expert axis: everything downstream of where the expert index enters
    vE = set(varying)
    for q in sorted(template_eqns, key=lambda q: prog.pos[q]):
        if q in eslices or any((q, i) in elits for i in range(len(q.ins))) or \
                any(isinstance(a, Var) and a in vE for a in q.ins):
            vE.update(q.outs)
    if t0 not in vE:
        raise Miss(f"the {what} do not depend on the expert index")
    site.vE = vE
    site.eslices = {q: ax for q, ax in eslices.items()}
    site.elits = {k_: "E" for k_ in elits}
    site.varying = varying
    site.template_out = t0
    for v, vs in pairs.items():
        if v in vE:
            site.stacked[v] = ("list", [v] + vs)
    for q, ax in eslices.items():
        base = q.ins[0]
        o = q.outs[0]
        site.stacked[o] = ("base", base, ax)
        # W[e] = squeeze(slice(W, e)): the squeezed template is the stacked base too
        for u in prog.uses(o):
            if u.name == "squeeze" and tuple(d % o.ndim for d in u.params["dimensions"]) == (ax,) \
                    and u.outs[0] in site.stacked:
                site.stacked[u.outs[0]] = ("base", base, ax)


def _params_equal(p, q):
    if p.keys() != q.keys():
        return False
    for k in p:
        a, b = p[k], q[k]
        if a is b:
            continue
        try:
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not np.array_equal(a, b):
                    return False
            elif not bool(a == b):
                return False
        except Exception:  # noqa: BLE001
            return False
    return True


def _lit_eq(a, b):
    try:
        return np.array_equal(np.asarray(a.val), np.asarray(b.val)) and a.dtype == b.dtype
    except Exception:  # noqa: BLE001
        return False


def _iso(prog, v0, ve, e0, e, pairs, eslices, elits, varying):
    """Match the term of expert e against the template (expert e0); record where they differ."""
    seen = {}
    stack = [(v0, ve)]
    while stack:
        a, b = stack.pop()
        if a is b:
            continue
        if a in seen:
            if seen[a] is not b:
                raise Miss("a template value pairs with two different values of another expert's term")
            continue
        seen[a] = b
        pairs.setdefault(a, [])
        if len(pairs[a]) == e - 1:
            pairs[a].append(b)
        elif len(pairs[a]) < e - 1 or pairs[a][e - 1] is not b:
            raise Miss("the expert terms are not isomorphic")
        pa, pb = prog.producer.get(a), prog.producer.get(b)
        if pa is None or pb is None or pa.name != pb.name or pa.kind != "prim" or pb.kind != "prim":
            if a.shape != b.shape or a.dtype != b.dtype:
                raise Miss("the expert terms are not isomorphic")
            varying.add(a)  # per-expert leaf (separate weights), stacked per call
            continue
        if pa.outs.index(a) != pb.outs.index(b) or len(pa.ins) != len(pb.ins):
            raise Miss("the expert terms are not isomorphic", pa)
        if not _params_equal(pa.params, pb.params):
            ax = _expert_slice(pa, pb, e0, e)
            if ax is None:
                raise Miss(f"`{pa.name}` differs between experts in a way that is not an expert index", pb)
            prev = eslices.get(pa)
            if prev is not None and prev != ax:
                raise Miss("inconsistent expert slices", pa)
            eslices[pa] = ax
            continue
        for i, (x, y) in enumerate(zip(pa.ins, pb.ins)):
            if isinstance(x, Lit) or isinstance(y, Lit):
                if isinstance(x, Lit) and isinstance(y, Lit):
                    if _lit_eq(x, y):
                        continue
                    sx, sy = x.scalar(), y.scalar()
                    if x.ndim == 0 and sx == e0 and sy == e and pa.name in F.ELEMENTWISE \
                            and np.issubdtype(x.dtype, np.integer):
                        elits[(pa, i)] = True
                        continue
                raise Miss("a constant differs between experts", pa)
            stack.append((x, y))


def _expert_slice(pa, pb, e0, e):
    """The axis when pa/pb are `slice`s of the same array at indices e0/e (width 1) along one axis."""
    if pa.name != "slice" or pa.ins[0] is not pb.ins[0]:
        return None
    s0, l0 = pa.params["start_indices"], pa.params["limit_indices"]
    s1, l1 = pb.params["start_indices"], pb.params["limit_indices"]
    if pa.params["strides"] not in (None,) and any(s != 1 for s in pa.params["strides"]):
        return None
    diff = [a for a in range(len(s0)) if s0[a] != s1[a] or l0[a] != l1[a]]
    if len(diff) != 1:
        return None
    a = diff[0]
    if s0[a] == e0 and l0[a] == e0 + 1 and s1[a] == e and l1[a] == e + 1:
        return a
    return None
