"""`python -m jax_moe_ffi {demo,bench}`."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_moe_ffi")
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="run the built-in MoE layer naive vs grouped: numerics and timing")
    demo.add_argument("--tokens", type=int, default=512)
    demo.add_argument("--d-model", type=int, default=256)
    demo.add_argument("--d-ff", type=int, default=512)
    demo.add_argument("--experts", type=int, default=16)
    demo.add_argument("--top-k", type=int, default=2)
    demo.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        from jax_moe_ffi.demo import run_demo
        return run_demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
