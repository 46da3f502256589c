"""Small cases for compute-sanitizer (memcheck / racecheck): grouped GEMM with empty groups, sum < M,
odd sizes, forward, dgrad and wgrad, bf16 and f32 outputs; dispatch/combine (plan with its
last-block ticket, token-major gather, padding rows) with capacity, alignment and k > 8."""
import jax
import jax.numpy as jnp
import numpy as np

import jax_moe_ffi as jmf

rng = np.random.default_rng(0)
for m, k, n, sizes in [(200, 64, 128, [0, 50, 0, 77, 3]), (37, 16, 24, [37]), (129, 256, 136, [60, 0, 40, 0])]:
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n)), jnp.bfloat16)
    dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    gs = jnp.asarray(sizes, jnp.int32)
    for pet in (None, jnp.float32):
        outs = [jmf.grouped_matmul(lhs, rhs, gs, preferred_element_type=pet),
                jmf.grouped_matmul(dout, rhs, gs, transpose_rhs=True, preferred_element_type=pet),
                jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=pet)]
        jax.block_until_ready(outs)
for t, k, e, d, kw in [(300, 10, 7, 136, dict(capacity=200, align=16)), (64, 2, 300, 64, {}), (0, 2, 4, 8, {})]:
    x = jnp.asarray(rng.standard_normal((t, d)), jnp.bfloat16)
    ids = jnp.asarray(rng.integers(-1, e, (t, k)), jnp.int32)
    w = jnp.asarray(rng.random((t, k)), jnp.float32)
    f = lambda x, w: jnp.sum(jmf.moe_combine(jmf.moe_dispatch(x, ids, e, **kw)[0] * 2,
                                             jmf.moe_dispatch(x, ids, e, **kw)[2], w).astype(jnp.float32))
    jax.block_until_ready(jax.grad(f, (0, 1))(x, w))
print("sanitize cases ran")
