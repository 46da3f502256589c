"""Praxis / GShard capacity top-2: two argmaxes, each with its own slot array, in one-hot [G, S, E, C] tensors.

The combine tensor is `a1 (x) b1 + a2 (x) b2`, a_j the gate-weighted expert one-hot of argmax i_j and b_j the slot
one-hot of pos_j (the second choice's slots follow every first choice of the expert: choice-major priority). The
pass reads the two terms as one [G, S, 2] id array and one [G, S, 2] slot array tied by their choice axis
(facts._merged_top1). The two argmaxes may coincide (the second is over the gates with the first zeroed: all of
them zero but the first, and i1 = 0), so the ids may repeat within a token; a dropped second choice's slot reads
0, the cell the token's first choice may hold. The model counts a token's cell once, so the rewrite runs a
token's first choice of each (expert, slot) cell only (emit.first_choices with slots). These tests force repeats
(the even tokens' second argmax over the unmasked gates) and drops (capacity factor 1), and check that a missing
cell mask fails them.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_moe_ffi as jmf
from jax_moe_ffi.rewrite import emit

from helpers import assert_stays_as_written, rel, tree_rel

GG = "jax_moe_ffi_grouped_gemm"


def _params(seed, g=2, s=16, m=16, h=24, e=4):
    ks = jax.random.split(jax.random.key(seed), 6)
    p = {"gate": jax.random.normal(ks[0], (m, e)) / math.sqrt(m),
         "wi": jax.random.normal(ks[1], (e, m, h)) / math.sqrt(m),
         "bi": 0.1 * jax.random.normal(ks[2], (e, h)),
         "wo": jax.random.normal(ks[3], (e, h, m)) / math.sqrt(h)}
    return p, jax.random.normal(ks[4], (g, s, m))


def _top2_gating(logits, capacity, repeat, offset_second=True):
    """(combine [G, S, E, C], and per choice j: ids_j, slot_j, kept_j [G, S]). repeat=True: the even tokens'
    second argmax is over the unmasked gates (so it equals the first)."""
    e = logits.shape[-1]
    gates = jax.nn.softmax(logits, axis=-1)
    i1 = jnp.argmax(gates, axis=-1)
    m1 = jax.nn.one_hot(i1, e, dtype=gates.dtype)
    g1 = jnp.sum(gates * m1, axis=-1)
    rest = gates * (1.0 - m1)
    if repeat:
        rest = jnp.where((jnp.arange(gates.shape[1]) % 2 == 0)[None, :, None], gates, rest)
    i2 = jnp.argmax(rest, axis=-1)
    m2 = jax.nn.one_hot(i2, e, dtype=gates.dtype)
    g2 = jnp.sum(rest * m2, axis=-1)
    pos1 = jnp.cumsum(m1, axis=-2) - m1  # exclusive running count over the group's tokens
    m1 = m1 * (pos1 < capacity)
    count1 = jnp.sum(m1, axis=-2, keepdims=True)
    pos2 = jnp.cumsum(m2, axis=-2) - m2 + (count1 if offset_second else 0.0)
    m2 = m2 * (pos2 < capacity)
    kept1, kept2 = jnp.sum(m1, -1), jnp.sum(m2, -1)
    slot1 = jnp.sum(pos1 * m1, -1).astype(jnp.int32)  # 0 where dropped
    slot2 = jnp.sum(pos2 * m2, -1).astype(jnp.int32)
    denom = g1 + g2 + 1e-9
    g1, g2 = g1 / denom * kept1, g2 / denom * kept2
    combine = (jnp.einsum("GSE,GSC->GSEC", (g1[..., None] * jax.nn.one_hot(i1, e)), jax.nn.one_hot(slot1, capacity))
               + jnp.einsum("GSE,GSC->GSEC", (g2[..., None] * jax.nn.one_hot(i2, e)),
                            jax.nn.one_hot(slot2, capacity)))
    return combine, ((i1, slot1, kept1), (i2, slot2, kept2))


def praxis_top2(p, x, repeat=True, capacity_factor=1.0, dispatch="bool", offset_second=True):
    """dispatch: "bool" (Praxis: combine.astype(bool)) or "float" (the combine's nonzero pattern as 0. / 1.)."""
    g, s, _ = x.shape
    e = p["gate"].shape[-1]
    capacity = max(1, int(math.ceil(2 * s * capacity_factor / e)))
    combine, _ = _top2_gating(jnp.einsum("GSM,ME->GSE", x, p["gate"]), capacity, repeat, offset_second)
    d = combine.astype(bool) if dispatch == "bool" else (combine != 0).astype(x.dtype)
    xe = jnp.einsum("GSEC,GSM->EGCM", d.astype(x.dtype), x)
    hidden = jax.nn.relu(jnp.einsum("EGCM,EMH->EGCH", xe, p["wi"]) + p["bi"][:, None, None, :])
    return jnp.einsum("GSEC,EGCM->GSM", combine, jnp.einsum("EGCH,EHM->EGCM", hidden, p["wo"]))


def _cases(p, x, capacity_factor=1.0, repeat=True):
    """How many tokens repeat their expert, and how many of those have their second choice dropped onto the cell
    their first choice holds (slot 0): the case the cell mask is for."""
    s = x.shape[1]
    capacity = max(1, int(math.ceil(2 * s * capacity_factor / p["gate"].shape[-1])))
    _, ((i1, s1, k1), (i2, s2, k2)) = _top2_gating(jnp.einsum("GSM,ME->GSE", x, p["gate"]), capacity, repeat)
    same = np.asarray(i1 == i2)
    on_first_cell = same & np.asarray((k1 > 0) & (k2 == 0) & (s1 == s2))
    return int(same.sum()), int(on_first_cell.sum())


def _check_exact(fn, p, x):
    r = jmf.explain(fn, p, x)
    assert len(r.sites) == 1 and not r.misses, str(r)
    assert any("not run again" in n for n in r.sites[0].notes), str(r)
    of = jax.jit(jmf.optimize(fn))
    assert GG in str(jax.make_jaxpr(of)(p, x))
    assert rel(of(p, x), fn(p, x)) < 1e-5

    def loss(f):
        return lambda p, x: jnp.sum(f(p, x) ** 2)
    assert tree_rel(jax.grad(loss(of), argnums=(0, 1))(p, x), jax.grad(loss(fn), argnums=(0, 1))(p, x)) < 1e-5
    return r


@pytest.mark.parametrize("dispatch", ["bool", "float"])
@pytest.mark.parametrize("capacity_factor", [1.0, 2.0])
def test_praxis_top2_with_repeats_rewritten_exactly(dispatch, capacity_factor):
    seed = int(np.random.SeedSequence().entropy % (2**31))
    p, x = _params(seed)
    repeats, _ = _cases(p, x, capacity_factor)
    assert repeats >= x.shape[0] * x.shape[1] // 2, seed  # the even tokens repeat, by construction
    _check_exact(lambda p, x: praxis_top2(p, x, True, capacity_factor, dispatch), p, x)


def test_praxis_top2_as_written():
    """Praxis' own masking (the first choice zeroed before the second argmax): distinct ids on these inputs."""
    p, x = _params(3)
    assert _cases(p, x, repeat=False)[0] == 0
    _check_exact(lambda p, x: praxis_top2(p, x, repeat=False), p, x)


def test_cell_mask_is_needed(monkeypatch):
    """A repeated expert whose second choice is dropped reads slot 0, the cell of its first choice where that is
    slot 0: without the mask that cell's weight is counted twice."""
    p, x = next((p, x) for p, x in map(_params, range(100)) if _cases(p, x)[1] > 0)
    fn = praxis_top2
    assert rel(jax.jit(jmf.optimize(fn))(p, x), fn(p, x)) < 1e-5
    monkeypatch.setattr(emit, "first_choices", lambda ids, slots=None: jnp.ones(ids.shape, bool))
    assert rel(jax.jit(jmf.optimize(fn))(p, x), fn(p, x)) > 1e-2


def test_second_choices_counted_apart_stay():
    """Each choice's slots counted on their own (no offset by the first choices' count): a first and a second
    choice of different tokens share a cell, whose buffer row is the sum of two tokens; not rewritten."""
    p, x = _params(4)
    assert_stays_as_written(lambda p, x: praxis_top2(p, x, offset_second=False), p, x,
                            reason="two tokens can share an (expert, slot)")


def test_first_choices_with_slots():
    ids = jnp.array([[3, 3], [3, 3], [1, 2]], jnp.int32)
    slots = jnp.array([[0, 0], [0, 4], [0, 0]], jnp.int32)
    want = np.array([[1, 0], [1, 1], [1, 1]], bool)
    np.testing.assert_array_equal(np.asarray(emit.first_choices(ids, slots)), want)


@pytest.mark.gpu
def test_gpu_bf16_praxis_top2_runs_the_cuda_kernels():
    p, x = _params(13, g=2, s=512, m=256, h=128, e=8)
    pb = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)
    xb = x.astype(jnp.bfloat16)
    for repeat in (False, True):
        fn = lambda p, x, repeat=repeat: praxis_top2(p, x, repeat)  # noqa: E731
        of = jax.jit(jmf.optimize(fn))
        assert f'custom_call_target="{GG}"' in of.lower(pb, xb).compile().as_text()
        want = fn(p, x)
        assert rel(of(pb, xb).astype(jnp.float32), want) < 2 * rel(jax.jit(fn)(pb, xb).astype(jnp.float32), want) \
            + 1e-2
