"""Shared benchmark plumbing: shapes, group sizes, timing, and result files (JSON + markdown + PNG).

Every result file names the command, git commit, jax/jaxlib versions and the device that made it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def load_shapes() -> dict:
    """The canonical shapes: ../shared/bench/shapes.json when present, else the committed copy."""
    shared = ROOT.parent / "shared" / "bench" / "shapes.json"
    path = shared if shared.exists() else ROOT / "benchmarks" / "shapes.json"
    return json.loads(path.read_text())


def group_sizes(m: int, g: int, kind: str, shapes: dict) -> np.ndarray:
    """'even' splits m equally; 'skew' is Dirichlet(alpha) with default_rng(seed), floored, remainder to the largest."""
    if kind == "even":
        sizes = np.full(g, m // g, np.int64)
        sizes[: m - sizes.sum()] += 1
    else:
        rng = np.random.default_rng(shapes["skew"]["seed"])
        p = rng.dirichlet(np.full(g, shapes["skew"]["alpha"]))
        sizes = np.floor(p * m).astype(np.int64)
        sizes[np.argmax(sizes)] += m - sizes.sum()
    assert sizes.sum() == m
    return sizes.astype(np.int32)


def _require_cuda_library_on_gpu() -> None:
    """On a GPU, refuse to time anything when the CUDA library is not loaded: every `ours` row would
    silently measure the pure-JAX fallbacks. JMF_ALLOW_FALLBACK=1 overrides (for anchor-only runs)."""
    import jax

    if jax.default_backend() != "gpu" or os.environ.get("JMF_ALLOW_FALLBACK") == "1":
        return
    from jax_moe_ffi import _registry
    if not _registry.cuda_targets:
        raise RuntimeError("benchmarks: on a GPU but the jax_moe_ffi CUDA library is not loaded "
                           f"({_registry.cuda_load_error}); set JAX_MOE_FFI_CUDA_LIB (tools/device_session.sh "
                           "does) or JMF_ALLOW_FALLBACK=1 to time the fallbacks on purpose")


def time_ms(fn, *args, min_time_s: float = 0.3, trials: int = 5) -> float:
    """Median per-call milliseconds. Calls are dispatched back to back (async) and blocked on at the end
    of each trial, so host dispatch overlaps device work; the trial length adapts to the op's speed."""
    import jax

    _require_cuda_library_on_gpu()
    jax.block_until_ready(fn(*args))  # compile
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    one = max(time.perf_counter() - t0, 1e-6)
    reps = int(max(1, min(200, min_time_s / trials / one)))
    per_call = []
    for _ in range(trials):
        t0 = time.perf_counter()
        out = None
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        per_call.append((time.perf_counter() - t0) / reps)
    return float(np.median(per_call)) * 1e3


def gpu_stream_events(fn, args, steps: int, with_stats: bool = False) -> dict:
    """Runs fn(*args) `steps` times back to back under the JAX profiler (after one warm-up call) and returns
    {stream line name: [(start_ns, end_ns, kernel name), ...]} from the trace's GPU planes. XLA's GPU plane
    has one line per CUDA stream plus summary lines ("XLA Ops", "XLA Modules", ...) that repeat the same
    time; only the stream lines are kept. with_stats: each event also carries its trace stats as a dict
    (XLA names the HLO instruction that launched a kernel or memcpy there, e.g. "hlo_op")."""
    import glob
    import tempfile

    import jax

    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(steps):
                out = fn(*args)
            jax.block_until_ready(out)
        files = glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError("the profiler wrote no .xplane.pb")
        data = jax.profiler.ProfileData.from_file(files[0])
        lines = {}
        for plane in data.planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                if "stream" in line.name.lower():
                    lines.setdefault(f"{plane.name} {line.name}", []).extend(
                        (ev.start_ns, ev.end_ns, ev.name) + ((_stats(ev),) if with_stats else ())
                        for ev in line.events)
    return lines


def _stats(ev) -> dict:
    try:
        return {str(k): v for k, v in ev.stats}
    except Exception:  # noqa: BLE001 - stats are best effort (their form varies across jaxlib versions)
        return {}


def import_tokamax():
    """tokamax (the Pallas Mosaic GPU ragged_dot anchor) when importable, else None. It imports `xprof` only
    for its own profiler helpers, so a stub stands in for that 32 MiB wheel (see shared/tools/device_wheels.sh)."""
    import types
    try:
        for n in ("xprof", "xprof.cli", "xprof.cli.tools"):
            sys.modules.setdefault(n, types.ModuleType(n))
        sys.modules["xprof.cli.tools"].get_kernel_stats_tool = lambda *a, **k: None
        import tokamax
        return tokamax
    except Exception as e:  # noqa: BLE001
        print(f"tokamax not importable: {e}")
        return None


def train_variant(loss_fn, params0, batches, optimizer, trained=None) -> tuple[float, list[float], int | None]:
    """Trains from params0 for one step per batch (value_and_grad of loss_fn(params, batch), then the optax
    `optimizer`), then times the step on batches[0]. Returns (ms per step, losses per step, compiled peak
    bytes: arguments + outputs + temporaries). `trained`, if given, is called with the trained parameters
    and batches[0] (what the timed step sees) before the timing, e.g. to measure its routing."""
    import jax
    import optax

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, losses = params0, optimizer.init(params0), []
    for batch in batches:
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    if trained is not None:
        trained(params, batches[0])
    ms = time_ms(step, params, opt_state, batches[0])
    mem = step.lower(params, opt_state, batches[0]).compile().memory_analysis()
    peak = None if mem is None else int(mem.temp_size_in_bytes + mem.argument_size_in_bytes
                                        + mem.output_size_in_bytes)
    return ms, losses, peak


def metadata(argv: list[str]) -> dict:
    import jax
    import jaxlib

    # The device machine gets the working tree without .git: JMF_GIT_COMMIT (set by whoever sends it)
    # names the commit there; otherwise "unknown".
    # JMF_GIT_COMMIT, when set, wins: a copy of the tree may carry a stale .git (it did on the device).
    commit, dirty = os.environ.get("JMF_GIT_COMMIT", ""), False
    if not commit:
        commit = "unknown"
        try:
            res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
            if res.returncode == 0 and len(res.stdout.strip()) == 40:
                commit = res.stdout.strip()
                dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                            capture_output=True, text=True).stdout.strip())
        except OSError:
            pass
    dev = jax.devices()[0]
    return {
        "command": "python " + " ".join([os.path.relpath(argv[0], ROOT)] + argv[1:]),
        "git_commit": commit + ("+dirty" if dirty else ""),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "device": dev.device_kind,
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        # tile / kernel overrides in effect (JAX_MOE_FFI_GEMM_TILES etc.): a run with them is an A/B run
        "jmf_env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith("JAX_MOE_FFI_") and k != "JAX_MOE_FFI_CUDA_LIB"},
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }


def machine_tag() -> str:
    import jax

    kind = jax.devices()[0].device_kind.lower()
    if "h200" in kind:
        return "h200"
    if jax.default_backend() == "cpu":
        return "cpu"
    return kind.replace(" ", "_")


def write_results(name: str, meta: dict, rows: list[dict], value_key: str, title: str,
                  plot_groups: tuple[str, ...] = ("even",), extra_md: list[str] | None = None) -> Path:
    """Writes benchmarks/results/<name>.{json,md,png}; returns the JSON path. extra_md: lines appended to the .md
    after the rows' table (a script's own summary, e.g. same-run ratios)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = RESULTS / name
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    cols = list(dict.fromkeys(["case", "impl", "pass", "groups", "ms", value_key])) + sorted(
        {k for r in rows for k in r} - {"case", "impl", "pass", "groups", "ms", value_key})
    lines = [f"# {title}", "", f"Command: `{meta['command']}`  ", f"Commit: `{meta['git_commit']}`  ",
             f"Device: {meta['device']} ({meta['backend']}), jax {meta['jax']}, jaxlib {meta['jaxlib']}, "
             f"{meta['date']}"]
    # settings that change what was measured: say them next to the command
    flags = meta.get("xla_flags") or meta.get("XLA_FLAGS")  # scripts' own key, or metadata()'s environment copy
    if flags:
        lines[-1] += "  "
        lines.append(f"XLA_FLAGS: `{flags}`")
    if meta.get("jmf_env"):
        lines[-1] += "  "
        lines.append("Environment: " + ", ".join(f"`{k}={v}`" for k, v in meta["jmf_env"].items()))
    for key in ("note", "partial"):
        if meta.get(key):
            lines[-1] += "  "
            lines.append(f"{key.capitalize()}: {meta[key]}")
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    lines += extra_md or []
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    _plot(base.with_suffix(".png"), meta, rows, value_key, title)
    return base.with_suffix(".json")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _plot(path: Path, meta: dict, rows: list[dict], value_key: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = sorted({(r["impl"], r["pass"], r["groups"]) for r in rows if r.get(value_key) is not None})
    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.8 * len(cases)) + 3, 5))
    width = 0.8 / max(1, len(series))
    colors = plt.get_cmap("tab20").colors
    for i, s in enumerate(series):
        vals = [next((r[value_key] for r in rows if (r["impl"], r["pass"], r["groups"]) == s and r["case"] == c),
                     0.0) or 0.0 for c in cases]
        ax.bar(np.arange(len(cases)) + i * width, vals, width, label="/".join(s), color=colors[i % len(colors)])
    ax.set_xticks(np.arange(len(cases)) + 0.4 - width / 2)
    ax.set_xticklabels(cases, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel(value_key)
    ax.set_title(f"{title}\n{meta['device']}, jax {meta['jax']}, {meta['git_commit'][:10]}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.text(0.01, 0.01, meta["command"], fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
