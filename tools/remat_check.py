"""Does the compiled executable recompute the expert GEMMs? Custom calls by target in the optimized HLO of
the train_step.py model's value_and_grad, per variant, plus XLA's own rematerialization clones (`.remat` in
instruction names) and the compiled memory analysis. CPU or GPU (whatever backend jax picks).

  python tools/remat_check.py [--layers 2] [--variants ours_exact,ours_exact_save]
"""
import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import profile_step as PS  # noqa: E402
import train_step as TS  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--variants", default="ours_exact,ours_exact_save")
    ap.add_argument("--dump", default="", help="write each compiled HLO to DUMP/<variant>.hlo.txt")
    args = ap.parse_args()
    cfg = TS.Config(layers=args.layers)
    TS.ATTENTION_IMPL[0] = "xla"
    params = jax.eval_shape(lambda: TS.init(cfg, jax.random.PRNGKey(0), jnp.bfloat16))
    data = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
    fns = PS.variants(cfg)
    for name in args.variants.split(","):
        lowered = jax.jit(jax.value_and_grad(fns[name])).lower(params, data)
        low = collections.Counter(re.findall(r"@(jax_moe_ffi_\w+)", lowered.as_text()))
        compiled = lowered.compile()
        text = compiled.as_text()
        calls = collections.Counter(re.findall(r'custom_call_target="(jax_moe_ffi_\w+)"', text))
        remat = len(re.findall(r"\.remat\d*\b", text))
        mem = compiled.memory_analysis()
        temp = getattr(mem, "temp_size_in_bytes", None)
        print(f"{name}: lowered {dict(low)}\n  compiled {dict(calls)}\n  '.remat' names {remat}, temp bytes {temp}",
              flush=True)
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            (Path(args.dump) / f"{name}.hlo.txt").write_text(text)


if __name__ == "__main__":
    main()
