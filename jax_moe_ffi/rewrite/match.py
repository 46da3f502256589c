"""Site analysis: find reductions over experts that are provably k-sparse and the region that feeds them.

A *site* is a reduction over the expert axis E (a `reduce_sum`, a `dot_general` contraction, or, for
per-expert loops, a chain of `add`s over experts) of a value that the facts prove zero outside the
(token, expert) pairs chosen by a `top_k`. Walking back from it, every value that carries both a
token coordinate and an expert coordinate (or, for capacity layers, an (expert, slot) coordinate) must be
produced by an op that is *pointwise* in those coordinates -- then the value at a selected pair can be
computed from that pair's token row and that expert's weights alone, which is what the emitted
dispatch -> grouped GEMM -> combine does. Anything not proven leaves the code as it is, with a reason.

Labels: each axis of a region value is None (a feature axis, kept whole in each row) or (L, bcast) with
L one of ("T", i) (token axis i = batch axis i of the top_k indices), "E" (expert), "C" (capacity slot);
bcast=True when the axis has size 1 there (broadcast). Rows form of a value: [rows, *unlabeled axes].
"""
from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from jax_moe_ffi.rewrite import facts as F
from jax_moe_ffi.rewrite.ir import Lit, Var, scan_split, source_line

REGION_OPS = F.ELEMENTWISE | {"broadcast_in_dim", "reshape", "squeeze", "transpose", "dot_general", "slice",
                              "dynamic_slice", "concatenate", "pad", "split", "iota", "optimization_barrier",
                              "stack"} | {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
                                   "reduce_or", "argmax", "argmin"} | F.CUMULATIVE
GEMM_DTYPES = (np.dtype(np.float32), np.dtype("bfloat16"), np.dtype(np.float16))
GATHER_LIMIT = 1 << 16  # elements per expert an expert-side leaf may have to be gathered per row


class Miss(Exception):
    def __init__(self, reason, eqn=None):
        super().__init__(reason)
        self.reason = reason
        self.eqn = eqn


REPEAT_NOTE = ("the expert ids may repeat within a token (assembled from several argmaxes / top_ks): a token's "
               "repeated expert runs once, at its first choice, with the gate the model summed over its choices")
REPEAT_NOTE_CELLS = ("the expert ids may repeat within a token (assembled from several argmaxes / top_ks): each (token, "
                     "choice) runs its expert at its own capacity slot; a choice whose (expert, slot) cell an earlier "
                     "choice of the token holds is not run again (the model counts the cell once)")
FIXED_NOTE = "reads choice column {} of the ids only: the other choices' pairs are not run"
REPEAT_NOTE_PER_CHOICE = ("the expert ids may repeat within a token (assembled from several argmaxes / top_ks): each "
                          "(token, choice) runs its expert, as the model's per-choice terms count it")


@dataclasses.dataclass
class Site:
    family: str
    root: object                # the reducing Eqn (families 1-3) or the last add of the chain (family 4)
    out: Var
    I: Var                      # top_k indices
    E: int
    k: int
    b_axes: list                # axes of I that are token axes (in label order T0, T1, ...)
    j_axis: int
    labels: dict                # Var -> labels tuple
    kinds: dict                 # leaf Var -> kind
    region: list                # region eqns in program order (excluding the root)
    root_kind: str              # "dot" | "reduce" | "chain"
    out_labels: tuple = ()
    weights_operand: object = None  # root operand used as combine weights (peephole), or None
    rows_operand: object = None
    S: object = None            # capacity slot index array (family 1)
    s_roles: tuple = ()         # per axis of S: ("T", i) | "J" | "E" | "1" (a size-1 axis, read at 0)
    C: int | None = None
    disp_eqn: object = None
    disp_operand: object = None
    gemms: dict = dataclasses.field(default_factory=dict)   # Eqn -> grouped GEMM plan
    primary: object = None      # token leaf sent through moe_dispatch
    vE: set = dataclasses.field(default_factory=set)       # family 4: template values with a virtual E
    stacked: dict = dataclasses.field(default_factory=dict)  # family 4: leaf Var -> ("base", W, axis) | ("list", [v_e])
    elits: dict = dataclasses.field(default_factory=dict)   # family 4: (Eqn, operand) -> "E" (literal = expert id)
    eslices: dict = dataclasses.field(default_factory=dict)  # family 4: slice Eqn -> axis sliced at the expert id
    terms: list = dataclasses.field(default_factory=list)
    template_out: object = None
    varying: set = dataclasses.field(default_factory=set)
    extra_terms: list = dataclasses.field(default_factory=list)
    chain: set = dataclasses.field(default_factory=set)
    stack_eqns: set = dataclasses.field(default_factory=set)  # `jnp.stack` Eqns over the experts (template: piece 0)
    keep_is_nonzero: bool = False
    first_choice_only: bool = False  # ids that may repeat (facts.may_repeat), rows per expert: keep first choices
    fixed_choice: int | None = None  # the root reads one choice column of I: only its pairs are run
    shared_uses: dict = dataclasses.field(default_factory=dict)  # use outside the region -> region Eqn it reads
    first_cell_only: bool = False  # ... with capacity slots: keep a token's first choice of each (expert, slot)
    s_off: int = 0
    gather_perm: object = None
    shapes: dict = dataclasses.field(default_factory=dict)
    flops_before: int = 0
    flops_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    notes: list = dataclasses.field(default_factory=list)
    source: str = ""
    path: str = ""

    @property
    def token_shape(self):
        return tuple(self.I.shape[a] for a in self.b_axes)

    @property
    def num_tokens(self):
        return int(np.prod(self.token_shape, dtype=np.int64))


def others(v, labels):
    lab = labels.get(v)
    if lab is None:
        return list(range(v.ndim))
    return [a for a in range(v.ndim) if lab[a] is None]


def label_kinds(lab):
    out = set()
    for x in lab:
        if x is not None and not x[1]:
            out.update(merged_parts(x[0]) or (x[0],))
    return out


def merged_parts(kind):
    """The (kind, size) parts of a merged label ("M", ((kind, size), ...)): an axis that a reshape made of
    several labeled axes, row-major (flaxformer's [E, G, C, D] -> [E, G*C, D] expert input); else None."""
    return kind[1] if isinstance(kind, tuple) and len(kind) == 2 and kind[0] == "M" else None


def _is_t(L):
    return isinstance(L, tuple) and L[0] == "T"


def _is_c(L):
    """The capacity-slot coordinate, or "C+s": the slot coordinate shifted by s (before a [s:] slice)."""
    return isinstance(L, str) and (L == "C" or L.startswith("C+"))


def _shift_c(L, s):
    base = 0 if L == "C" else int(L[2:])
    return "C" if base + s == 0 else f"C+{base + s}"


def _merge_unit_labels(a, b, shape):
    """Two uses' labels of one value, merged where they differ only on size-1 axes that one use leaves
    unlabeled and the other labels with a token coordinate (a reshape that drops or adds a size-1 axis
    carries no label for it, e.g. flaxformer's [E, G*C, D] with G = 1). Only token coordinates: a token axis
    of size 1 means that coordinate has one value, 0, so the two readings agree. A size-1 expert axis (a
    loop site's w[e] slice) or slot axis is not merged: its coordinate can take other values. None where
    they conflict."""
    if len(a) != len(b):
        return None
    out = []
    for x, y, n in zip(a, b, shape):
        if x == y:
            out.append(x)
        elif n == 1 and (x is None) != (y is None) and _is_t((x or y)[0]) and not (x or y)[1]:
            out.append(x or y)
        else:
            return None
    return tuple(out)


# ------------------------------------------------------------------------------------------------
class Analyzer:
    def __init__(self, prog, facts, mode="exact", outer_router=False):
        self.prog = prog
        self.outer_router = outer_router  # a loop body's analysis: the enclosing program has a top_k
        self.facts = facts
        self.mode = mode
        self.sites = []
        self.misses = []
        self.covered = set()  # eqns inside sites
        self.stack_misses = {}  # stack Eqn -> why a site over its pieces (one per expert) failed
        self.loop_scans = []  # scans / fori_loops over the experts, conds on the router: the Plan tries them again
        self._stack_seen = None

    def run(self):
        tried = set()
        while True:  # again where _drop_unshared uncovered roots that a dropped site's region held
            self._attempt_roots(tried)
            if not self._drop_unshared():
                break
        self._note_shared()
        from jax_moe_ffi.rewrite import loops
        loops.find_loop_sites(self)
        self._uncovered_misses()
        return self.sites, self.misses

    def _attempt_roots(self, tried):
        prog = self.prog
        for e in reversed(prog.flat):  # later (outer) reductions first: they own larger regions
            if e in self.covered or e.kind != "prim" or e in tried:
                continue
            tried.add(e)
            if e.name in ("reduce_sum", "dot_general", "gather"):
                cand = self._candidate(e) if e.name != "gather" else self._gather_candidate(e)
                if cand is None:
                    continue
                self._stack_seen = None
                try:
                    site = self._attempt(e, *cand) if e.name != "gather" else self._attempt_gather(e, *cand)
                except Miss as m:
                    if self._stack_seen is not None:  # why a site over per-expert stacked outputs failed
                        self.stack_misses.setdefault(self._stack_seen, m.reason)
                    if self._interesting(e):
                        self._miss(e, m.reason, m.eqn)
                    continue
                if site is not None:
                    self._accept(site)

    def _accept(self, site):
        self.sites.append(site)
        self.covered.add(site.root)
        self.covered.update(site.region)

    def _drop_unshared(self):
        """Sites that share an expert-stacked intermediate (one all-experts tensor picked per choice column by
        separate reductions: `sum_j w_j * einsum('te,ted->td', one_hot(ids[:, j]), y)`) each compute their own
        rows of it, so the dense tensor is needed only if some use of it is not replaced: a site stays only when
        every use of its region outside it lies in another site that stays (each site reads the shared values at
        its own pairs, as the model does). The others are near-misses with the use named. Returns whether
        some site was dropped."""
        dropped = False
        while True:
            owned = {q for s in self.sites for q in [s.root] + s.region + list(s.chain)}
            bad = [s for s in self.sites if any(u not in owned for u in s.shared_uses)]
            if not bad:
                break
            dropped = True
            for s in bad:
                self.sites.remove(s)
                u, e = next((u, e) for u, e in s.shared_uses.items() if u not in owned)
                self._miss(s.root, f"an expert-stacked intermediate is also used outside the MoE region "
                                   f"(by `{u.name}` at {source_line(u)})", e)
        self.covered = {q for s in self.sites for q in [s.root] + s.region}
        return dropped

    def _note_shared(self):
        for s in self.sites:
            if s.shared_uses:
                others = len({t.root for t in self.sites if set(s.shared_uses) & ({t.root} | set(t.region))})
                s.flops_before //= others + 1  # the dense tensor it replaces is shared: count it once in all
                s.notes.append(f"its expert compute is shared with {others} other site(s) (one all-experts tensor "
                               "read per choice by separate reductions): each runs it for its own (token, choice) "
                               "pairs, and the dense tensor is no longer computed")

    def _miss(self, e, reason, at=None):
        self.misses.append({"reason": reason, "source": source_line(e), "op": e.name,
                            "at": source_line(at) if at is not None else None,
                            "shapes": [tuple(a.shape) for a in e.ins]})

    # -------------------------------------------------------------------------------- candidates
    def _candidate(self, e):
        """(cons in product space, summed axes, product->operand maps) when some top_k constraint
        has its category among the summed axes."""
        if e.name == "reduce_sum":
            f = self.facts.get(e.ins[0])
            cons, summed = f.cons, set(e.params["axes"])
            maps = [{a: a for a in range(e.ins[0].ndim)}]
        else:
            cons, n_out, n_c, _ = self.facts.dot_product_fact(e, out_space=False)
            summed = set(range(n_out, n_out + n_c))
            maps = _dot_maps(e)
        cands = []
        for c in cons:
            if isinstance(c.cat, int) and c.cat in summed and F.is_choice_indices(c.src, self.prog):
                _, j_axis, b_axes = F.topk_info(c.src, self.prog)
                ok = all(isinstance(c.xmap[b], int) and c.xmap[b] not in summed for b in b_axes)
                cands.append((not ok, c.src.id, c.cat, id(c), c))
        if not cands:
            return None
        c = min(cands, key=lambda z: z[:4])[-1]
        return c, cons, summed, maps

    # --------------------------------------------------------------------------------- attempt
    def _attempt(self, root, econ, cons, summed, maps):
        prog = self.prog
        I = econ.src
        E, j_axis, b_axes = F.topk_info(I, prog)
        jb = F.xj(econ, j_axis)
        prod_labels = {}
        if isinstance(jb, int) and jb not in summed:
            prod_labels[jb] = "J"  # per-choice output: out[t, j] = value at expert I[t, j]
        for i, b in enumerate(b_axes):
            a = econ.xmap[b]
            if not isinstance(a, int) or a in summed:
                raise Miss("the reduction over experts also sums over tokens")
            prod_labels[a] = ("T", i)
        prod_labels[econ.cat] = "E"
        if _prod_size(root, econ.cat) != E:
            raise Miss(f"the expert axis has {_prod_size(root, econ.cat)} entries but top_k chooses among {E}")
        # capacity slot constraint (family 1)
        ccon = None
        for c in cons:
            if c is econ or not isinstance(c.cat, int) or c.cat not in summed or c.src is I:
                continue
            roles = _roles(c, econ, b_axes, j_axis)
            if roles is None:
                continue
            ccon = (c, roles)
            break
        S = s_roles = None
        s_off = 0
        if ccon is not None:
            c, s_roles = ccon
            S = c.src
            s_off = c.off
            prod_labels[c.cat] = "C"
            if econ.off != 0:
                raise Miss("the expert one-hot is sliced")
        site = Site(family="", root=root, out=root.outs[0], I=I, E=E, k=_k(I, j_axis), b_axes=b_axes,
                    j_axis=j_axis, labels={}, kinds={}, region=[], root_kind="dot" if root.name == "dot_general"
                    else "reduce", S=S, s_roles=tuple(s_roles or ()))
        if isinstance(jb, F.Fixed):
            # the root reads one choice column (`one_hot(ids[:, j])`): zero at every other pair of distinct ids, and
            # at a repeated expert's other pairs the same (token, expert) term -- run column j's pairs only
            site.fixed_choice = jb.index
            site.notes.append(FIXED_NOTE.format(jb.index))
        elif F.may_repeat(I, prog) and S is not None:
            # a token's repeated expert holds one (expert, slot) cell per distinct slot: the model sums the
            # token's terms of one cell, so a pair whose cell an earlier choice of the token holds is not run again
            if self.mode != "exact":
                raise Miss("capacity slots over expert ids that may repeat within a token: rewritten in exact mode "
                           "only (dropless would count a repeated expert's cells anew)")
            site.first_cell_only = True
            site.notes.append(REPEAT_NOTE_CELLS)
        elif F.may_repeat(I, prog):
            # the choice axis summed inside each (token, expert) term: run a repeated expert once, as the model
            # counts it; a per-(token, choice) term (choice axis kept) counts every choice and needs no mask
            site.first_choice_only = isinstance(jb, F.Bound)
            site.notes.append(REPEAT_NOTE if site.first_choice_only else REPEAT_NOTE_PER_CHOICE)
        site.s_off = s_off
        # labels of the root operands
        op_labels = []
        for i, x in enumerate(root.ins):
            m = maps[i]
            lab = tuple((prod_labels[m[a]], x.shape[a] == 1 and _prod_size(root, m[a]) != 1)
                        if m[a] in prod_labels else None for a in range(x.ndim))
            op_labels.append(lab)
        # extra summed axes that are labeled T would sum tokens: rejected above. Summed axes that are
        # unlabeled are ordinary contractions done inside each row.
        if root.name == "reduce_sum":
            out_lab = tuple(lab for a, lab in enumerate(op_labels[0]) if a not in summed)
        else:
            out_lab = tuple(prod_labels.get(a) and (prod_labels[a], False) for a in range(root.outs[0].ndim))
        site.out_labels = tuple(x if x else None for x in out_lab)
        if S is not None:  # capacity = size of the slot axis
            site.C = _prod_size(root, ccon[0].cat)
        self._grow(site, [(x, op_labels[i]) for i, x in enumerate(root.ins)])
        self._finish(site)
        return site

    # ------------------------------------------------------------------------------ gather root
    def _gather_candidate(self, e):
        """y[t, I[t, j], ...] picked with a gather (take_along_axis / fancy indexing): the choice's
        expert output, a per-choice root (no sparsity needed: the gather reads only selected pairs)."""
        if len(e.ins) != 2 or isinstance(e.ins[1], Lit):
            return None
        Y, idx = e.ins
        dn = e.params["dimension_numbers"]
        ss = e.params["slice_sizes"]
        n = idx.shape[-1]
        pieces = self.facts._index_pieces(idx, n, fixed=True)
        if pieces is None:
            return None
        sim = tuple(dn.start_index_map)
        align = {}  # operand axis -> index batch axis
        e_ax = I = xm = None
        for comp, (kind, val) in enumerate(pieces):
            oa = sim[comp]
            if kind == "iota":
                align[oa] = val
            elif kind == "view" and F.is_choice_indices(val[0], self.prog) and I is None:
                I, xm, e_ax = val[0], val[1], oa
            else:
                return None
        if I is None:
            return None
        for oa, ib in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):
            align[oa] = ib
        return I, xm, e_ax, align, tuple(dn.offset_dims), tuple(dn.collapsed_slice_dims), ss

    def _attempt_gather(self, root, I, xm, e_ax, align, offset_dims, collapsed, ss):
        prog = self.prog
        Y = root.ins[0]
        out = root.outs[0]
        E, j_axis, b_axes = F.topk_info(I, prog)
        if Y.shape[e_ax] != E or ss[e_ax] != 1:
            raise Miss("the gathered expert axis does not match the top_k")
        ylab = [None] * Y.ndim
        ylab[e_ax] = ("E", False)
        ib_label = {}
        ib_of = {ib: oa for oa, ib in align.items()}
        for i, b in enumerate(b_axes):
            ib = xm[b]
            oa = ib_of.get(ib)
            if oa is None:
                raise Miss("the gather does not keep each token's own row")
            ylab[oa] = (("T", i), False)
            ib_label[ib] = ("T", i)
        fixed = xm[j_axis] if j_axis is not None and isinstance(xm[j_axis], F.Fixed) else None
        if any(isinstance(a, F.Fixed) for a in xm) and fixed is None:
            raise Miss("the gather reads the ids at a fixed token")
        if j_axis is not None and fixed is None:
            if xm[j_axis] in ib_of:
                raise Miss("the gather aligns the choice axis with an operand axis")
            ib_label[xm[j_axis]] = "J"
        nb = root.ins[1].ndim - 1
        for oa in range(Y.ndim):
            if oa != e_ax and oa not in align and (oa in collapsed or ss[oa] != Y.shape[oa]):
                raise Miss("the gather slices a feature axis")
            if oa in align and ss[oa] != 1:
                raise Miss("unsupported gather slice sizes")
        # output axes: offset dims at their positions, index batch axes elsewhere in order
        off_ops = [oa for oa in range(Y.ndim) if oa != e_ax and oa not in align]
        batch_pos = [a for a in range(out.ndim) if a not in offset_dims]
        if len(batch_pos) != nb or len(off_ops) != len(offset_dims):
            raise Miss("unsupported gather layout")
        out_lab, out_src = [], []
        for a in range(out.ndim):
            if a in offset_dims:
                out_lab.append(None)
                out_src.append(off_ops[offset_dims.index(a)])
            else:
                ib = batch_pos.index(a)
                if ib in ib_label:
                    out_lab.append((ib_label[ib], False))
                    out_src.append(None)
                elif ib in ib_of:  # a feature axis the gather walks pointwise
                    out_lab.append(None)
                    out_src.append(ib_of[ib])
                elif root.ins[1].shape[ib] == 1:  # `ids[:, j, None]`: a unit axis of the index, no data
                    out_lab.append(None)
                    out_src.append(None)
                else:
                    raise Miss("the gather broadcasts over an index axis")
        if any(ylab[oa] is not None for oa in out_src if oa is not None):
            raise Miss("unsupported gather layout")
        yo = [oa for oa in range(Y.ndim) if ylab[oa] is None]
        site = Site(family="", root=root, out=out, I=I, E=E, k=_k(I, j_axis), b_axes=b_axes, j_axis=j_axis,
                    labels={}, kinds={}, region=[], root_kind="gather")
        site.out_labels = tuple(out_lab)
        if fixed is not None:  # y[t, ids[t, j]]: column j's pairs only (as a per-choice root of one column)
            site.fixed_choice = fixed.index
            site.notes.append(FIXED_NOTE.format(fixed.index))
        site.rows_operand = Y
        site.gather_perm = [yo.index(oa) for oa in out_src if oa is not None]
        self._grow(site, [(Y, tuple(ylab))])
        self._finish(site)
        return site

    # ------------------------------------------------------------------------------------ growth
    def _grow(self, site, seeds, stop=None):
        prog = self.prog
        labels = site.labels
        heap = []
        done_eqns = set()

        def push(x, lab):
            if isinstance(x, Lit):
                if x.ndim and any(L is not None and not L[1] for L in lab):
                    raise Miss("a constant array carries the token/expert coordinate")
                return
            old = labels.get(x)
            if old is None:
                labels[x] = lab
                e = prog.producer.get(x)
                heapq.heappush(heap, (-(prog.pos[e] if e is not None else -1), x.id, x))
            elif old != lab:
                merged = _merge_unit_labels(old, lab, x.shape)
                if merged is None:
                    raise Miss(f"value {x.aval.str_short()} is used with inconsistent token/expert axes "
                               f"({_fmt_lab(old)} vs {_fmt_lab(lab)})", prog.producer.get(x))
                if merged != old:  # a size-1 axis gained its label: its producer sees it again
                    labels[x] = merged
                    e = prog.producer.get(x)
                    heapq.heappush(heap, (-(prog.pos[e] if e is not None else -1), x.id, x))

        for x, lab in seeds:
            push(x, lab)
        while heap:
            _, _, v = heapq.heappop(heap)
            lab = labels[v]
            kind = self._classify(site, v, lab)
            if kind != "region":
                site.kinds[v] = kind
                continue
            e = prog.producer[v]
            if e in done_eqns:
                continue
            done_eqns.add(e)
            if e.name not in REGION_OPS:
                raise Miss(f"unsupported op `{e.name}` on an expert-stacked value", e)
            out_labs = []
            for o in e.outs:
                if o in labels:
                    out_labs.append(labels[o])
                elif prog.uses(o) or prog.is_output(o):
                    raise Miss(f"`{e.name}` output is used outside the MoE region", e)
                else:
                    out_labs.append(tuple([None] * o.ndim))
            for x, xl in zip(e.ins, self._back(site, e, out_labs)):
                if xl is not None:
                    push(x, xl)
            site.region.append(e)
        site.region.sort(key=lambda q: prog.pos[q])

    def _classify(self, site, v, lab):
        prog = self.prog
        ks = label_kinds(lab)
        e = prog.producer.get(v)
        has_t = any(_is_t(L) or L == "J" for L in ks)
        if v in site.vE and not has_t and "E" not in ks:
            if v not in site.stacked:
                raise Miss("a per-expert value that cannot be stacked", e)
            return "vexp"
        if v in site.varying:
            raise Miss("per-expert token values computed differently in each term", e)
        if not ks:
            return "free"
        if e is not None and e.name == "iota":
            return "iota"
        if all(_is_t(L) or L == "J" for L in ks):
            return "tok" if v not in site.vE else "region"
        if ks == {"E"}:
            return "exp"
        if all(_is_c(L) for L in ks) and (e is None or e.name not in REGION_OPS):
            return "slot"
        if not any(_is_c(L) for L in ks) and v not in site.vE:
            unl = [a for a in range(v.ndim) if lab[a] is None and v.shape[a] != 1]
            jset = set()
            for c in self.facts.get(v).cons:
                jset.update(a for a in c.xmap if isinstance(a, int))
            if all(a in jset for a in unl) and (unl == [] or e is None or e.name not in ("dot_general",)):
                return "pair"
        if e is None:
            return "pair"
        return "region"

    def _back(self, site, e, out_labs):
        """Labels of the operands of region eqn e, from the labels of its outputs."""
        name = e.name
        if name in ("stack", "concatenate"):
            stacked = self._stack_back(site, e, out_labs[0])
            if stacked is not None:
                return stacked
        omaps, reduced = F.axis_map(e)
        if omaps is None:
            raise Miss(f"unsupported op `{name}` on an expert-stacked value", e)
        res = [None if isinstance(x, Lit) else [None] * x.ndim for x in e.ins]
        if name == "slice" and e in site.eslices:
            ax = site.eslices[e]
            omaps = [list(omaps[0])]
            omaps[0][ax] = ("pt", {0: (ax, False)})
        if name == "reshape" and any(k == "mix" and L is not None for (k, _), L in zip(omaps[0], out_labs[0])):
            return self._reshape_back(e, out_labs[0])
        if name == "slice" and e not in site.eslices:
            st, sr = e.params["start_indices"], e.params["strides"]
            omaps = [list(omaps[0])]
            for a, L in enumerate(out_labs[0]):
                if L is not None and _is_c(L[0]) and omaps[0][a][0] == "mix" and (sr is None or sr[a] == 1):
                    omaps[0][a] = ("pt", {0: (a, False)})
                    out_labs = [tuple((_shift_c(x[0], st[a]), x[1]) if i == a else x
                                      for i, x in enumerate(out_labs[0]))]
        for o, (omap, olab) in enumerate(zip(omaps, out_labs)):
            for a, (kind, d) in enumerate(omap):
                L = olab[a]
                if L is None:
                    continue
                if kind == "mix":
                    raise Miss(f"`{name}` mixes positions along the {_lname(L[0])} axis", e)
                for i, (ax, bc) in d.items():
                    if res[i] is None:
                        continue
                    new = (L[0], L[1] or bc)
                    if res[i][ax] is not None and res[i][ax] != new:
                        raise Miss(f"`{name}` aligns different coordinates", e)
                    res[i][ax] = new
        if name == "slice" and e in site.eslices:
            ax = site.eslices[e]
            res[0][ax] = ("E", False)
        if name == "dot_general":
            self._dot_rule(site, e, res, out_labs[0])
        # every labeled axis of an operand must come from an output label: nothing else to check
        return [tuple(r) if r is not None else None for r in res]

    def _stack_back(self, site, e, olab):
        """`jnp.stack([expert_e(x) for e ...])` along the expert axis: the pieces, computed alike with each
        expert's weights, become one template evaluated per row with the row's expert (the loop family's
        virtual expert axis); only piece 0 enters the region. None when the joined axis is not the experts'."""
        ax = e.params["axis"] if e.name == "stack" else e.params["dimension"]
        L = olab[ax]
        if L is None or L[0] != "E":
            return None
        pieces = list(e.ins)
        if e.name == "concatenate" and any(isinstance(p, Var) and p.shape[ax] != 1 for p in pieces):
            return None  # concatenated blocks of several experts each: not one value per expert
        if len(pieces) != site.E or any(not isinstance(p, Var) for p in pieces):
            raise Miss(f"`{e.name}` of {len(pieces)} values along the expert axis of {site.E} experts", e)
        if site.template_out is not None:
            raise Miss("two stacks of per-expert values in one site", e)
        from jax_moe_ffi.rewrite.loops import virtual_expert_axis  # (loops imports this module)
        self._stack_seen = e  # a Miss from here on is said by _unsupported_forms, at the stack
        virtual_expert_axis(self.prog, site, pieces, "stacked expert outputs")
        site.stack_eqns.add(e)
        lab0 = tuple(x for a, x in enumerate(olab) if a != ax) if e.name == "stack" else \
            tuple(None if a == ax else x for a, x in enumerate(olab))
        return [lab0] + [None] * (len(pieces) - 1)

    def _reshape_back(self, e, olab):
        """Operand labels of a reshape that merges labeled axes into one (the operand's axes get the merged
        label's parts) or splits one axis into labeled axes (the operand's axis gets a merged label). Per row,
        such a reshape moves no data: the labeled axes are the row index either way."""
        x, out = e.ins[0], e.outs[0]
        groups = None if e.params.get("dimensions") is not None else \
            F._reshape_groups(tuple(x.shape), tuple(out.shape))
        if groups is None:
            raise Miss("`reshape` mixes positions along a token/expert axis", e)
        res = [None] * x.ndim
        covered = set()
        for gi, gj in groups:
            covered.update(gj)
            labs = [olab[a] for a in gj]
            if all(L is None for L in labs):
                continue
            if any(L is None or L[1] for L in labs):
                raise Miss("`reshape` mixes token/expert axes with feature axes", e)
            if len(gi) == 1 and len(gj) == 1:
                res[gi[0]] = labs[0]
            elif len(gi) == 1:  # split: the operand axis is the row-major merge of the output's labeled axes
                res[gi[0]] = (("M", tuple((L[0], out.shape[a]) for L, a in zip(labs, gj))), False)
            elif len(gj) == 1:  # merge: a merged label whose parts are the operand's axes
                parts = merged_parts(labs[0][0])
                if parts is None or [n for _, n in parts] != [x.shape[a] for a in gi]:
                    raise Miss("`reshape` mixes positions along a token/expert axis", e)
                for a, (kind, _) in zip(gi, parts):
                    res[a] = (kind, False)
            else:
                raise Miss("`reshape` mixes positions along a token/expert axis", e)
        if any(olab[a] is not None for a in range(out.ndim) if a not in covered):
            raise Miss("`reshape` mixes positions along a token/expert axis", e)  # a labeled size-1 axis
        return [tuple(res)]

    def _dot_rule(self, site, e, res, olab):
        """Contractions inside the region: over feature axes (rows), or over tokens at the capacity
        dispatch (x -> [E, C, D] buffers), where the slot constraint proves one token per slot."""
        (lc, rc), _ = e.params["dimension_numbers"]
        if not lc:
            return
        kinds_out = label_kinds(olab)
        if "C" in kinds_out and "E" in kinds_out:
            for d_i in (0, 1):
                D = e.ins[d_i]
                if isinstance(D, Lit):
                    continue
                dc = lc if d_i == 0 else rc
                oc = rc if d_i == 0 else lc
                lab = self._dispatch_labels(site, e, D, d_i, dc, olab)
                if lab is None:
                    continue
                if site.disp_eqn is not None and site.disp_eqn is not e:
                    raise Miss("more than one capacity dispatch feeds one combine", e)
                site.disp_eqn = e
                site.disp_operand = D
                for a, L in lab.items():
                    res[d_i][a] = L
                    other = 1 - d_i
                    if res[other] is not None:
                        res[other][oc[dc.index(a)]] = L
                return

    def _dispatch_labels(self, site, e, D, d_i, dc, olab):
        if site.S is None:
            return None
        f = self.facts.get(D)
        m = _dot_maps(e)[d_i]  # D axis -> product axis
        out_cat = {olab[pa][0]: pa for pa in range(len(olab)) if olab[pa] is not None}
        econ = ccon = None
        for c in f.cons:
            if not isinstance(c.cat, int):
                continue
            pc = m[c.cat]
            if c.src is site.I and pc == out_cat.get("E"):
                econ = c
            elif c.src is site.S and pc == out_cat.get("C"):
                ccon = c
        if econ is None or ccon is None:
            return None
        roles = _roles(ccon, econ, site.b_axes, site.j_axis)
        if roles is None or tuple(roles) != site.s_roles or ccon.off != site.s_off:
            raise Miss("the capacity dispatch and combine use different slot assignments", e)
        lab = {}
        for i, b in enumerate(site.b_axes):
            a = econ.xmap[b]
            if not isinstance(a, int):
                return None
            if a in dc:
                lab[a] = (("T", i), False)
        if set(lab) != set(dc):
            raise Miss("the dispatch einsum contracts axes other than tokens", e)
        return lab

    # ------------------------------------------------------------------------------------ checks
    def _finish(self, site):
        prog = self.prog
        region = set(site.region)
        allowed = region | {site.root} | site.chain
        for e in site.region + [site.root]:
            if e.effects:
                raise Miss(f"`{e.name}` with side effects inside the expert compute", e)
            u = e.unit
            while u is not None:
                if u.name == "custom_vjp_call":
                    raise Miss("the expert compute calls a custom_vjp function (its gradient rule would be lost)",
                               e)
                u = u.unit
        for e in site.region:
            for o in e.outs:
                if prog.is_output(o):
                    raise Miss("an expert-stacked intermediate is an output of the function", e)
                for u in prog.uses(o):
                    if u not in allowed:
                        if u.kind != "prim" or u.effects:
                            raise Miss(f"an expert-stacked intermediate is also used outside the MoE region "
                                       f"(by `{u.name}` at {source_line(u)})", e)
                        site.shared_uses.setdefault(u, e)  # kept if another site replaces u (_drop_unshared)
        for v, kd in site.kinds.items():
            if kd == "slot":
                raise Miss("a per-slot value from outside the region (not supported)")
        if site.S is not None and site.disp_eqn is None:
            raise Miss("capacity combine without a matching one-hot dispatch einsum")
        # GEMMs
        for e in site.region + [site.root]:
            if e.name == "dot_general":
                self._plan_dot(site, e)
        if not site.gemms:
            raise Miss("no expert weight contraction in the region (nothing to group)")
        if not any(self._from_tokens(site, plan["rows_from"]) for plan in site.gemms.values()):
            raise Miss("no token activations reach the expert GEMMs (the top_k axis is not an expert axis: "
                       "expert-choice routing?)")
        # combine peephole: a root operand with no feature axes is the combine weight
        if site.root_kind == "dot":
            (lc, rc), (lb, rb) = site.root.params["dimension_numbers"]
            for i in (0, 1):
                x = site.root.ins[i]
                # unlabeled axes of extent 1 that the root contracts or batches (MaxText's inference-mode
                # combine 'EBNCM,BNSEC -> BNSM' with N = 1) hold no feature data: still a combine weight
                paired = set((lc, rc)[i]) | set((lb, rb)[i])
                if isinstance(x, Var) and all(x.shape[a] == 1 and a in paired for a in others(x, site.labels)) \
                        and not self._has_gemm(site, x):
                    site.weights_operand = x
                    site.rows_operand = site.root.ins[1 - i]
                    break
        if site.disp_operand is not None and self._has_gemm(site, site.disp_operand):
            raise Miss("the capacity dispatch mask depends on expert compute")
        # token leaf for moe_dispatch: the largest float token leaf feeding a GEMM
        best = None
        cands = [plan["rows_from"] for plan in site.gemms.values()]
        if site.disp_eqn is not None:
            cands += [x for x in site.disp_eqn.ins if x is not site.disp_operand]
        for x in cands:
            if not isinstance(x, Var):
                continue
            if site.kinds.get(x) == "tok" and np.dtype(x.dtype) in GEMM_DTYPES:
                lab = site.labels[x]
                if all(L is None or not L[1] for L in lab) and len([L for L in lab if L]) == len(site.b_axes):
                    if best is None or x.size > best.size:
                        best = x
        site.primary = best
        site.family = self._family(site)
        if site.S is not None:
            if not self._has_cumsum(site.S):
                raise Miss("capacity slot index is not computed by a running count (cumsum): cannot prove "
                           "one token per slot")
            if self.mode == "exact":  # dropless gives every pair its own row by definition
                from jax_moe_ffi.rewrite import capacity as CAP
                ok, why = CAP.one_token_per_slot(site, prog)
                if not ok:
                    raise Miss(why, site.disp_eqn)
                site.notes.append(why)
        self._cost(site)
        site.source = source_line(site.root)

    def _interesting(self, e, limit=400):
        """Does a dense expert-stacked contraction feed this reduction (worth a near-miss report)?"""
        prog = self.prog
        seen, stack = set(), [e]
        while stack and len(seen) < limit:
            q = stack.pop()
            if q in seen:
                continue
            seen.add(q)
            if q.name == "dot_general" and _stacked_dot(q, prog) and q not in self.router_eqns():
                return True
            stack += [prog.producer[a] for a in q.ins if isinstance(a, Var) and a in prog.producer]
        return False

    def _has_cumsum(self, v, limit=2000):
        return upstream(self.prog, v, lambda x, e: e is not None and e.name in F.CUMULATIVE, limit)

    def _from_tokens(self, site, v):
        """Is v (transitively, inside the region) computed from a token leaf with feature axes?"""
        prog = self.prog
        stack, seen = [v], set()
        while stack:
            x = stack.pop()
            if not isinstance(x, Var) or x in seen:
                continue
            seen.add(x)
            if site.kinds.get(x) == "tok" and others(x, site.labels):
                return True
            if site.kinds.get(x) is not None:
                continue
            e = prog.producer.get(x)
            if e is not None and e in site.region:
                stack += list(e.ins)
        return False

    def _has_gemm(self, site, v):
        prog = self.prog
        stack, seen = [v], set()
        while stack:
            x = stack.pop()
            e = prog.producer.get(x)
            if e is None or e in seen or (e not in site.region):
                continue
            seen.add(e)
            if e in site.gemms:
                return True
            stack += [a for a in e.ins if isinstance(a, Var)]
        return False

    def _family(self, site):
        if site.S is not None:
            return "capacity"
        if site.terms or site.stack_eqns:
            return "loop"
        # tokens broadcast to every expert then masked: a token leaf reaches a broadcast that adds E
        for e in site.region:
            if e.name == "broadcast_in_dim":
                x = e.ins[0]
                if isinstance(x, Var) and site.kinds.get(x) == "tok":
                    olab = site.labels[e.outs[0]]
                    if "E" in label_kinds(olab):
                        return "masked"
        return "dense"

    def _plan_dot(self, site, e):
        """Grouped GEMM when one operand is expert-side weights; otherwise a per-row dot."""
        labels = site.labels
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        is_root = e is site.root
        ops = e.ins
        labs = [labels.get(x) if isinstance(x, Var) else None for x in ops]
        kinds = [site.kinds.get(x) if isinstance(x, Var) else "lit" for x in ops]
        wi = None
        for i in (0, 1):
            if kinds[i] in ("exp", "vexp"):
                wi = i
        # labeled contractions: only E/C at the root, T at the capacity dispatch
        for i, j in zip(lc, rc):
            li = labs[0][i] if labs[0] else None
            lj = labs[1][j] if labs[1] else None
            for L in (li, lj):
                if L is None:
                    continue
                if (L[0] == "E" or _is_c(L[0])) and not is_root:
                    raise Miss("contraction over experts inside the region", e)
                if (_is_t(L[0]) or L[0] == "J") and e is not site.disp_eqn:
                    raise Miss("contraction over tokens inside the region", e)
            if (li is None) != (lj is None) and not (wi is not None and kinds[1 - wi] != "exp"
                                                     and ((li or lj)[0] == "E")):
                raise Miss("contraction pairs a coordinate axis with a feature axis", e)
        if wi is None:
            for i in (0, 1):
                if kinds[i] == "exp" and ops[i].size // max(1, site.E) > GATHER_LIMIT:
                    raise Miss("expert weights would be gathered per row", e)
            return
        W, P = ops[wi], ops[1 - wi]
        wl, pl = labs[wi], labs[1 - wi]
        wc, pc = (lc, rc) if wi == 0 else (rc, lc)
        wb, pb = (lb, rb) if wi == 0 else (rb, lb)
        virtual = site.kinds.get(W) == "vexp"
        if virtual:
            e_ax = None
        else:
            e_axes = [a for a in range(W.ndim) if wl[a] is not None and wl[a][0] == "E" and not wl[a][1]]
            if len(e_axes) != 1:
                raise Miss("expert weights without a single expert axis", e)
            e_ax = e_axes[0]
        # batch dims other than E: not supported
        for a, b in zip(wb, pb):
            if a != e_ax:
                raise Miss("expert contraction with extra batch dimensions", e)
        p_unl = [a for a in range(P.ndim) if pl is None or pl[a] is None]
        pc_unl = [a for a in pc if pl is None or pl[a] is None]
        # an uncontracted unlabeled axis of extent 1 (e.g. the N=1 axis of MaxText's inference-mode
        # 'EBNCM,EMH -> EBNCH') is a free axis of the rows that holds no data: each row's GEMM is
        # unchanged and the output keeps it as a size-1 axis (emit._gemm reshapes to the out's rows form)
        p_unl = [a for a in p_unl if a in pc_unl or P.shape[a] != 1]
        if sorted(pc_unl) != sorted(p_unl):
            raise Miss("the token-side operand of an expert GEMM has free feature axes", e)
        if e_ax is not None and e_ax in wc:
            if not is_root:
                raise Miss("contraction over experts inside the region", e)
        wc_unl = [wc[pc.index(a)] for a in pc_unl]
        w_free = [a for a in range(W.ndim) if a not in wc and a != e_ax and a not in wb]
        if P.dtype != W.dtype or np.dtype(W.dtype) not in GEMM_DTYPES:
            raise Miss(f"expert GEMM dtypes {P.dtype} x {W.dtype} are not supported by grouped_matmul", e)
        pet = e.params.get("preferred_element_type")
        out_dt = np.dtype(e.outs[0].dtype)
        if out_dt != np.dtype(W.dtype) and out_dt != np.dtype(np.float32):
            raise Miss(f"expert GEMM output dtype {out_dt} not supported", e)
        del pet
        site.gemms[e] = {"w": W, "w_index": wi, "e_ax": e_ax, "wc": wc_unl, "pc": pc_unl, "w_free": w_free,
                         "rows_from": P, "virtual": virtual, "out_dtype": out_dt,
                         "K": int(np.prod([P.shape[a] for a in pc_unl], dtype=np.int64)),
                         "N": int(np.prod([W.shape[a] for a in w_free], dtype=np.int64))}

    def _cost(self, site):
        k, t = site.k, site.num_tokens
        rows = t * (k if site.fixed_choice is None else 1)  # a fixed-column site runs one pair per token
        if site.C is not None and self.mode == "exact":
            rows = min(rows, site.E * site.C * int(np.prod([site.token_shape[i] for i, r in
                                                            enumerate(site.token_shape)
                                                            if any(lab == (("T", i), False) for lab in
                                                                   site.labels.get(site.disp_eqn.outs[0], ()))]
                                                           or [1])))
        before = after = 0
        bb = ba = 0
        for e in site.region + [site.root]:
            if e.name == "dot_general":
                (lc, _), _ = e.params["dimension_numbers"]
                out = e.outs[0]
                kk = int(np.prod([e.ins[0].shape[a] for a in lc], dtype=np.int64)) if lc else 1
                # (a stacked site's region holds the template expert's dots: every expert runs them)
                before += 2 * out.size * kk * (site.E if site.stack_eqns and e is not site.root else 1)
            for o in e.outs:
                bb = max(bb, o.size * np.dtype(o.dtype).itemsize)
        for plan in site.gemms.values():
            after += 2 * rows * plan["K"] * plan["N"]
            ba = max(ba, rows * max(plan["K"], plan["N"]) * np.dtype(plan["out_dtype"]).itemsize)
        if site.terms:
            before *= len(site.terms)
        site.flops_before, site.flops_after = int(before), int(after)
        site.bytes_before, site.bytes_after = int(bb), int(ba)
        site.shapes = {"tokens": site.token_shape, "E": site.E, "k": site.k,
                       "gemms": [(tuple(p["rows_from"].shape), tuple(p["w"].shape)) for p in site.gemms.values()]}

    # ------------------------------------------------------------------------------- near misses
    def router_eqns(self, limit=5000):
        """Equations that feed a top_k (the router): their dots are not expert compute."""
        if getattr(self, "_router", None) is not None:
            return self._router
        prog = self.prog
        seen = set()
        stack = [e for e in prog.flat if F.is_router_eqn(e, prog)]
        while stack and len(seen) < limit:
            q = stack.pop()
            if q in seen:
                continue
            seen.add(q)
            stack += [prog.producer[a] for a in q.ins if isinstance(a, Var) and a in prog.producer]
        self._router = seen
        return seen

    def _uncovered_misses(self):
        """Expert-stacked dense contractions no site covers, with the best reason we have."""
        prog = self.prog
        router = self.router_eqns()
        has_topk = any(F.is_router_eqn(e, prog) for e in prog.flat)  # top_k, approx_top_k, argmax (top-1)
        reported = {m["source"] for m in self.misses}
        gather_reason = self._expert_choice_reason()
        if gather_reason is not None:
            for m in self.misses:
                m["reason"] = f"{gather_reason} ({m['reason']})"
        for e in prog.flat:
            if e.name != "dot_general" or e in self.covered or e.kind != "prim":
                continue
            if not _stacked_dot(e, prog) or e in router:
                continue
            src = source_line(e)
            if src in reported:
                continue
            reported.add(src)
            if gather_reason is not None:
                reason = gather_reason
            elif not has_topk and self.outer_router:
                reason = ("expert-stacked contraction in a loop body whose router (top_k) is outside the loop, "
                          "e.g. lax.map(batch_size=b) over groups of experts: not rewritten (a loop over single "
                          "experts, lax.map without batch_size, jax.vmap and the all-experts einsum are)")
            elif not has_topk:
                reason = ("no k-sparse gate: the expert-stacked contraction is combined with dense weights "
                          "(no top_k/approx_top_k/argmax in the function; soft/dense MoE keeps its meaning)")
            elif self._sum_of_choices(e):
                reason = ("the gate / dispatch tensor is a sum of one-hot terms over different index arrays that "
                          "are not read as one id array (argmaxes over different expert counts, top-k arrays, "
                          "terms whose constraints differ in kind or number): each term is sparse, the sum is not "
                          "proven to be one top-k; argmaxes over the same experts (each term optionally with its own "
                          "slot one-hot), or an id array from lax.top_k(gates, k), are")
            else:
                reason = ("expert-stacked contraction whose reduction over experts is not provably "
                          "weighted by a top_k-sparse gate")
            self.misses.append({"reason": reason, "source": src, "op": e.name, "at": None,
                                "shapes": [tuple(a.shape) for a in e.ins]})
        self._unsupported_forms(reported)

    def _sum_of_choices(self, e, limit=400):
        """Is an operand of e computed from an add whose two terms are each one-hot over the same category axis
        but by different top-k index arrays (a per-choice sum the constraint facts cannot merge)?"""
        prog, facts = self.prog, self.facts

        def topk_cons(a):
            return {(c.cat, c.src) for c in facts.get(a).cons
                    if isinstance(c.cat, int) and F.is_topk_indices(c.src, prog)}

        def hit(x, q):
            if q is None or q.name not in ("add", "add_any") or len(q.ins) != 2:
                return False
            ca, cb = topk_cons(q.ins[0]), topk_cons(q.ins[1])
            return any(cat == cat2 and src is not src2 for cat, src in ca for cat2, src2 in cb)

        return any(upstream(prog, a, hit, limit) for a in e.ins if isinstance(a, Var))

    def _unsupported_forms(self, reported):
        """Routed MoE written in forms the pass does not rewrite, reported so that they are not silent: a loop
        over the experts (a lax.scan / fori_loop here is also handed to the Plan, which tries it unrolled), a
        lax.scan over the tokens, a cond on the router's choices (also handed to the Plan), expert weights gathered
        per (token, choice), rows gathered per expert, lax.switch under vmap (select_n by the ids), and stacked
        per-expert outputs picked per id column, or gated but not rewritten."""
        prog = self.prog
        experts = F.router_sizes(prog)
        if not experts:
            return

        def note(e, reason):
            src = source_line(e)
            if src not in reported:
                reported.add(src)
                self.misses.append({"reason": reason, "source": src, "op": e.name, "at": None,
                                    "shapes": [tuple(a.shape) for a in e.ins]})

        for e in prog.flat:
            if e in self.covered:
                continue
            if e.kind in ("scan", "while") and any(_has_dot(sub) for sub in e.subs or []):
                # (a fori_loop with static bounds is a scan with no xs: the stacked weights are its consts)
                stacked = any(isinstance(x, Var) and x.ndim >= 3 and x.shape[0] in experts for x in e.ins)
                if stacked and e.kind == "while":
                    note(e, "per-expert loop written as lax.while_loop over stacked expert weights: not rewritten "
                            "(a while loop is not unrolled; lax.scan and lax.fori_loop with static bounds over the "
                            "experts are read as their unrolled iterations)")
                elif stacked and e.params["length"] in experts:
                    if e.orig is not None:
                        self.loop_scans.append(e)  # the Plan reads it unrolled, and amends this note if that fails
                    note(e, "per-expert loop written as lax.scan / lax.fori_loop over stacked expert weights: not "
                            "rewritten")
                elif stacked and e.kind == "scan" and any(
                        isinstance(x, Var) and self._from_router(x)
                        for x in e.ins[sum(scan_split(e.params, e.ins)):]):
                    note(e, "per-token loop (lax.scan over the tokens, each step indexing the stacked expert weights "
                            "by that token's ids): not rewritten (the all-experts einsum weighted by the gate, a loop "
                            "over the experts, or jax.lax.ragged_dot on rows sorted by expert are)")
            elif e.kind == "cond" and isinstance(e.ins[0], Var) and self._from_router(e.ins[0]) \
                    and any(_has_dot(sub) for sub in e.subs or []):
                if e.orig is not None:
                    self.loop_scans.append(e)  # the Plan tries it as its second branch (zeros otherwise)
                note(e, "an expert's computation under lax.cond on the router's choices (e.g. skipped when no token "
                        "chose the expert): not rewritten (the same loop or einsum without the cond is; the pass "
                        "then runs only the chosen (token, expert) pairs anyway)")
            elif e.name == "gather" and e.ins[0].ndim >= 3 and e.ins[0].shape[0] in experts \
                    and self._from_router(e.ins[1]):
                note(e, "expert weights gathered per (token, choice) (`w[idx]`, a copy of k weight matrices per "
                        "token): not rewritten (the all-experts einsum or a loop over the experts is)")
            elif e.name == "eq" and self._assembled_ids(e):
                note(e, "expert ids assembled from several routers' outputs (concatenated index arrays) and compared "
                        "with each expert: not rewritten (read as one [T, k] id array are: top_k / argsort ids, "
                        "and top-1 arrays (argmax, keepdims) or top_k arrays concatenated along their choice axis, "
                        "all over the same experts)")
            elif e.name == "dot_general" and self._rows_gathered_per_expert(e, experts):
                note(e, "per-expert loop over the expert's own gathered token rows (`x[rows]`, rows chosen by "
                        "the router: `nonzero(ids == e)`, index_add style, or sorted by expert): not rewritten "
                        "(a loop that runs each expert on all tokens under a gate column, the all-experts "
                        "einsum and capacity einsums are)")
            elif e.name == "select_n" and np.issubdtype(e.ins[0].dtype, np.integer) and e.outs[0].ndim >= 2 \
                    and (len(e.ins) - 1 in experts or any(d in experts for d in e.outs[0].shape)) \
                    and self._from_router(e.ins[0]):
                note(e, "expert weights or outputs selected per token by the router's ids with select_n (what "
                        "lax.switch over the experts becomes under jax.vmap: a copy of the chosen expert's weights "
                        "per token, or every expert run on every token): not rewritten (the all-experts einsum "
                        "weighted by the gate, a loop over the experts, or jnp.take_along_axis over the stacked "
                        "outputs with the [T, k] ids are)")
            elif e.name == "gather" and e.ins[0].ndim >= 2 and self._from_router(e.ins[1]) \
                    and not self._from_router(e.ins[0]) and self._picks_from_stacked_experts(e, experts):
                note(e, "per-expert outputs stacked, then picked with a gather per choice column (`ids[:, j]`), but "
                        "not rewritten: each column's gather must pick the token's own row at its choice, and every "
                        "use of the stacked outputs must be such a gather (one jnp.take_along_axis with the whole "
                        "[T, k] id array is rewritten too)")
            elif e.name in ("concatenate", "stack") and len(e.ins) in experts and self._stacked_then_gated(e):
                why = self.stack_misses.get(e, "the stack is not reached from a top_k-sparse combine")
                note(e, "per-expert outputs stacked (`jnp.stack([expert_e(x) for e ...])`) and combined with the "
                        f"router's gate, but not rewritten: {why} (piece e must be the same computation with "
                        "expert e's weights)")

    def _assembled_ids(self, e):
        """An `eq` of an integer array that is a concatenation of two or more top-k / argmax index arrays (through
        slices, reshapes and casts) with an expert id, in a form facts.may_repeat does not read as one id array."""
        prog = self.prog
        through = ("slice", "squeeze", "reshape", "convert_element_type", "broadcast_in_dim", "expand_dims",
                   "dynamic_slice", "gather")

        def strip(v):
            for _ in range(12):
                q = prog.producer.get(v) if isinstance(v, Var) else None
                if q is None or q.name not in through or F.is_topk_indices(v, prog):
                    return v, q
                v = q.ins[0]
            return v, None

        for a in e.ins:
            if not isinstance(a, Var) or not np.issubdtype(np.dtype(a.dtype), np.integer):
                continue
            v, q = strip(a)
            if q is not None and q.name == "concatenate" and len(q.ins) >= 2 and not F.may_repeat(v, prog) and \
                    all(isinstance(p_, Var) and F.is_topk_indices(strip(p_)[0], prog) for p_ in q.ins):
                return True
        return False

    def _picks_from_stacked_experts(self, e, experts):
        """A gather whose operand is a `concatenate` of one piece per expert (jnp.stack of expert outputs)."""
        q = self.prog.producer.get(e.ins[0]) if isinstance(e.ins[0], Var) else None
        return q is not None and q.name in ("concatenate", "stack") and len(q.ins) in experts

    def _stacked_then_gated(self, e):
        """`jnp.stack` of per-expert values (width-1 pieces along the joined axis, none of them computed from
        the router) whose result meets a router-derived operand in a dot or a product (the gate)."""
        prog = self.prog
        if any(not isinstance(a, Var) or self._from_router(a) for a in e.ins):
            return False  # (expert outputs come from the tokens and weights, not from the router)
        if e.name == "concatenate" and any(a.shape[e.params["dimension"]] != 1 for a in e.ins):
            return False
        stack, seen = [e.outs[0]], set()
        while stack:
            v = stack.pop()
            for u in prog.uses(v):
                if u in seen:
                    continue
                seen.add(u)
                if u.name in ("transpose", "reshape", "convert_element_type", "broadcast_in_dim"):
                    stack.append(u.outs[0])
                elif u.name in ("dot_general", "mul") and any(
                        isinstance(o, Var) and o is not v and self._from_router(o) for o in u.ins):
                    return True
        return False

    def _rows_gathered_per_expert(self, e, experts):
        """A dot of token rows gathered by router-derived indices with one expert's slice `W[e]` of a
        stacked weight: the body of a loop that computes each expert on its own rows."""
        prog = self.prog

        def producer(v, through=("squeeze", "reshape", "convert_element_type")):
            p = prog.producer.get(v) if isinstance(v, Var) else None
            while p is not None and p.name in through and isinstance(p.ins[0], Var):
                p = prog.producer.get(p.ins[0])
            return p

        def gathered_rows(v):
            p = producer(v)
            return p is not None and p.name == "gather" and p.ins[0].ndim == 2 and self._from_router(p.ins[1])

        def expert_slice(v):
            p = producer(v)
            return p is not None and p.name in ("slice", "dynamic_slice") and p.ins[0].ndim >= 3 \
                and p.ins[0].shape[0] in experts and p.outs[0].shape[0] == 1

        a, b = e.ins[:2]
        return (gathered_rows(a) and expert_slice(b)) or (gathered_rows(b) and expert_slice(a))

    def _from_router(self, v, limit=200):
        """Is v computed (within a few hundred equations) from top-k indices?"""
        return upstream(self.prog, v, lambda x, e: F.is_topk_indices(x, self.prog), limit)

    def _expert_choice_reason(self):
        """A top_k whose one-hot category axis is contracted against activations that share none of the
        top_k's batch axes -- a gather of tokens by index, one row per (batch, choice): experts choose
        tokens (expert-choice routing)."""
        prog = self.prog
        for e in prog.flat:
            if e.name != "dot_general" or e in self.covered:
                continue
            cons, n_out, n_c, _ = self.facts.dot_product_fact(e, out_space=False)
            maps = _dot_maps(e)
            for c in cons:
                if not (isinstance(c.cat, int) and c.cat >= n_out and F.is_topk_indices(c.src, prog)):
                    continue
                _, j_axis, b_axes = F.topk_info(c.src, prog)
                if j_axis is None or not isinstance(c.xmap[j_axis], int) or c.xmap[j_axis] >= n_out:
                    continue
                bpos = {c.xmap[b] for b in b_axes if isinstance(c.xmap[b], int)}
                for i, x in enumerate(e.ins):
                    if isinstance(x, Var) and not self.facts.get(x).cons and \
                            c.cat in maps[i].values() and not bpos & set(maps[i].values()):
                        return ("expert-choice routing: top_k selects along the token axis (experts pick "
                                "tokens); not token-choice MoE, left as is")
        # the same written as a gather: an expert contraction whose rows are x[ids] for top_k ids that range over
        # x's rows (x[top_k(scores.T, c)[1]]: each expert's c tokens)
        for e in prog.flat:
            if e.name != "dot_general" or e in self.covered or not _stacked_dot(e, prog):
                continue
            for a in e.ins:
                p = prog.producer.get(a) if isinstance(a, Var) else None
                if p is None or p.name != "gather" or isinstance(p.ins[1], Lit):
                    continue
                v = self.facts.view(p.ins[1])
                if v is not None and F.is_topk_indices(v[0], prog) and p.ins[0].ndim == 2 \
                        and F.topk_info(v[0], prog)[0] == p.ins[0].shape[0]:
                    return ("expert-choice routing: the experts' rows are gathered by top_k indices over the "
                            "tokens (experts pick tokens); not token-choice MoE, left as is")
        return None


def _kind_name(k):
    parts = merged_parts(k)
    if parts:
        return "(" + "*".join(_kind_name(q) for q, _ in parts) + ")"
    return f"T{k[1]}" if _is_t(k) else str(k)


def _fmt_lab(lab):
    return "[" + ",".join("_" if L is None else _kind_name(L[0]) + ("'" if L[1] else "") for L in lab) + "]"


def _lname(L):
    return {"E": "expert", "C": "capacity-slot", "J": "choice"}.get(L, "token") \
        if not isinstance(L, tuple) else "token"


def _roles(c, econ, b_axes, j_axis):
    """Roles of the slot index's axes relative to the top_k constraint, or None."""
    roles = []
    for a in c.xmap:
        r = None
        for i, b in enumerate(b_axes):
            if econ.xmap[b] is a or (isinstance(a, int) and econ.xmap[b] == a):
                r = ("T", i)
        jx = F.xj(econ, j_axis)
        if jx is not None and (jx is a or (isinstance(a, int) and jx == a)):
            r = "J"
        if isinstance(a, int) and a == econ.cat:
            r = "E"
        if r is None and c.src.shape[len(roles)] == 1:
            # a size-1 axis of the slot index (e.g. MaxText's inference masks [B, N=1, S, E]) carries no
            # coordinate: every lookup reads index 0 there (emit._slot_at), so it needs no role.
            r = "1"
        if r is None:
            return None
        roles.append(r)
    return roles


def _k(I, j_axis):
    return 1 if j_axis is None else I.shape[j_axis]


_dot_maps = F.dot_axis_maps


def _prod_size(root, pa):
    if root.name == "reduce_sum":
        return root.ins[0].shape[pa]
    for i, m in enumerate(_dot_maps(root)):
        for a, p in m.items():
            if p == pa and root.ins[i].shape[a] != 1:
                return root.ins[i].shape[a]
    return 1


SHAPE_OPS = {"convert_element_type", "transpose", "reshape", "squeeze", "slice", "broadcast_in_dim", "copy",
             "copy_p", "dynamic_slice", "name", "sharding_constraint", "alias", "reduce_precision"}


def _param_like(prog, v, limit=64):
    """A function input (or constant) seen through layout/dtype ops: weights, not activations."""
    for _ in range(limit):
        if isinstance(v, Lit):
            return True
        e = prog.producer.get(v)
        if e is None:
            return True
        if e.name not in SHAPE_OPS:
            return False
        v = e.ins[0]
    return False


def upstream(prog, v, hit, limit):
    """Does hit(var, its producer or None) hold for v or a value it is computed from (walking at most `limit`
    variables up the producers)?"""
    stack, seen = [v], set()
    while stack and len(seen) < limit:
        x = stack.pop()
        if not isinstance(x, Var) or x in seen:
            continue
        seen.add(x)
        e = prog.producer.get(x)
        if hit(x, e):
            return True
        if e is not None:
            stack.extend(e.ins)
    return False


def _has_dot(sub) -> bool:
    """Does a sub-program (a scan / while body, nested ones included) contain a dot_general?"""
    return any(q.name == "dot_general" or any(_has_dot(x) for x in (q.subs or [])) for q in sub.flat)


def _stacked_dot(e, prog=None):
    """A contraction against expert-stacked weights: a weight-like operand with >= 3 axes. Not a dense layer
    `x[..., D] @ W[D, F]` whose >= 3-axis operand is activations that happen to be a function input ([B, S, D]
    tokens feeding a shared expert): contracted on its last axis only, against a 2-D operand's first axis."""
    if e.outs[0].ndim < 2:
        return False
    (lc, rc), (lb, _) = e.params["dimension_numbers"]
    for i, (x, contracted) in enumerate(zip(e.ins, (lc, rc))):
        if not (isinstance(x, Var) and x.ndim >= 3 and (prog is None or _param_like(prog, x))):
            continue
        other, other_contracted = e.ins[1 - i], (rc, lc)[i]
        dense_layer = (not lb and tuple(contracted) == (x.ndim - 1,) and other.ndim == 2
                       and tuple(other_contracted) == (0,))
        if not dense_layer:
            return True
    return False
