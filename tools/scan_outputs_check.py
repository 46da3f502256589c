"""Checks runtime.uninitialized_scan_outputs() on the training-step model of benchmarks/train_step.py (GPU): for
each variant, the loss and gradients of one executable compiled as usual and one compiled under the knob, the
latter run after the device's free memory was filled with NaN and freed (an element the loop does not write would
read NaN). Prints, per variant: NaN count, bitwise-equal leaves, the largest relative difference, and the same for
the default executable run twice and compiled twice (what the step's own nondeterminism is).

  python tools/scan_outputs_check.py --variants ours_save,ours_exact_save,ours_fp8_save [--out results.json]
  XLA_FLAGS=--xla_gpu_deterministic_ops=true python tools/scan_outputs_check.py --variants ours_save
      (XLA's deterministic reductions and scatters: then the two executables can be compared bit for bit)
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import profile_step as PS  # noqa: E402
import train_step as TS  # noqa: E402
from jax_moe_ffi import runtime  # noqa: E402
from test_runtime import poison_free_device_memory  # noqa: E402


def compare(a, b) -> dict:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    rel, equal, nan = 0.0, 0, 0
    for x, y in zip(la, lb):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        nan += int(np.sum(~np.isfinite(x)))
        equal += int(np.array_equal(x, y))
        rel = max(rel, float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)))
    return {"leaves": len(la), "bitwise_equal_leaves": equal, "max_rel_diff": rel, "nonfinite": nan}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="ours_save,ours_exact_save,ours_fp8_save")
    ap.add_argument("--out", default="")
    ap.add_argument("--attention", default="auto", choices=["auto", "cudnn", "xla"])
    args = ap.parse_args()
    cfg = TS.Config()
    TS.ATTENTION_IMPL[0] = TS.pick_attention(args.attention, cfg, jnp.bfloat16)
    params = TS.init(cfg, jax.random.PRNGKey(0), jnp.bfloat16)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.batch, cfg.seq), 0, cfg.vocab)
    fns = PS.variants(cfg)
    report = {}
    for name in args.variants.split(","):
        vg = jax.value_and_grad(fns[name])
        plain = jax.jit(lambda p, t: vg(p, t))
        want = jax.block_until_ready(plain(params, tokens))
        again = jax.block_until_ready(plain(params, tokens))
        recompiled = jax.block_until_ready(jax.jit(lambda p, t: vg(p, t))(params, tokens))
        with runtime.uninitialized_scan_outputs():
            noinit = jax.jit(lambda p, t: vg(p, t))
            allocs = noinit.lower(params, tokens).as_text().count("AllocateBuffer")
            jax.block_until_ready(noinit(params, tokens))
        poison_free_device_memory(0.7)
        got = jax.block_until_ready(noinit(params, tokens))
        report[name] = {"allocate_buffer_calls": allocs, "noinit_vs_default": compare(got, want),
                        "default_run_twice": compare(again, want), "default_compiled_twice": compare(recompiled, want)}
        print(name, json.dumps(report[name]), flush=True)
        del want, again, recompiled, got, plain, noinit
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
