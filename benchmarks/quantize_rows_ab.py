"""The 1 x 128 row quantiser (blockwise activations / gradients): its variants, alternating in one process.

Needs a CUDA library built with -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON: the handler reads JAX_MOE_FFI_QUANT_EXPERIMENT on
every call (cc/cuda/quantize.cu, launch_rowblock_128):
  default            rowblock16_kernel: 16 elements per thread, 8 lanes per block, 2 units in flight (session 28)
  x16_unroll4        the same with 4 units in flight
  x8                 rowblock_kernel, the default until session 28: 8 elements per thread, __fdiv_rn, 4 chunks in
                     flight; the variants below are its forms
  markstein          x / s as RN(q1 + (x - q1 s) r), q1 = RN(x r), r = RN(1/s) (bitwise __fdiv_rn; div_by_scale)
  unroll8            the default with 8 chunks in flight
  markstein_unroll8  both
  midpoint           q1 = RN(x r), dividing only where an FP8 rounding boundary may lie between q1 and x / s
                     (encode8_div_midpoint; session 28)
  unroll2 / occ6     2 chunks in flight / a register cap for 6 resident CTAs per SM (occupancy; session 28)
  midpoint_unroll2, midpoint_occ6   both
Every variant's codes and scales are compared bitwise with the default's on the same input (a random normal
tensor with rows scaled over 2^-30 .. 2^30, so that scales span many binades). A copy of the same bytes is the
bandwidth anchor. Writes benchmarks/results/<out>.{json,md,png}.

  XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/quantize_rows_ab.py
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import _common
import jax_moe_ffi as jmf

VARIANTS = ("default", "x16_unroll4", "x8")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=f"quantize_rows_ab_{_common.machine_tag()}")
    args = ap.parse_args(argv)
    shapes = _common.load_shapes()
    rng = np.random.default_rng(0)
    rows = []
    seen = set()
    for case in shapes["grouped_gemm"]:
        m, k = case["M"], case["K"]
        if (m, k) in seen:
            continue
        seen.add((m, k))
        x = rng.standard_normal((m, k), dtype=np.float32) * np.exp2(rng.integers(-30, 31, (m, 1))).astype(np.float32)
        x = jnp.asarray(x, jnp.bfloat16)
        for fmt in ("e4m3", "e5m2"):
            fn = jax.jit(lambda a, fmt=fmt: jmf.quantize(a, "blockwise", dtype=fmt))
            os.environ.pop("JAX_MOE_FFI_QUANT_EXPERIMENT", None)
            want = jax.block_until_ready(fn(x))
            want_d = np.asarray(want.data.view(jnp.uint8))
            want_s = np.asarray(want.scale)
            nbytes = m * k * 3 + want_s.size * 4
            for r in range(args.rounds):
                for v in args.variants.split(","):
                    if v == "default":
                        os.environ.pop("JAX_MOE_FFI_QUANT_EXPERIMENT", None)
                    else:
                        os.environ["JAX_MOE_FFI_QUANT_EXPERIMENT"] = v
                    got = jax.block_until_ready(fn(x))
                    same = bool(np.array_equal(np.asarray(got.data.view(jnp.uint8)), want_d)
                                and np.array_equal(np.asarray(got.scale).view(np.uint32), want_s.view(np.uint32)))
                    ms = _common.time_ms(fn, x)
                    rows.append({"case": f"[{m}, {k}] {fmt}", "impl": v, "pass": "quantize", "groups": "n/a",
                                 "ms": ms, "gbps": nbytes / ms / 1e6, "bitwise_default": same, "round": r})
                    print(f"[{m}, {k}] {fmt} r{r} {v:>18} {ms:8.4f} ms {nbytes / ms / 1e6:7.0f} GB/s bitwise={same}",
                          flush=True)
            os.environ.pop("JAX_MOE_FFI_QUANT_EXPERIMENT", None)
        big = jnp.asarray(rng.standard_normal((m * k * 3 // 4,)), jnp.bfloat16)  # 2 x 2 B x n*3/4 = 3n bytes moved
        ms = _common.time_ms(jax.jit(lambda a: a * 2), big)
        rows.append({"case": f"[{m}, {k}] e4m3", "impl": "copy", "pass": "quantize", "groups": "n/a", "ms": ms,
                     "gbps": big.size * 4 / ms / 1e6})
        meta = _common.metadata(sys.argv if argv is None else ["benchmarks/quantize_rows_ab.py"] + argv)
        meta["note"] = "experiment build (-DJAX_MOE_FFI_FP8_EXPERIMENTS=ON); variants alternate within one process"
        _common.write_results(args.out, meta, rows, "gbps", "1 x 128 row quantiser variants (GB/s)")


if __name__ == "__main__":
    main()
