"""optimize(streams=..., offload=...): stream annotation in the lowered HLO, offload tags + policy, numerics."""
import jax
import jax.numpy as jnp
import numpy as np

import jax_moe_ffi as jmf
from jax_moe_ffi import examples, runtime


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_streams_annotate_the_combine_and_keep_numerics():
    fn, args = examples.mixtral_dense(tokens=64, d_model=32, d_ff=64, experts=8, seed=3)
    on, off = jmf.optimize(fn, streams=True), jmf.optimize(fn, streams=False)
    text_on = jax.jit(on).lower(*args).as_text()
    text_off = jax.jit(off).lower(*args).as_text()
    if runtime.streams_supported():
        assert "_xla_stream_annotation" in text_on
    assert "_xla_stream_annotation" not in text_off
    ref = fn(*args)
    assert _rel(on(*args), ref) < 1e-5 and _rel(off(*args), ref) < 1e-5


def test_offload_tags_and_policy_offload_the_moe_intermediates():
    fn, args = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=4)
    fast = jmf.optimize(fn, offload="pinned_host")
    assert hasattr(fast, "offload_policy")
    layer = jax.checkpoint(fast, policy=fast.offload_policy)
    loss = lambda f: (lambda p, x: jnp.sum(f(p, x) ** 2))
    g = jax.grad(loss(layer), (0, 1))(*args)
    g0 = jax.grad(loss(fn), (0, 1))(*args)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
        assert _rel(a, b) < 1e-4
    # the tagged rows really are held in host memory by the policy; none without tags
    assert runtime.offloaded_bytes(lambda p, x: jnp.sum(layer(p, x) ** 2), *args) > 0
    plain = jax.checkpoint(jmf.optimize(fn), policy=fast.offload_policy)
    assert runtime.offloaded_bytes(lambda p, x: jnp.sum(plain(p, x) ** 2), *args) == 0
