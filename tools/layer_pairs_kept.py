"""The share of routed (token, expert) pairs that the capacity rule keeps on the inputs benchmarks/moe_layer.py
times (CPU is enough: the router only). If it is below 1, the layer's model TFLOP/s would count dropped pairs.

  python tools/layer_pairs_kept.py
"""
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _common  # noqa: E402

from jax_moe_ffi import models  # noqa: E402

for case in _common.load_shapes()["moe_layers"]:
    t, d, f, e, k = case["tokens"], case["hidden"], case["moe_intermediate"], case["experts"], case["top_k"]
    pk, xk = jax.random.split(jax.random.PRNGKey(0))  # as benchmarks/moe_layer.py
    params = models.init_moe_params(pk, d, f, e, jnp.bfloat16)
    x = jax.random.normal(xk, (t, d), jnp.bfloat16)
    _, experts, _ = models._router(params, x, k)
    counts = np.bincount(np.asarray(experts).reshape(-1), minlength=e)
    cap = max(1, int(math.ceil(t * k / e * case["capacity_factor"])))
    print(f"{case['name']}: capacity {cap}, largest expert count {counts.max()}, "
          f"pairs kept {np.minimum(counts, cap).sum() / counts.sum():.4f}")
