"""Does XLA keep the stream annotations to the compiled GPU executable? Compiles a small shared-expert MoE
layer through optimize(streams=True) with runtime.apply_xla_flags() and prints what of the annotations,
async call-start/done pairs and stream ids survive in the optimized HLO (written to $OUT or /tmp)."""
import os
import re

from jax_moe_ffi import runtime

print("flags:", runtime.apply_xla_flags())
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi import models  # noqa: E402

t, d, f, e = 4096, 1024, 512, 16
p = models.init_moe_params(jax.random.PRNGKey(0), d, f, e, jnp.bfloat16)
k1, k2 = jax.random.split(jax.random.PRNGKey(1))
p["shared_up"] = (jax.random.normal(k1, (d, f)) / d ** 0.5).astype(jnp.bfloat16)
p["shared_down"] = (jax.random.normal(k2, (f, d)) / f ** 0.5).astype(jnp.bfloat16)
x = jax.random.normal(jax.random.PRNGKey(2), (t, d), jnp.bfloat16)
fn = jmf.optimize(lambda p, x: models.shared_expert_moe(p, x, 2), streams=True)
out_dir = os.environ.get("OUT", "/tmp")
for name, f_ in (("fwd", jax.jit(fn)), ("fwd_bwd", jax.jit(jax.grad(lambda p, x: jnp.sum(fn(p, x).astype(jnp.float32) ** 2), (0, 1))))):
    low = f_.lower(p, x)
    pre = low.as_text()
    txt = low.compile().as_text()
    with open(f"{out_dir}/stream_hlo_{name}.txt", "w") as fh:
        fh.write(txt)
    print(f"== {name}: lowered annotations {pre.count('_xla_stream_annotation')}; compiled: "
          f"annotations {txt.count('_xla_stream_annotation')}, call-start {len(re.findall(r'call-start', txt))}, "
          f"async-start {len(re.findall(r'async-start', txt))}, stream ids {sorted(set(re.findall(r'stream[_ ]?id[=:]?\"?(\\d+)', txt)))}")
    for line in txt.splitlines():
        if "_xla_stream_annotation" in line or "call-start" in line or "async-start" in line:
            print("  ", line.strip()[:240])
