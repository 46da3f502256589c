"""EasyDeL's MoE causal LMs (tiny configs, random weights, CPU) through jax_moe_ffi.explain / optimize, for each
of EasyDeL's three MoE execution paths (its `moe_method` config): dense_moe (expert weights gathered per (token,
choice): family 6), standard_moe (sort + jax.lax.ragged_dot via ejkernel's XLA grouped_matmul: family 5) and
fused_moe (the same inside a shard_map). Prints, per model and path: the sites by family, the near-misses, and
the logits' and gradients' max relative error (max |diff| / max |model|, worst leaf) against the model as written,
beside the model's own gradient noise (its eager against its jitted gradient: some paths round to bf16 inside).

Not part of CI (EasyDeL pulls ray, transformers, datasets, ... and pins flax 0.12.3, which needs jax < 0.11).
Set-up used for tools/zoo/results_easydel.txt (Python 3.12):
    python3.12 -m venv /tmp/edl-venv && /tmp/edl-venv/bin/pip install easydel==0.3.0 pillow
    /tmp/edl-venv/bin/pip install jax==0.10.2 jaxlib==0.10.2 scikit-build-core nanobind cmake ninja
    /tmp/edl-venv/bin/pip install --no-deps --no-build-isolation -e .
    /tmp/edl-venv/bin/python tools/zoo/easydel_models.py > tools/zoo/results_easydel.txt
"""
import importlib
import os
import sys
import time
import traceback
import types
import warnings

os.environ["EASYDEL_AUTO"] = "0"  # EasyDeL otherwise appends GPU / TPU XLA_FLAGS that this CPU jaxlib rejects
# EasyDeL patches a few Hugging Face torch modeling modules at import; torch is not installed for this probe
for _n in ("dbrx", "glm4v_moe", "llama4", "phimoe", "qwen3_5_moe", "qwen3_next"):
    setattr(importlib.import_module(f"transformers.models.{_n}"), f"modeling_{_n}", types.ModuleType(_n))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import easydel as ed  # noqa: E402
from flax import nnx  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=24, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
              num_experts_per_tok=2)
MODELS = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(num_experts=4, shared_expert_intermediate_size=32,
                                                                 decoder_sparse_step=1)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=4, decoder_sparse_step=1)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=0,
                         q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(num_local_experts=4, sliding_window=16)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(n_routed_experts=4, n_shared_experts=1,
                                                             first_k_dense_replace=0, n_group=1, topk_group=1)),
    "phimoe": ("PhiMoeConfig", "PhiMoeForCausalLM", dict(num_local_experts=4)),
    "grok_1": ("Grok1Config", "Grok1ForCausalLM", dict(num_experts=4)),
    "arctic": ("ArcticConfig", "ArcticForCausalLM", dict(num_local_experts=4)),
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM", dict(num_local_experts=4)),
}
METHODS = ("dense_moe", "standard_moe", "fused_moe")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def probe(name, method):
    cfg_name, lm_name, extra = MODELS[name]
    cfg = getattr(ed, cfg_name)(**{**COMMON, **extra, "moe_method": method})
    model = getattr(ed, lm_name)(config=cfg, dtype=jnp.float32, param_dtype=jnp.float32, precision=None,
                                 rngs=nnx.Rngs(0))
    gd, state, rest = nnx.split(model, nnx.Param, ...)  # parameters (differentiated) and the rest (rng keys)
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, COMMON["vocab_size"])

    def logits(state, ids):
        return nnx.merge(gd, state, rest)(input_ids=ids).logits

    with model.mesh:  # EasyDeL shards activations by logical axes inside its modules: it needs its mesh
        return _check(logits, state, ids)


def _check(logits, state, ids):
    try:
        jax.jit(logits)(state, ids)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"the model as written fails here, before the pass: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:120]}") from exc
    r = jmf.explain(logits, state, ids)
    fams = {}
    for s in r.sites:
        fams[s.family] = fams.get(s.family, 0) + 1
    fast = jmf.optimize(logits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y0, y1 = jax.jit(logits)(state, ids), jax.jit(fast)(state, ids)
    loss = lambda f: (lambda st: jnp.mean(jax.nn.log_softmax(f(st, ids))[..., 0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g0 = jax.jit(jax.grad(loss(logits)))(state)
        g1 = jax.jit(jax.grad(loss(fast)))(state)
        g0_eager = jax.grad(loss(logits))(state)  # the model's own noise: its gradient eager vs jitted

    def worst(ga, gb):
        return max((rel(a, b) for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)) if np.any(np.asarray(b))),
                   default=0.0)
    return r, fams, rel(y1, y0), worst(g1, g0), worst(g0_eager, g0)


def main(names):
    print(f"# jax {jax.__version__}, easydel {ed.__version__}, jax_moe_ffi {jmf.__version__}; tiny configs, CPU")
    for name in names:
        for method in METHODS:
            t = time.time()
            try:
                r, fams, ferr, gerr, noise = probe(name, method)
            except Exception as exc:  # noqa: BLE001 -- a model that EasyDeL cannot build here is reported
                print(f"{name:12s} {method:13s} ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                if os.environ.get("EDL_TRACE"):
                    traceback.print_exc()
                continue
            misses = sorted({m.reason[:110] for m in r.misses})
            print(f"{name:12s} {method:13s} sites={fams} near-misses={len(r.misses)} logits rel {ferr:.1e} "
                  f"grad rel {gerr:.1e} (model's own eager-vs-jit grad noise {noise:.1e}; {time.time() - t:.0f} s)")
            for m in misses:
                print(f"    miss: {m}")
            sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))  # model names (keys of MODELS) to run a few; all by default
