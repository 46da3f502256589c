"""Small grouped GEMM cases for compute-sanitizer (memcheck / racecheck): empty groups, sum < M,
odd sizes, forward, dgrad and wgrad, bf16 and f32 outputs."""
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
print("sanitize cases ran")
