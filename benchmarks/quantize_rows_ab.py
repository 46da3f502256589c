"""The 1 x 128 row quantiser (blockwise activations / gradients) and, with --weights, the weights' 128 x 128 tile
quantiser (band_kernel, both orientations, as `quantize_weights`): their variants, alternating in one process.

Needs a CUDA library built with -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON: the handler reads JAX_MOE_FFI_QUANT_EXPERIMENT on
every call (cc/cuda/quantize.cu, launch_rowblock_128):
  default            rowblock_kernel with 16 elements per thread (kChunks = 2), 8 lanes per block, 2 units in
                     flight (session 28; one kernel with the 8-element form since session 29)
  x16_unroll4        the same with 4 units in flight
  x8                 8 elements per thread (kChunks = 1), the default until session 28: __fdiv_rn, 4 chunks in
                     flight; the variants below are its forms
  markstein          x / s as RN(q1 + (x - q1 s) r), q1 = RN(x r), r = RN(1/s) (bitwise __fdiv_rn; div_by_scale)
  unroll8            the default with 8 chunks in flight
  markstein_unroll8  both
  midpoint           q1 = RN(x r), dividing only where an FP8 rounding boundary may lie between q1 and x / s
                     (encode8_div_midpoint; session 28)
  unroll2 / occ6     2 chunks in flight / a register cap for 6 resident CTAs per SM (occupancy; session 28)
  midpoint_unroll2, midpoint_occ6   both
With --weights (variants default,band_prefetch):
  default            band_kernel
  band_prefetch      with an L2 prefetch of each CTA's next tile (session 29: 11-13% slower)
Every variant's codes and scales are compared bitwise with the default's on the same input (a random normal
tensor with rows scaled over 2^-30 .. 2^30, so that scales span many binades). A copy of the same bytes is the
bandwidth anchor. Writes benchmarks/results/<out>.{json,md,png}.

  XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/quantize_rows_ab.py
  XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/quantize_rows_ab.py --weights
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
WEIGHT_VARIANTS = ("default", "band_prefetch")
# expert weights [E, K, N]: the train step's stacked gate/up and down (4 layers x 128 experts, quantised once a step),
# and the gate_up weights of three benchmark shapes
WEIGHT_SHAPES = ((512, 2048, 768), (512, 768, 2048), (128, 2048, 1536), (32, 7168, 4096), (16, 4096, 3072))


def set_variant(v):
    if v == "default":
        os.environ.pop("JAX_MOE_FFI_QUANT_EXPERIMENT", None)
    else:
        os.environ["JAX_MOE_FFI_QUANT_EXPERIMENT"] = v


def bits(tree):
    return [np.asarray(a).view(np.uint8) for a in jax.tree_util.tree_leaves(tree)]


def weight_rows(variants, rounds, rng):
    """quantize_weights (both K-major orientations of the 128 x 128 tiles) per variant, bitwise against the default."""
    rows = []
    for shape in WEIGHT_SHAPES:
        key = jax.random.PRNGKey(int(rng.integers(1 << 30)))
        binades = jnp.asarray(np.exp2(rng.integers(-30, 31, (shape[0], 1, 1))), jnp.float32)  # scales span binades
        x = (jax.random.normal(key, shape, jnp.float32) * binades).astype(jnp.bfloat16)
        fn = jax.jit(lambda a: jmf.quantize_weights(a).pairs)
        set_variant("default")
        want = bits(jax.block_until_ready(fn(x)))
        n = x.size
        nbytes = n * 2 + 2 * n + 2 * (n // (128 * 128)) * 4  # read bf16, two FP8 copies, their scales
        case = f"weights {list(shape)}"
        for r in range(rounds):
            for v in variants:
                set_variant(v)
                got = bits(jax.block_until_ready(fn(x)))
                same = len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
                ms = _common.time_ms(fn, x)
                rows.append({"case": case, "impl": v, "pass": "quantize_weights", "groups": "n/a", "ms": ms,
                             "gbps": nbytes / ms / 1e6, "bitwise_default": same, "round": r})
                print(f"{case} r{r} {v:>18} {ms:8.4f} ms {nbytes / ms / 1e6:7.0f} GB/s bitwise={same}", flush=True)
        set_variant("default")
        big = jnp.asarray(rng.standard_normal((n,)), jnp.bfloat16)  # 2 x 2 B x n = 4n bytes moved
        ms = _common.time_ms(jax.jit(lambda a: a * 2), big)
        rows.append({"case": case, "impl": "copy", "pass": "quantize_weights", "groups": "n/a", "ms": ms,
                     "gbps": big.size * 4 / ms / 1e6})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="", help=f"default {','.join(VARIANTS)}; with --weights "
                    f"{','.join(WEIGHT_VARIANTS)}")
    ap.add_argument("--weights", action="store_true", help="the weights' 128 x 128 tile quantiser instead")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=f"quantize_rows_ab_{_common.machine_tag()}")
    args = ap.parse_args(argv)
    variants = args.variants.split(",") if args.variants else list(WEIGHT_VARIANTS if args.weights else VARIANTS)
    shapes = _common.load_shapes()
    rng = np.random.default_rng(0)
    rows = []
    seen = set()
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/quantize_rows_ab.py"] + argv)
    meta["note"] = "experiment build (-DJAX_MOE_FFI_FP8_EXPERIMENTS=ON); variants alternate within one process"
    if args.weights:
        rows = weight_rows(variants, args.rounds, rng)
        _common.write_results(args.out, meta, rows, "gbps", "128 x 128 weight tile quantiser variants (GB/s)")
        return
    for case in shapes["grouped_gemm"]:
        m, k = case["M"], case["K"]
        if (m, k) in seen:
            continue
        seen.add((m, k))
        x = rng.standard_normal((m, k), dtype=np.float32) * np.exp2(rng.integers(-30, 31, (m, 1))).astype(np.float32)
        x = jnp.asarray(x, jnp.bfloat16)
        for fmt in ("e4m3", "e5m2"):
            fn = jax.jit(lambda a, fmt=fmt: jmf.quantize(a, "blockwise", dtype=fmt))
            set_variant("default")
            want = jax.block_until_ready(fn(x))
            want_d = np.asarray(want.data.view(jnp.uint8))
            want_s = np.asarray(want.scale)
            nbytes = m * k * 3 + want_s.size * 4
            for r in range(args.rounds):
                for v in variants:
                    set_variant(v)
                    got = jax.block_until_ready(fn(x))
                    same = bool(np.array_equal(np.asarray(got.data.view(jnp.uint8)), want_d)
                                and np.array_equal(np.asarray(got.scale).view(np.uint32), want_s.view(np.uint32)))
                    ms = _common.time_ms(fn, x)
                    rows.append({"case": f"[{m}, {k}] {fmt}", "impl": v, "pass": "quantize", "groups": "n/a",
                                 "ms": ms, "gbps": nbytes / ms / 1e6, "bitwise_default": same, "round": r})
                    print(f"[{m}, {k}] {fmt} r{r} {v:>18} {ms:8.4f} ms {nbytes / ms / 1e6:7.0f} GB/s bitwise={same}",
                          flush=True)
            set_variant("default")
        big = jnp.asarray(rng.standard_normal((m * k * 3 // 4,)), jnp.bfloat16)  # 2 x 2 B x n*3/4 = 3n bytes moved
        ms = _common.time_ms(jax.jit(lambda a: a * 2), big)
        rows.append({"case": f"[{m}, {k}] e4m3", "impl": "copy", "pass": "quantize", "groups": "n/a", "ms": ms,
                     "gbps": big.size * 4 / ms / 1e6})
        _common.write_results(args.out, meta, rows, "gbps", "1 x 128 row quantiser variants (GB/s)")


if __name__ == "__main__":
    main()
