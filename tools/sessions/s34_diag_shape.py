"""Session 34: the kernel GPU test test_benchmark_shapes_fwd_dgrad_wgrad[even-65536x2048x1536x128] failed on an
H100 (its traceback was lost to the step's timeout). Re-run that shape's forward / dgrad / wgrad on several seeds
and report the error against two independent f32 references (XLA's ragged_dot, and per-group jnp.dot), with the
first exception's traceback in full."""
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import jax_moe_ffi as jmf

sys.path.insert(0, "tests")
from test_gpu_grouped_gemm import ragged_f32, sizes_for, wgrad_f32  # noqa: E402


def rel(out, ref):
    out = np.asarray(out, np.float32)
    ref = np.asarray(ref, np.float32)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref)), bool(np.all(np.isfinite(out)))


def per_group(lhs, rhs, gs, transpose=False):
    outs, start = [], 0
    for g, s in enumerate(np.asarray(gs)):
        w = rhs[g].T if transpose else rhs[g]
        outs.append(jnp.dot(lhs[start:start + s], w, preferred_element_type=jnp.float32))
        start += int(s)
    return jnp.concatenate(outs)


def worst_rows(out, ref, gs):
    d = np.abs(np.asarray(out, np.float32) - np.asarray(ref, np.float32)).max(axis=1)
    bounds = np.cumsum(np.asarray(gs))
    rows = np.argsort(d)[-5:][::-1]
    return [(int(r), int(np.searchsorted(bounds, r, side="right")), float(d[r])) for r in rows]


m, k, n, g = (int(a) for a in (sys.argv[1:5] if len(sys.argv) > 4 else (65536, 2048, 1536, 128)))
print(jax.devices(), jax.__version__, flush=True)
for kind in ("even", "skew"):
    for seed in range(3):
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
        lhs = jax.random.normal(k1, (m, k), jnp.bfloat16)
        rhs = (jax.random.normal(k2, (g, k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
        dout = jax.random.normal(k3, (m, n), jnp.bfloat16)
        gs = sizes_for(np.random.default_rng(g + seed), m, g, m, kind)
        for name, ours, refs in (
            ("fwd", lambda: jmf.grouped_matmul(lhs, rhs, gs),
             (lambda: ragged_f32(lhs, rhs, gs), lambda: per_group(lhs, rhs, gs))),
            ("dgrad", lambda: jmf.grouped_matmul(dout, rhs, gs, transpose_rhs=True),
             (lambda: ragged_f32(dout, jnp.swapaxes(rhs, 1, 2), gs), lambda: per_group(dout, rhs, gs, True))),
            ("wgrad", lambda: jmf.grouped_matmul_wgrad(lhs, dout, gs, preferred_element_type=jnp.float32),
             (lambda: wgrad_f32(lhs, dout, gs),)),
        ):
            try:
                out = ours()
                line = [f"{kind} seed={seed} {name}"]
                for i, ref in enumerate(refs):
                    r = ref()
                    e, finite = rel(out, r)
                    line.append(f"ref{i}: rel={e:.3e} finite={finite}")
                    if e > 1e-2 and name != "wgrad":
                        line.append(f"worst (row, group, absdiff)={worst_rows(out, r, gs)}")
                print(" | ".join(line), flush=True)
            except Exception:
                print(f"{kind} seed={seed} {name}: EXCEPTION", flush=True)
                traceback.print_exc()
