"""MaxText `maxtext.layers.moe.RoutedMoE` through `optimize`/`explain` (tiny configs, CPU, float32).

- `dense_matmul` with capacity_factor > 0: `mode="exact"` must reproduce MaxText's drops; `mode="dropless"` must
  equal MaxText's own dropless answer.
- `dense_matmul` dropless (capacity_factor = -1): exact, and equal to MaxText's `sparse_matmul` path.
- `sparse_matmul` (already grouped: `jax.lax.ragged_dot`) is the reference answer for dropless; `optimize` swaps
  its ragged_dots for the grouped GEMM (family 5), with the same values.
The module is built through MaxText's own config system (`pyconfig.initialize` on its base.yml) and called as a
pure function of (params, x) with `nnx.split`/`nnx.merge`.
"""
from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import pytest

import moe_check as C

maxtext = C.require("maxtext", "pip install --no-deps maxtext + its import deps; needs Python >= 3.12")
from flax import nnx  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from maxtext.configs import pyconfig  # noqa: E402
from maxtext.layers import moe  # noqa: E402
from maxtext.layers.initializers import nd_dense_init  # noqa: E402
from maxtext.utils import maxtext_utils  # noqa: E402

from jax_moe_ffi.rewrite import explain, optimize  # noqa: E402

pytestmark = pytest.mark.models

B, S, D, F, E = 2, 12, 16, 32, 8
T = B * S
BASE_YML = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")


def build(seed, shared=False, **overrides):
    """A RoutedMoE (shared=True: RoutedAndSharedMoE, routed experts plus a shared MLP beside them) from MaxText's
    config system; returns (f(params, x) -> output, params, config)."""
    kw = dict(run_name="jax_moe_ffi_models", enable_checkpointing=False, model_name="default", dtype="float32",
              weight_dtype="float32", matmul_precision="highest", megablox=False, sparse_matmul=False,
              capacity_factor=-1.0, num_experts=E, num_experts_per_tok=2, base_emb_dim=D, base_moe_mlp_dim=F,
              base_mlp_dim=F, base_num_query_heads=2, base_num_kv_heads=2, head_dim=8, base_num_decoder_layers=1,
              max_target_length=S, per_device_batch_size=B, load_balance_loss_weight=0.0)
    kw.update(overrides)
    cfg = pyconfig.initialize([None, BASE_YML], **kw)
    mesh = Mesh(maxtext_utils.create_device_mesh(cfg), cfg.mesh_axes)
    if shared:
        layer = moe.RoutedAndSharedMoE(config=cfg, mesh=mesh, kernel_init=nd_dense_init(1.0, "fan_in", "truncated_normal"),
                                       kernel_axes=("embed", "mlp"), rngs=nnx.Rngs(params=seed),
                                       weight_dtype=jnp.float32, dtype=jnp.float32)
    else:
        layer = moe.RoutedMoE(config=cfg, num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                              mesh=mesh, kernel_init=nd_dense_init(1.0, "fan_in", "truncated_normal"),
                              kernel_axes=("embed", "mlp"), intermediate_dim=F, dtype=jnp.float32,
                              weight_dtype=jnp.float32, rngs=nnx.Rngs(params=seed))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def f(params, x):
        out, _lb_loss, _bias_updates = nnx.merge(graphdef, params, rest)(x)
        return out

    params = _random_biases(params, seed)
    return f, params, cfg


def _random_biases(params, seed):
    """MaxText initialises expert biases to zero; make them random so that carrying them over is tested."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(jax.random.key(seed + 1), max(1, len(leaves)))
    out = [0.3 * jax.random.normal(k, leaf.shape, leaf.dtype) if "bias" in jax.tree_util.keystr(path) else leaf
           for (path, leaf), k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, out)


def maxtext_capacity(cfg, seq_len=S):
    """MaxText's expert_capacity_per_batch (RoutedMoE.generate_masks)."""
    tokens = seq_len * cfg.num_experts_per_tok
    return int(max(math.ceil(tokens / cfg.num_experts) * cfg.capacity_factor, cfg.capacity_factor))


def _x(seed):
    return jax.random.normal(jax.random.key(seed + 2), (B, S, D), jnp.float32)


def _sparse_reference(seed, params, x, **overrides):
    """MaxText's own dropless answer: the sparse_matmul path (sort + jax.lax.ragged_dot), same weights."""
    fs, ps, _ = build(seed, sparse_matmul=True, capacity_factor=-1.0, **overrides)
    assert jax.tree.structure(ps) == jax.tree.structure(params)
    return fs(params, x)


DROPLESS = [
    ("default", {}),
    ("norm_topk_prob", dict(norm_topk_prob=True)),
    ("mlp_bias", dict(mlp_bias=True)),
    ("gelu_glu", dict(mlp_activations=["gelu", "linear"])),
    ("sigmoid_router", dict(routed_score_func="sigmoid")),
    ("qwen3_block", dict(decoder_block="qwen3", norm_topk_prob=True)),
    ("deepseek_block_clamped", dict(decoder_block="deepseek", routed_score_func="sigmoid",
                                    mlp_activations_limit=0.5)),
    ("gpt_oss_block_bias_clamp", dict(decoder_block="gpt_oss", mlp_bias=True, mlp_activations_limit=7.0)),
    ("llama4_block_top1_input_scaling", dict(decoder_block="llama4", num_experts_per_tok=1)),
    # DeepSeek-V3 routing: sigmoid scores plus a routing-only bias, top-2 of 4 expert groups (each group scored
    # by the sum of its top 2), top-k within them, renormalised and scaled
    ("deepseek_v3_group_limited_bias_scaled", dict(
        decoder_block="deepseek", routed_score_func="sigmoid", routed_bias=True, n_routing_groups=4,
        topk_routing_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)),
]


@pytest.mark.parametrize("name,over", DROPLESS, ids=[c[0] for c in DROPLESS])
def test_dense_matmul_dropless(name, over):
    seed = C.seed()
    f, p, cfg = build(seed, **over)
    x = _x(seed)
    y = f(p, x)
    C.check_model(f"maxtext.RoutedMoE dense_matmul dropless [{name}]", f, (p, x), expected_sites=1, family="dense",
                  E=E, k=cfg.num_experts_per_tok, dense_dot_floor=E * T * min(D, F), loss_argnums=(0, 1),
                  seed_=seed)
    # MaxText's sparse_matmul path is the reference answer for dropless
    ref = _sparse_reference(seed, p, x, **over)
    assert C.rel(y, ref) <= C.TOL, (name, seed, "MaxText dense vs sparse", C.rel(y, ref))
    assert C.rel(jax.jit(optimize(f))(p, x), ref) <= C.TOL, (name, seed)


CAPACITY = [
    ("cf0.5_C1", dict(capacity_factor=0.5)),
    ("cf1.0_C3", dict(capacity_factor=1.0)),
    ("cf1.25_C3", dict(capacity_factor=1.25)),
    ("cf2.0_C6", dict(capacity_factor=2.0)),
    ("cf1.0_mlp_bias", dict(capacity_factor=1.0, mlp_bias=True)),
    ("cf1.0_qwen3_norm_topk", dict(capacity_factor=1.0, decoder_block="qwen3", norm_topk_prob=True)),
]


@pytest.mark.parametrize("name,over", CAPACITY, ids=[c[0] for c in CAPACITY])
def test_dense_matmul_capacity(name, over):
    seed = C.seed()
    f, p, cfg = build(seed, **over)
    x = _x(seed)
    cap = maxtext_capacity(cfg)
    y = f(p, x)
    ref = _sparse_reference(seed, p, x, **{k: v for k, v in over.items() if k != "capacity_factor"})
    drops = C.rel(y, ref) > 1e-3
    if cap * E < S * cfg.num_experts_per_tok:  # fewer slots than assignments: MaxText must have dropped
        assert drops, (name, seed, "expected dropped tokens")
    # exact: MaxText's drops and priority order (the running count over (token, choice) in sequence order)
    C.check_model(f"maxtext.RoutedMoE dense_matmul capacity [{name}]", f, (p, x), expected_sites=1,
                  family="capacity", E=E, k=cfg.num_experts_per_tok, capacity=cap,
                  dense_dot_floor=E * B * cap * min(D, F),
                  loss_argnums=(0, 1), seed_=seed, extra={"drops": drops})
    # dropless: the same layer without capacity = MaxText's sparse_matmul answer
    C.check_model(f"maxtext.RoutedMoE dense_matmul capacity [{name}]", f, (p, x), expected_sites=1,
                  family="capacity", E=E, k=cfg.num_experts_per_tok, capacity=cap,
                  dense_dot_floor=E * B * cap * min(D, F),
                  mode="dropless", reference=ref, seed_=seed)
    r = explain(f, p, x, mode="dropless")
    assert all(s.dropless for s in r.sites), str(r)


@pytest.mark.parametrize("cf", [1.0, 0.5], ids=["cf1.0_C3", "cf0.5_C1"])
def test_dense_matmul_capacity_inference_mode(cf):
    """model_call_mode='inference' takes generate_masks_subgroup: masks laid out [B, N, S, E, C] (N = context
    partitions, 1 here) and combine weights from the full softmax. It is dense_matmul with capacity_factor > 0,
    so it is one of the sites to rewrite."""
    seed = C.seed()
    f, p, cfg = build(seed, capacity_factor=cf, model_call_mode="inference")
    x = _x(seed)
    name = f"maxtext.RoutedMoE dense_matmul capacity inference [cf{cf}]"
    r = explain(f, p, x)
    # was xfailed (no site: the N=1 axis of the masks was an unmatched free axis); now a regular check
    assert len(r.sites) == 1, (f"MaxText dense_matmul inference mode (masks [B,N,S,E,C], N=1), "
                               f"capacity_factor={cf}: {str(r)}; plain-JAX reproducer: tests/models/repro.py "
                               f"maxtext_inference_capacity / capacity_with_size1_group_axis")
    cap = int(max(math.ceil(S * cfg.num_experts_per_tok / E) * cf, cf))
    C.check_model(name, f, (p, x), expected_sites=1, family="capacity", E=E, k=cfg.num_experts_per_tok,
                  capacity=cap, dense_dot_floor=E * B * cap * min(D, F), loss_argnums=(0, 1), seed_=seed)


def test_sparse_matmul_ragged_dot_is_swapped_for_the_grouped_gemm():
    """The sparse_matmul path (megablox=False) is already grouped: sort + `jax.lax.ragged_dot` inside MaxText's
    shard_map. Family (5) swaps its three ragged_dots (gate, up, down) for `grouped_matmul`, looking into the
    shard_map body: same values and gradients (f32), no ragged_dot left in the lowered module."""
    seed = C.seed()
    f, p, cfg = build(seed, sparse_matmul=True)
    x = _x(seed)
    r = explain(f, p, x)
    assert len(r.sites) == 3 and all(s.family == "ragged" for s in r.sites), str(r)
    assert all(s.E == cfg.num_experts and s.path.startswith("shard_map") for s in r.sites), str(r)
    assert not [m for m in r.misses if m.op == "ragged_dot_general"], str(r)  # (the router's dot is a near-miss)
    of = optimize(f)
    y0, y1 = f(p, x), jax.jit(of)(p, x)
    assert C.tree_rel(y1, y0) <= C.TOL
    after = jax.jit(of).lower(p, x).as_text()
    assert C.grouped_gemm_calls(after) == 3 and "ragged_dot" not in after
    loss = lambda fn: (lambda p, x: jnp.sum(jnp.sin(jax.tree.leaves(fn(p, x))[0])))
    g0 = jax.grad(loss(f), (0, 1))(p, x)
    g1 = jax.jit(jax.grad(loss(of), (0, 1)))(p, x)
    assert C.tree_rel(g1, g0) <= C.GRAD_TOL


def test_capacity_path_under_jit_scan_and_remat():
    """Two RoutedMoE layers (capacity) stacked and run under lax.scan + jax.checkpoint, as MaxText's scanned
    decoder does."""
    seed = C.seed()
    f, p, cfg = build(seed, capacity_factor=1.0)
    _, p2, _ = build(seed + 7, capacity_factor=1.0)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), p, p2)

    def decoder(stacked, x):
        def body(h, layer_params):
            return h + f(layer_params, h), None
        h, _ = jax.lax.scan(jax.checkpoint(body), x, stacked)
        return h

    x = _x(seed)
    assert [s.path for s in explain(decoder, stacked, x).sites] == ["scan/remat/"]
    C.check_model("maxtext.RoutedMoE capacity x2 under scan+remat", decoder, (stacked, x), expected_sites=1,
                  family="capacity", E=E, k=2, capacity=maxtext_capacity(cfg),
                  dense_dot_floor=E * B * maxtext_capacity(cfg) * min(D, F), loss_argnums=(0, 1), seed_=seed)


@pytest.mark.parametrize("cf", [-1.0, 2.0], ids=["dropless", "cf2.0_C6"])
def test_routed_and_shared_moe(cf):
    """MaxText's RoutedAndSharedMoE (DeepSeek-style: routed experts + a shared MLP on every token, summed): the
    routed part is the one site, the shared MLP is left as it is (and, with streams=True, placed beside it).
    Capacity 6 keeps the smallest E x C dot (the check's floor) above the shared MLP's dots."""
    seed = C.seed()
    over = dict(decoder_block="deepseek", routed_score_func="sigmoid", shared_experts=1, capacity_factor=cf)
    f, p, cfg = build(seed, shared=True, **over)
    x = _x(seed)
    r = explain(f, p, x)
    assert len(r.sites) == 1, str(r)
    assert any("1 side branch" in n for n in r.notes), str(r)  # the shared MLP found beside the site
    if cf > 0:
        cap = maxtext_capacity(cfg)
        C.check_model("maxtext.RoutedAndSharedMoE dense_matmul capacity", f, (p, x), expected_sites=1,
                      family="capacity", E=E, k=cfg.num_experts_per_tok, capacity=cap,
                      dense_dot_floor=E * B * cap * min(D, F), loss_argnums=(0, 1), seed_=seed)
    else:
        C.check_model("maxtext.RoutedAndSharedMoE dense_matmul dropless", f, (p, x), expected_sites=1,
                      family="dense", E=E, k=cfg.num_experts_per_tok, dense_dot_floor=E * T * min(D, F),
                      loss_argnums=(0, 1), seed_=seed)
