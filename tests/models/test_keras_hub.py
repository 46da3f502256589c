"""keras-hub with the JAX backend: the sparse MoE blocks of Mixtral, Qwen3-MoE, Qwen-MoE (Qwen1.5/2: fused
gate/up weight, shared expert with a sigmoid gate), Qwen3.5-MoE and GPT-OSS (interleaved gate/up columns, expert
biases, clamps, a custom GLU), and whole MixtralBackbone / Qwen3MoeBackbone / QwenMoeBackbone / GptOssBackbone /
Gemma4Backbone with its MoE block (tiny random configs, no weights downloaded) through `optimize`/`explain`.

Each layer is called functionally: `layer.stateless_call(trainable, non_trainable, x)` is a pure function of
(weights, inputs), which is what `optimize` rewrites. float32; fresh random weights and inputs each run
(the seed is in every failure message).
"""
from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

import moe_check as C  # noqa: E402

keras = C.require("keras", "pip install keras keras-hub")
keras_hub = C.require("keras_hub", "pip install keras-hub")
assert keras.backend.backend() == "jax", "set KERAS_BACKEND=jax before keras is imported"

from keras_hub.models import MixtralBackbone, Qwen3MoeBackbone  # noqa: E402
from keras_hub.src.models.mixtral.mixtral_decoder import MixtralSparseMoeBlock  # noqa: E402
from keras_hub.src.models.qwen3_moe.qwen3_moe_decoder import Qwen3SparseMoeBlock  # noqa: E402

# Added after the pass was written (keras-hub 0.32.0, pinned by .ci/models.sh): MoE code the matcher had not
# been shown.
from keras_hub.models import Gemma4Backbone, GptOssBackbone, QwenMoeBackbone  # noqa: E402
from keras_hub.src.models.gpt_oss.gpt_oss_decoder import GptOssSparseMoeBlock  # noqa: E402
from keras_hub.src.models.qwen3_5_moe.qwen3_5_moe_decoder import Qwen3_5MoeSparseMoeBlock  # noqa: E402
from keras_hub.src.models.qwen_moe.qwen_moe_decoder import QwenSparseMoeBlock  # noqa: E402

pytestmark = pytest.mark.models

B, S, D, F, E = 2, 12, 16, 32, 8
T = B * S


def _functional(layer, **call_kw):
    """(trainable values, x) -> layer outputs, through keras' stateless_call."""
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def f(trainable, x):
        out, _ = layer.stateless_call(trainable, non_trainable, x, **call_kw)
        return out

    return f, [v.value for v in layer.trainable_variables]


BLOCKS = [
    # (id, constructor, top_k)
    ("mixtral", lambda: MixtralSparseMoeBlock(hidden_dim=D, intermediate_dim=F, num_experts=E, top_k=2,
                                              dtype="float32"), 2),
    ("qwen3_norm_topk", lambda: Qwen3SparseMoeBlock(hidden_dim=D, moe_intermediate_dim=F, num_experts=E, top_k=2,
                                                    norm_top_k_prob=True, dtype="float32"), 2),
    ("qwen3_k4_no_norm", lambda: Qwen3SparseMoeBlock(hidden_dim=D, moe_intermediate_dim=F, num_experts=E, top_k=4,
                                                     norm_top_k_prob=False, dtype="float32"), 4),
    # fused [E, D, 2F] gate/up weight split in halves; shared expert scaled by sigmoid(x W_g) beside the site
    ("qwen_moe_shared_expert", lambda: QwenSparseMoeBlock(
        hidden_dim=D, moe_intermediate_dim=F, shared_expert_intermediate_dim=24, num_experts=E, top_k=2,
        norm_top_k_prob=False, dtype="float32"), 2),
    ("qwen3_5_moe_shared_expert", lambda: Qwen3_5MoeSparseMoeBlock(
        hidden_dim=D, moe_intermediate_dim=F, shared_expert_intermediate_size=24, num_experts=E, top_k=4,
        dtype="float32"), 4),
    # gate = columns 0::2, up = 1::2 of one GEMM, expert biases, clamps, gate * sigmoid(1.702 gate) * (up + 1);
    # router: top_k of the logits, then softmax over the k
    ("gpt_oss", lambda: GptOssSparseMoeBlock(hidden_dim=D, intermediate_dim=F, num_experts=E, top_k=2,
                                             dtype="float32"), 2),
]


@pytest.mark.parametrize("name,make,top_k", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_sparse_moe_block(name, make, top_k):
    seed = C.seed()
    keras.utils.set_random_seed(seed)
    layer = make()
    x = jax.random.normal(jax.random.key(seed), (B, S, D), jnp.float32)
    layer.build(x.shape)
    f, w = _functional(layer)
    # outputs: (moe output, router logits); the router logits are an output too and must stay exact
    r = C.check_model(f"keras_hub.{type(layer).__name__}[{name}]", f, (w, x), expected_sites=1, family="dense",
                      E=E, k=top_k, dense_dot_floor=E * T * min(D, F), loss_argnums=(0, 1), seed_=seed)
    _names_keras_hub_code(r)


def _names_keras_hub_code(report):
    """Each site names keras-hub's MoE block (`...SparseMoeBlock.call`), not the keras.ops wrapper it called
    (`keras/src/backend/jax/numpy.py ... (sum)` before session 31)."""
    for s in report.sites:
        assert "keras_hub/src/models/" in s.source and "MoeBlock" in s.source, s.source


def test_mixtral_block_training_mode_with_aux_loss():
    """training=True adds the load-balancing loss (one_hot of the same top_k): the site is still rewritten and
    the loss is unchanged."""
    seed = C.seed()
    keras.utils.set_random_seed(seed)
    layer = MixtralSparseMoeBlock(hidden_dim=D, intermediate_dim=F, num_experts=E, top_k=2, dtype="float32")
    x = jax.random.normal(jax.random.key(seed), (B, S, D), jnp.float32)
    layer.build(x.shape)
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def f(trainable, x):
        (y, logits), _, losses = layer.stateless_call(trainable, non_trainable, x, training=True, return_losses=True)
        return y, logits, losses

    w = [v.value for v in layer.trainable_variables]
    _, _, losses = f(w, x)
    assert len(losses) == 1
    C.check_model("keras_hub.MixtralSparseMoeBlock[training+aux_loss]", f, (w, x), expected_sites=1,
                  family="dense", E=E, k=2, dense_dot_floor=E * T * min(D, F), loss_argnums=(0, 1), seed_=seed)


def _tokens(seed, vocab):
    k1, _ = jax.random.split(jax.random.key(seed))
    ids = jax.random.randint(k1, (B, S), 0, vocab).astype(jnp.int32)
    mask = jnp.ones((B, S), jnp.int32).at[1, S - 3:].set(0)  # the second sequence is padded
    return {"token_ids": ids, "padding_mask": mask}


BACKBONES = [
    # (id, constructor, number of MoE layers, top_k)
    ("mixtral_2_layers", lambda: MixtralBackbone(
        vocabulary_size=64, num_layers=2, num_query_heads=4, hidden_dim=D, intermediate_dim=F, num_key_value_heads=2,
        num_experts=E, top_k=2, sliding_window=8, dtype="float32"), 2, 2),
    ("qwen3_moe_3_layers_one_dense", lambda: Qwen3MoeBackbone(
        vocabulary_size=64, num_layers=3, num_query_heads=4, num_key_value_heads=2, hidden_dim=D, intermediate_dim=48,
        moe_intermediate_dim=F, num_experts=E, top_k=2, norm_top_k_prob=True, mlp_only_layers=[1],
        dtype="float32"), 2, 2),
    ("qwen3_moe_defaults_k4", lambda: Qwen3MoeBackbone(
        vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=D, intermediate_dim=48,
        moe_intermediate_dim=F, num_experts=E, dtype="float32"), 2, 4),
    ("qwen_moe_2_layers_shared_expert", lambda: QwenMoeBackbone(
        vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=D, intermediate_dim=48,
        moe_intermediate_dim=F, shared_expert_intermediate_dim=24, num_experts=E, top_k=2, dtype="float32"), 2, 2),
    ("gpt_oss_2_layers", lambda: GptOssBackbone(
        vocabulary_size=64, num_layers=2, num_query_heads=4, hidden_dim=D, intermediate_dim=F, num_key_value_heads=2,
        num_experts=E, top_k=2, sliding_window=8, dtype="float32"), 2, 2),
]


@pytest.mark.parametrize("name,make,n_moe,top_k", BACKBONES, ids=[b[0] for b in BACKBONES])
def test_backbone(name, make, n_moe, top_k):
    seed = C.seed()
    keras.utils.set_random_seed(seed)
    model = make()
    f, w = _functional(model)
    inputs = _tokens(seed, 64)
    # the dense MLP layer (qwen3 mlp_only_layers) and attention must be left alone: exactly n_moe sites
    r = C.check_model(f"keras_hub.{type(model).__name__}[{name}]", f, (w, inputs), expected_sites=n_moe,
                      family="dense", E=E, k=top_k, dense_dot_floor=E * T * min(D, F), loss_argnums=(0,), seed_=seed)
    _names_keras_hub_code(r)


def test_gemma4_backbone_with_moe_block():
    """Gemma 4 (26b-a4b layout): every decoder layer runs a dense MLP beside a sparse MoE block; the router
    RMS-normalises and rescales its input, the experts use a GeGLU computed in float32 and a per-expert output
    scale. keras-hub initialises the expert weights to zero, so they (and the scales) are drawn at random here:
    with zeros the rewritten and the original model would agree trivially."""
    seed = C.seed()
    keras.utils.set_random_seed(seed)
    model = Gemma4Backbone(vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=D,
                           intermediate_dim=24, head_dim=8, image_size=16, sliding_window_size=8,
                           enable_moe_block=True, num_experts=E, expert_intermediate_dim=F, num_experts_per_token=2,
                           dtype="float32")
    f, w = _functional(model)
    keys = jax.random.split(jax.random.key(seed + 1), len(w))
    names = [v.path for v in model.trainable_variables]
    w = [1.0 + 0.3 * jax.random.normal(k, a.shape, a.dtype) if "scale" in n else
         0.3 * jax.random.normal(k, a.shape, a.dtype) if not bool(jnp.any(a)) else a
         for k, a, n in zip(keys, w, names)]
    inputs = _tokens(seed, 64)
    inputs["position_ids"] = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    C.check_model("keras_hub.Gemma4Backbone[moe_2_layers]", f, (w, inputs), expected_sites=2, family="dense",
                  E=E, k=2, dense_dot_floor=E * T * min(D, F), loss_argnums=(0,), seed_=seed)
