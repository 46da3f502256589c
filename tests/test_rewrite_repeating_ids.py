"""Expert ids that may repeat within a token, and gates built one choice column at a time.

PhiMoE's SparseMixer (and Praxis-style top-2) takes two argmaxes, the second over the scores with the first
masked, and concatenates them into [T, 2] ids: unlike lax.top_k's, the two may coincide (every other score
-inf). A gate summed over the choices (`sum_j where(ids[:, j] == e, w[:, j], 0)`, or a one-hot sum) then gives a
repeated expert once, with both weights: the rewrite runs a token's first choice of each expert only
(emit.first_choices). A term kept per (token, choice) counts every choice, as the model does, and needs no mask.
These tests force repeats (the second argmax equal to the first in half the tokens) so that a missing or a wrong
mask fails them.
"""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jax_moe_ffi as jmf
from jax_moe_ffi import models as M
from jax_moe_ffi.rewrite import emit

from helpers import assert_stays_as_written, rel, tree_rel

GG = "jax_moe_ffi_grouped_gemm"


def _params(seed, t=24, d=16, f=12, e=6):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return M.init_moe_params(k1, d, f, e), jax.random.normal(k2, (t, d), jnp.float32)


def _two_argmax(p, x, repeat):
    """[T, 2] ids by two argmaxes and their softmax weights. The second argmax is over the scores with the first
    masked (PhiMoE: distinct unless every other score is -inf); repeat=True leaves the even tokens' scores unmasked,
    so that half the tokens choose the same expert twice."""
    s = x @ p["router"]
    t = s.shape[0]
    first = jnp.argmax(s, axis=-1, keepdims=True)
    second_scores = s.at[jnp.arange(t), first[:, 0]].set(-jnp.inf)
    if repeat:
        second_scores = jnp.where((jnp.arange(t) % 2 == 0)[:, None], s, second_scores)
    second = jnp.argmax(second_scores, axis=-1)[:, None]
    w = jnp.concatenate([jnp.take_along_axis(jax.nn.softmax(s, -1), first, -1),
                         jnp.take_along_axis(jax.nn.softmax(second_scores, -1), second, -1)], axis=-1)
    return w, jnp.concatenate([first, second], axis=-1).astype(jnp.int32)


def _expert(p, x, e):
    return (jax.nn.silu(x @ p["w_gate"][e]) * (x @ p["w_up"][e])) @ p["w_down"][e]


def loop_column_gate(p, x, repeat=True):  # PhiMoE as EasyDeL writes it
    w, ids = _two_argmax(p, x, repeat)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        g = sum(jnp.where(ids[:, j] == e, w[:, j], 0.0) for j in range(2))
        out = out + _expert(p, x, e) * g[:, None]
    return out


def loop_whole_ids_gate(p, x, repeat=True):  # the gate from the whole [T, 2] id array
    w, ids = _two_argmax(p, x, repeat)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        out = out + _expert(p, x, e) * jnp.sum(jnp.where(ids == e, w, 0.0), -1)[:, None]
    return out


def dense_one_hot_gate(p, x, repeat=True):  # all experts on all tokens, a [T, E] gate of one-hots summed over j
    w, ids = _two_argmax(p, x, repeat)
    gate = jnp.sum(jax.nn.one_hot(ids, p["w_gate"].shape[0]) * w[..., None], axis=1)
    return jnp.einsum("ted,te->td", _all_experts(p, x), gate)


def _all_experts(p, x):
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, p["w_gate"])) * jnp.einsum("td,edf->tef", x, p["w_up"])
    return jnp.einsum("tef,efd->ted", h, p["w_down"])


def dense_three_operand_einsum(p, x, repeat=True):  # jnp.einsum sums the choices into a [T, E] gate first
    w, ids = _two_argmax(p, x, repeat)
    return jnp.einsum("tje,tj,ted->td", jax.nn.one_hot(ids, p["w_gate"].shape[0]), w, _all_experts(p, x))


def dense_per_choice(p, x, repeat=True):  # each choice's expert output picked, then weighted: every choice counts
    w, ids = _two_argmax(p, x, repeat)
    picked = jnp.einsum("tje,ted->tjd", jax.nn.one_hot(ids, p["w_gate"].shape[0]), _all_experts(p, x))
    return jnp.sum(picked * w[..., None], axis=1)


def _argmaxes(p, x, repeat, n=2):
    """n separate [T] id arrays by argmaxes, each over the scores with the earlier choices masked (Praxis' top-2
    gating when n = 2), and their softmax weights; repeat=True leaves the even tokens' scores unmasked (those
    tokens choose one expert n times)."""
    scores = x @ p["router"]
    t = scores.shape[0]
    ws, ids = [], []
    for _ in range(n):
        i = jnp.argmax(scores, axis=-1)
        ws.append(jnp.take_along_axis(jax.nn.softmax(scores, -1), i[:, None], -1)[:, 0])
        ids.append(i)
        masked = scores.at[jnp.arange(t), i].set(-jnp.inf)
        scores = jnp.where((jnp.arange(t) % 2 == 0)[:, None], scores, masked) if repeat else masked
    return ws, ids


def dense_separate_one_hots(p, x, repeat=True, n=2):  # `w1 * one_hot(i1) + w2 * one_hot(i2)`: no id array at all
    ws, ids = _argmaxes(p, x, repeat, n)
    gate = sum(w[:, None] * jax.nn.one_hot(i, p["w_gate"].shape[0]) for w, i in zip(ws, ids))
    return jnp.einsum("ted,te->td", _all_experts(p, x), gate)


def loop_separate_wheres(p, x, repeat=True):  # per expert: `where(i1 == e, w1, 0) + where(i2 == e, w2, 0)`
    (w1, w2), (i1, i2) = _argmaxes(p, x, repeat)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        out = out + _expert(p, x, e) * (jnp.where(i1 == e, w1, 0.0) + jnp.where(i2 == e, w2, 0.0))[:, None]
    return out


FORMS = {"loop_column_gate": loop_column_gate, "loop_whole_ids_gate": loop_whole_ids_gate,
         "dense_one_hot_gate": dense_one_hot_gate, "dense_three_operand_einsum": dense_three_operand_einsum,
         "dense_per_choice": dense_per_choice, "dense_separate_one_hots": dense_separate_one_hots,
         "dense_three_separate_argmaxes": partial(dense_separate_one_hots, n=3),
         "loop_separate_wheres": loop_separate_wheres}


def test_first_choices():
    ids = jnp.array([[3, 3, 1], [0, 2, 0], [5, 4, 3], [2, 2, 2]], jnp.int32)
    want = np.array([[1, 0, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    np.testing.assert_array_equal(np.asarray(emit.first_choices(ids)), want)


@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_first_choices_property(t, k, e, seed):
    ids = np.random.default_rng(seed).integers(0, e, (t, k)).astype(np.int32)
    keep = np.asarray(emit.first_choices(jnp.asarray(ids)))
    for r in range(t):
        assert [bool(keep[r, j]) for j in range(k)] == [ids[r, j] not in ids[r, :j] for j in range(k)]


@pytest.mark.parametrize("name", list(FORMS))
def test_repeating_ids_rewritten_exactly(name):
    fn = FORMS[name]
    seed = int(np.random.SeedSequence().entropy % (2**31))
    p, x = _params(seed)
    _, ids = _two_argmax(p, x, True)
    repeats = int(np.sum(np.asarray(ids[:, 0] == ids[:, 1])))
    assert repeats == x.shape[0] // 2, (seed, repeats)  # the test data must exercise both cases
    r = jmf.explain(fn, p, x)
    assert len(r.sites) == 1 and not r.misses, str(r)
    once = "per_choice" not in name
    assert any(("runs once, at its first choice" if once else "each (token, choice) runs") in n
               for n in r.sites[0].notes), str(r)
    of = jax.jit(jmf.optimize(fn))
    assert GG in str(jax.make_jaxpr(of)(p, x))
    assert rel(of(p, x), fn(p, x)) < 1e-5, seed

    def loss(f):
        return lambda p, x: jnp.sum(f(p, x) ** 2)
    g1 = jax.grad(loss(of), argnums=(0, 1))(p, x)
    g0 = jax.grad(loss(fn), argnums=(0, 1))(p, x)
    assert tree_rel(g1, g0) < 1e-5, seed


@pytest.mark.parametrize("name", ["loop_column_gate", "dense_one_hot_gate", "dense_separate_one_hots",
                                  "loop_separate_wheres"])
def test_gate_summed_over_choices_needs_the_first_choice_mask(name, monkeypatch):
    """Without the mask a repeated expert is run twice with its summed gate: the rewrite must differ then
    (this is what the mask is for, and what makes the test above able to fail)."""
    fn = FORMS[name]
    p, x = _params(11)
    monkeypatch.setattr(emit, "first_choices", lambda ids: jnp.ones(ids.shape, bool))
    assert rel(jax.jit(jmf.optimize(fn))(p, x), fn(p, x)) > 1e-2


def test_phimoe_without_repeats_and_models_form():
    """PhiMoE's own masking (distinct ids on these inputs) and the package's model of it."""
    p, x = _params(5)
    for fn in (partial(loop_column_gate, repeat=False), M.two_argmax_loop_moe, M.column_gate_loop_moe):
        r = jmf.explain(fn, p, x)
        assert len(r.sites) == 1 and not r.misses, str(r)
        assert rel(jax.jit(jmf.optimize(fn))(p, x), fn(p, x)) < 1e-5


def test_inside_scan_with_checkpoint():
    p, x = _params(8)
    stacked = jax.tree.map(lambda a: jnp.stack([a, 0.5 * a]), p)

    def model(ps, x):
        def body(h, pl):
            return h + jax.checkpoint(loop_column_gate)(pl, h), None
        return jax.lax.scan(body, x, ps)[0]
    of = jax.jit(jmf.optimize(model))
    assert GG in str(jax.make_jaxpr(of)(stacked, x))
    assert rel(of(stacked, x), model(stacked, x)) < 1e-5
    g1 = jax.grad(lambda ps: jnp.sum(of(ps, x) ** 2))(stacked)
    g0 = jax.grad(lambda ps: jnp.sum(model(ps, x) ** 2))(stacked)
    assert tree_rel(g1, g0) < 1e-5


def test_column_gate_with_top_k_ids_of_three_choices():
    """lax.top_k ids (distinct), k = 3, the gate built column by column (no mask needed; rewritten)."""
    p, x = _params(9)
    fn = partial(M.column_gate_loop_moe, top_k=3)
    r = jmf.explain(fn, p, x)
    assert len(r.sites) == 1 and not r.misses, str(r)
    assert rel(jax.jit(jmf.optimize(fn))(p, x), fn(p, x)) < 1e-5


def _partial_columns(p, x):
    """A gate from choice column 0 only (`where(ids[:, 0] == e, w[:, 0], 0)`): zero unless e is the first
    choice -- rewritten too (any subset of the columns keeps the sparsity), and still exact."""
    w, ids, _ = M._router(p, x, 2)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        out = out + _expert(p, x, e) * jnp.where(ids[:, 0] == e, w[:, 0], 0.0)[:, None]
    return out


def _partial_columns_repeating(p, x):
    w, ids = _two_argmax(p, x, True)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        out = out + _expert(p, x, e) * jnp.where(ids[:, 1] == e, w[:, 1], 0.0)[:, None]
    return out


@pytest.mark.parametrize("fn", [_partial_columns, _partial_columns_repeating])
def test_gate_from_one_column_only(fn):
    p, x = _params(10)
    r = jmf.explain(fn, p, x)
    assert len(r.sites) == 1 and not r.misses, str(r)
    of = jax.jit(jmf.optimize(fn))
    assert rel(of(p, x), fn(p, x)) < 1e-5
    g1 = jax.grad(lambda p: jnp.sum(of(p, x) ** 2))(p)
    g0 = jax.grad(lambda p: jnp.sum(fn(p, x) ** 2))(p)
    assert tree_rel(g1, g0) < 1e-5


def _column_of_another_token(p, x):
    """The column test of the *next* token's ids (a shifted gate): not sparse per token -- must stay as written."""
    w, ids, _ = M._router(p, x, 2)
    shifted = jnp.roll(ids, 1, axis=0)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        g = sum(jnp.where(shifted[:, j] == e, w[:, j], 0.0) for j in range(2))
        out = out + _expert(p, x, e) * g[:, None]
    return out


@pytest.mark.gpu
def test_gpu_bf16_repeating_ids_run_the_cuda_kernels():
    p, x = _params(13, t=512, d=256, f=128, e=8)
    pb = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)
    xb = x.astype(jnp.bfloat16)
    for fn in (loop_column_gate, dense_one_hot_gate, dense_separate_one_hots):
        of = jax.jit(jmf.optimize(fn))
        assert f'custom_call_target="{GG}"' in of.lower(pb, xb).compile().as_text()
        want = fn(p, x)
        assert rel(of(pb, xb).astype(jnp.float32), want) < 2 * rel(jax.jit(fn)(pb, xb).astype(jnp.float32), want) \
            + 1e-2


def test_capacity_layer_over_repeating_ids():
    """GShard capacity einsums over ids that may repeat: a repeated expert takes two slots in the model (its two
    pairs counted one after the other), each cell a (token, choice) of its own. Rewritten in exact mode (forward and
    gradients); dropless mode would count the cells anew and leaves it as written, with the reason."""
    p, x = _params(14)

    def router(p, x, k):
        w, ids = _two_argmax(p, x, True)
        return w, ids, None
    fn = partial(M.capacity_moe, router=router)
    _, ids = _two_argmax(p, x, True)
    assert int(np.sum(np.asarray(ids[:, 0] == ids[:, 1]))) == x.shape[0] // 2
    r = jmf.explain(fn, p, x)
    assert len(r.sites) == 1 and not r.misses, str(r)
    assert any("not run again" in n for n in r.sites[0].notes), str(r)
    of = jax.jit(jmf.optimize(fn))
    assert rel(of(p, x), fn(p, x)) < 1e-5
    g1 = jax.grad(lambda p: jnp.sum(of(p, x) ** 2))(p)
    g0 = jax.grad(lambda p: jnp.sum(fn(p, x) ** 2))(p)
    assert tree_rel(g1, g0) < 1e-5
    rd = jmf.explain(fn, p, x, mode="dropless")
    assert not rd.sites and any("exact mode only" in m.reason for m in rd.misses), str(rd)


def _first_tokens_choice(p, x):
    """Every token gated by whether token 0 chose e (`ids[0:1, j] == e`): a one-row slice of the ids along the
    token axis is a fixed token, not the token's own choice -- must stay as written."""
    w, ids, _ = M._router(p, x, 2)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        g = sum(jnp.where(ids[0:1, j] == e, w[:, j], 0.0) for j in range(2))
        out = out + _expert(p, x, e) * g[:, None]
    return out


def _columns_of_two_routers(p, x):
    """Column 0 of one router's ids and column 1 of another's (different index arrays): not one constraint."""
    w, ids, _ = M._router(p, x, 2)
    _, ids2, _ = M._router(p, -x, 2)
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        g = jnp.where(ids[:, 0] == e, w[:, 0], 0.0) + jnp.where(ids2[:, 1] == e, w[:, 1], 0.0)
        out = out + _expert(p, x, e) * g[:, None]
    return out


@pytest.mark.parametrize("fn", [_column_of_another_token, _first_tokens_choice, _columns_of_two_routers])
def test_column_gates_that_are_not_the_tokens_own_choice_stay(fn):
    assert_stays_as_written(fn, *_params(15))


def _argmaxes_over_different_expert_counts(p, x):
    """Two argmaxes concatenated, the second over E + 2 columns (ids up to E + 1): not one id array over the
    same experts -- stays as written, reported (match._assembled_ids)."""
    s = x @ p["router"]
    wide = jnp.concatenate([s, s[:, :2]], axis=1)
    ids = jnp.concatenate([jnp.argmax(s, -1, keepdims=True), jnp.argmax(wide, -1, keepdims=True)], -1)
    w = jax.nn.softmax(s, -1)[:, :2]
    out = jnp.zeros_like(x)
    for e in range(p["w_gate"].shape[0]):
        g = sum(jnp.where(ids[:, j] == e, w[:, j], 0.0) for j in range(2))
        out = out + _expert(p, x, e) * g[:, None]
    return out


def test_ids_assembled_over_different_expert_counts_are_a_near_miss():
    p, x = _params(16)
    r = jmf.explain(_argmaxes_over_different_expert_counts, p, x)
    assert not r.sites and any("assembled from several routers" in m.reason for m in r.misses), str(r)
    with pytest.warns(RuntimeWarning, match="no MoE site"):
        y = jmf.optimize(_argmaxes_over_different_expert_counts)(p, x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(_argmaxes_over_different_expert_counts(p, x)))


def _separate_argmaxes_over_different_expert_counts(p, x):
    """`g * one_hot(i1, E) + g * one_hot(i2, E)` with i2 an argmax over E + 2 columns: the two arrays do not range
    over the same experts, so they are not read as one id array -- stays as written, with its reason."""
    g = jax.nn.softmax(x @ p["router"], -1)
    e = g.shape[-1]
    i1 = jnp.argmax(g, -1)
    i2 = jnp.argmax(jnp.concatenate([g * (1.0 - jax.nn.one_hot(i1, e)), g[:, :2]], -1), -1)
    gate = g * jax.nn.one_hot(i1, e) + g * jax.nn.one_hot(i2, e)
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, p["w_gate"])) * jnp.einsum("td,edf->tef", x, p["w_up"])
    return jnp.einsum("tef,efd,te->td", h, p["w_down"], gate)


def test_separate_argmaxes_over_different_expert_counts_are_a_near_miss():
    assert_stays_as_written(_separate_argmaxes_over_different_expert_counts, *_params(17),
                            reason="sum of one-hot terms over different index arrays")


def test_assembled_equations_run_only_where_a_site_reads_them():
    """ir.assemble_top1 inserts its equations once per program (a second Facts pass reuses them) and the
    scheduler drops them where no site reads the assembled ids: the program without a site is unchanged."""
    from jax_moe_ffi.rewrite import facts as F
    from jax_moe_ffi.rewrite import ir
    p, x = _params(18)
    prog = ir.program_from_closed(jax.make_jaxpr(dense_separate_one_hots)(p, x))
    n0 = len(prog.flat)
    F.Facts(prog)
    n1 = len(prog.flat)
    F.Facts(prog)
    assert n1 == n0 + 3 and len(prog.flat) == n1 and len(prog.assembled) == 1, (n0, n1, len(prog.flat))
    (ids,) = prog.assembled.values()
    assert ids.shape == (x.shape[0], 2) and F.may_repeat(ids, prog)
