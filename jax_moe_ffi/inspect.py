"""HLO inspection: what XLA runs for a function, before and after `optimize`.

`summarize_hlo(text)` reads optimized HLO text and reports custom calls by target, dot count and FLOPs,
and the largest buffers. `inspect_function` writes StableHLO and optimized HLO of the original and the
optimized function to files. CLI: `python -m jax_moe_ffi inspect MODULE:FUNCTION|EXAMPLE [--out DIR]`,
where FUNCTION() returns `(fn, args)` and EXAMPLE names a built-in example model.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import re
from collections import Counter
from pathlib import Path

import jax

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2,
                "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8}
_SHAPE = r"([a-z0-9]+)\[([0-9,]*)\]"
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*" + _SHAPE + r"\S*\s+([\w\-]+)\((.*)$")


def _dims(s: str) -> tuple[int, ...]:
    return tuple(int(d) for d in s.split(",") if d)


@dataclasses.dataclass
class HloSummary:
    custom_calls: dict[str, int]
    dots: int
    dot_flops: float
    largest_buffers: list[tuple[str, str, int]]  # (instruction, shape, bytes)

    def __str__(self) -> str:
        cc = ", ".join(f"{k} x{v}" for k, v in sorted(self.custom_calls.items())) or "none"
        big = "; ".join(f"{n} {s} {b / 2**20:.2f} MiB" for n, s, b in self.largest_buffers[:3])
        return (f"{self.dots} dot ops ({self.dot_flops / 1e9:.4g} GFLOP), custom calls: {cc}\n"
                f"    largest buffers: {big}")


def summarize_hlo(text: str, top: int = 5) -> HloSummary:
    calls: Counter[str] = Counter()
    dots, flops = 0, 0.0
    buffers = []
    shapes: dict[str, tuple[int, ...]] = {}  # instruction shapes of the current computation
    for line in text.splitlines():
        if line.rstrip().endswith("{") and "->" in line:  # a new computation: names are local to it
            shapes = {}
        if " custom-call(" in line:  # counted here: multi-output calls have tuple shapes _INSTR skips
            t = re.search(r'custom_call_target="([^"]+)"', line)
            if t:
                calls[t.group(1)] += 1
        m = _INSTR.match(line)
        if not m:
            continue
        name, dt, dims, op, rest = m.groups()
        shape = _dims(dims)
        shapes[name] = shape
        if dt in _DTYPE_BYTES and op not in ("parameter", "constant", "get-tuple-element", "bitcast", "tuple"):
            buffers.append((name, f"{dt}[{dims}]", math.prod(shape) * _DTYPE_BYTES[dt]))
        if op == "dot":
            dots += 1
            # operands print either with their shapes or as bare names, depending on the XLA version
            typed = re.match(r"\s*" + _SHAPE, rest)
            first = re.match(r"\s*%?([\w.\-]+)", rest)
            lhs_shape = _dims(typed.group(2)) if typed else shapes.get(first.group(1)) if first else None
            contract = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", line)
            if lhs_shape is not None and contract:
                k = math.prod(lhs_shape[int(i)] for i in contract.group(1).split(",") if i)
                flops += 2.0 * math.prod(shape) * k
    buffers.sort(key=lambda b: -b[2])
    return HloSummary(dict(calls), dots, flops, buffers[:top])


def compiled_text(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def inspect_function(name: str, fn, args, out_dir: Path, optimized=None) -> dict[str, HloSummary]:
    """Writes <name>.{before,after}.{stablehlo.mlir,hlo.txt} into out_dir; returns the summaries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {}
    variants = [("before", fn)] + ([("after", optimized)] if optimized is not None else [])
    for tag, f in variants:
        lowered = jax.jit(f).lower(*args)
        (out_dir / f"{name}.{tag}.stablehlo.mlir").write_text(lowered.as_text())
        hlo = lowered.compile().as_text()
        (out_dir / f"{name}.{tag}.hlo.txt").write_text(hlo)
        result[tag] = summarize_hlo(hlo)
    return result


def resolve(spec: str):
    """'module.path:function' -> function() must return (fn, args)."""
    mod, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    target = getattr(importlib.import_module(mod), attr)
    fn, args = target()
    return fn, tuple(args)
