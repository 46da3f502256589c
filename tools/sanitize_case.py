"""Small cases for compute-sanitizer (memcheck / racecheck): grouped GEMM with empty groups, sum < M,
odd sizes, forward, dgrad and wgrad, bf16 and f32 outputs, the 128x256 1x2 kernel, the accumulate form and the
blockwise FP8 kernel (all of them through per-group TMA descriptors built before the GEMM); dispatch/combine (plan
with its last-block ticket, token-major gather, padding rows) with capacity, alignment and k > 8.
`python tools/sanitize_case.py fp8` runs the FP8 cases only."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_moe_ffi as jmf

rng = np.random.default_rng(0)
only_fp8 = sys.argv[1:] == ["fp8"]
for m, k, n, sizes in [] if only_fp8 else [(200, 64, 128, [0, 50, 0, 77, 3]), (37, 16, 24, [37]), (129, 256, 136, [60, 0, 40, 0])]:
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n)), jnp.bfloat16)
    dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    gs = jnp.asarray(sizes, jnp.int32)
    for pet in (None, jnp.float32):
        outs = [jmf.grouped_matmul(lhs, rhs, gs, preferred_element_type=pet),
                jmf.grouped_matmul(dout, rhs, gs, transpose_rhs=True, preferred_element_type=pet),
                jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=pet)]
        jax.block_until_ready(outs)
# More than 128 rows a group on average and N = 512 (two 256-wide tiles): auto's 128x256 1x2 kernel; the accumulate
# form; the FP8 wide kernel (N = 512) and the 128x128 one (N = 136).
if not only_fp8:
    lhs = jnp.asarray(rng.standard_normal((2100, 64)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((6, 64, 512)), jnp.bfloat16)
    gs = jnp.asarray([500, 0, 377, 129, 700, 300], jnp.int32)
    jax.block_until_ready([jmf.grouped_matmul(lhs, rhs, gs),
                           jmf.grouped_matmul_acc(lhs, rhs, gs, jnp.ones((2100, 512), jnp.bfloat16))])
for n in (512, 136):
    a = jnp.asarray(rng.standard_normal((700, 256)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((5, 256, n)), jnp.bfloat16)
    jax.block_until_ready(jmf.grouped_matmul(a, w, jnp.asarray([200, 0, 131, 300, 19], jnp.int32), recipe="blockwise"))
for t, k, e, d, kw in [] if only_fp8 else [(300, 10, 7, 136, dict(capacity=200, align=16)), (64, 2, 300, 64, {}), (0, 2, 4, 8, {})]:
    x = jnp.asarray(rng.standard_normal((t, d)), jnp.bfloat16)
    ids = jnp.asarray(rng.integers(-1, e, (t, k)), jnp.int32)
    w = jnp.asarray(rng.random((t, k)), jnp.float32)
    f = lambda x, w: jnp.sum(jmf.moe_combine(jmf.moe_dispatch(x, ids, e, **kw)[0] * 2,
                                             jmf.moe_dispatch(x, ids, e, **kw)[2], w).astype(jnp.float32))
    jax.block_until_ready(jax.grad(f, (0, 1))(x, w))
print("sanitize cases ran")
