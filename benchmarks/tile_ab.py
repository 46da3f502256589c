"""bf16 grouped GEMM forward / dgrad / wgrad: tile choices alternated in one process (A/B timings).

Needs a CUDA library built with -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON: there the handler reads JAX_MOE_FFI_GEMM_TILES on
every call (a shipped library reads it once), so one jitted call runs each choice in turn on the same operands,
alternating over --rounds, with XLA's command buffers off (a replayed CUDA graph would keep the first choice).
Each output is compared bitwise with the first choice's: the tile choices differ in clusters, row splits and epilogue
subtiles only (the same k-order of wgmma steps per output element), so they must be equal. A variant `<tiles>+stream`
runs that choice with JAX_MOE_FFI_SECOND_LAUNCH=stream (a split call's second kernel beside the first on a side
stream; `<tiles>` alone: serial); `<tiles>+groups` runs the wgrad with its problems in group order
(JAX_MOE_FFI_WGRAD_ORDER=groups; default and `+size`: largest group first; `+mixed`: largest, smallest, second
largest, ...); `<tiles>+n4` etc. the wgrad's tiles in another order (JAX_MOE_FFI_WGRAD_SCHEDULE, m1 .. n8). With
`--passes wgrad` the variants set JAX_MOE_FFI_WGRAD_TILES instead (`static` / `auto`: the default, cooperative
128x256 2x1 since session 45; `pingpong`: the default before).
`--passes sum` times the summed dgrad of a gate/up pair (dG . Wg^T + dU . Wu^T, one kernel; 2x the FLOPs of a dgrad)
with variants `persm` / `prebuilt` (JAX_MOE_FFI_SUM_MAPS: the mainloop's TMA descriptors rewritten per SM on each
group change, or built per group before the GEMM). Writes benchmarks/results/<out>.{json,md,png}.

  XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/tile_ab.py --variants static,split,pick --rounds 2
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


_SCHEDULES = [f"{d}{s}" for d in "mn" for s in (1, 2, 4, 8)]  # JAX_MOE_FFI_WGRAD_SCHEDULE values
_CALLER_ENV = dict(os.environ)


def _set_or_restore(var, value):
    """Sets var to value, or back to what the caller's environment had (absent: unset) when value is None."""
    if value is None:
        value = _CALLER_ENV.get(var)
    if value is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="static,split,pick,c2x1")
    ap.add_argument("--groups", default="even,skew")
    ap.add_argument("--passes", default="fwd,dgrad", help="fwd, dgrad, wgrad")
    ap.add_argument("--cases", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=f"tile_ab_{_common.machine_tag()}")
    args = ap.parse_args(argv)
    if "--xla_gpu_enable_command_buffer=" not in os.environ.get("XLA_FLAGS", ""):
        sys.exit("tile_ab.py: run with XLA_FLAGS=--xla_gpu_enable_command_buffer= (see the docstring)")
    variants = args.variants.split(",")
    shapes = _common.load_shapes()
    rng = np.random.default_rng(0)
    rows = []
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/tile_ab.py"] + argv)
    meta["note"] = ("JAX_MOE_FFI_GEMM_TILES per call (experiment build); variants alternate within one process"
                    if len(variants) > 1 else "one variant: the choices the environment made (a process per choice)")
    for case in shapes["grouped_gemm"]:
        if args.cases and not any(c in case["name"] for c in args.cases.split(",")):
            continue
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
        dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
        for kind in args.groups.split(","):
            sizes = jnp.asarray(_common.group_sizes(m, g, kind, shapes))
            for pass_ in args.passes.split(","):
                if pass_ == "fwd":  # out[M, N] = lhs . rhs[g]
                    fn, a = jax.jit(lambda x, w, s: jmf.grouped_matmul(x, w, s)), (lhs, rhs, sizes)
                elif pass_ == "sum":  # dlhs[M, K] = dout . rhs[g]^T + dout2 . rhs2[g]^T, one kernel
                    # the op's internal entry point: grouped_matmuls_shared_lhs's backward, without its wgrads
                    fn = jax.jit(jmf.ops.grouped_gemm._sum_call)
                    a = (dout, rhs, jnp.flip(dout, 0), jnp.flip(rhs, 2), sizes)
                elif pass_ == "wgrad":  # drhs[g] = lhs[rows_g]^T . dout[rows_g] (variants set WGRAD_TILES)
                    fn, a = jax.jit(lambda x, d, s: jmf.grouped_matmul_wgrad(x, d, s)), (lhs, dout, sizes)
                else:  # dgrad: dlhs[M, K] = dout . rhs[g]^T (rhs read as [N, K] column-major)
                    fn, a = jax.jit(lambda d, w, s: jmf.grouped_matmul(d, w, s, transpose_rhs=True)), (dout, rhs, sizes)
                want = None
                for r in range(args.rounds):
                    for v in variants:
                        tiles, _, launch = v.partition("+")
                        if pass_ == "sum":
                            os.environ["JAX_MOE_FFI_SUM_MAPS"] = tiles if tiles in ("persm", "prebuilt") else "persm"
                        elif pass_ == "wgrad":  # static / auto: the default wgrad tiles
                            os.environ["JAX_MOE_FFI_WGRAD_TILES"] = "coop" if tiles in ("static", "auto") else tiles
                        else:
                            os.environ["JAX_MOE_FFI_GEMM_TILES"] = tiles
                        # suffix: stream | serial (a split's second kernel), groups | size | mixed (the wgrad's problem
                        # order), m1..n8 (the wgrad's tile order); without one, as the caller's environment says
                        os.environ["JAX_MOE_FFI_SECOND_LAUNCH"] = launch if launch in ("stream", "serial") else "serial"
                        order = launch if launch in ("groups", "size", "mixed") else None
                        _set_or_restore("JAX_MOE_FFI_WGRAD_ORDER", order)
                        _set_or_restore("JAX_MOE_FFI_WGRAD_SCHEDULE", launch if launch in _SCHEDULES else None)
                        got = np.asarray(jax.block_until_ready(fn(*a)).view(jnp.uint16))
                        want = got if want is None else want
                        bitwise = bool(np.array_equal(got, want))
                        ms = _common.time_ms(fn, *a)
                        tf = (4.0 if pass_ == "sum" else 2.0) * m * k * n / ms / 1e9
                        rows.append({"case": case["name"], "impl": v, "pass": pass_, "groups": kind, "ms": ms,
                                     "tflops": tf, "round": r, "bitwise_first": bitwise,
                                     "M": m, "K": k, "N": n, "G": g})
                        print(f"{case['name']:>30} {kind:>4} {pass_:>5} r{r} {v:>13} {ms:8.3f} ms {tf:7.1f} TFLOP/s"
                              f" bitwise_first={bitwise}", flush=True)
            os.environ.pop("JAX_MOE_FFI_GEMM_TILES", None)
            os.environ.pop("JAX_MOE_FFI_WGRAD_TILES", None)
            os.environ.pop("JAX_MOE_FFI_SECOND_LAUNCH", None)
            os.environ.pop("JAX_MOE_FFI_SUM_MAPS", None)
            _common.write_results(args.out, meta, rows, "tflops", "bf16 grouped GEMM tile choices (TFLOP/s)")


if __name__ == "__main__":
    main()
