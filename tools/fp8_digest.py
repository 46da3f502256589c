"""Digests of the blockwise-FP8 grouped GEMM's outputs on the benchmark shapes, to compare two CUDA libraries
bitwise (run once per library, JAX_MOE_FFI_CUDA_LIB set differently, and diff the lines): the kernel alone on
quantised operands (forward, and the dgrad's transposed-weight form), even and skewed groups, inputs from a fixed
seed. A changed scale layout or group mapping changes the digests; a pure refactor keeps them.

  JAX_MOE_FFI_CUDA_LIB=a.so python tools/fp8_digest.py > a.txt
  JAX_MOE_FFI_CUDA_LIB=b.so python tools/fp8_digest.py > b.txt; diff a.txt b.txt
"""
import hashlib
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _common  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi.ops import grouped_gemm_fp8 as fp8  # noqa: E402


def digest(x) -> str:
    return hashlib.sha256(np.asarray(x.astype(jnp.float32)).tobytes()).hexdigest()[:16]


def main():
    shapes = _common.load_shapes()
    rng = np.random.default_rng(0)
    print("cuda library:", jmf._registry.cuda_library_path, file=sys.stderr)
    for case in shapes["grouped_gemm"]:
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        dout = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
        rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), jnp.bfloat16)
        (fwd_w, fwd_s), (dg_w, dg_s) = fp8._weight_quant(rhs, False)
        a = jmf.quantize(lhs, "blockwise")
        d = jmf.quantize(dout, "blockwise")
        for kind in ("even", "skew"):
            sizes = jnp.asarray(_common.group_sizes(m, g, kind, shapes))
            out = jax.jit(fp8._fp8_call)(a.data, a.scale, fp8._e4m3(fwd_w), fwd_s, sizes)
            dlhs = jax.jit(fp8._fp8_call)(d.data, d.scale, fp8._e4m3(dg_w), dg_s, sizes)
            print(f"{case['name']} {kind} fwd {digest(out)} dgrad {digest(dlhs)}", flush=True)


if __name__ == "__main__":
    main()
