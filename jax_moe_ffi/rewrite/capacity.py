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
