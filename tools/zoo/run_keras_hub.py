"""KerasHub's MoE backbones (Keras 3, JAX backend) through jax_moe_ffi.optimize, unchanged library code.

Tiny configurations of MixtralBackbone, QwenMoeBackbone, Qwen3MoeBackbone, Qwen3_5MoeBackbone and GptOssBackbone are built with random
weights; each forward pass is taken as a pure function of the weights with `stateless_call`, then `explain`
reports what the pass found and the optimized function is compared with the original, forward and
gradients. Needs `pip install keras keras-hub` (not a project dependency; not run in CI).

Usage: KERAS_BACKEND=jax python tools/zoo/run_keras_hub.py [model ...] [--dtype bfloat16]
  -> prints; writes results_keras_hub[_bfloat16].txt
"""
from __future__ import annotations

import io
import os
import sys
import warnings

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402

OUT = io.StringIO()


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s)
    OUT.write(s + "\n")


DTYPE = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else None
COMMON = dict(vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=32, dtype=DTYPE)
MODELS = {
    "mixtral": lambda: keras_hub.models.MixtralBackbone(intermediate_dim=48, num_experts=4, top_k=2, **COMMON),
    "qwen_moe": lambda: keras_hub.models.QwenMoeBackbone(intermediate_dim=48, moe_intermediate_dim=24,
                                                         shared_expert_intermediate_dim=32, num_experts=4,
                                                         top_k=2, **COMMON),
    "qwen3_moe": lambda: keras_hub.models.Qwen3MoeBackbone(intermediate_dim=48, moe_intermediate_dim=24,
                                                           num_experts=4, top_k=2, head_dim=8, **COMMON),
    # Qwen3.5-MoE: gated-delta-net linear attention layers between full attention ones, a gated shared expert
    "qwen3_5_moe": lambda: keras_hub.models.Qwen3_5MoeBackbone(
        head_dim=8, moe_intermediate_dim=24, shared_expert_intermediate_size=32, num_experts=4, top_k=2,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        **{k: v for k, v in COMMON.items() if k != "num_layers"}, num_layers=4),
    "gpt_oss": lambda: keras_hub.models.GptOssBackbone(intermediate_dim=48, num_experts=4, top_k=2, head_dim=8,
                                                       **COMMON),
}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(name):
    log("=" * 100)
    try:
        model = MODELS[name]()
    except Exception as exc:  # noqa: BLE001  (a constructor argument this keras_hub version does not take)
        log(f"{name}: could not build ({type(exc).__name__}: {exc})")
        return
    batch, seq = 2, 8
    rng = np.random.default_rng(0)
    inputs = {"token_ids": jnp.asarray(rng.integers(0, 64, (batch, seq)), jnp.int32),
              "padding_mask": jnp.ones((batch, seq), jnp.int32)}
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]

    def forward(trainable, inputs):
        out, _ = model.stateless_call(trainable, frozen, inputs)
        return out

    log(f"MODEL {name}: {type(model).__name__}, keras {keras.__version__}, keras_hub {keras_hub.__version__}, "
        f"{sum(int(np.prod(t.shape)) for t in trainable)} weights")
    report = jmf.explain(forward, trainable, inputs)
    log(str(report))
    fast = jmf.optimize(forward)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y1 = jax.jit(fast)(trainable, inputs)
    for x in w:
        log(f"warning: {x.message}")
    y0 = jax.jit(forward)(trainable, inputs)
    log(f"forward rel err (jit(optimize(f)) vs jit(f)): {rel(y1, y0):.2e}")

    def loss(f):
        return lambda t, i: jnp.sum(jnp.sin(f(t, i).astype(jnp.float32)))

    g0 = jax.jit(jax.grad(loss(forward)))(trainable, inputs)
    g1 = jax.jit(jax.grad(loss(fast)))(trainable, inputs)
    errs = [rel(a, b) for a, b in zip(g1, g0) if np.linalg.norm(np.asarray(b)) > 0]
    log(f"gradient rel err, worst weight: {max(errs):.2e} (over {len(errs)} weights with a nonzero gradient)")
    calls = str(jax.make_jaxpr(fast)(trainable, inputs)).count("jax_moe_ffi_grouped_gemm")
    log(f"grouped GEMM calls in the optimized jaxpr: {calls}")


def main(names):
    log(f"jax {jax.__version__}, devices {jax.devices()}, dtype {DTYPE or 'float32'}")
    for n in names or MODELS:
        run(n)
    suffix = f"_{DTYPE}" if DTYPE else ""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"results_keras_hub{suffix}.txt"), "w") as fh:
        fh.write(OUT.getvalue())


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--dtype" in args:
        i = args.index("--dtype")
        args = args[:i] + args[i + 2:]
    main(args)
