"""Grouped GEMM benchmark: ours vs XLA ragged_dot, tokamax, a dense matmul of equal FLOPs, torch._grouped_mm
(separate process, when torch is importable) and a copy for bandwidth, on the shapes of shapes.json.

  python benchmarks/grouped_gemm.py                 # on the GPU: all shapes, even+skew, fwd+fwd_bwd
  python benchmarks/grouped_gemm.py --cpu-scale 16  # on CPU: shapes scaled down 16x in M, K, N
  python benchmarks/grouped_gemm.py --recipe blockwise --no-torch   # FP8: adds ours_fp8 rows and dense_fp8

Writes benchmarks/results/grouped_gemm_<machine>.{json,md,png} (grouped_gemm_fp8_<machine> with --recipe).
With --recipe blockwise the rows are: `ours` (bf16), `ours_fp8` (the FP8 kernel on operands quantised
beforehand: the GEMM alone), `ours_fp8_with_quant` (grouped_matmul(recipe="blockwise") from bf16 operands:
quantising lhs and rhs, and in fwd_bwd the gradient, is inside the timing; bf16 weight gradient, the default),
`ours_fp8_fp8_wgrad` (fwd_bwd: the same with the FP8 weight gradient, fp8_wgrad=True),
`ours_fp8_cached_weights` (the weights quantised once outside the timing with quantize_weights, as for the
micro-batches of one step; lhs and the gradient quantised inside), `dense_fp8` (XLA's
dense FP8 matmul of equal FLOPs) and the same anchors as the bf16 run. `--passes wgrad` times the weight
gradient alone (`ours` bf16, `ours_fp8` kernel only, `ours_fp8_with_quant` with its operands' quantisation),
`--passes dgrad` the lhs gradient alone (`ours` bf16); torch._grouped_mm runs both passes too, so
`--passes fwd,dgrad,wgrad,fwd_bwd` says which of the three GEMMs of fwd_bwd trails which peer.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402


def impls(tokamax, dtype, recipe=None):
    out = {
        "ours": lambda a, b, s: jmf.grouped_matmul(a, b, s, preferred_element_type=dtype),
        "xla_ragged_dot": lambda a, b, s: jax.lax.ragged_dot(a, b, s, preferred_element_type=dtype),
    }
    if tokamax is not None:
        out["tokamax"] = lambda a, b, s: tokamax.ragged_dot(a, b, s, preferred_element_type=dtype,
                                                            implementation="mosaic")
    if recipe:
        out["ours_fp8_with_quant"] = lambda a, b, s: jmf.grouped_matmul(a, b, s, recipe=recipe)
        # fwd_bwd only: the same with the weight gradient in FP8 too (the opt-in fp8_wgrad=True)
        out["ours_fp8_fp8_wgrad"] = lambda a, b, s: jmf.grouped_matmul(a, b, s, recipe=recipe, fp8_wgrad=True)
    return out


def wgrad_rows(lhs, cot, sizes, recipe):
    """pass "wgrad" (the weight gradient alone, out[g] = lhs_g^T cot_g): {impl: (fn, args)}. ours: the bf16
    kernel; with a recipe, ours_fp8 (the FP8 wgrad kernel on operands quantised beforehand) and
    ours_fp8_with_quant (both operands' per-group transposed quantisation inside the timing)."""
    out = {"ours": (jax.jit(jmf.grouped_matmul_wgrad), (lhs, cot, sizes))}
    if recipe:
        from jax_moe_ffi.ops import grouped_gemm_fp8 as fp8
        from jax_moe_ffi.ops.quantize import quantize_groups_transposed
        at, sat, plan = jax.block_until_ready(quantize_groups_transposed(lhs, sizes))
        bt, sbt, _ = jax.block_until_ready(quantize_groups_transposed(cot, sizes))
        out["ours_fp8"] = (jax.jit(fp8._fp8_wgrad_call), (at, sat, bt, sbt, plan))
        out["ours_fp8_with_quant"] = (jax.jit(lambda a, b, s: fp8._wgrad_fp8(a, b, s, "e4m3")), (lhs, cot, sizes))
    return out


def dgrad_ours(cot, rhs, sizes):
    """pass "dgrad": the lhs gradient of lhs @ rhs[g] alone, cot[i] @ rhs[g(i)]^T (bf16 out)."""
    return jmf.grouped_matmul(cot, rhs, sizes, transpose_rhs=True, preferred_element_type=cot.dtype)


def fp8_kernel_only(lhs, rhs, sizes):
    """The FP8 kernel on operands quantised outside the timed function: (fn, args)."""
    from jax_moe_ffi.ops import grouped_gemm_fp8 as fp8
    qa = jmf.quantize(lhs, "blockwise")
    qw = jmf.quantize(rhs, "blockwise", block=(128, 128))
    bt = jax.block_until_ready(jnp.swapaxes(qw.data, 1, 2))
    return jax.jit(fp8._fp8_call), (qa.data, qa.scale, bt, qw.scale, sizes)


def fwd_bwd(f):
    """One forward, dgrad and wgrad (value_and_grad w.r.t. both operands with a fixed cotangent)."""
    def run(a, b, s, cot):
        out, vjp = jax.vjp(lambda a, b: f(a, b, s), a, b)
        return out, vjp(cot)
    return run


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-scale", type=int, default=0, help="divide M, K, N by this (CPU runs)")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names to run")
    ap.add_argument("--groups", default="even,skew")
    ap.add_argument("--passes", default="fwd,fwd_bwd")
    ap.add_argument("--skip", default="", help="comma-separated impls to skip")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--anchor-groups", default="even,skew",
                    help="group kinds on which the slow anchors (xla_ragged_dot, tokamax) run")
    ap.add_argument("--out", default="", help="result name (default grouped_gemm_<machine>)")
    ap.add_argument("--recipe", default="", help="FP8 recipe to add (blockwise)")
    args = ap.parse_args(argv)
    unknown = set(args.passes.split(",")) - {"fwd", "fwd_bwd", "dgrad", "wgrad"}
    if unknown:
        ap.error(f"--passes: unknown pass(es) {sorted(unknown)}; choose from fwd, fwd_bwd, dgrad, wgrad")

    shapes = _common.load_shapes()
    dtype = jnp.bfloat16
    on_gpu = jax.default_backend() == "gpu"
    tokamax = _common.import_tokamax() if on_gpu else None
    recipe = args.recipe or None
    fns = {k: v for k, v in impls(tokamax, dtype, recipe).items() if k not in args.skip.split(",")}
    rows = []
    result_name = args.out or (f"grouped_gemm_fp8_{_common.machine_tag()}" if recipe else
                               f"grouped_gemm_{_common.machine_tag()}")
    title = f"Grouped GEMM, bf16 vs FP8 {recipe} (TFLOP/s)" if recipe else "Grouped GEMM, bf16 (TFLOP/s)"

    def save(rows, done):
        """Results so far: written after every case too, so a run stopped by its time limit keeps them."""
        meta = _common.metadata(sys.argv if argv is None else ["benchmarks/grouped_gemm.py"] + argv)
        meta["dtype"] = "bfloat16" + (f"; FP8 recipe {recipe} (E4M3, 1x128 / 128x128 float32 scales)"
                                      if recipe else "")
        meta["cuda_library"] = jmf._registry.cuda_library_path
        if tokamax is not None:
            meta["tokamax"] = getattr(tokamax, "__version__", "?")
        if not done:
            meta["partial"] = "the run was still going when this was written (cases so far only)"
        return _common.write_results(result_name, meta, rows, "tflops", title, extra_md=ratio_table(rows))

    rng = np.random.default_rng(0)
    for case in shapes["grouped_gemm"]:
        if args.cases and not any(c in case["name"] for c in args.cases.split(",")):
            continue
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        if args.cpu_scale:
            m, k, n = m // args.cpu_scale, max(8, k // args.cpu_scale), max(8, n // args.cpu_scale)
        lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
        rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), dtype)
        cot = jnp.asarray(rng.standard_normal((m, n)), dtype)
        flops = 2.0 * m * k * n

        def add_row(impl, p, kind, ms, tf, label=None):
            """One timed grouped row: kept for the results and printed as it comes."""
            rows.append({"case": case["name"], "impl": impl, "pass": p, "groups": kind, "ms": ms, "tflops": tf,
                         "M": m, "K": k, "N": n, "G": g})
            print(f"{case['name']:>30} {kind:>4} {p:>7} {label or impl:>15} {ms:9.3f} ms {tf:9.3f} TFLOP/s",
                  flush=True)

        for kind in args.groups.split(","):
            sizes = jnp.asarray(_common.group_sizes(m, g, kind, shapes))
            for p in args.passes.split(","):
                if p == "wgrad":
                    for name, (fn, a) in wgrad_rows(lhs, cot, sizes, recipe).items():
                        if name in args.skip.split(","):
                            continue
                        ms = _common.time_ms(fn, *a)
                        add_row(name, p, kind, ms, flops / ms / 1e9)
                    continue
                if p == "dgrad":
                    # the lhs gradient alone, dlhs[i] = cot[i] @ rhs[g(i)]^T (bf16 kernel, the form the custom_vjp
                    # runs), beside torch's own dgrad: with "wgrad" it splits fwd_bwd into its three GEMMs
                    fn = jax.jit(dgrad_ours)
                    ms = _common.time_ms(fn, cot, rhs, sizes)
                    add_row("ours", p, kind, ms, flops / ms / 1e9)
                    continue
                if recipe and p == "fwd" and "ours_fp8" not in args.skip.split(","):
                    fn, a = fp8_kernel_only(lhs, rhs, sizes)
                    ms = _common.time_ms(fn, *a)
                    add_row("ours_fp8", p, kind, ms, flops / ms / 1e9)
                if recipe and "ours_fp8_cached_weights" not in args.skip.split(","):
                    # weights quantised once outside the timing (quantize_weights: once per step for all its
                    # micro-batches); lhs, and in fwd_bwd the gradient, quantised inside; bf16 weight gradient
                    wq = jax.block_until_ready(jmf.quantize_weights(rhs))
                    cached = lambda a, b, s, wq: jmf.grouped_matmul(a, b, s, recipe=recipe, fp8_weights=wq)
                    if p == "fwd":
                        fn, a = jax.jit(cached), (lhs, rhs, sizes, wq)
                    else:
                        fn = jax.jit(lambda a, b, s, cot, wq: fwd_bwd(lambda a, b, s: cached(a, b, s, wq))(a, b, s,
                                                                                                          cot))
                        a = (lhs, rhs, sizes, cot, wq)
                    ms = _common.time_ms(fn, *a)
                    add_row("ours_fp8_cached_weights", p, kind, ms, (flops if p == "fwd" else 3 * flops) / ms / 1e9,
                            label="fp8_cached_w")
                    del wq, a
                for name, f in fns.items():
                    if name in ("xla_ragged_dot", "tokamax") and kind not in args.anchor_groups.split(","):
                        continue
                    if name == "ours_fp8_fp8_wgrad" and p == "fwd":  # the forward is ours_fp8_with_quant's
                        continue
                    fn = jax.jit(f) if p == "fwd" else jax.jit(fwd_bwd(f))
                    a = (lhs, rhs, sizes) if p == "fwd" else (lhs, rhs, sizes, cot)
                    try:
                        ms = _common.time_ms(fn, *a)
                    except Exception as e:  # noqa: BLE001 - a failing anchor is reported, not fatal
                        print(f"{case['name']} {name} {p} {kind}: FAILED {type(e).__name__}: {str(e)[:200]}")
                        continue
                    add_row(name, p, kind, ms, (flops if p == "fwd" else 3 * flops) / ms / 1e9)
        # anchors independent of the grouping: a dense matmul of equal FLOPs and a copy (--skip dense,copy
        # leaves them out of A/B sweeps)
        skip = args.skip.split(",")
        if "dense" not in skip:
            dense = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=dtype))
            ms = _common.time_ms(dense, lhs, rhs[0])
            rows.append({"case": case["name"], "impl": "dense", "pass": "fwd", "groups": "even", "ms": ms,
                         "tflops": flops / ms / 1e9})
        if recipe and "dense" not in skip:
            a8 = lhs.astype(jnp.float8_e4m3fn)
            b8t = jnp.swapaxes(rhs[0], 0, 1).astype(jnp.float8_e4m3fn)  # [N, K]: K-major, cuBLASLt's FP8 layout
            dense8 = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                                                              preferred_element_type=dtype))
            try:
                ms = _common.time_ms(dense8, a8, b8t)
                rows.append({"case": case["name"], "impl": "dense_fp8", "pass": "fwd", "groups": "even", "ms": ms,
                             "tflops": flops / ms / 1e9})
            except Exception as e:  # noqa: BLE001
                print(f"{case['name']} dense_fp8: FAILED {type(e).__name__}: {str(e)[:200]}")
        if "copy" not in skip:
            copy = jax.jit(lambda a: a * 2)
            big = jnp.asarray(rng.standard_normal((g, k, n)), dtype)
            ms = _common.time_ms(copy, big)
            rows.append({"case": case["name"], "impl": "copy", "pass": "fwd", "groups": "even", "ms": ms,
                         "gbps": 2 * big.size * 2 / ms / 1e6})
        save(rows, done=False)
    if on_gpu and not args.no_torch:
        rows += torch_rows(args)
    path = save(rows, done=True)
    print(f"wrote {path}")
    summarize(rows)


def torch_rows(args) -> list[dict]:
    script = Path(__file__).with_name("torch_grouped_mm.py")
    cmd = [sys.executable, str(script), "--groups", args.groups, "--passes", args.passes]
    if args.cases:
        cmd += ["--cases", args.cases]
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stderr[-2000:])
    rows = []
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
            r = rows[-1]
            print(f"{r['case']:>30} {r['groups']:>4} {r['pass']:>7} {r['impl']:>15} {r['ms']:9.3f} ms "
                  f"{r['tflops']:8.1f} TFLOP/s")
    return rows


PEERS = ("torch_grouped_mm", "tokamax", "xla_ragged_dot")
OURS = ("ours", "ours_fp8", "ours_fp8_with_quant", "ours_fp8_fp8_wgrad", "ours_fp8_cached_weights")


def ratio_rows(rows) -> list[dict]:
    """Same-run ratios against the targets of the grouped-GEMM issues (#3: vs torch._grouped_mm and tokamax,
    skewed / even; #6: FP8 vs our bf16), one dict per (case, pass, groups, our impl); None where a peer is absent."""
    by = {(r["case"], r["impl"], r["pass"], r["groups"]): r for r in rows}
    out = []
    for (case, impl, p, kind), r in by.items():
        if impl not in OURS:
            continue
        ratio = lambda other: None if other is None else r["tflops"] / other["tflops"]
        row = {"case": case, "pass": p, "groups": kind, "impl": impl, "tflops": r["tflops"],
               "vs_ours_bf16": ratio(by.get((case, "ours", p, kind))) if impl != "ours" else None}
        for peer in PEERS:
            row[f"vs_{peer}"] = ratio(by.get((case, peer, p, kind)))
        row["skew_over_even"] = ratio(by.get((case, impl, p, "even"))) if kind == "skew" else None
        out.append(row)
    return out


def ratio_table(rows) -> list[str]:
    """The ratios as a markdown table (empty columns left out), for the results' .md."""
    rr = ratio_rows(rows)
    keys = [k for k in ("vs_ours_bf16", *(f"vs_{p}" for p in PEERS), "skew_over_even")
            if any(r[k] is not None for r in rr)]
    if not rr or not keys:
        return []
    fmt = lambda v: "" if v is None else f"{v:.2f}"
    lines = ["", "## Same-run ratios", "", "| case | pass | groups | impl | TFLOP/s | " + " | ".join(keys) + " |",
             "|" + "---|" * (5 + len(keys))]
    for r in rr:
        lines.append(f"| {r['case']} | {r['pass']} | {r['groups']} | {r['impl']} | {r['tflops']:.4g} | "
                     + " | ".join(fmt(r[k]) for k in keys) + " |")
    return lines


def summarize(rows):
    """Prints the same-run ratios (ratio_rows) a line each."""
    for r in ratio_rows(rows):
        parts = [f"{r['vs_ours_bf16']:.2f}x ours (bf16)"] if r["vs_ours_bf16"] is not None else []
        parts += [f"{r[f'vs_{peer}']:.2f}x {peer}" for peer in PEERS if r[f"vs_{peer}"] is not None]
        if r["skew_over_even"] is not None:
            parts.append(f"skew/even {r['skew_over_even']:.2f}")
        print(f"{r['case']:>30} {r['groups']:>4} {r['pass']:>7} {r['impl']}: {r['tflops']:.0f} TFLOP/s; "
              + ", ".join(parts))


if __name__ == "__main__":
    main()
