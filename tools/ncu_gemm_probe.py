"""One launch of each grouped GEMM kernel at a benchmark shape, for Nsight Compute (hardware counters).

Runs our forward, dgrad (transposed rhs) and wgrad, or (--torch) torch._grouped_mm forward and backward, once
each after compiling / warming up, so that an `ncu` filter on CUTLASS kernel names sees one launch per kernel:

  ncu --clock-control none --target-processes all -k regex:device_kernel --launch-skip 3 --launch-count 3 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
      python3 tools/ncu_gemm_probe.py --case "qwen3-30b-a3b gate_up"        # ours: warm-up 3 then 3
  ncu ... --launch-skip 3 --launch-count 3 python3 tools/ncu_gemm_probe.py --case ... --torch

--recipe blockwise runs the FP8 forward kernel alone (operands quantised before it, as the `ours_fp8` rows of
benchmarks/grouped_gemm.py), --fwd-only the bf16 forward alone and --wgrad-only the bf16 wgrad alone: two warm-up
calls then the profiled one, so `--launch-skip 2 --launch-count 1`. tools/ncu_sass_stalls.py sums the warp-stall samples of a report by SASS opcode.

(`tools/device_session.sh ncu` runs both for the two Qwen3 shapes; our JAX process is slow under ncu, see that
step.) Timed numbers come from benchmarks/grouped_gemm.py, not from here: ncu serialises and replays kernels.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _common  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="qwen3-30b-a3b gate_up")
    ap.add_argument("--groups", default="even", choices=("even", "skew"))
    ap.add_argument("--torch", action="store_true", help="torch._grouped_mm instead of ours")
    ap.add_argument("--recipe", default="", choices=("", "blockwise"), help="the FP8 forward kernel alone")
    ap.add_argument("--fwd-only", action="store_true", help="the bf16 forward alone (3 calls)")
    ap.add_argument("--wgrad-only", action="store_true", help="the bf16 wgrad alone (3 calls)")
    args = ap.parse_args(argv)
    shapes = _common.load_shapes()
    case = next(c for c in shapes["grouped_gemm"] if c["name"] == args.case)
    m, k, n, g = case["M"], case["K"], case["N"], case["G"]
    sizes = _common.group_sizes(m, g, args.groups, shapes)
    if args.torch:
        import torch
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5).requires_grad_(True)
        cot = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(torch.tensor(sizes, device="cuda", dtype=torch.int32), 0, dtype=torch.int32)

        def step():
            out = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
            return torch.autograd.grad(out, (a, w), cot)
        for _ in range(2):  # warm-up, then the profiled one
            step()
            torch.cuda.synchronize()
        return
    import jax
    import jax.numpy as jnp

    import jax_moe_ffi as jmf
    key = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(key[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(key[1], (g, k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
    dout = jax.random.normal(key[2], (m, n), jnp.bfloat16)
    gs = jnp.asarray(sizes)
    fwd = jax.jit(lambda x, w, s: jmf.grouped_matmul(x, w, s))
    if args.recipe or args.fwd_only or args.wgrad_only:
        if args.wgrad_only:
            fn, fargs = jax.jit(lambda x, d, s: jmf.grouped_matmul_wgrad(x, d, s)), (x, dout, gs)
        elif args.recipe:
            import grouped_gemm as bench  # benchmarks/grouped_gemm.py: the same call as its ours_fp8 rows
            fn, fargs = bench.fp8_kernel_only(x, w, gs)
        else:
            fn, fargs = fwd, (x, w, gs)
        for _ in range(3):  # compile + warm-up, warm-up, the profiled call
            jax.block_until_ready(fn(*fargs))
        return
    dgrad = jax.jit(lambda d, w, s: jmf.grouped_matmul(d, w, s, transpose_rhs=True))
    wgrad = jax.jit(lambda x, d, s: jmf.grouped_matmul_wgrad(x, d, s))
    for _ in range(2):  # warm-up (compile + one run each), then the profiled run
        jax.block_until_ready((fwd(x, w, gs), dgrad(dout, w, gs), wgrad(x, dout, gs)))


if __name__ == "__main__":
    main()
