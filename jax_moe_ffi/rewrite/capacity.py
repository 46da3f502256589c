"""Cheap capacity leaves for exact mode: skip the model's own running count when it is the GShard rule.

A capacity layer computes each (token, choice) pair's slot with a running count (a cumsum over a one-hot
[T*k, E] mask: 8M int32 at Qwen3-30B shapes, ~0.1 ms on an H200, 6% of the optimized layer). In exact mode
the emitter reads the values the model derives from it (the kept mask, the slot index) at the pairs. The
dispatch plan already computes the same running count with `capacity=C` (token-major, choice-minor:
DESIGN.md's GShard rule), so when a leaf is a function of the expert ids alone *and* equals one of a few
GShard-derived forms, the emitter reads that form instead, computed from the plan.

"Equals" is checked by evaluating the model's own sub-program from the ids to the leaf on probe id arrays
(uniform, all to one expert, skewed, distinct per token) and comparing bit for bit with the candidate; any
leaf that depends on something else, or matches no candidate, leaves the site on the model's own values
(the previous behaviour), and the report says which. The check is by evaluation, not a symbolic proof:
a function of the ids that agrees with the GShard rule on every probe but not in general would be
mis-rewritten; the probes include the drop-heavy and duplicate-expert cases where capacity rules differ.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_moe_ffi.rewrite.facts import may_repeat
from jax_moe_ffi.rewrite.ir import Lit, Var
from jax_moe_ffi.rewrite.interp import bind

MAX_PROBE_ELEMENTS = 1 << 26  # skip the check (and the shortcut) for leaves larger than this


def gshard_slots(ids: np.ndarray, num_experts: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept [T,k] bool, slot [T,k] int: running count of earlier pairs of the same expert) for ids [T,k],
    in flat token-major, choice-minor order; ids outside [0, E) are never kept and never counted."""
    flat = ids.reshape(-1).astype(np.int64)
    valid = (flat >= 0) & (flat < num_experts)
    key = np.where(valid, flat, num_experts)  # invalid ids sort last, in their own group
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    first = np.searchsorted(sorted_key, sorted_key, side="left")  # first index of each one's group
    slot = np.empty_like(flat)
    slot[order] = np.arange(flat.size) - first
    kept = valid & (slot < capacity)
    return kept.reshape(ids.shape), slot.reshape(ids.shape)


def _candidates(kept, slot, ids, num_experts, shape, dtype):
    """name -> candidate value (numpy) of a leaf of `shape`, from the GShard kept mask and slots."""
    slot_kept = np.where(kept, slot, 0)
    out = {}
    kind = _form(shape, ids.shape, num_experts)
    if kind == "pairs":
        out["kept"] = kept
        out["slot_if_kept"] = slot_kept
    elif kind == "pairs_x_experts":
        onehot = ids[..., None] == np.arange(num_experts)
        out["onehot_kept"] = onehot & kept[..., None]
        out["onehot_slot_if_kept"] = np.where(onehot & kept[..., None], slot_kept[..., None], 0)
    return {k: v.astype(dtype).reshape(shape) for k, v in out.items()}


def _form(shape, ids_shape, num_experts):
    """'pairs': the ids' shape plus size-1 axes; 'pairs_x_experts': plus one trailing E axis; else None."""
    shape, n = tuple(shape), len(ids_shape)
    if shape[:n] != tuple(ids_shape):
        return None
    rest = [d for d in shape[n:] if d != 1]
    if not rest:
        return "pairs"
    if rest == [num_experts] and shape[-1] == num_experts:
        return "pairs_x_experts"
    return None


def _device_candidate(name, kept, slot, ids, num_experts, dtype):
    """The same forms as `_candidates`, as JAX values from the plan's kept mask and slots."""
    slot_kept = jnp.where(kept, slot, 0)
    if name == "kept":
        v = kept
    elif name == "slot_if_kept":
        v = slot_kept
    else:
        onehot = ids[..., None] == jnp.arange(num_experts, dtype=ids.dtype)
        sel = onehot & kept[..., None]
        v = sel if name == "onehot_kept" else jnp.where(sel, slot_kept[..., None], 0)
    return v.astype(dtype)


def _depends_only_on(prog, v, source, limit=4000):
    """True when v is computed from `source` (and literals) only, by primitives of the flat view."""
    stack, seen, reached = [v], set(), False
    while stack:
        x = stack.pop()
        if x is source:
            reached = True
            continue
        if isinstance(x, Lit) or x in seen:
            continue
        seen.add(x)
        if len(seen) > limit:
            return False
        e = prog.producer.get(x)
        if e is None or e.kind not in ("prim", "alias") or e.effects:
            return False
        stack.extend(a for a in e.ins if isinstance(a, Var) or a is source)
    return reached


def _evaluate(prog, vs, source, value):
    """The model's sub-program from `source` (bound to `value`) to each of vs, evaluated eagerly once."""
    env = {source: value}

    def read(x):
        if isinstance(x, Lit):
            return x.val
        if x not in env:
            e = prog.producer[x]
            for o, r in zip(e.outs, bind(e, [read(a) for a in e.ins])):
                env[o] = r
        return env[x]

    with jax.ensure_compile_time_eval():
        return [np.asarray(read(v)) for v in vs]


def _probes(shape, num_experts, rng):
    t, k = int(np.prod(shape[:-1])), shape[-1]
    distinct = np.argsort(rng.random((t, num_experts)), axis=1)[:, :k] if k <= num_experts else None
    skew = np.minimum(rng.zipf(1.5, (t, k)) - 1, num_experts - 1)
    out = [rng.integers(0, num_experts, (t, k)), np.zeros((t, k)), skew]
    if distinct is not None:
        out.append(distinct)
    return [p.reshape(shape) for p in out]


def capacity_shortcuts(site, prog, leaves):
    """{leaf var: candidate name} for every leaf in `leaves` that depends on the expert ids, when all of
    them match a GShard form on every probe; else (None, reason)."""
    memo = getattr(site, "_shortcuts_memo", None)
    key = tuple(id(v) for v in leaves)
    if memo is not None and memo[0] == key:
        return memo[1]
    r = _capacity_shortcuts(site, prog, leaves)
    site._shortcuts_memo = (key, r)
    return r


def _capacity_shortcuts(site, prog, leaves):
    I = site.I
    if site.C is None or I.ndim < 1:
        return None, "no capacity"
    if list(site.b_axes) != list(range(I.ndim - 1)) or site.j_axis not in (I.ndim - 1, None):
        return None, "expert ids are not laid out [tokens..., k]"
    dependent = [v for v in leaves if isinstance(v, Var) and v is not I and _depends_only_on(prog, v, I)]
    if not dependent:
        return None, "no capacity value computed from the expert ids alone"
    if any(v.size > MAX_PROBE_ELEMENTS for v in dependent):
        return None, "capacity values too large to check"
    probes = _probe_set(site)
    names = {v: None for v in dependent}
    for probe, kept, slot in probes:
        try:
            values = _evaluate(prog, dependent, I, probe.reshape(I.shape).astype(I.dtype))
        except Exception as ex:  # noqa: BLE001 - an op that cannot run eagerly here: keep the model's values
            return None, f"could not evaluate a capacity value on probe ids ({type(ex).__name__})"
        for v, got in zip(dependent, values):
            cands = _candidates(kept, slot, probe, site.E, v.shape, v.dtype)
            ok = {n for n, c in cands.items() if c.shape == got.shape and np.array_equal(c, got)}
            names[v] = ok if names[v] is None else names[v] & ok
            if not names[v]:
                return None, f"a capacity value ({v.aval.str_short()}) is not a GShard running-count form"
    found = {v: sorted(n)[0] for v, n in names.items()}
    return found, None


# ----------------------------------------------------------------------------- one token per slot
# Exact mode gives every kept (token, choice) pair its own expert row. That is the model's function only if
# no two kept pairs share a buffer row (expert, slot, and the dispatch's uncontracted axes): a shared row
# holds the *sum* of their tokens, and the expert is nonlinear in it. A running count proves it when it runs
# over every pair the dispatch contracts, in one sequence; a count per choice, or per group while the
# dispatch sums over groups, does not. This is checked on the probe ids: the dispatch tensor's may-be-nonzero
# pattern (the ids' part evaluated exactly; every value the ids do not determine -- router weights, tokens --
# taken as possibly nonzero), summed over the contracted axes, must be at most one everywhere.

_SAME_PATTERN = {"convert_element_type", "neg", "copy", "copy_p", "reduce_precision", "abs", "sign", "floor",
                 "ceil", "round", "real", "stop_gradient"}
_UNION = {"add", "add_any", "sub", "or", "max", "min"}
_STRUCTURAL = {"broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "slice", "rev",
               "concatenate", "pad", "gather", "dynamic_slice", "select_n"}
_ANY = {"reduce_sum", "reduce_max", "reduce_min", "reduce_or", "reduce_and", "reduce_prod"}


def _nz(val):
    kind, a = val
    if kind == "m":
        return a
    try:
        return np.asarray(a) != 0
    except TypeError:  # e.g. a PRNG key array: no pattern to read, may be anything
        return np.ones(np.shape(a), bool)


def _may_nonzero_rule(e, vals):
    """Over-approximated may-be-nonzero patterns of e's outputs from its operands' (concrete or pattern)."""
    name = e.name
    outs = e.outs
    unknown = [np.ones(o.shape, bool) for o in outs]
    if name in ("mul", "and"):
        return [np.broadcast_to(_nz(vals[0]) & _nz(vals[1]), outs[0].shape)]
    if name == "div":
        if vals[1][0] == "c" and np.all(np.asarray(vals[1][1]) != 0):
            return [np.broadcast_to(_nz(vals[0]), outs[0].shape)]
        return unknown
    if name in _SAME_PATTERN or name == "integer_pow" and e.params.get("y", 0) > 0:
        return [np.broadcast_to(_nz(vals[0]), outs[0].shape)]
    if name in _UNION:
        return [np.broadcast_to(_nz(vals[0]) | _nz(vals[1]), outs[0].shape)]
    if name == "select_n":
        cases = [np.broadcast_to(_nz(v), outs[0].shape) for v in vals[1:]]
        if vals[0][0] == "c":
            which = np.broadcast_to(np.asarray(vals[0][1]).astype(np.int64), outs[0].shape)
            return [np.choose(which, cases)]
        return [np.logical_or.reduce(cases)]
    if name in _ANY:
        return [np.any(_nz(vals[0]), axis=tuple(e.params["axes"]))]
    if name == "dot_general":
        dn = e.params["dimension_numbers"]
        a, b = (_nz(v).astype(np.float32) for v in vals)
        with jax.ensure_compile_time_eval():
            return [np.asarray(jax.lax.dot_general(a, b, dn)) > 0]
    if name in _STRUCTURAL:
        # the same op on the patterns; index operands (gather / dynamic_slice) must be concrete
        if name in ("gather", "dynamic_slice") and any(v[0] == "m" for v in vals[1:]):
            return unknown
        ops = [_nz(vals[0])] + [(_nz(v) if name in ("concatenate", "pad") else np.asarray(v[1]))
                                for v in vals[1:]]
        with jax.ensure_compile_time_eval():
            return [np.asarray(r).astype(bool) for r in bind(e, [np.asarray(o) for o in ops])]
    return unknown


def _aliases(prog, v):
    """v and every variable that is v under another name (the flat view's alias equations: call boundaries)."""
    same, changed = {v}, True
    while changed:
        changed = False
        for e in prog.flat:
            if e.kind != "alias":
                continue
            for a, o in zip(e.ins, e.outs):
                if isinstance(a, Var) and (a in same) != (o in same):
                    same |= {a, o}
                    changed = True
    return same


def _bound_sources(prog, source, value):
    """{variable: its value} for `source` bound to `value` and their aliases; where `source` is an id array the pass
    assembled from separate argmaxes (ir.assemble_top1), which the model itself does not read, each argmax (and its
    aliases) is bound to its column of `value` too."""
    value = np.asarray(value)
    out = {x: value for x in _aliases(prog, source)}
    for j, part in enumerate(prog.assembled_parts.get(source, ())):
        out.update({x: value[..., j].astype(part.dtype) for x in _aliases(prog, part)})
    return out


def _random_leaf(x, rng):
    """A random value for an input of the program (a concrete stand-in for the model's weights and tokens)."""
    dt = np.dtype(x.dtype)
    # numpy arrays: under an enclosing jit trace even jnp.asarray would be staged into that trace (a tracer)
    if dt == np.bool_:
        return rng.random(x.shape) < 0.5
    if np.issubdtype(dt, np.integer):
        return rng.integers(0, 8, x.shape).astype(dt)
    if np.issubdtype(dt, np.floating) or dt.kind == "V" and dt.itemsize in (1, 2):  # ml_dtypes: bf16, fp8
        return rng.standard_normal(x.shape).astype(np.float32).astype(dt)
    raise TypeError(f"no random stand-in for {x.aval.str_short()}")


def _may_nonzero(prog, v, source, value, limit=4000, rng=None):
    """v's may-be-nonzero pattern with `source` (and its aliases) bound to `value`; None when the sub-program
    is too big. The program's inputs are unknown (may be anything), or with `rng` random stand-ins (then the
    pattern is v's actual nonzero pattern for those inputs)."""
    bound = _bound_sources(prog, source, value)
    sources = set(bound)
    order, seen, stack = [], set(), [v]
    while stack:  # the equations v needs, leaves excluded
        x = stack.pop()
        if isinstance(x, Lit) or x in sources or x in seen:
            continue
        seen.add(x)
        e = prog.producer.get(x)
        if e is None:
            continue
        if len(seen) > limit:
            return None
        order.append(e)
        stack.extend(a for a in e.ins if isinstance(a, Var))
    env = {x: ("c", val) for x, val in bound.items()}
    lit_env = {}

    def get(x):
        if isinstance(x, Lit):
            if not isinstance(x.val, jax.core.Tracer):
                return ("c", x.val)
            # a value of an enclosing trace captured as a constant: unknown, like an input
            if rng is None:
                return ("m", np.ones(x.shape, bool))
            if x not in lit_env:
                lit_env[x] = ("c", _random_leaf(x, rng))
            return lit_env[x]
        if x not in env and rng is not None and prog.producer.get(x) is None:
            env[x] = ("c", _random_leaf(x, rng))
        return env.get(x) or ("m", np.ones(x.shape, bool))  # a leaf the ids do not determine

    for e in sorted(set(order), key=lambda q: prog.pos[q]):
        if any(o.size > MAX_PROBE_ELEMENTS for o in e.outs):
            return None
        vals = [get(a) for a in e.ins]
        if e.kind not in ("prim", "alias") or e.effects:
            res = [("m", np.ones(o.shape, bool)) for o in e.outs]
        else:
            try:
                if all(k == "c" for k, _ in vals):
                    with jax.ensure_compile_time_eval():  # values stay JAX arrays (PRNG keys have no numpy form)
                        res = [("c", r) for r in bind(e, [a for _, a in vals])]
                else:
                    res = [("m", m) for m in _may_nonzero_rule(e, vals)]
            except Exception:  # noqa: BLE001 - an op that cannot run eagerly: its outputs may be anything
                res = [("m", np.ones(o.shape, bool)) for o in e.outs]
        for o, r in zip(e.outs, res):
            if o not in sources:  # the top_k that makes the ids also makes the weights: keep the probe ids
                env[o] = r
    kind, val = get(v)
    if rng is not None and (kind != "c" or isinstance(val, jax.core.Tracer)):
        return None  # with random inputs the pattern must be a fact: here some value stayed unknown
    return _nz((kind, val))


def _routing_probes(shape, num_experts, rng, repeats=False):
    """Expert ids a router can produce (distinct experts within a token, as top-k gives) that crowd experts:
    every token on the same k experts (in both choice orders), a Zipf-skewed draw and a uniform one. With
    `repeats` (ids assembled from separate argmaxes, which may coincide), also ids that repeat: every token on
    expert 0 for every choice, and the uniform draw with every other token's last choice equal to its first."""
    t, k = int(np.prod(shape[:-1])), shape[-1]
    if k > num_experts:
        return []
    same = np.broadcast_to(np.arange(k), (t, k))
    gumbel = -np.log(-np.log(rng.random((t, num_experts))))
    skew = np.argsort(-(gumbel - 1.5 * np.log1p(np.arange(num_experts))), axis=1)[:, :k]
    uniform = np.argsort(rng.random((t, num_experts)), axis=1)[:, :k]
    out = [same, same[:, ::-1], skew, uniform]
    if repeats:
        mixed = uniform.copy()
        mixed[::2, -1] = mixed[::2, 0]
        out += [np.zeros((t, k), np.int64), mixed]
    return [p.reshape(shape) for p in out]


def one_token_per_slot(site, prog):
    """(True, note) when no two kept (token, choice) pairs can share an (expert, slot) row of `site`'s capacity
    dispatch, else (False, the near-miss reason). Exact mode only: dropless gives every pair its own row."""
    found, _ = capacity_shortcuts(site, prog, list(site.kinds) + [site.S])
    if found is not None and site.S in found:
        return True, ("one token per (expert, slot): the slots are the GShard running count over every pair "
                      "(checked on probe ids)")
    D, e = site.disp_operand, site.disp_eqn
    if D is None or e is None:
        return False, "capacity dispatch tensor not found: cannot check one token per (expert, slot)"
    if D.size > MAX_PROBE_ELEMENTS:
        return False, ("cannot check one token per (expert, slot): the dispatch tensor is too large to probe "
                       "and the slots are not the GShard running count")
    (lc, rc), _ = e.params["dimension_numbers"]
    contracted = tuple(lc if e.ins[0] is D else rc)

    def collides(probe, rng=None):
        """True / False; None: the random-input evaluation left some value unknown (no verdict)."""
        pat = _may_nonzero(prog, D, site.I, probe.reshape(site.I.shape).astype(site.I.dtype), rng=rng)
        if pat is None:
            if rng is None:
                raise ValueError("the slot computation is too large to evaluate")
            return None
        return bool(np.any(np.sum(pat, axis=contracted) > 1))

    rng = np.random.default_rng(1)
    probes = _routing_probes(_pair_shape(site), site.E, rng, repeats=may_repeat(site.I, prog))
    if not probes:
        return False, "cannot check one token per (expert, slot): more choices per token than experts"
    unsure = 0
    for probe in probes:
        try:
            if not collides(probe):
                continue  # no collision whatever the other values are
            # the pattern also depends on values other than the ids (a weight-dependent or random second-choice
            # policy): evaluate the model on random inputs, where a collision is a fact, not a bound
            verdicts = [collides(probe, np.random.default_rng(seed)) for seed in (2, 3)]
            if any(verdicts):
                return False, ("two tokens can share an (expert, slot) of the capacity buffer (found on probe ids): "
                               "the running count does not run over every (token, choice) pair the dispatch sums")
            if None in verdicts:
                return False, ("cannot check one token per (expert, slot): the slots depend on values besides the "
                               "expert ids that could not be evaluated here")
            unsure += 1
        except Exception as ex:  # noqa: BLE001 - an op that cannot run eagerly here
            return False, f"cannot check one token per (expert, slot) on probe ids ({type(ex).__name__}: {ex})"
    if unsure:
        return True, ("one token per (expert, slot): checked on probe ids with random inputs (the slots depend on "
                      "values besides the expert ids, so this is a check of examples, not a bound)")
    return True, ("one token per (expert, slot): checked on probe ids (the dispatch tensor's may-be-nonzero "
                  "pattern, summed over its contracted token axes, is at most one whatever the other values)")


def _pair_shape(site):
    return tuple(site.I.shape) if site.j_axis is not None else tuple(site.I.shape) + (1,)


def _probe_set(site):
    """[(probe ids in the pair layout, GShard kept, slots)] for the site's shapes (seeded: deterministic)."""
    shape = _pair_shape(site)
    out = []
    for probe in _probes(shape, site.E, np.random.default_rng(0)):
        kept, slot = gshard_slots(probe.reshape(-1, shape[-1]), site.E, site.C)
        out.append((probe, kept.reshape(shape), slot.reshape(shape)))
    return out


def probe_leaves(site, found):
    """For each probe: (the expert ids as the model's I, {matched leaf: its value}, GShard kept [T,k])."""
    out = []
    for probe, kept, slot in _probe_set(site):
        vals = {v: _candidates(kept, slot, probe, site.E, v.shape, v.dtype)[name] for v, name in found.items()}
        out.append((probe.reshape(site.I.shape).astype(site.I.dtype), vals, kept.reshape(-1, kept.shape[-1])))
    return out


def shortcut_reader(read, site, found, routing):
    """`read` with the matched leaves computed from a plan routed with capacity=C (`routing`)."""
    ids = read(site.I).astype(jnp.int32)
    shape = ids.shape if site.j_axis is not None else ids.shape + (1,)
    ids2 = ids.reshape(shape)
    kept = (routing.pos >= 0).reshape(shape)
    flat_ids = ids2.reshape(-1)
    offsets = jnp.cumsum(routing.group_sizes) - routing.group_sizes  # align=1: rows of expert e start here
    slot = (routing.pos.reshape(-1) - offsets[jnp.clip(flat_ids, 0, site.E - 1)]).reshape(shape)
    cache = {}

    def read2(v):
        name = found.get(v)
        if name is None:
            return read(v)
        if v not in cache:
            val = _device_candidate(name, kept, slot, ids2, site.E, v.dtype)
            cache[v] = val.reshape(v.shape)
        return cache[v]

    return read2
