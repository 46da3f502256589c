"""A tile-cost model of the wgrad's persistent schedule: how far above the mean the slowest CTA ends, with the
problems in group order or largest group first (SizeDescendingRank, cc/cuda/grouped_gemm_common.cuh).

Each group's [K, N] output is cut into tm x tn tiles; a tile costs `fixed` + its group's 64-row k-tiles; CUTLASS's
grouped scheduler deals tiles to the CTAs round-robin in problem order (132 SMs). Group sizes are shapes.json's
skewed draw. A model, not a measurement: on the H200 (benchmarks/results/wgrad_order_h200.md) the order moved the
skewed wgrads by -0.4 .. +2%, where this predicts up to 7%.

  python tools/wgrad_order_model.py
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SHAPES = Path(__file__).resolve().parents[1] / "benchmarks" / "shapes.json"


def skewed_sizes(m: int, g: int, alpha: float, seed: int) -> np.ndarray:
    """shapes.json's rule: Dirichlet(alpha) proportions, floored, the remainder to the largest group."""
    p = np.random.default_rng(seed).dirichlet([alpha] * g)
    s = np.floor(p * m).astype(np.int64)
    s[np.argmax(s)] += m - s.sum()
    return s


def slowest_over_mean(sizes, tiles_per_group: int, fixed: float, order, sms: int = 132) -> float:
    cost = np.concatenate([np.full(tiles_per_group, fixed + -(-sizes[g] // 64)) for g in order if sizes[g] > 0])
    load = np.zeros(sms)
    np.add.at(load, np.arange(cost.size) % sms, cost)
    return float(load.max() / (cost.sum() / sms))


def main():
    spec = json.loads(SHAPES.read_text())
    skew = spec["skew"]
    for case in spec["grouped_gemm"]:
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        sizes = skewed_sizes(m, g, skew["alpha"], skew["seed"])
        for tm, tn in ((128, 128), (128, 256)):
            tiles = -(-k // tm) * -(-n // tn)
            for fixed in (2, 4):
                by_group = slowest_over_mean(sizes, tiles, fixed, np.arange(g))
                by_size = slowest_over_mean(sizes, tiles, fixed, np.argsort(-sizes, kind="stable"))
                print(f"{case['name']:>28} tile {tm}x{tn} fixed {fixed}: slowest / mean  group order {by_group:.3f}"
                      f"  size order {by_size:.3f}")


if __name__ == "__main__":
    main()
