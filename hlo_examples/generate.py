"""Regenerates hlo_examples/: StableHLO and optimized (CPU) HLO of the built-in example models before and
after `optimize`, plus SUMMARY.md (custom calls, dot count and FLOPs, largest buffers).

  python hlo_examples/generate.py [--out hlo_examples]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import jax

import jax_moe_ffi as jmf
from jax_moe_ffi import examples, inspect


def generate(out: Path) -> dict:
    summaries = {}
    for name, make in examples.EXAMPLES.items():
        fn, args = make()
        summaries[name] = inspect.inspect_function(name, fn, args, out, jmf.optimize(fn))
    lines = ["# HLO of the built-in examples, before and after `optimize`", "",
             f"Made by `python hlo_examples/generate.py` with jax {jax.__version__} on {jax.default_backend()}.", ""]
    for name, res in summaries.items():
        lines += [f"## {name}", "", f"- before: {res['before']}".replace("\n", " "),
                  f"- after: {res['after']}".replace("\n", " "), ""]
    (out / "SUMMARY.md").write_text("\n".join(lines))
    return summaries


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    generate(Path(ap.parse_args().out))
