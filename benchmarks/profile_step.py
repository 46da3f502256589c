"""Where a training step's time goes, variant against variant: per-kernel GPU time of the train_step.py model's
forward+backward (value_and_grad, no optimizer) from a JAX profiler trace, for two or more variants, and the
kernels whose time differs most between the first variant and each other one.

  python benchmarks/profile_step.py --variants ours_exact,ours_exact_save [--steps 5] [--layers 4]
  python benchmarks/profile_step.py --tiny --steps 2           # CPU smoke run (no GPU planes: empty table)
  python benchmarks/profile_step.py --variants ours_exact,naive --dump-hlo /tmp/hlo   # + optimized HLO
  python benchmarks/profile_step.py --variants ours_save_noinit,ours_save_noinit_adamw   # what the update adds

A variant name ending in `_adamw` profiles the whole training step of train_step.py instead (value_and_grad, then
optax AdamW and apply_updates, as benchmarks/_common.train_variant times it), so its difference to the same variant
without the suffix is the optimizer's kernels.
  (xla_ragged_dot asks for ~100 GiB at these shapes: out of memory on an H200 next to other variants)

Kernels are grouped by name with digits dropped (XLA numbers its fusions per module: `loop_add_fusion.12`
and `loop_add_fusion.7` are one row), so the comparison is by kind of kernel. Writes
benchmarks/results/profile_step_<machine>.json (rows: impl, kernel, us_per_step, launches_per_step).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import train_step as TS  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi import runtime  # noqa: E402


def kernel_kind(name: str) -> str:
    """A kernel name without the numbers XLA appends per module; CUTLASS names are cut to their config."""
    if name.startswith("_ZN7cutlass"):
        sched = "pingpong" if "Pingpong" in name else "coop"
        tile = re.search(r"NSC_ILi(\d+)EEENSC_ILi(\d+)EEENSC_ILi(\d+)EEEEEE", name)
        return f"cutlass grouped gemm {sched}" + (f" {tile.group(1)}x{tile.group(2)}x{tile.group(3)}" if tile else "")
    return re.sub(r"[._]?\d+", "", name)[:90]


def is_ours(kind: str) -> bool:
    """A kernel of this package: its CUTLASS grouped GEMMs (and their descriptor builder) or a jax_moe_ffi kernel."""
    return "cutlass" in kind or "jax_moe_ffi" in kind or "BuildGroupTensormaps" in kind


def variants(cfg):
    naive = TS.make_loss(cfg, TS.moe_capacity_einsum)
    return {"naive": naive,
            "ours_exact": jmf.optimize(naive, mode="exact"),
            "ours_exact_save": jmf.optimize(naive, mode="exact", offload="device"),
            "ours": jmf.optimize(naive, mode="dropless"),
            "ours_save": jmf.optimize(naive, mode="dropless", offload="device"),
            # the same model without jax.checkpoint on its layers: every residual is stacked by the scan
            "ours_exact_noremat": jmf.optimize(TS.make_loss(cfg, TS.moe_capacity_einsum, remat=False), mode="exact"),
            "ours_fp8": jmf.optimize(naive, mode="dropless", recipe="blockwise"),
            "ours_fp8_save": jmf.optimize(naive, mode="dropless", recipe="blockwise", offload="device"),
            # the dropless anchor on XLA's ragged_dot: the same model around the MoE, so the kernels that
            # are not MoE kernels (attention, norms, copies, the scan's buffers) can be told apart
            "xla_ragged_dot": TS.make_loss(cfg, TS.moe_ragged(jax.lax.ragged_dot)),
            # the model's jax.checkpoint(prevent_cse=True) kept (optimize() drops it in the scan body)
            "ours_save_keepcse": jmf.optimize(naive, mode="dropless", offload="device", keep_prevent_cse=True),
            "ours_fp8_save_keepcse": jmf.optimize(naive, mode="dropless", recipe="blockwise", offload="device",
                                                  keep_prevent_cse=True)}


def train_step_fn(loss_fn, params, tokens):
    """train_step.py's jitted step (value_and_grad, optax AdamW with its warm-up schedule, apply_updates) and its
    arguments, as _common.train_variant builds it."""
    import optax
    opt = optax.adamw(optax.linear_schedule(0.0, 1e-3, 100))  # train_step.py's default warm-up

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, opt.init(params), tokens)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="ours_exact,ours_exact_save")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--detail", default="memcpy,loop_broadcast_fusion",
                    help="comma-separated kernel kinds to break down by the HLO instruction that launched them "
                         "(the trace's hlo_op stat) and by the kernel that ran just before")
    ap.add_argument("--dump-hlo", default="", help="directory: write each variant's optimized HLO there "
                                                    "(<variant>.hlo.txt), to find what a kernel is")
    args = ap.parse_args(argv)
    cfg = TS.TINY if args.tiny else TS.Config()
    if args.layers:
        cfg = dataclasses.replace(cfg, layers=args.layers)
    dtype = jnp.float32 if args.tiny else jnp.bfloat16
    TS.ATTENTION_IMPL[0] = TS.pick_attention("auto", cfg, dtype)
    params = TS.init(cfg, jax.random.PRNGKey(0), dtype)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.batch, cfg.seq), 0, cfg.vocab)
    fns = variants(cfg)
    per = {}
    rows = []
    for name in args.variants.split(","):
        # <variant>_noinit: compiled under runtime.uninitialized_scan_outputs() (no zero fill of scan outputs)
        # <variant>_adamw: the whole training step (the optimizer's update too)
        with_update = name.endswith("_adamw")
        noinit = name.removesuffix("_adamw")
        base = noinit.removesuffix("_noinit")
        scope = runtime.uninitialized_scan_outputs() if noinit != base else contextlib.nullcontext()
        with scope:
            if with_update:
                step, step_args = train_step_fn(fns[base], params, tokens)
            else:
                step, step_args = jax.jit(jax.value_and_grad(fns[base])), (params, tokens)
            if args.dump_hlo:
                out = Path(args.dump_hlo)
                out.mkdir(parents=True, exist_ok=True)
                step = step.lower(*step_args).compile()  # profiled below as compiled: one compilation
                (out / f"{name}.hlo.txt").write_text(step.as_text())
            times, counts = collections.Counter(), collections.Counter()
            detail = {k: collections.Counter() for k in args.detail.split(",") if k}
            for _, evs in _common.gpu_stream_events(step, step_args, args.steps, with_stats=True).items():
                evs = sorted(evs)
                for i, (start, end, kernel, stats) in enumerate(evs):
                    kind = kernel_kind(kernel)
                    times[kind] += (end - start) / 1e3 / args.steps
                    counts[kind] += 1 / args.steps
                    if kind in detail:
                        op = next((str(v) for k, v in stats.items() if "hlo_op" in k), "?")
                        size = next((str(v)[:60] for k, v in stats.items() if "memcpy" in k or "bytes" in k), "")
                        prev = kernel_kind(evs[i - 1][2]) if i else "-"
                        detail[kind][f"{op} (after {prev[:40]}) {size}"] += (end - start) / 1e3 / args.steps
        per[name] = times
        total = sum(times.values())
        ours = sum(us for k, us in times.items() if is_ours(k))
        print(f"\n== {name}: {total / 1e3:.2f} ms of kernels per step ({len(times)} kinds; this package's "
              f"{ours / 1e3:.2f} ms, the rest {(total - ours) / 1e3:.2f} ms)")
        for k, us in times.most_common(args.top):
            print(f"{us / 1e3:8.3f} ms  x{counts[k]:5.0f}  {k}")
        for k, c in detail.items():
            if c:
                print(f"   {k} by launching HLO op:")
                for what, us in c.most_common(12):
                    print(f"   {us / 1e3:8.3f} ms  {what}")
        rows += [{"impl": name, "kernel": k, "us_per_step": us, "launches_per_step": counts[k]}
                 for k, us in times.items()]
    names = args.variants.split(",")
    for other in names[1:]:
        a, b = per[names[0]], per[other]
        diff = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), key=lambda t: -abs(t[0]))
        print(f"\n== {other} - {names[0]}: {(sum(b.values()) - sum(a.values())) / 1e3:+.2f} ms of kernels per step")
        for d, k in diff[: args.top]:
            print(f"{d / 1e3:+8.3f} ms  {k}")
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/profile_step.py"] + argv)
    meta["config"] = dataclasses.asdict(cfg)
    path = _common.RESULTS / f"profile_step_{_common.machine_tag()}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
