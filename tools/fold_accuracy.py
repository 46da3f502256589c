"""Is folding the combine weights into the down GEMM's rows less accurate? (CPU, a few seconds.)

The MoE layer benchmark compares `optimize()` with the naive bf16 model; with the fold on, the two round in a
different order, so that comparison moves from ~2e-6 to ~4e-3 (one bf16 rounding). Which one is nearer the
truth: this script runs a small GShard capacity layer in bf16, naive and optimized (JAX_MOE_FFI_FOLD_COMBINE_WEIGHTS
as set), and compares both with the float32 model on the same bf16-representable inputs: output, dx, dW_down,
dW_router.

  for f in 0 1; do JAX_MOE_FFI_FOLD_COMBINE_WEIGHTS=$f python tools/fold_accuracy.py --seed 1; done
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import jax
import jax.numpy as jnp

import jax_moe_ffi as jmf
from jax_moe_ffi import models


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t, d, f, e, k, cf = 1024, 256, 128, 16, 4, 1.25
    pk, xk = jax.random.split(jax.random.PRNGKey(args.seed))
    as_bf16 = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)  # the truth sees the bf16 inputs exactly
    p32 = jax.tree.map(as_bf16, models.init_moe_params(pk, d, f, e, jnp.float32))
    x32 = as_bf16(jax.random.normal(xk, (t, d), jnp.float32))
    naive = lambda p, x: models.capacity_moe(p, x, k, cf)

    def loss(fn):
        return lambda p, x: jnp.sum(fn(p, x).astype(jnp.float32) * jnp.sin(x.astype(jnp.float32)))

    y_true = naive(p32, x32)
    g_true = jax.grad(loss(naive), (0, 1))(p32, x32)
    pb, xb = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p32), x32.astype(jnp.bfloat16)
    fold = os.environ.get("JAX_MOE_FFI_FOLD_COMBINE_WEIGHTS", "1")
    for name, fn in (("naive bf16", naive), ("optimize bf16", jmf.optimize(naive, mode="exact"))):
        y = jax.jit(fn)(pb, xb)
        gp, gx = jax.jit(jax.grad(loss(fn), (0, 1)))(pb, xb)
        print(f"fold={fold} {name:>14}: rel err vs float32  out {rel(y, y_true):.3e}  dx {rel(gx, g_true[1]):.3e}  "
              f"dW_down {rel(gp['w_down'], g_true[0]['w_down']):.3e}  dW_router {rel(gp['router'], g_true[0]['router']):.3e}")


if __name__ == "__main__":
    main()
