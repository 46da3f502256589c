"""Multistreaming and host offload, measured: a multi-layer MoE decoder (`lax.scan` over layers, shared
expert) through `optimize`, as `ours` (plain), `ours_streams` (streams=True with runtime.apply_xla_flags),
`ours_offload` (offload tags + the pinned-host remat policy on the scanned layer), `ours_save` (the same
layer with offload="device": the tagged rows and expert GEMM outputs stay on the device) and
`ours_offload_rows` / `ours_offload_hidden` (only the dispatched rows, or only the GEMM outputs, to the host;
the other tag saved on the device) and `ours_offload_gate` (only the first expert GEMM output, the gate
projection's, to the host), forward+backward.
Rows carry ms, peak_bytes (compiled memory analysis) and offloaded_bytes.

  python benchmarks/runtime.py                 # GPU (deepseek-v3-ep8-local layer shape, 4 layers, bf16)
  python benchmarks/runtime.py --cpu-scale 32  # CPU smoke run
  python benchmarks/runtime.py --no-scan       # diagnostic: layers unrolled in Python instead of lax.scan
  python benchmarks/runtime.py --variants ours_streams --xla-options loop_double_buffering

Writes benchmarks/results/runtime_<machine>.{json,md}. XLA flags must be set before the backend starts,
so this script applies them first (recorded in the JSON). Each variant is measured on its own: one that
fails to compile or run is recorded as a row with `error` (and printed), and the others are still measured.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

from jax_moe_ffi import runtime  # noqa: E402  (imports jax but starts no backend)


# name -> (optimize(streams=), optimize(offload=))
# ours_save: offload="device", the same tags kept on the device (no expert GEMM recomputed in the backward): the
# memory that ours_offload moves to the host, and the step time without any transfer.
# ours_offload_rows / ours_offload_hidden: only the dispatched rows (or only the expert GEMM outputs) go to the
# host, the other tag stays on the device as in ours_save: fewer bytes over PCIe than ours_offload, and no
# expert GEMM recomputed.
VARIANTS = {"ours": (False, None), "ours_streams": (True, None), "ours_offload": (False, "pinned_host"),
            "ours_save": (False, "device"),
            "ours_offload_rows": (False, {"moe_dispatched_rows": "pinned_host", "moe_expert_hidden": "device"}),
            "ours_offload_hidden": (False, {"moe_dispatched_rows": "device", "moe_expert_hidden": "pinned_host"}),
            # one expert GEMM output (the gate projection's, index 0) to the host, everything else as ours_save:
            # half of ours_offload_hidden's PCIe bytes, which a DeepSeek layer's compute can hide
            "ours_offload_gate": (False, {"moe_dispatched_rows": "device", "moe_expert_hidden": "device",
                                          "moe_expert_hidden.0": "pinned_host"})}


def build_model(case_name: str, num_layers: int, cpu_scale: int = 0, no_scan: bool = False):
    """The benchmark's model: `num_layers` decoder MoE blocks (routed experts in dense form + a shared expert) on
    the `case_name` shape. Returns (variant, stacked_params, x); variant(streams, offload) -> loss(ps, x)."""
    import jax
    import jax.numpy as jnp

    import jax_moe_ffi as jmf
    from jax_moe_ffi import models

    case = next(c for c in _common.load_shapes()["moe_layers"] if c["name"] == case_name)
    t, d, f, e, k = case["tokens"], case["hidden"], case["moe_intermediate"], case["experts"], case["top_k"]
    if cpu_scale:
        t, d, f = t // cpu_scale, d // cpu_scale, f // cpu_scale
    dtype = jnp.float32 if cpu_scale else jnp.bfloat16
    keys = jax.random.split(jax.random.PRNGKey(0), num_layers + 1)

    def layer_params(key):
        p = models.init_moe_params(key, d, f, e, dtype)
        k1, k2 = jax.random.split(key)
        p["shared_up"] = (jax.random.normal(k1, (d, f), jnp.float32) / d ** 0.5).astype(dtype)
        p["shared_down"] = (jax.random.normal(k2, (f, d), jnp.float32) / f ** 0.5).astype(dtype)
        return p

    stacked = jax.tree.map(lambda *a: jnp.stack(a), *[layer_params(kk) for kk in keys[:-1]])
    x = jax.random.normal(keys[-1], (t, d), dtype)

    def block(h, p):
        return h + models.shared_expert_moe(p, h, k), None

    def variant(streams, offload):
        fast_block = jmf.optimize(block, streams=streams, offload=offload)
        body = jax.checkpoint(fast_block, policy=fast_block.offload_policy) if offload else jax.checkpoint(fast_block)

        def layers(ps, x):
            if not no_scan:
                return jax.lax.scan(body, x, ps)[0]
            for i in range(num_layers):  # the --no-scan diagnostic: same layers, no while loop
                x = body(x, jax.tree.map(lambda a: a[i], ps))[0]
            return x

        def loss(ps, x):
            return jnp.sum(layers(ps, x).astype(jnp.float32) ** 2)
        return loss

    return variant, stacked, x


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-scale", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--case", default="deepseek-v3-ep8-local")
    ap.add_argument("--no-scan", action="store_true", help="unroll the layers in Python (no lax.scan)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    ap.add_argument("--xla-options", default="",
                    help="comma-separated runtime.xla_flags options to turn on as well, e.g. "
                         "loop_double_buffering,pipelined_host_offload")
    ap.add_argument("--out", default="", help="result name (default runtime_<machine>)")
    ap.add_argument("--dump-hlo", default="",
                    help="directory: write each variant's compiled (scheduled) HLO there as <variant>.hlo.txt, to see "
                         "where XLA puts the host-offload copy-start / copy-done")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    options = {o: True for o in args.xla_options.split(",") if o}
    flags = runtime.apply_xla_flags(**options) if not args.cpu_scale else []

    import jax

    variant, stacked, x = build_model(args.case, args.layers, args.cpu_scale, args.no_scan)
    rows = []
    for name in args.variants.split(","):
        streams, offload = VARIANTS[name]
        row = {"case": args.case, "impl": name, "pass": "fwd_bwd", "groups": "routed", "ms": None,
               "scan": not args.no_scan}
        try:
            loss = variant(streams, offload)
            step = jax.jit(jax.value_and_grad(loss, (0, 1)))
            if args.dump_hlo:
                Path(args.dump_hlo).mkdir(parents=True, exist_ok=True)
                (Path(args.dump_hlo) / f"{name}.hlo.txt").write_text(step.lower(stacked, x).compile().as_text())
            ms = _common.time_ms(step, stacked, x)
            mem = runtime.memory_report(jax.value_and_grad(loss, (0, 1)), stacked, x)
            off = runtime.offloaded_bytes(loss, stacked, x)
            row.update(ms=ms, peak_bytes=mem.get("peak_bytes"), peak_source=mem.get("peak_source"),
                       offloaded_bytes=off, device_peak_bytes=runtime.device_peak_bytes())
            print(f"{name:>14}: {ms:9.3f} ms  peak {mem.get('peak_bytes')} B  offloaded {off} B", flush=True)
        except Exception as e:  # noqa: BLE001  (record the failure, measure the other variants)
            row["error"] = " ".join(f"{type(e).__name__}: {e}".split()).replace("|", "/")[:2000]  # one table cell
            print(f"{name:>14}: FAILED {row['error'][:600]}", flush=True)
            traceback.print_exc(limit=3)
        rows.append(row)
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/runtime.py"] + argv)
    meta["xla_flags"] = flags
    meta["layers"] = args.layers
    meta["scan"] = not args.no_scan
    meta["xla_options"] = sorted(options)
    meta["failed"] = [r["impl"] for r in rows if "error" in r]
    path = _common.write_results(args.out or f"runtime_{_common.machine_tag()}" + ("_noscan" if args.no_scan else ""), meta,
                                 rows, "ms",
                                 "Streams and host offload (fwd+bwd ms)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
