"""FP8 forward: the blockwise kernel against ceilings of its own tile shape (variant timings, one process).

Needs a CUDA library built with -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON (cc/cuda/experiments/fp8_ceiling.cuh). The
handler reads JAX_MOE_FFI_FP8_EXPERIMENT on every call, so one jitted forward runs each variant in turn on the
same quantised operands, alternating over --rounds:

  default        the shipped choice (JAX_MOE_FFI_FP8_TILES=auto): where N has an even number of 256-wide tiles
                 (every benchmark shape) wide128c12 for K <= 2048, wide64c12 above (session 20); coop128 otherwise
  coop128        cooperative 128x128x128, 1x2 cluster, overlapped promotion (the default until session 19;
                 JAX_MOE_FFI_FP8_TILES=large); checked bitwise against default
  overlap128c22  coop128 on a 2x2 cluster (both operands multicast); checked bitwise against default
  pingpong       the ping-pong 64x128x128 overlapped kernel (shipped for short groups); bitwise default
  direct128      128x128 tiles, 1x2, every k-tile accumulated straight into the result, scales ignored
  direct128c22   the same on a 2x2 cluster
  direct256      128x256 tiles, 1x2, scales ignored
  direct256c21   128x256 tiles, 2x1, scales ignored
  pertensor128   CUTLASS's per-tensor FP8 kernel (fast accumulation: no promotion, no scale loads), 128x128, 1x2
  pertensor256c21  the same, 128x256 tiles on a 2x1 cluster (added after session 17's run)
  wide64c12      correct numerics: 128x256 tiles, 1x2, the result promoted in 64-column slices
                 (fp8_wide_tile_mainloop.cuh; JAX_MOE_FFI_FP8_TILES=wide); checked bitwise against default
  wide64c21      the same on a 2x1 cluster (JAX_MOE_FFI_FP8_TILES=wide_c21)
  wide64rsc12    wide64c12 with A read into registers once per k-tile (wgmma RS; JAX_MOE_FFI_FP8_TILES=wide_rs)
  wide64rsc21    the same on a 2x1 cluster (JAX_MOE_FFI_FP8_TILES=wide_rs_c21)
  wide128c12     128x256 tiles, 1x2, one 128-column slice per warp group (JAX_MOE_FFI_FP8_TILES=wide_one_slice;
                 auto's choice for K <= 2048 since session 20); checked bitwise against default
  wide128c21     the same on a 2x1 cluster (JAX_MOE_FFI_FP8_TILES=wide_one_slice_c21)
  split          the cluster split (JAX_MOE_FFI_FP8_TILES=split): 2x1 on each group's pairs of 128-row tiles, 1x2 on
                 odd last tiles, one slice for K <= 2048 (session 21; slower on skewed groups)
The direct* and pertensor* kernels give wrong answers by design: direct* is what the tile shape allows with a free
promotion (same operand and scale loads, pipeline, scheduler and epilogue), pertensor* what CUTLASS's kernel without
any scales does. Writes benchmarks/results/<out>.{json,md,png}.

  XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/fp8_ceiling.py --rounds 2
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

VARIANTS = ("default", "coop128", "overlap128c22", "pingpong", "direct128", "direct128c22", "direct256", "direct256c21",
            "pertensor128", "pertensor256c21", "wide64c12", "wide64c21",
            "wide64rsc12", "wide64rsc21", "wide128c12", "wide128c21", "split")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--groups", default="even")
    ap.add_argument("--cases", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=f"fp8_ceiling_{_common.machine_tag()}")
    args = ap.parse_args(argv)
    shapes = _common.load_shapes()
    rng = np.random.default_rng(0)
    rows = []
    for case in shapes["grouped_gemm"]:
        if args.cases and not any(c in case["name"] for c in args.cases.split(",")):
            continue
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
        for kind in args.groups.split(","):
            sizes = jnp.asarray(_common.group_sizes(m, g, kind, shapes))
            fn, a = gg.fp8_kernel_only(lhs, rhs, sizes)
            os.environ.pop("JAX_MOE_FFI_FP8_EXPERIMENT", None)
            want = np.asarray(jax.block_until_ready(fn(*a)).view(jnp.uint16))
            for r in range(args.rounds):
                for v in args.variants.split(","):
                    which, _, launch = v.partition("+")  # <variant>+stream: JAX_MOE_FFI_SECOND_LAUNCH=stream
                    os.environ["JAX_MOE_FFI_SECOND_LAUNCH"] = launch or "serial"
                    if which == "default":
                        os.environ.pop("JAX_MOE_FFI_FP8_EXPERIMENT", None)
                    else:
                        os.environ["JAX_MOE_FFI_FP8_EXPERIMENT"] = which
                    # default, coop128, overlap128c22, pingpong and wide* must equal; a direct* / pertensor* output equal to default would mean
                    # the variant was not switched (e.g. a replayed CUDA graph): run with command buffers off.
                    got = np.asarray(jax.block_until_ready(fn(*a)).view(jnp.uint16))
                    bitwise = bool(np.array_equal(got, want))
                    ms = _common.time_ms(fn, *a)
                    tf = 2.0 * m * k * n / ms / 1e9
                    rows.append({"case": case["name"], "impl": v, "pass": "fwd", "groups": kind, "ms": ms,
                                 "tflops": tf, "round": r, "bitwise_default": bitwise,
                                 "M": m, "K": k, "N": n, "G": g})
                    print(f"{case['name']:>30} {kind:>4} r{r} {v:>14} {ms:8.3f} ms {tf:7.1f} TFLOP/s"
                          + f" bitwise_default={bitwise}", flush=True)
            os.environ.pop("JAX_MOE_FFI_FP8_EXPERIMENT", None)
            os.environ.pop("JAX_MOE_FFI_SECOND_LAUNCH", None)
            meta = _common.metadata(sys.argv if argv is None else ["benchmarks/fp8_ceiling.py"] + argv)
            meta["note"] = ("direct* / pertensor* = scale-ignoring ceiling kernels (wrong answers by design, experiment "
                            "build -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON); variants alternate within one process")
            _common.write_results(args.out, meta, rows, "tflops", "FP8 forward vs its tile's ceilings (TFLOP/s)")


if __name__ == "__main__":
    main()
