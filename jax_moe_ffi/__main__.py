"""`python -m jax_moe_ffi {demo,inspect}`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_moe_ffi")
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="rewrite the built-in MoE models with optimize(): report, numerics, "
                                       "HLO before/after, timing")
    demo.add_argument("--model", default="all", help="all, gshard_capacity, mixtral_dense or decoder_scan")
    demo.add_argument("--mode", default="exact", choices=["exact", "dropless"])
    demo.add_argument("--tokens", type=int, default=None, help="default 512 (CPU), 8192 (GPU)")
    demo.add_argument("--d-model", type=int, default=None, help="default 256 (CPU), 1024 (GPU)")
    demo.add_argument("--d-ff", type=int, default=None, help="default 512 (CPU), 2048 (GPU)")
    demo.add_argument("--experts", type=int, default=None, help="default 16 (CPU), 32 (GPU)")
    demo.add_argument("--top-k", type=int, default=2)
    demo.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                      help="auto: bfloat16 on a GPU (what the CUDA kernels take), float32 elsewhere")
    ins = sub.add_parser("inspect", help="write StableHLO and optimized HLO before/after optimize() and "
                                         "print a summary")
    ins.add_argument("target", help="a built-in example (gshard_capacity, mixtral_dense, decoder_scan) or "
                                    "MODULE:FUNCTION where FUNCTION() returns (fn, args)")
    ins.add_argument("--out", default="hlo_out", help="output folder")
    ins.add_argument("--mode", default="exact", choices=["exact", "dropless"])
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        from jax_moe_ffi.demo import run_demo
        return run_demo(args)
    if args.cmd == "inspect":
        import jax_moe_ffi as jmf
        from jax_moe_ffi import examples, inspect

        if ":" in args.target:
            fn, fargs = inspect.resolve(args.target)
            name = args.target.replace(":", ".")
        else:
            if args.target not in examples.EXAMPLES:
                parser.error(f"unknown example {args.target!r}; choose from {sorted(examples.EXAMPLES)}")
            fn, fargs = examples.EXAMPLES[args.target]()
            name = args.target
        print(jmf.explain(fn, *fargs, mode=args.mode))
        res = inspect.inspect_function(name, fn, fargs, Path(args.out), jmf.optimize(fn, mode=args.mode))
        for tag, summary in res.items():
            print(f"{tag}: {summary}")
        print(f"wrote {args.out}/{name}.{{before,after}}.{{stablehlo.mlir,hlo.txt}}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
