"""Benchmark helpers whose numbers end up in results: the train step's FLOP accounting for capacity models."""
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import train_step as TS  # noqa: E402


def test_capacity_kept_share_matches_the_models_own_drop_rule():
    """capacity_kept_share counts min(count, C) per expert; the model keeps a pair when its running count
    (cumsum) is below C. Layer by layer on the tiny config (a router made imbalanced so that pairs drop),
    the share must equal the model's own keep mask, computed here from its cumsum rule."""
    cfg = TS.TINY
    TS.ATTENTION_IMPL[0] = "xla"
    params = TS.init(cfg, jax.random.PRNGKey(3), jnp.float32)
    # a shared bias direction in the router: most tokens prefer the same experts, as at initialisation
    params["layers"]["router"] = params["layers"]["router"] * 0.2 + jnp.linspace(0, 3, cfg.experts)
    tokens = jax.random.randint(jax.random.PRNGKey(4), (cfg.batch, cfg.seq), 0, cfg.vocab)
    share, per_layer = TS.capacity_kept_share(cfg, params, tokens)

    cap = max(1, int(math.ceil(cfg.tokens * cfg.top_k / cfg.experts * cfg.capacity_factor)))
    h = params["embed"][tokens]
    kept = []
    for layer in range(cfg.layers):
        p = jax.tree.map(lambda a: a[layer], params["layers"])
        h = h + TS.attention(cfg, p, TS.rms(h, p["ln1"]))
        x = TS.rms(h, p["ln2"]).reshape(cfg.tokens, -1)
        _, e = TS.router(p, x, cfg)
        mask = np.asarray(jax.nn.one_hot(e, cfg.experts, dtype=jnp.int32)).reshape(-1, cfg.experts)
        pos = np.cumsum(mask, axis=0) - 1
        kept.append(((pos < cap) & (mask == 1)).sum() / mask.sum())
        h = h + TS.moe_capacity_einsum(cfg, p, x).reshape(h.shape)
    assert min(kept) < 0.95  # the test must exercise drops
    np.testing.assert_allclose(per_layer, kept, atol=1e-4)
    np.testing.assert_allclose(share, np.mean(kept), atol=1e-6)  # equal pairs per layer: the mean
    # FLOPs: the dropped pairs cost no expert FLOPs
    assert TS.model_flops(cfg, share) < TS.model_flops(cfg)


def test_runtime_bench_no_prevent_cse_drops_the_remat_barrier():
    """benchmarks/runtime.py --no-prevent-cse: the scanned layer's jax.checkpoint without prevent_cse lowers with
    one optimization barrier fewer (the one over the recompute's residuals, which made a host-offloaded residual
    arrive before any of the layer's backward ran on the H200, NOTES.md session 10); the pass's own barriers stay."""
    import jax
    import runtime as rb

    counts = []
    for pc in (True, False):
        variant, stacked, x = rb.build_model("deepseek-v3-ep8-local", 2, 32, prevent_cse=pc)
        loss = variant(False, rb.VARIANTS["ours_offload"][1])
        counts.append(jax.jit(jax.value_and_grad(loss, (0, 1))).lower(stacked, x).as_text().count("optimization_barrier"))
    assert counts[1] == counts[0] - 1 and counts[1] > 0, counts


def test_grouped_gemm_ratio_table_reports_the_issue_ratios():
    """benchmarks/grouped_gemm.py's same-run ratios (written into the results' .md): ours over each peer on the same
    (case, pass, groups), FP8 over our bf16, and skew over even of the same impl; a peer missing from the run gives
    an empty cell, not a ratio against something else."""
    import grouped_gemm as GG

    rng = np.random.default_rng()
    t = {key: float(rng.uniform(100, 900)) for key in
         [(c, i, p, g) for c in ("a", "b") for i in ("ours", "ours_fp8", "tokamax", "torch_grouped_mm")
          for p in ("fwd", "fwd_bwd") for g in ("even", "skew")]}
    del t[("b", "torch_grouped_mm", "fwd", "skew")]  # a peer absent for one row
    rows = [{"case": c, "impl": i, "pass": p, "groups": g, "tflops": v} for (c, i, p, g), v in t.items()]
    rows.append({"case": "a", "impl": "copy", "pass": "fwd", "groups": "even", "gbps": 3000.0})
    got = {(r["case"], r["impl"], r["pass"], r["groups"]): r for r in GG.ratio_rows(rows)}
    assert len(got) == 16  # ours and ours_fp8 only
    for (c, i, p, g), r in got.items():
        assert r["vs_tokamax"] == t[(c, i, p, g)] / t[(c, "tokamax", p, g)]
        peer = t.get((c, "torch_grouped_mm", p, g))
        assert r["vs_torch_grouped_mm"] == (None if peer is None else t[(c, i, p, g)] / peer)
        assert r["vs_ours_bf16"] == (None if i == "ours" else t[(c, i, p, g)] / t[(c, "ours", p, g)])
        assert r["skew_over_even"] == (t[(c, i, p, "skew")] / t[(c, i, p, "even")] if g == "skew" else None)
        assert r["vs_xla_ragged_dot"] is None
    table = GG.ratio_table(rows)
    assert "vs_xla_ragged_dot" not in table[3]  # a column no row has is left out
    header = [x.strip() for x in table[3].split("|")]
    cells = dict(zip(header, [x.strip() for x in next(x for x in table if x.startswith("| b | fwd | skew | ours |"))
                              .split("|")]))
    assert cells["vs_torch_grouped_mm"] == ""  # absent peer, empty cell
    assert cells["vs_tokamax"] == f"{t[('b', 'ours', 'fwd', 'skew')] / t[('b', 'tokamax', 'fwd', 'skew')]:.2f}"
    assert cells["skew_over_even"] == f"{t[('b', 'ours', 'fwd', 'skew')] / t[('b', 'ours', 'fwd', 'even')]:.2f}"


def test_gate_up_pair_variants_compute_the_same_products(monkeypatch):
    """benchmarks/gate_up_pair.py times four forms of the gate / up products (pair launch, interleaved pair, two
    launches, one GEMM on concatenated weights): each must be the two ragged products (float32 reference), forward and
    gradients, on random sizes with an empty group and a total below M."""
    import gate_up_pair as GP

    rng = np.random.default_rng(7)
    m, k, n, g = 96, 32, 24, 5
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    wg, wu = (jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32) for _ in range(2))
    s = jnp.asarray([30, 0, 17, 41, 3], jnp.int32)  # sum 91 < M: rows past it are zero

    def reference(x, wg, wu):
        rows = x[: int(s.sum())]
        out = [jnp.zeros((m, n)).at[: rows.shape[0]].set(jax.lax.ragged_dot(rows, w, s)) for w in (wg, wu)]
        return out

    want = jnp.concatenate(reference(x, wg, wu), -1)
    loss = lambda x, wg, wu: jnp.sum(jnp.prod(jnp.stack(reference(x, wg, wu)), 0))
    want_grads = jax.grad(loss, argnums=(0, 1, 2))(x, wg, wu)
    for variant in GP.VARIANT_ENV:
        for key, value in GP.VARIANT_ENV[variant].items():
            monkeypatch.setenv(key, value)  # restored after the test, whatever the caller had set
        ws = GP.weights_for(variant, wg, wu)
        got = GP.variant_fn(variant, "fwd")(x, ws, s)
        dx, dws = GP.variant_fn(variant, "fwd_bwd")(x, ws, s)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=variant)
        if variant == "concat":
            dws = jnp.split(dws[0], 2, axis=-1)
        for a, b in zip([dx, *dws], want_grads):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-3, err_msg=variant)


def test_grouped_gemm_dgrad_pass_times_the_lhs_gradient():
    """benchmarks/grouped_gemm.py --passes dgrad times dgrad_ours: it must be the lhs gradient of the forward it
    is compared with (ragged_dot's vjp w.r.t. lhs), on skewed sizes with an empty group and rows past the sum."""
    import grouped_gemm as GG

    rng = np.random.default_rng(11)
    m, k, n, g = 40, 24, 16, 4
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    sizes = jnp.asarray([13, 0, 20, 5], jnp.int32)  # sum 38 < 40
    _, vjp = jax.vjp(lambda a: jax.lax.ragged_dot(a, rhs, sizes), lhs)
    want = vjp(cot)[0]
    got = GG.dgrad_ours(cot, rhs, sizes)
    assert got.shape == (m, k)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
