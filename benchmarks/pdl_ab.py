"""Programmatic dependent launch (JAX_MOE_FFI_PDL=0|1) alternated in one process: grouped GEMM A/B timings.

A grouped-GEMM call is a chain of launches (setup, scale repack and zeros for FP8, per-group descriptors, the GEMM;
cc/cuda/dependent_launch.cuh). With PDL on, the kernels after the setup kernel are launched with CUDA's
programmatic-stream-serialization attribute, so their CTAs can be resident before the kernel ahead of them ends.
The handler reads JAX_MOE_FFI_PDL on every call, and each variant gets a freshly jitted function, so XLA records a
new command buffer for it (command buffers stay on, as in a user's program). Variants alternate over --rounds on
the same operands; every output (and gradient) is compared bitwise with the first variant's: PDL changes when CTAs
start, never what they compute. Passes: `fwd`, `fwd_bwd` (one forward, dgrad and wgrad), `fp8` (the blockwise FP8
forward kernel on operands quantised outside the timing). Writes benchmarks/results/<out>.{json,md,png}.

  python benchmarks/pdl_ab.py --rounds 2
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import _common
import grouped_gemm as gg
import jax_moe_ffi as jmf

_VARIANTS = {"off": "0", "on": "1"}


def _fresh(pass_):
    """A new jitted function (a new executable, so a new command buffer recorded with the current environment)."""
    if pass_ == "fwd":
        return jax.jit(lambda a, b, s: jmf.grouped_matmul(a, b, s))
    if pass_ == "fwd_bwd":
        return jax.jit(gg.fwd_bwd(lambda a, b, s: jmf.grouped_matmul(a, b, s)))
    from jax_moe_ffi.ops import grouped_gemm_fp8 as fp8
    return jax.jit(lambda *a: fp8._fp8_call(*a))


def _bits(tree):
    return [np.asarray(x).view(np.uint8) for x in jax.tree_util.tree_leaves(tree)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", default="fwd,fwd_bwd,fp8")
    ap.add_argument("--groups", default="even,skew")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=f"pdl_ab_{_common.machine_tag()}")
    args = ap.parse_args(argv)
    shapes = _common.load_shapes()
    rng = np.random.default_rng(0)
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/pdl_ab.py"] + argv)
    meta["note"] = "JAX_MOE_FFI_PDL off/on alternated in one process, a fresh jit (command buffer) per run"
    rows = []
    for case in shapes["grouped_gemm"]:
        if args.cases and not any(c in case["name"] for c in args.cases.split(",")):
            continue
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
        cot = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
        flops = 2.0 * m * k * n
        for kind in args.groups.split(","):
            sizes = jnp.asarray(_common.group_sizes(m, g, kind, shapes))
            for pass_ in args.passes.split(","):
                if pass_ == "fp8":
                    _, operands = gg.fp8_kernel_only(lhs, rhs, sizes)
                else:
                    operands = (lhs, rhs, sizes) + ((cot,) if pass_ == "fwd_bwd" else ())
                want = None
                for r in range(args.rounds):
                    for name, value in _VARIANTS.items():
                        os.environ["JAX_MOE_FFI_PDL"] = value
                        fn = _fresh(pass_)
                        got = _bits(jax.block_until_ready(fn(*operands)))
                        want = got if want is None else want
                        bitwise = all(np.array_equal(x, y) for x, y in zip(got, want))
                        ms = _common.time_ms(fn, *operands)
                        tf = (3 * flops if pass_ == "fwd_bwd" else flops) / ms / 1e9
                        rows.append({"case": case["name"], "impl": f"pdl_{name}", "pass": pass_, "groups": kind,
                                     "ms": ms, "tflops": tf, "round": r, "bitwise_first": bitwise,
                                     "M": m, "K": k, "N": n, "G": g})
                        print(f"{case['name']:>30} {kind:>4} {pass_:>7} r{r} pdl_{name:<3} {ms:8.4f} ms "
                              f"{tf:7.1f} TFLOP/s bitwise_first={bitwise}", flush=True)
                        del fn
                os.environ.pop("JAX_MOE_FFI_PDL", None)
        _common.write_results(args.out, meta, rows, "tflops", "grouped GEMM, PDL off / on (TFLOP/s)")


if __name__ == "__main__":
    main()
