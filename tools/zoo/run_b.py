"""Run every zoo_b layer through jax_moe_ffi.explain / optimize: forward + gradient exactness, jaxpr check.

Usage: python tools/zoo/run_b.py [layer ...]  -> prints and writes results.txt
(tools/zoo/run_c.py runs zoo_c's layers through the same harness.)
"""
from __future__ import annotations

import io
import re
import os
import sys
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_moe_ffi as jmf  # noqa: E402
import zoo_b  # noqa: E402

SEEDS = (11, 202, 3003)
TOL = 1e-5
OUT = io.StringIO()


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    OUT.write(s + "\n")


def _last(tb):
    lines = [l for l in tb.strip().splitlines() if l.strip() and not l.startswith(("For simplicity", "-----"))]
    return lines[-1][:300]


def rel(a, b):
    """Max |a - b| / max |b|; for pytrees (a layer returning (y, aux)) the worst leaf."""
    if not hasattr(b, "shape"):
        return max(rel(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.max(np.abs(a - b)) if a.size else 0.0
    s = np.max(np.abs(b)) if b.size else 0.0
    return float(d / s) if s > 0 else float(d)  # absolute when the reference is all zero


def leaf_errs(ga, gb):
    pa, _ = jax.tree_util.tree_flatten_with_path(ga)
    pb = jax.tree.leaves(gb)
    return {jax.tree_util.keystr(k): rel(a, b) for (k, a), b in zip(pa, pb)}


def run_layer(name, init, f, expected, tol=TOL):
    summary = {"layer": name, "expected": expected, "sites": None, "families": [], "misses": [],
               "fwd": [], "grad": [], "gemm_in_jaxpr": None, "exc": []}
    log("=" * 100)
    log(f"LAYER {name}  (expected: {expected})")
    log(f"  doc: {' '.join((f.__doc__ or '').split())}")
    for si, seed in enumerate(SEEDS):
        key = jax.random.PRNGKey(seed)
        try:
            params, x = init(key)
        except Exception:
            summary["exc"].append(f"init seed {seed}: " + _last(traceback.format_exc()))
            log(traceback.format_exc())
            continue
        if si == 0:
            try:
                rep = jmf.explain(f, params, x)
                log(str(rep))
                summary["sites"] = len(rep.sites)
                summary["families"] = [s.family for s in rep.sites]
                summary["misses"] = [m.reason for m in rep.misses]
            except Exception:
                tb = traceback.format_exc()
                summary["exc"].append("explain: " + _last(tb))
                log("EXPLAIN EXCEPTION\n" + tb)
            try:
                jp = str(jax.make_jaxpr(jmf.optimize(f))(params, x))
                summary["gemm_in_jaxpr"] = "jax_moe_ffi_grouped_gemm" in jp
                targets = sorted(set(re.findall(r"jax_moe_ffi_\w+", jp)))
                log(f"  optimized jaxpr contains jax_moe_ffi_grouped_gemm: {summary['gemm_in_jaxpr']}; "
                    f"custom targets: {targets}")
            except Exception:
                tb = traceback.format_exc()
                summary["exc"].append("make_jaxpr(optimize): " + _last(tb))
                log("MAKE_JAXPR EXCEPTION\n" + tb)
        # forward
        try:
            ref = jax.jit(f)(params, x)
            with warnings.catch_warnings(record=True) as wl:
                warnings.simplefilter("always")
                opt = jax.jit(jmf.optimize(f))(params, x)
            e = rel(opt, ref)
            summary["fwd"].append(e)
            log(f"  seed {seed}: fwd rel err {e:.3e}" + ("" if e <= tol else "   <-- INEXACT")
                + (f"  [warning: {str(wl[0].message)[:160]}]" if wl else ""))
        except Exception:
            tb = traceback.format_exc()
            summary["exc"].append(f"fwd seed {seed}: " + _last(tb))
            log("FWD EXCEPTION\n" + tb)
            continue
        # gradients
        try:
            def loss(fn):
                return lambda p, xx: sum(jnp.sum(jnp.sin(leaf.astype(jnp.float32)))
                                         for leaf in jax.tree.leaves(fn(p, xx)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g_opt = jax.jit(jax.grad(loss(jmf.optimize(f)), argnums=(0, 1)))(params, x)
            g_ref = jax.jit(jax.grad(loss(f), argnums=(0, 1)))(params, x)
            errs = leaf_errs(g_opt, g_ref)
            worst = max(errs.items(), key=lambda kv: kv[1])
            summary["grad"].append(worst[1])
            log(f"  seed {seed}: grad max rel err {worst[1]:.3e} (leaf {worst[0]})"
                + ("" if worst[1] <= tol else "   <-- INEXACT"))
            if si == 0 or worst[1] > tol:
                log("    per leaf: " + ", ".join(f"{k}={v:.1e}" for k, v in errs.items()))
        except Exception:
            tb = traceback.format_exc()
            summary["exc"].append(f"grad seed {seed}: " + _last(tb))
            log("GRAD EXCEPTION\n" + tb)
    return summary


def main(names, zoo=zoo_b, results="results"):
    log(f"jax {jax.__version__}, jax_moe_ffi {jmf.__version__}, devices {jax.devices()}")
    rows = []
    for name, (init, f, expected, *tol) in zoo.LAYERS.items():
        if names and name not in names:
            continue
        rows.append(run_layer(name, init, f, expected, *tol))
    log("=" * 100)
    log("SUMMARY")
    log(f"{'layer':24s} {'expected':34s} {'sites':12s} {'gemm':5s} {'fwd max':9s} {'grad max':9s} misses / exc")
    for r in rows:
        fam = ",".join(r["families"]) or "-"
        fwd = f"{max(r['fwd']):.1e}" if r["fwd"] else "n/a"
        grd = f"{max(r['grad']):.1e}" if r["grad"] else "n/a"
        log(f"{r['layer']:24s} {r['expected'][:34]:34s} {str(r['sites'])+':'+fam:12s} "
            f"{str(r['gemm_in_jaxpr'])[:5]:5s} {fwd:9s} {grd:9s} "
            f"{len(r['misses'])} miss; {'; '.join(r['exc']) or 'no exc'}")
        for m in r["misses"]:
            log(f"    miss: {m[:300]}")
    suffix = ("_" + "_".join(names)) if names else ""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{results}{suffix}.txt"), "w") as fh:
        fh.write(OUT.getvalue())


if __name__ == "__main__":
    main(sys.argv[1:])
