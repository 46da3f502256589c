"""Training step on MaxText's own MoE layer: a small stack of `maxtext.layers.moe.RoutedMoE` (the
dense_matmul path: GShard-style capacity einsums, as MaxText runs it without megablox/sparse_matmul), residual
blocks under `lax.scan(jax.checkpoint(...))` like MaxText's scanned decoder, AdamW; run as written and through
`optimize(mode="exact")` and `optimize(mode="dropless")`; and MaxText's sparse_matmul path without megablox
(dropless, already grouped with `jax.lax.ragged_dot`) as written and through `optimize` (family 5: the
ragged_dots swapped for the grouped GEMM). Reports step time, tokens/s, routed-expert TFLOP/s, peak memory and
the loss after N steps on the same data.

  python benchmarks/train_step_maxtext.py              # GPU: Qwen3-30B-A3B MoE shapes, 2 layers, bf16
  python benchmarks/train_step_maxtext.py --tiny       # CPU smoke run (tiny config, float32)

Needs MaxText (Python >= 3.12; `pip install --no-deps maxtext` + its import deps, as .ci/models.sh does).
Writes benchmarks/results/train_step_maxtext_<machine>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402

QWEN3 = dict(batch=4, seq=2048, d_model=2048, d_ff=768, experts=128, top_k=8)
TINY = dict(batch=2, seq=12, d_model=16, d_ff=32, experts=8, top_k=2)


STUBBED_MODULES: list[str] = []


def import_maxtext(max_stubs: int = 20):
    """Imports the MaxText modules used here. On a machine without MaxText's full dependency set (the H200
    image has no network), top-level modules that MaxText imports only for its servers, logging and tooling
    (e.g. pathwaysutils -> fastapi, uvicorn) are replaced by empty stub modules, one at a time as imports
    fail, and listed in STUBBED_MODULES (printed, and stored in the results). The stubs cannot change the
    numbers: every variant runs the same MaxText layer, and exact mode is checked against the naive loss."""
    import importlib
    import types
    from unittest import mock

    class _Stub(types.ModuleType):
        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return mock.MagicMock(name=f"{self.__name__}.{attr}")

    for _ in range(max_stubs + 1):
        try:
            for name in ("maxtext.configs.pyconfig", "maxtext.layers.moe", "maxtext.layers.initializers",
                         "maxtext.utils.maxtext_utils"):
                importlib.import_module(name)
            return
        except ModuleNotFoundError as e:
            missing = (e.name or "").split(".")[0]
            if not missing or missing == "maxtext" or missing in STUBBED_MODULES or len(STUBBED_MODULES) >= max_stubs:
                raise
            STUBBED_MODULES.append(missing)
            print(f"train_step_maxtext: stubbing missing module {missing!r} (imported by MaxText, not used here)")
            for mod in [m for m in sys.modules if m.split(".")[0] in ("maxtext", "pathwaysutils")]:
                del sys.modules[mod]
            stub = _Stub(missing)
            stub.__path__ = []  # a package, so `import missing.sub` finds stub submodules below
            sys.modules[missing] = stub
            sys.meta_path.insert(0, _StubFinder(missing))


class _StubFinder:
    """Resolves `prefix.anything` to a stub module (submodules of a stubbed package)."""

    def __init__(self, prefix):
        self.prefix = prefix

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery
        if fullname.startswith(self.prefix + "."):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        mod = type(sys.modules[self.prefix])(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def build_layer(shape, capacity_factor, dtype, seed, sparse=False):
    """One RoutedMoE from MaxText's config system; returns (f(params, x) -> out, params). sparse=True: MaxText's
    sparse_matmul path without megablox (dropless: sort + jax.lax.ragged_dot inside shard_map)."""
    from flax import nnx
    from jax.sharding import Mesh
    import_maxtext()
    from maxtext.configs import pyconfig
    from maxtext.layers import moe
    from maxtext.layers.initializers import nd_dense_init
    from maxtext.utils import maxtext_utils

    name = jnp.dtype(dtype).name
    cfg = pyconfig.initialize(
        [None, os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")],
        run_name="jax_moe_ffi_bench", enable_checkpointing=False, model_name="default", dtype=name,
        weight_dtype=name, megablox=False, sparse_matmul=sparse, capacity_factor=-1.0 if sparse else capacity_factor,
        num_experts=shape["experts"], num_experts_per_tok=shape["top_k"], base_emb_dim=shape["d_model"],
        base_moe_mlp_dim=shape["d_ff"], base_mlp_dim=shape["d_ff"], base_num_query_heads=2, base_num_kv_heads=2,
        head_dim=8, base_num_decoder_layers=1, max_target_length=shape["seq"], per_device_batch_size=shape["batch"],
        load_balance_loss_weight=0.0)
    mesh = Mesh(maxtext_utils.create_device_mesh(cfg), cfg.mesh_axes)
    layer = moe.RoutedMoE(config=cfg, num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                          mesh=mesh, kernel_init=nd_dense_init(1.0, "fan_in", "truncated_normal"),
                          kernel_axes=("embed", "mlp"), intermediate_dim=shape["d_ff"], dtype=dtype,
                          weight_dtype=dtype, rngs=nnx.Rngs(params=seed))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def f(p, x):
        out, _lb_loss, _bias_updates = nnx.merge(graphdef, p, rest)(x)
        return out

    return f, params


def main(argv=None):
    import optax

    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="a tiny float32 config for a CPU smoke run")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--out", default="", help="result name (default train_step_maxtext_<machine>)")
    ap.add_argument("--variants", default="naive,ours_exact,ours,sparse_ragged,sparse_ragged_ours",
                    help="naive / ours_exact / ours: the dense_matmul (capacity) path as written / optimize(exact) / "
                         "optimize(dropless); sparse_ragged / sparse_ragged_ours: MaxText's sparse_matmul path "
                         "(jax.lax.ragged_dot) as written / through optimize (ragged_dot swapped, family 5)")
    args = ap.parse_args(argv)
    shape = TINY if args.tiny else QWEN3
    dtype = jnp.float32 if args.tiny else jnp.bfloat16
    b, s, d = shape["batch"], shape["seq"], shape["d_model"]
    f, p0 = build_layer(shape, args.capacity_factor, dtype, 0)
    layers = [p0] + [build_layer(shape, args.capacity_factor, dtype, i)[1] for i in range(1, args.layers)]
    params0 = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    xs = jax.random.normal(jax.random.PRNGKey(1), (args.steps, b, s, d), jnp.float32).astype(dtype)
    target = jax.random.normal(jax.random.PRNGKey(2), (b, s, d), jnp.float32).astype(dtype)

    def make_loss(moe):
        def loss(stacked, x):
            def body(h, lp):
                return h + moe(lp, h), None
            h, _ = jax.lax.scan(jax.checkpoint(body), x, stacked)
            return jnp.mean((h.astype(jnp.float32) - target.astype(jnp.float32)) ** 2)
        return loss

    variants = {"naive": f, "ours_exact": jmf.optimize(f, mode="exact"), "ours": jmf.optimize(f, mode="dropless")}
    f_sparse, p_sparse = build_layer(shape, args.capacity_factor, dtype, 0, sparse=True)
    if jax.tree.structure(p_sparse) != jax.tree.structure(p0):
        raise RuntimeError("MaxText's sparse_matmul and dense_matmul layers have different parameter trees")
    variants.update(sparse_ragged=f_sparse, sparse_ragged_ours=jmf.optimize(f_sparse))
    print(jmf.explain(make_loss(f), params0, xs[0]))
    opt = optax.adamw(1e-3)
    tokens = b * s
    routed_flops = 3 * 2.0 * 3 * tokens * shape["top_k"] * d * shape["d_ff"] * args.layers  # fwd+bwd, 3 GEMMs
    rows = []
    for name in args.variants.split(","):
        try:
            ms, traj, peak = _common.train_variant(make_loss(variants[name]), params0, list(xs), opt)
        except Exception as e:  # noqa: BLE001 - a failing variant must not cost the others
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append({"case": "maxtext RoutedMoE", "impl": name, "pass": "train_step", "groups": "routed",
                         "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        rows.append({"case": f"maxtext RoutedMoE x{args.layers}" + (" tiny" if args.tiny else " qwen3-30b-a3b"),
                     "impl": name, "pass": "train_step", "groups": "routed", "ms": ms,
                     "tflops": routed_flops / ms / 1e9, "tokens_per_s": tokens / ms * 1e3, "peak_bytes": peak,
                     "loss_first": traj[0], "loss_last": traj[-1], "steps": args.steps})
        print(f"{name:>11}: {ms:9.2f} ms/step  {routed_flops / ms / 1e9:8.2f} routed TFLOP/s  "
              f"{tokens / ms * 1e3:10.0f} tok/s  loss {traj[0]:.5f} -> {traj[-1]:.5f}", flush=True)
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/train_step_maxtext.py"] + argv)
    meta.update(stubbed_modules=STUBBED_MODULES, shape=shape, dtype=jnp.dtype(dtype).name, layers=args.layers, capacity_factor=args.capacity_factor,
                flops="routed expert GEMMs only (3 per layer, forward + backward), no padding")
    path = _common.write_results(args.out or f"train_step_maxtext_{_common.machine_tag()}" + ("_tiny" if args.tiny else ""),
                                 meta, rows, "tflops", "MaxText RoutedMoE stack, training step (routed TFLOP/s)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
