"""Where a benchmark's per-call time comes from: the optimized Qwen3-30B-A3B-shaped MoE layer (forward+
backward) timed four ways in one process, to separate per-call device time from per-trial overhead.

  python benchmarks/timing_check.py

1. _common.time_ms as the benchmarks use it (5 trials of ~60 ms, host clock, blocked at each trial's end);
2. the same with 10x longer trials (a fixed per-trial cost shrinks 10x per call);
3. the marginal cost: (time of 2N back-to-back calls - time of N calls) / N, medians over trials;
4. the host-side time to enqueue one call (no block), i.e. whether the host keeps ahead of the GPU.
Writes benchmarks/results/timing_check_<machine>.json.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi import models  # noqa: E402


def run_n(fn, args, n):
    t0 = time.perf_counter()
    out = None
    for _ in range(n):
        out = fn(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - t0


def main():
    case = next(c for c in _common.load_shapes()["moe_layers"] if "qwen3-30b" in c["name"])
    t, d, f, e, k = case["tokens"], case["hidden"], case["moe_intermediate"], case["experts"], case["top_k"]
    pk, xk = jax.random.split(jax.random.PRNGKey(0))
    params = models.init_moe_params(pk, d, f, e, jnp.bfloat16)
    x = jax.random.normal(xk, (t, d), jnp.bfloat16)
    naive = lambda p, x: models.capacity_moe(p, x, k, case["capacity_factor"])
    ours = jmf.optimize(naive, mode="exact")
    loss = lambda w, p, x: jnp.sum(ours({**p, **w}, x).astype(jnp.float32) ** 2)
    w = {kk: params[kk] for kk in ("w_gate", "w_up", "w_down")}
    fwd_bwd = jax.jit(jax.value_and_grad(loss, (0, 2)))
    args = (w, params, x)
    res = {}
    jax.block_until_ready(fwd_bwd(*args))
    phases = {}
    t0 = time.time()
    res["time_ms_60ms_trials"] = _common.time_ms(fwd_bwd, *args)
    phases["60ms_trials"] = (t0, time.time())
    t0 = time.time()
    res["time_ms_600ms_trials"] = _common.time_ms(fwd_bwd, *args, min_time_s=3.0)
    phases["600ms_trials"] = (t0, time.time())
    n = 20
    marg = []
    for _ in range(5):
        t1 = run_n(fwd_bwd, args, n)
        t2 = run_n(fwd_bwd, args, 2 * n)
        marg.append((t2 - t1) / n)
    res["marginal_ms"] = float(np.median(marg)) * 1e3
    jax.block_until_ready(fwd_bwd(*args))
    enq = []
    outs = []
    for _ in range(10):
        t0 = time.perf_counter()
        outs.append(fwd_bwd(*args))
        enq.append(time.perf_counter() - t0)
    jax.block_until_ready(outs)
    res["host_enqueue_ms_median"] = float(np.median(enq)) * 1e3
    res["host_enqueue_ms_first"] = enq[0] * 1e3
    for kk, v in res.items():
        print(f"{kk:>28}: {v:8.3f}")
    meta = _common.metadata(sys.argv)
    path = _common.RESULTS / f"timing_check_{_common.machine_tag()}.json"
    print("phases (unix time, to align with nvidia-smi samples):", phases)
    path.write_text(json.dumps({"meta": meta, "results": res, "phases_unix_s": phases}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
