"""The main job: take the built-in MoE models written the naive ways, rewrite them with `optimize`, and show
what happened: the explain report, numerics against the original, what XLA runs before/after, timing."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_moe_ffi as jmf
from jax_moe_ffi import _registry, examples
from jax_moe_ffi.inspect import summarize_hlo


def _time(fn, *args, reps=10):
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def _rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_demo(args) -> int:
    on_gpu = jax.default_backend() == "gpu"
    dtype = jnp.dtype(("bfloat16" if on_gpu else "float32") if args.dtype == "auto" else args.dtype)
    print(f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind}); "
          f"FFI targets: {len(_registry.cpu_targets)} CPU, {len(_registry.cuda_targets)} CUDA; dtype {dtype.name}")
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    # float32 is compared at full float32 precision: XLA:GPU's default runs float32 dots in TF32 (~3e-4 apart),
    # which would hide a real mismatch at 1e-5 or report a false one. Timing uses the default precision.
    check_precision = "highest" if dtype == jnp.float32 else None
    # sizes: small enough for a 2-core CPU; on a GPU, large enough that the kernels, not launches, are timed
    defaults = {"tokens": 8192, "d_model": 1024, "d_ff": 2048, "experts": 32} if on_gpu else \
        {"tokens": 512, "d_model": 256, "d_ff": 512, "experts": 16}
    for k_, v in defaults.items():
        if getattr(args, k_, None) is None:
            setattr(args, k_, v)
    ok = True
    names = list(examples.EXAMPLES) if args.model == "all" else [args.model]
    for name in names:
        kwargs = {"dtype": dtype}
        if name != "decoder_scan":
            kwargs.update(tokens=args.tokens, d_model=args.d_model, d_ff=args.d_ff, experts=args.experts,
                          top_k=args.top_k)
        fn, fargs = examples.EXAMPLES[name](**kwargs)
        print(f"\n=== {name} ({dtype.name}) " + "=" * max(0, 60 - len(name)))
        report = jmf.explain(fn, *fargs, mode=args.mode)
        print(report)
        fast = jmf.optimize(fn, mode=args.mode)
        before, after = jax.jit(fn), jax.jit(fast)
        with jax.default_matmul_precision(check_precision):
            y0, y1 = jax.jit(fn)(*fargs), jax.jit(fast)(*fargs)
            err = _rel(y1, y0)
            # gradients w.r.t. the input and the parameters, through the ops' custom_vjp
            loss = lambda f: (lambda p, x: jnp.sum(f(p, x).astype(jnp.float32) ** 2))
            g0 = jax.jit(jax.grad(loss(fn), (0, 1)))(*fargs)
            g1 = jax.jit(jax.grad(loss(fast), (0, 1)))(*fargs)
            gerr = max(_rel(a, b) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)))
        good = err <= tol and gerr <= 10 * tol and report.rewritten
        ok &= good
        print(f"numerics: optimized vs original rel err {err:.2e}, gradients {gerr:.2e} "
              f"(tolerance {tol:.0e}) -> {'OK' if good else 'MISMATCH'}")
        print(f"before: {summarize_hlo(before.lower(*fargs).compile().as_text())}")
        print(f"after:  {summarize_hlo(after.lower(*fargs).compile().as_text())}")
        # FP8: the same rewrite with blockwise-FP8 expert GEMMs (values differ by FP8 rounding, so it is judged
        # by the similarity 1 - 2<x,y>/(|x|^2+|y|^2) of the outputs, not by a relative error)
        y8 = jax.jit(jmf.optimize(fn, mode=args.mode, recipe="blockwise"))(*fargs)
        a, b = np.asarray(y8, np.float64).ravel(), np.asarray(y0, np.float64).ravel()
        sim = 1.0 - 2.0 * float(a @ b) / float(a @ a + b @ b)
        ok &= sim < 1e-2
        print(f"FP8 (recipe='blockwise'): output similarity loss vs original {sim:.1e} "
              f"-> {'OK' if sim < 1e-2 else 'MISMATCH'} (< 1e-2)")
        t0, t1 = _time(before, *fargs), _time(after, *fargs)
        print(f"time (forward, {jax.default_backend()}): original {t0:.2f} ms, optimized {t1:.2f} ms "
              f"({t0 / t1:.2f}x)")
    print("\ndemo: OK" if ok else "\ndemo: FAILED")
    return 0 if ok else 1
