"""Runner for zoo_a: explain / optimize(mode="exact") fwd + grad checks, 3 seeds per layer."""
import os
import sys
import traceback

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import jax.numpy as jnp
import numpy as np

import jax_moe_ffi as jmf
import zoo_a  # noqa: E402

SEEDS = [11, 202, 3003]
GG = "jax_moe_ffi_grouped_gemm"


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    d = np.linalg.norm(a - b)
    return d / nb if nb > 0 else d


def max_rel(ta, tb):
    la, lb = jax.tree.leaves(ta), jax.tree.leaves(tb)
    assert len(la) == len(lb)
    return max(rel(a, b) for a, b in zip(la, lb)), [rel(a, b) for a, b in zip(la, lb)]


def scalar_loss(f):
    def loss(p, x):
        out = f(p, x)
        if isinstance(out, tuple):
            y, aux = out
            return jnp.sum(jnp.sin(y)) + aux
        return jnp.sum(jnp.sin(out))
    return loss


def main(names=None):
    rows = []
    for name, (f, init, family, note) in zoo_a.LAYERS.items():
        if names and name not in names:
            continue
        print("=" * 100)
        print(f"LAYER {name}  (expected: {family}; {note})")
        print(f"  doc: {f.__doc__.strip().splitlines()[0]}")
        summary = {"name": name, "family": family, "sites": [], "misses": [], "fwd": [], "grad": [],
                   "gg": [], "exc": []}
        for seed in SEEDS:
            print(f"--- seed {seed}")
            try:
                params, x = init(jax.random.PRNGKey(seed))
            except Exception:
                tb = traceback.format_exc()
                print("INIT EXCEPTION\n" + tb)
                summary["exc"].append(f"seed {seed} init: {tb.strip().splitlines()[-1]}")
                continue
            try:
                rep = jmf.explain(f, params, x)
                print(rep)
                summary["sites"].append(tuple(s.family for s in rep.sites))
                summary["misses"].append(tuple(m.reason for m in rep.misses))
            except Exception:
                tb = traceback.format_exc()
                print("EXPLAIN EXCEPTION\n" + tb)
                summary["exc"].append(f"seed {seed} explain: {tb.strip().splitlines()[-1]}")
            of = jmf.optimize(f, mode="exact")
            try:
                ref = jax.jit(f)(params, x)
                got = jax.jit(of)(params, x)
                m, per = max_rel(got, ref)
                me, _ = max_rel(of(params, x), f(params, x))
                mx, _ = max_rel(ref, f(params, x))
                print(f"fwd rel err jit(opt) vs jit(f) (max over outputs): {m:.3e}  per output: "
                      f"{['%.2e' % v for v in per]}; eager opt vs eager f: {me:.3e}; (jit(f) vs eager f: {mx:.3e})")
                summary["fwd"].append(m)
            except Exception:
                tb = traceback.format_exc()
                print("FWD EXCEPTION\n" + tb)
                summary["exc"].append(f"seed {seed} fwd: {tb.strip().splitlines()[-1]}")
            try:
                gref = jax.jit(jax.grad(scalar_loss(f), argnums=(0, 1)))(params, x)
                ggot = jax.jit(jax.grad(scalar_loss(of), argnums=(0, 1)))(params, x)
                m, per = max_rel(ggot, gref)
                paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(gref)[0]]
                worst = sorted(zip(per, paths), reverse=True)[:3]
                print(f"grad rel err jit vs jit (max over leaves): {m:.3e}  worst: {[(p, '%.2e' % v) for v, p in worst]}")
                summary["grad"].append(m)
            except Exception:
                tb = traceback.format_exc()
                print("GRAD EXCEPTION\n" + tb)
                summary["exc"].append(f"seed {seed} grad: {tb.strip().splitlines()[-1]}")
            try:
                txt = str(jax.make_jaxpr(of)(params, x))
                has = GG in txt
                print(f"optimized jaxpr contains {GG}: {has} (count {txt.count('target_name=' + GG)})")
                summary["gg"].append(has)
            except Exception:
                tb = traceback.format_exc()
                print("JAXPR EXCEPTION\n" + tb)
                summary["exc"].append(f"seed {seed} jaxpr: {tb.strip().splitlines()[-1]}")
        rows.append(summary)

    print("=" * 100)
    print("SUMMARY")
    for r in rows:
        fwd = max(r["fwd"]) if r["fwd"] else float("nan")
        grad = max(r["grad"]) if r["grad"] else float("nan")
        print(f"{r['name']:26s} expected={r['family']:28s} sites={sorted(set(r['sites']))} "
              f"gg={r['gg']} fwd={fwd:.2e} grad={grad:.2e}")
        for ms in sorted(set(r["misses"])):
            for reason in ms:
                print(f"    miss: {reason}")
        for ex in r["exc"]:
            print(f"    EXC: {ex}")


if __name__ == "__main__":
    main(sys.argv[1:] or None)
