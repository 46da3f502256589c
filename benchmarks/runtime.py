"""Multistreaming and host offload, measured: a multi-layer MoE decoder (`lax.scan` over layers, shared
expert) through `optimize`, forward+backward, as the VARIANTS below: `ours` (plain), `ours_streams`
(streams=True with runtime.apply_xla_flags), `ours_save` (offload="device": the tagged rows and expert GEMM
outputs kept on the device) and host-offload rows that move some of those tensors to pinned host memory
(`ours_offload`: the gate projection's output only; `_hidden`, `_rows`, `_all`: more).
Rows carry ms, peak_bytes (compiled memory analysis), device_peak_bytes (Device.memory_stats() peak; with
--isolate each variant runs in its own process, so it is that variant's own peak) and offloaded_bytes.

  python benchmarks/runtime.py                 # GPU (deepseek-v3-ep8-local layer shape, 4 layers, bf16)
  python benchmarks/runtime.py --cpu-scale 32  # CPU smoke run
  python benchmarks/runtime.py --no-scan       # diagnostic: layers unrolled in Python instead of lax.scan
  python benchmarks/runtime.py --variants ours_streams --xla-options loop_double_buffering
  python benchmarks/runtime.py --isolate --variants ours_save,ours_offload,ours_save,ours_offload

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
# ours: no offload argument, the layer's jax.checkpoint recomputes everything (the baseline of ours_streams).
# ours_save: offload="device", the dispatched rows and every expert GEMM output kept on the device (no expert GEMM
# recomputed in the backward): the baseline of the host-offload rows, which move some of those same tensors to
# host memory and keep the rest as here, so their peak should drop by exactly the bytes they offload.
# ours_offload: the first expert GEMM output (index 0, the gate projection's: runtime.hidden_name) to the host,
# the rest as ours_save. Since session 10 (before: offload="pinned_host", now ours_offload_all). Per DeepSeek layer
# that is 134 MB over PCIe each way, which the layer's forward and backward can hide.
# ours_offload_hidden: both gate and up outputs to the host (268 MB a layer). ours_offload_rows: the dispatched
# rows (470 MB). ours_offload_all: offload="pinned_host", rows and expert outputs, the rest recomputed.
VARIANTS = {"ours": (False, None), "ours_streams": (True, None),
            "ours_save": (False, "device"),
            "ours_offload": (False, {"moe_dispatched_rows": "device", "moe_expert_hidden": "device",
                                     "moe_expert_hidden.0": "pinned_host"}),
            "ours_offload_hidden": (False, {"moe_dispatched_rows": "device", "moe_expert_hidden": "pinned_host"}),
            "ours_offload_rows": (False, {"moe_dispatched_rows": "pinned_host", "moe_expert_hidden": "device"}),
            "ours_offload_all": (False, "pinned_host")}


def build_model(case_name: str, num_layers: int, cpu_scale: int = 0, no_scan: bool = False,
                prevent_cse: bool = True):
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
        # prevent_cse=False: no optimization barrier over the residuals at the start of the recompute (JAX
        # documents that lax.scan already prevents the CSE it guards against); with it, a residual fetched from
        # host memory must arrive before any of the layer's backward runs (NOTES.md, session 10).
        kw = {"prevent_cse": prevent_cse}
        body = (jax.checkpoint(fast_block, policy=fast_block.offload_policy, **kw) if offload
                else jax.checkpoint(fast_block, **kw))

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
    ap.add_argument("--command-buffer", default=None,
                    help='xla_gpu_enable_command_buffer for every variant: "" turns CUDA graphs off; default: '
                         'runtime.xla_flags()\'s (XLA\'s own: on)')
    ap.add_argument("--graph-scheduling", default="CONCURRENT",
                    help='runtime.xla_flags(graph_scheduling=...): the command-buffer scheduling mode, "" for XLA\'s')
    ap.add_argument("--xla-extra", default="",
                    help="comma-separated name=value XLA flags added to every variant (checked like the others), e.g. "
                         "xla_gpu_command_buffer_scheduling_mode=CONCURRENT")
    ap.add_argument("--out", default="", help="result name (default runtime_<machine>)")
    ap.add_argument("--no-prevent-cse", action="store_true",
                    help="jax.checkpoint(..., prevent_cse=False) on the scanned layer (no residual barrier)")
    ap.add_argument("--isolate", action="store_true",
                    help="run each variant in a fresh process (memory_stats' peak is per process), one after another")
    ap.add_argument("--dump-hlo", default="",
                    help="directory: write each variant's compiled (scheduled) HLO there as <variant>.hlo.txt, to see "
                         "where XLA puts the host-offload copy-start / copy-done")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    options = {o: True for o in args.xla_options.split(",") if o}
    if args.isolate:
        return _isolated(args, argv if argv is not None else sys.argv[1:])
    extra = dict(kv.split("=", 1) for kv in args.xla_extra.split(",") if kv)
    flags = (runtime.apply_xla_flags(**options, command_buffer=args.command_buffer, extra=extra,
                                     graph_scheduling=args.graph_scheduling or None)
             if not args.cpu_scale else [])

    import jax

    variant, stacked, x = build_model(args.case, args.layers, args.cpu_scale, args.no_scan,
                                      prevent_cse=not args.no_prevent_cse)
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
    meta["prevent_cse"] = not args.no_prevent_cse
    meta["xla_options"] = sorted(options)
    meta["failed"] = [r["impl"] for r in rows if "error" in r]
    path = _common.write_results(args.out or f"runtime_{_common.machine_tag()}" + ("_noscan" if args.no_scan else ""), meta,
                                 rows, "ms",
                                 "Streams and host offload (fwd+bwd ms)")
    print(f"wrote {path}")


def _isolated(args, argv):
    """--isolate: each variant in its own process (this script without --isolate, one variant, a scratch result
    name), then one result file with all rows, in the order given."""
    import json
    import subprocess
    import tempfile

    base = [a for a in argv if a != "--isolate"]
    drop = {"--variants", "--out"}
    rest, skip = [], False
    for a in base:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = True
            continue
        if any(a.startswith(d + "=") for d in drop):
            continue
        rest.append(a)
    rows, metas = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(args.variants.split(",")):
            out = str(Path(tmp) / f"v{i}")
            subprocess.run([sys.executable, __file__, *rest, "--variants", name, "--out", out], check=False)
            try:
                d = json.loads(Path(out + ".json").read_text())
            except (OSError, ValueError) as e:
                rows.append({"case": args.case, "impl": name, "pass": "fwd_bwd", "groups": "routed", "ms": None,
                             "error": f"the variant's process wrote no result ({type(e).__name__})"})
                continue
            rows += [dict(r, process=i) for r in d["rows"]]
            metas.append(d["meta"])
    meta = metas[0] if metas else _common.metadata(["benchmarks/runtime.py"] + list(argv))
    meta["command"] = " ".join(["python", "benchmarks/runtime.py"] + list(argv))
    meta["isolated"] = True
    meta["failed"] = [r["impl"] for r in rows if "error" in r]
    path = _common.write_results(args.out or f"runtime_{_common.machine_tag()}", meta, rows, "ms",
                                 "Streams and host offload (fwd+bwd ms; one process per variant)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
