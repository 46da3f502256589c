"""The main job: a built-in Mixtral-style MoE layer written naively (all experts dense) against the same
layer on `grouped_matmul`: numerics check, what XLA runs before/after, and timing."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_moe_ffi import _registry, models
from jax_moe_ffi.inspect import summarize_hlo


def _time(fn, *args, reps=10):
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def _hlo_summary(fn, *args) -> str:
    return str(summarize_hlo(fn.lower(*args).compile().as_text()))


def run_demo(args) -> int:
    dtype = jnp.dtype(args.dtype)
    key = jax.random.PRNGKey(0)
    pk, xk = jax.random.split(key)
    params = models.init_moe_params(pk, args.d_model, args.d_ff, args.experts, dtype)
    x = jax.random.normal(xk, (args.tokens, args.d_model), dtype)
    print(f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind}); "
          f"CPU targets: {len(_registry.cpu_targets)}, CUDA targets: {len(_registry.cuda_targets)}")
    print(f"MoE layer: T={args.tokens} D={args.d_model} F={args.d_ff} E={args.experts} "
          f"top-{args.top_k} {dtype.name}")

    naive = jax.jit(lambda p, x: models.dense_moe(p, x, args.top_k))
    grouped = jax.jit(lambda p, x: models.grouped_moe(p, x, args.top_k))
    y_naive, y_grouped = naive(params, x), grouped(params, x)
    # ground truth in float64 on the host-side reference path
    with jax.default_matmul_precision("highest"):
        p32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
        y_ref = np.asarray(models.dense_moe(p32, x.astype(jnp.float32), args.top_k), np.float64)
    err = lambda y: np.linalg.norm(np.asarray(y, np.float64) - y_ref) / np.linalg.norm(y_ref)
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    e_naive, e_grouped = err(y_naive), err(y_grouped)
    print(f"numerics vs f32 reference: naive rel err {e_naive:.2e}, grouped rel err {e_grouped:.2e} "
          f"(tolerance {tol:.0e})")
    print(f"before: {_hlo_summary(naive, params, x)}")
    print(f"after:  {_hlo_summary(grouped, params, x)}")
    t_naive, t_grouped = _time(naive, params, x), _time(grouped, params, x)
    flops_routed = 2 * 3 * args.tokens * args.top_k * args.d_model * args.d_ff
    print(f"time: naive {t_naive:.2f} ms, grouped {t_grouped:.2f} ms ({t_naive / t_grouped:.2f}x); "
          f"routed expert FLOPs {flops_routed / 1e9:.2f} GFLOP, naive computes {args.experts / args.top_k:.0f}x that")
    ok = e_grouped < tol
    print("demo: OK" if ok else "demo: NUMERICS MISMATCH")
    return 0 if ok else 1
