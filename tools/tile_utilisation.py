"""Row-tile utilisation of the forward / dgrad grouped GEMM (CPU, no GPU needed): the share of computed rows
that are real rows, when every group's row tiles (128 rows) are rounded up to the cluster's M extent (CUTLASS's
grouped scheduler rounds each group's tile grid up to the cluster shape). 2x1 = weight multicast, 1x2 / 1x1 = the
host's choice; `pick` = which of the two the CUDA setup kernels run under JAX_MOE_FFI_GEMM_TILES=pick (opt-in,
bf16 -> bf16): 2x1 iff at most 1/64 of the row tiles are padding (`SetupGroupsKernel` in
cc/cuda/grouped_gemm_run.cuh; this is the same integer rule).

  python tools/tile_utilisation.py

Cases: the grouped_gemm benchmark's group sizes (even, Dirichlet skew) from shapes.json, and the routed sizes of
the Qwen3-30B MoE layer benchmark (benchmarks/moe_layer.py: same init and input, top-8, capacity 1.25). The last
column: 64-row tiles without a cluster (session 12's ping-pong 64x256 A/B, measured slower and removed).
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import _common  # noqa: E402


def utilisation(sizes, tile=128, cluster_m=1):
    tiles = np.ceil(np.ceil(np.asarray(sizes) / tile) / cluster_m) * cluster_m
    return float(np.sum(sizes) / (tiles.sum() * tile))


def paired_pick(sizes, tile=128, max_pad_share=64):
    """The device-side rule of cc/cuda/grouped_gemm_run.cuh: True = the 2x1-cluster kernel runs."""
    tiles = -(-np.asarray(sizes, np.int64) // tile)
    return int(np.sum(tiles & 1)) * max_pad_share <= int(np.sum(tiles))


def layer_sizes():
    import jax
    import jax.numpy as jnp

    from jax_moe_ffi import models
    shapes = _common.load_shapes()
    case = next(c for c in shapes["moe_layers"] if c["name"] == "qwen3-30b-a3b")
    t, d, f, e, k = case["tokens"], case["hidden"], case["moe_intermediate"], case["experts"], case["top_k"]
    pk, xk = jax.random.split(jax.random.PRNGKey(0))  # as benchmarks/moe_layer.py
    params = models.init_moe_params(pk, d, f, e, jnp.bfloat16)
    x = jax.random.normal(xk, (t, d), jnp.bfloat16)
    _, idx = jax.lax.top_k(x.astype(jnp.float32) @ params["router"].astype(jnp.float32), k)
    cap = int(np.ceil(t * k / e * case["capacity_factor"]))
    return np.minimum(np.bincount(np.asarray(idx).ravel(), minlength=e), cap)


def main():
    shapes = _common.load_shapes()
    print(f"{'case':<42} {'groups':<7} {'2x1':>6} {'1x2/1x1':>8} {'pick':>6} {'64-row':>7}")
    for c in shapes["grouped_gemm"]:
        for kind in ("even", "skew"):
            s = _common.group_sizes(c["M"], c["G"], kind, shapes)
            print(f"{c['name']:<42} {kind:<7} {utilisation(s, cluster_m=2):6.3f} {utilisation(s):8.3f} "
                  f"{'2x1' if paired_pick(s) else 'host':>6} {utilisation(s, tile=64):7.3f}")
    s = layer_sizes()
    print(f"{'qwen3-30b-a3b MoE layer (routed, ' + str(s.min()) + '-' + str(s.max()) + ' rows)':<42} {'routed':<7} "
          f"{utilisation(s, cluster_m=2):6.3f} {utilisation(s):8.3f} {'2x1' if paired_pick(s) else 'host':>6} "
          f"{utilisation(s, tile=64):7.3f}")


if __name__ == "__main__":
    main()
