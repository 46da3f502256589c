"""How far the Gemma4 keras-hub backbone's own gradient moves between eager and jit (f32), next to the rewrite's
error: the noise floor that tests/models/moe_check.py's gradient bound is scaled by. Run in the model-group
venv (.ci/models.sh): `KERAS_BACKEND=jax python tools/models_grad_noise.py 1 2 3 4 5 6` (seeds)."""
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras_hub.models import Gemma4Backbone  # noqa: E402

import test_keras_hub as T  # noqa: E402
from jax_moe_ffi.rewrite import optimize  # noqa: E402


def setup(seed):
    keras.utils.set_random_seed(seed)
    model = Gemma4Backbone(vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=2,
                           hidden_dim=T.D, intermediate_dim=24, head_dim=8, image_size=16, sliding_window_size=8,
                           enable_moe_block=True, num_experts=T.E, expert_intermediate_dim=T.F,
                           num_experts_per_token=2, dtype="float32")
    f, w = T._functional(model)
    keys = jax.random.split(jax.random.key(seed + 1), len(w))
    names = [v.path for v in model.trainable_variables]
    w = [1.0 + 0.3 * jax.random.normal(k, a.shape, a.dtype) if "scale" in n else
         0.3 * jax.random.normal(k, a.shape, a.dtype) if not bool(jnp.any(a)) else a
         for k, a, n in zip(keys, w, names)]
    inputs = T._tokens(seed, 64)
    inputs["position_ids"] = jnp.broadcast_to(jnp.arange(T.S, dtype=jnp.int32), (T.B, T.S))
    return f, w, inputs, names


def loss(f):
    def s(*a):
        y = jax.tree.leaves(f(*a))[0]
        return jnp.sum(jnp.sin(y) * jnp.cos(jnp.arange(y.size, dtype=y.dtype).reshape(y.shape)))
    return s


def per_leaf(a, b):
    return np.array([np.linalg.norm(np.asarray(x, np.float64) - np.asarray(y, np.float64))
                     / max(np.linalg.norm(np.asarray(y, np.float64)), 1e-300)
                     for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))])


for seed in [int(s) for s in sys.argv[1:]] or [1, 2, 3]:
    f, w, inp, names = setup(seed)
    g0 = jax.grad(loss(f))(w, inp)
    e_opt = per_leaf(jax.jit(jax.grad(loss(optimize(f))))(w, inp), g0)
    e_own = per_leaf(jax.jit(jax.grad(loss(f)))(w, inp), g0)
    print(f"seed {seed}: rewrite {e_opt.max():.2e} at {names[int(e_opt.argmax())]} | "
          f"own jit vs eager {e_own.max():.2e} at {names[int(e_own.argmax())]}", flush=True)
