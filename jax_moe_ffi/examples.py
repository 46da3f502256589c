"""Built-in example models for the demo, `inspect` and `hlo_examples/`: each entry builds (fn, args).

- gshard_capacity: a GShard/Switch capacity layer (one-hot [T,E,C] dispatch/combine einsums, drops);
- mixtral_dense:   a Mixtral-style layer computing every expert on every token, weighted by a top-2 gate;
- decoder_scan:    a small decoder, `lax.scan` over layers of MoE blocks under `jax.checkpoint`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_moe_ffi import models


def _layer(tokens, d_model, d_ff, experts, dtype, seed):
    pk, xk = jax.random.split(jax.random.PRNGKey(seed))
    params = models.init_moe_params(pk, d_model, d_ff, experts, dtype)
    x = jax.random.normal(xk, (tokens, d_model), dtype)
    return params, x


def gshard_capacity(tokens=512, d_model=256, d_ff=512, experts=16, top_k=2, capacity_factor=1.0,
                    dtype=jnp.float32, seed=0):
    params, x = _layer(tokens, d_model, d_ff, experts, dtype, seed)
    return (lambda p, x: models.capacity_moe(p, x, top_k, capacity_factor)), (params, x)


def mixtral_dense(tokens=512, d_model=256, d_ff=512, experts=16, top_k=2, dtype=jnp.float32, seed=0):
    params, x = _layer(tokens, d_model, d_ff, experts, dtype, seed)
    return (lambda p, x: models.dense_moe(p, x, top_k)), (params, x)


def decoder_scan(tokens=256, d_model=128, d_ff=256, experts=8, top_k=2, layers=2, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), layers + 1)
    stacked = jax.tree.map(lambda *a: jnp.stack(a),
                           *[models.init_moe_params(k, d_model, d_ff, experts, dtype) for k in keys[:-1]])
    x = jax.random.normal(keys[-1], (tokens, d_model), dtype)
    return (lambda p, x: models.moe_decoder(p, x, top_k)), (stacked, x)


EXAMPLES = {"gshard_capacity": gshard_capacity, "mixtral_dense": mixtral_dense, "decoder_scan": decoder_scan}
