"""Three launches of one row quantiser on a bf16 [rows, cols] array, for Nsight Compute (hardware counters).

  ncu --clock-control none -k regex:rowblock_kernel --launch-skip 2 --launch-count 1 ... \
      python3 tools/ncu_quantize_probe.py --recipe blockwise        # the 1 x 128 E4M3 row quantiser
  ncu ... python3 tools/ncu_quantize_probe.py --recipe mxfp8            # the 1 x 32 MXFP8 one, for comparison
  ncu -k regex:band_kernel ... python3 tools/ncu_quantize_probe.py --weights   # the weights' 128 x 128 tiles, both
                                                                    # orientations (quantize_weights, as the step)

Why: in the session-28 FP8 train step the 1 x 128 row kernel moves ~5 GB a step at about 2.5 TB/s while the MXFP8
row kernel of the same structure reaches 3.3-3.8 TB/s (benchmarks/results/quantize_h200.md); session 17 ruled out
the division and deeper unrolling. Timed numbers come from benchmarks/quantize.py, not from here.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jax_moe_ffi as jmf


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="blockwise", choices=("blockwise", "mxfp8"))
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--weights", action="store_true",
                    help="quantize_weights of a [128, 2048, 1536] expert weight instead (band_kernel)")
    args = ap.parse_args(argv)
    if args.weights:
        x = jax.random.normal(jax.random.PRNGKey(0), (128, 2048, 1536), jnp.bfloat16)
        f = jax.jit(lambda x: jmf.quantize_weights(x).pairs)
        what = "weight tile quantiser (both orientations)"
    else:
        x = jax.random.normal(jax.random.PRNGKey(0), (args.rows, args.cols), jnp.bfloat16)
        f = jax.jit(lambda x: jmf.quantize(x, args.recipe))
        what = f"{args.recipe} row quantiser"
    for _ in range(3):
        jax.block_until_ready(f(x))
    print(f"3 launches of the {what} on {x.shape} {x.dtype}")


if __name__ == "__main__":
    main()
