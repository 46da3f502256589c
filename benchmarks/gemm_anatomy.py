"""Where a grouped GEMM's time goes besides the tensor cores: the forward at fixed M and N over K and G, bf16 and FP8.

Each output tile costs about `fixed + K * per_k`; a least-squares line through the times at several K (same M, N, G,
even groups) separates the per-tile fixed cost (epilogue, prologue, the per-group TMA-descriptor updates of the
pointer-array kernels) from the mainloop. Changing G at equal M, K, N changes how often a persistent CTA moves to
another group (descriptor updates), not the number of tiles. Nsight Compute put the qwen3-30b gate_up kernels' tensor
pipes at 62% (FP8) and 80% (bf16) active (session 22); this says how much of the rest is per tile.

  python benchmarks/gemm_anatomy.py            # M = 65536, N = 1536, K in 1024,2048,4096, G in 1,8,128

Writes benchmarks/results/gemm_anatomy_<machine>.{json,md,png}; the fits are in the JSON's meta and printed.
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import _common
import grouped_gemm as gg
import jax_moe_ffi as jmf


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=65536)
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--ks", default="1024,2048,4096")
    ap.add_argument("--gs", default="1,8,128")
    ap.add_argument("--impls", default="ours,ours_fp8")
    ap.add_argument("--out", default=f"gemm_anatomy_{_common.machine_tag()}")
    args = ap.parse_args(argv)
    m, n = args.m, args.n
    ks = [int(k) for k in args.ks.split(",")]
    rng = np.random.default_rng(0)
    rows, fits = [], []
    sms = jax.devices()[0].core_count if hasattr(jax.devices()[0], "core_count") else 132
    tiles = (m // 128) * -(-n // 256)  # 128x256 output tiles (both kernels at these shapes)
    for g in (int(x) for x in args.gs.split(",")):
        sizes = jnp.full((g,), m // g, jnp.int32)
        for impl in args.impls.split(","):
            per_k = []
            for k in ks:
                lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
                rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
                if impl == "ours_fp8":
                    fn, a = gg.fp8_kernel_only(lhs, rhs, sizes)
                else:
                    fn, a = jax.jit(lambda x, w, s: jmf.grouped_matmul(x, w, s)), (lhs, rhs, sizes)
                ms = _common.time_ms(fn, *a)
                per_tile_us = ms * 1e3 / (tiles / sms)
                per_k.append(per_tile_us)
                rows.append({"case": f"M{m} N{n} G{g}", "impl": impl, "pass": "fwd", "groups": "even", "ms": ms,
                             "tflops": 2.0 * m * k * n / ms / 1e9, "G": g, "K": k, "us_per_tile_per_sm": per_tile_us})
                print(f"G={g:4d} K={k:5d} {impl:>9} {ms:8.3f} ms {rows[-1]['tflops']:7.1f} TFLOP/s "
                      f"{per_tile_us:6.2f} us per tile per SM", flush=True)
                del lhs, rhs, a
            slope, intercept = np.polyfit(np.asarray(ks, float), np.asarray(per_k), 1)
            fits.append({"impl": impl, "G": g, "fixed_us_per_tile": float(intercept),
                         "us_per_tile_per_1024_k": float(slope * 1024)})
            print(f"  fit G={g} {impl}: fixed {intercept:.2f} us per tile, {slope * 1024:.2f} us per 1024 of K",
                  flush=True)
            # written after every fit, so that a run cut by its time limit keeps what it measured
            meta = _common.metadata(sys.argv if argv is None else ["benchmarks/gemm_anatomy.py"] + argv)
            meta["fits"] = fits
            meta["note"] = (f"per tile per SM = ms / ({tiles} 128x256 tiles / {sms} SMs); fits: " + "; ".join(
                f"{f['impl']} G={f['G']}: fixed {f['fixed_us_per_tile']:.2f} us + {f['us_per_tile_per_1024_k']:.2f} "
                f"us per 1024 of K" for f in fits))
            _common.write_results(args.out, meta, rows, "tflops", "Grouped GEMM anatomy: per-tile fixed cost (TFLOP/s)")


if __name__ == "__main__":
    main()
