"""FP8 quantize benchmark (issue 6): `jax_moe_ffi.quantize` vs an elementwise copy of the same bytes, on the
operands of the `grouped_gemm` shapes of shapes.json (bf16 in).

Cases (per grouped_gemm shape; `case` = "<shape> <operand> <recipe>"):
  lhs mxfp8          activations [M, K] -> MXFP8 E4M3, 32-element blocks along K (rowwise, axis=-1)
  lhs mxfp8 colwise  the same [M, K] quantised along M (axis=-2: the wgrad operand; a native colwise kernel, no transposes)
  lhs blockwise      activations [M, K] -> 1 x 128 blocks along K, float32 scales
  rhs blockwise      weights [G, K, N] -> 128 x 128 tiles, float32 scales
Impls:
  ours           jax_moe_ffi.quantize (the FFI kernel; native colwise for axis=-2)
  xla_reference  jax_moe_ffi.reference.quantize_reference (the same bits in pure JAX: the GPU fallback)
  naive          what a JAX user writes: per-block amax, x / scale, clip, astype(float8) (not bit-exact)
  copy           y = 2 * a over a bf16 array of half the bytes below (same bytes read + written)
Bytes of a pass = input read once + FP8 data and scales written once = n*2 + n + scale bytes.
The issue's target: ours >= 70% of copy bandwidth.

  python benchmarks/quantize.py                 # on the GPU
  python benchmarks/quantize.py --cpu-scale 64  # CPU smoke run: M, K, N divided by 64 (G by 8)

Writes benchmarks/results/quantize_<machine>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi import reference  # noqa: E402

# (operand, recipe label, quantize kwargs)
VARIANTS = [
    ("lhs", "mxfp8", dict(recipe="mxfp8", axis=-1)),
    ("lhs", "mxfp8 colwise", dict(recipe="mxfp8", axis=-2)),
    ("lhs", "blockwise", dict(recipe="blockwise", axis=-1)),
    ("rhs", "blockwise", dict(recipe="blockwise", axis=-2, block=(128, 128))),
    # the FP8 GEMM's weight operands: 128 x 128 tiles written transposed (forward, K-major) and as stored
    # (dgrad) in one pass, against quantize + XLA's transpose of the codes (what the GEMM ran before)
    ("rhs", "blockwise transposed+plain", dict(recipe="blockwise", block=(128, 128), tiles_t="both")),
    ("rhs", "blockwise transposed", dict(recipe="blockwise", block=(128, 128), tiles_t="t")),
]


def naive_quantize(x, recipe, axis=-1, block=None):
    """The usual jnp formulation (amax per block, divide, clip, cast); not bit-exact to the spec."""
    if recipe == "mxfp8" or block is None:
        b = 32 if recipe == "mxfp8" else 128
        xm = jnp.moveaxis(x, axis, -1).astype(jnp.float32)
        blk = xm.reshape(xm.shape[:-1] + (-1, b))
        amax = jnp.max(jnp.abs(blk), axis=-1, keepdims=True)
        if recipe == "mxfp8":
            e = jnp.floor(jnp.log2(jnp.maximum(amax, 2.0 ** -127))) - 8
            scale = jnp.exp2(e)
            s_out = (jnp.clip(e, -127, 127) + 127).astype(jnp.uint8)[..., 0]
        else:
            scale = jnp.where(amax > 0, amax / 448.0, 1.0)
            s_out = scale[..., 0]
        q = jnp.clip(blk / scale, -448, 448).astype(jnp.float8_e4m3fn).reshape(xm.shape)
        return jnp.moveaxis(q, -1, axis), jnp.moveaxis(s_out, -1, axis)
    g, k, n = x.shape
    blk = x.astype(jnp.float32).reshape(g, k // 128, 128, n // 128, 128)
    amax = jnp.max(jnp.abs(blk), axis=(2, 4), keepdims=True)
    scale = jnp.where(amax > 0, amax / 448.0, 1.0)
    q = jnp.clip(blk / scale, -448, 448).astype(jnp.float8_e4m3fn).reshape(x.shape)
    return q, scale[:, :, 0, :, 0]


def scale_bytes(shape, kw) -> int:
    if kw.get("block") == (128, 128):
        return int(np.prod(shape[:-2])) * (-(-shape[-2] // 128)) * (-(-shape[-1] // 128)) * 4
    b, w = (32, 1) if kw["recipe"] == "mxfp8" else (128, 4)
    ax = kw.get("axis", -1)
    return int(np.prod(shape)) // shape[ax] * (-(-shape[ax] // b)) * w


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-scale", type=int, default=0, help="divide M, K, N by this and G by 8 (CPU smoke runs)")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names to run")
    ap.add_argument("--skip", default="", help="comma-separated impls to skip")
    ap.add_argument("--out", default="", help="result name (default quantize_<machine>)")
    args = ap.parse_args(argv)

    shapes = _common.load_shapes()
    skip = set(args.skip.split(","))
    key = jax.random.key(0)
    rows_out = []
    for case in shapes["grouped_gemm"]:
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        if args.cpu_scale:
            s = args.cpu_scale
            m, k, n, g = max(128, m // s), max(128, k // s), max(128, n // s), max(1, g // 8)
        for operand, label, kw in VARIANTS:
            name = f"{case['name']} {operand} {label}"
            if args.cases and not any(cc in name for cc in args.cases.split(",")):
                continue
            shape = (m, k) if operand == "lhs" else (g, k, n)
            key, sub = jax.random.split(key)
            x = jax.random.normal(sub, shape, jnp.bfloat16)
            nel = int(np.prod(shape))
            kw = dict(kw)  # VARIANTS is shared by every case
            tiles_t = kw.pop("tiles_t", None)
            nbytes = nel * 2 + nel * (2 if tiles_t == "both" else 1) + scale_bytes(shape, kw)
            base = {"case": name, "shape": list(shape), "recipe": kw["recipe"], "axis": kw.get("axis", -1),
                    "block": list(kw.get("block") or ((1, 32) if kw["recipe"] == "mxfp8" else (1, 128))),
                    "bytes": nbytes, "groups": "n/a", "pass": "quantize"}

            def record(impl, ms):
                gbps = nbytes / ms / 1e6
                rows_out.append({**base, "impl": impl, "ms": ms, "gbps": gbps})
                print(f"{name:>48} {impl:>14} {ms:9.4f} ms {gbps:8.1f} GB/s", flush=True)

            ours = jax.jit(lambda a, kw=kw: jmf.quantize(a, **kw))
            impls = {
                "ours": ours,
                "xla_reference": jax.jit(lambda a, kw=kw: reference.quantize_reference(a, **kw)),
                "naive": jax.jit(lambda a, kw=kw: naive_quantize(a, **kw)),
            }
            if tiles_t is not None:
                both = tiles_t == "both"

                def then_transpose(a, kw=kw, both=both):
                    q = jmf.quantize(a, **kw)
                    t = jmf.QuantizedArray(jnp.swapaxes(q.data, -1, -2), jnp.swapaxes(q.scale, -1, -2),
                                           q.recipe, q.axis, q.block)
                    return (t, q) if both else t

                impls = {"ours": jax.jit(lambda a, both=both: jmf.quantize_tiles_transposed(a, plain=both)
                                         if both else jmf.quantize_tiles_transposed(a)[0]),
                         "quantize_then_xla_transpose": jax.jit(then_transpose)}
            want = None
            for impl, fn in impls.items():
                if impl in skip:
                    continue
                try:
                    out = fn(x)
                    if impl == "ours":
                        want = out
                    elif impl == "quantize_then_xla_transpose" and want is not None:
                        for o, w in zip(jax.tree.leaves(out), jax.tree.leaves(want)):
                            np.testing.assert_array_equal(np.asarray(o).view(np.uint8) if o.dtype.itemsize == 1
                                                          else np.asarray(o), np.asarray(w).view(np.uint8)
                                                          if w.dtype.itemsize == 1 else np.asarray(w))
                    elif impl == "xla_reference" and want is not None:  # same bits, or the run is void
                        np.testing.assert_array_equal(np.asarray(out.data).view(np.uint8),
                                                      np.asarray(want.data).view(np.uint8))
                        np.testing.assert_array_equal(np.asarray(out.scale), np.asarray(want.scale))
                    record(impl, _common.time_ms(fn, x))
                except Exception as ex:  # noqa: BLE001 - a failing anchor is reported, not fatal
                    print(f"{name} {impl}: FAILED {type(ex).__name__}: {str(ex)[:300]}")
            if "copy" not in skip:
                big = jnp.zeros((nbytes // 4,), jnp.bfloat16) + 1  # reads + writes nbytes in total
                record("copy", _common.time_ms(jax.jit(lambda a: a * 2), big))

    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/quantize.py"] + argv)
    meta["dtype"] = "bfloat16 in, float8_e4m3fn out"
    meta["gpu"] = jax.devices()[0].device_kind
    meta["cuda_library"] = jmf._registry.cuda_library_path
    meta["bytes"] = "input read once + fp8 data and scales written once: n*2 + n + scale bytes"
    meta["summary"] = summarize(rows_out)
    out_name = args.out or f"quantize_{_common.machine_tag()}"
    path = _common.write_results(out_name, meta, rows_out, "gbps", "FP8 quantize, bf16 in (GB/s)",
                                 plot_groups=("n/a",))
    print(f"wrote {path}")
    for line in meta["summary"]:
        print(line)


def summarize(rows) -> list[str]:
    """Same-run ratios against the issue's target (>= 70% of copy bandwidth)."""
    by = {(r["case"], r["impl"]): r for r in rows}
    out = []
    for (case, impl), r in by.items():
        if impl != "ours":
            continue
        parts = []
        cp = by.get((case, "copy"))
        if cp:
            frac = r["gbps"] / cp["gbps"]
            parts.append(f"{frac:.0%} of copy ({'meets' if frac >= 0.7 else 'MISSES'} the 70% target)")
        for peer in ("xla_reference", "naive"):
            o = by.get((case, peer))
            if o:
                parts.append(f"{o['ms'] / r['ms']:.2f}x faster than {peer}")
        out.append(f"{case}: {r['gbps']:.0f} GB/s; " + ", ".join(parts))
    return out


if __name__ == "__main__":
    main()
