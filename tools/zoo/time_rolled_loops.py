"""Pass time for loops over the experts that JAX keeps rolled (session 31): explain() and optimize() + compile of
`models.scan_over_experts_moe` (fori_loop and scan forms) at E = 64, 128, 256 experts (T = 128 tokens, D = 64,
F = 32, k = 4), with the optimized output's relative error against the model.

Usage: python tools/zoo/time_rolled_loops.py
"""
from __future__ import annotations

import time
import warnings
from functools import partial

import jax
import numpy as np

import jax_moe_ffi as jmf
from jax_moe_ffi import models as M


def main():
    warnings.simplefilter("ignore")
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    for e in (64, 128, 256):
        p = M.init_moe_params_extra(jax.random.key(0), 64, 32, e)
        x = jax.random.normal(jax.random.key(1), (128, 64))
        for form in ("fori", "scan"):
            f = partial(M.scan_over_experts_moe, form=form, top_k=4)
            t0 = time.perf_counter()
            r = jmf.explain(f, p, x)
            t1 = time.perf_counter()
            fast = jax.jit(jmf.optimize(f)).lower(p, x).compile()
            t2 = time.perf_counter()
            y0, y1 = jax.jit(f)(p, x), fast(p, x)
            err = float(np.linalg.norm(np.asarray(y1 - y0)) / np.linalg.norm(np.asarray(y0)))
            print(f"E={e:3d} {form:4s} sites={[s.family for s in r.sites]} explain {t1 - t0:.2f} s, "
                  f"optimize+lower+compile {t2 - t1:.2f} s, rel err {err:.1e}")


if __name__ == "__main__":
    main()
