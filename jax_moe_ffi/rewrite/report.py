"""`Report`: what `explain` found -- matched sites and near-misses -- printable and as data."""
from __future__ import annotations

import dataclasses

FAMILIES = {
    "capacity": "(1) capacity one-hot dispatch/combine einsums",
    "dense": "(2) all-experts dense compute weighted by a top-k-sparse gate",
    "masked": "(3) tokens broadcast to every expert, then masked",
    "loop": "(4) per-expert unrolled loop",
    "ragged": "(5) jax.lax.ragged_dot, swapped for the grouped GEMM kernel",
    "gathered": "(6) expert weights gathered per (token, choice), run as a grouped GEMM of rows sorted by expert",
}


@dataclasses.dataclass
class SiteReport:
    family: str
    E: int
    k: int | None
    capacity: int | None
    tokens: tuple
    shapes: dict
    source: str
    path: str
    flops_before: int
    flops_after: int
    bytes_before: int
    bytes_after: int
    dropless: bool = False
    notes: list = dataclasses.field(default_factory=list)

    @property
    def flops_ratio(self):
        return self.flops_before / max(1, self.flops_after)

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class MissReport:
    reason: str
    source: str
    op: str
    shapes: list
    path: str = ""
    at: str | None = None

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Report:
    function: str
    mode: str
    sites: list
    misses: list
    recipe: object = None
    offload: object = None
    streams: bool = True
    notes: list = dataclasses.field(default_factory=list)

    @property
    def rewritten(self):
        return bool(self.sites)

    def as_dict(self):
        return {"function": self.function, "mode": self.mode, "recipe": self.recipe,
                "offload": self.offload, "streams": self.streams, "notes": list(self.notes),
                "sites": [s.as_dict() for s in self.sites], "misses": [m.as_dict() for m in self.misses]}

    def __str__(self):
        lines = [f"jax_moe_ffi.explain({self.function}) mode={self.mode}: {len(self.sites)} MoE site(s), "
                 f"{len(self.misses)} near-miss(es)"]
        for i, s in enumerate(self.sites):
            cap = f" capacity={s.capacity}" + (" (ignored: dropless)" if s.dropless else "") \
                if s.capacity is not None else ""
            lines.append(f"  site {i}: {FAMILIES.get(s.family, s.family)}")
            lines.append(f"    at {s.source}" + (f" (inside {s.path.rstrip('/')})" if s.path else ""))
            if s.family == "ragged":
                (a, w), = s.shapes["gemms"]
                lines.append(f"    groups={s.E} lhs {a} x rhs {w}")
            elif s.family == "gathered":
                lines.append(f"    E={s.E} (token, choice) rows {s.tokens}")
            else:
                lines.append(f"    E={s.E} k={s.k}{cap} tokens={s.tokens}")
            for j, (a, w) in enumerate(s.shapes.get("gemms", []) if s.family != "ragged" else []):
                lines.append(f"    gemm {j}: rows from {a} x expert weights {w}")
            lines.append(f"    FLOPs {_fmt(s.flops_before)} -> {_fmt(s.flops_after)} "
                         + (f"({s.flops_ratio:.1f}x fewer)" if s.flops_after != s.flops_before else "(the same)")
                         + f"; largest buffer {_fmt(s.bytes_before, 'B')} -> "
                         f"{_fmt(s.bytes_after, 'B')}")
            for n in s.notes:
                lines.append(f"    note: {n}")
        for m in self.misses:
            where = f" (inside {m.path.rstrip('/')})" if m.path else ""
            lines.append(f"  near-miss at {m.source}{where} ({m.op} {m.shapes}): {m.reason}")
            if m.at and m.at != m.source:
                lines.append(f"    (blocked at {m.at})")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)

    __repr__ = __str__


def _fmt(x, unit=""):
    for s, d in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= d:
            return f"{x / d:.2f}{s}{unit}"
    return f"{x}{unit}"
