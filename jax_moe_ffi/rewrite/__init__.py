"""The compiler pass: `optimize(fn)` rewrites naive MoE layers into dispatch -> grouped GEMM -> combine;
`explain(fn, *args)` reports what it would rewrite and why not elsewhere.

Pipeline: trace (`ir`: jaxpr -> renamed IR, calls inlined, scan/remat/cond/while/shard_map bodies as
sub-programs) -> facts (`facts`: which values are top_k indices, one-hot/k-sparse masks, iotas) -> sites
(`match`, `loops`: reductions over experts proven k-sparse, and the pointwise region feeding them; `ragged`:
`jax.lax.ragged_dot` calls, already grouped; `gathered`: dots of expert weights gathered per (token, choice))
-> emit (`emit`) -> evaluation (`interp`) -> `report`.
"""
from __future__ import annotations

import functools
import os
import warnings

import jax
import numpy as np

from jax_moe_ffi.rewrite import emit as EM
from jax_moe_ffi.rewrite.interp import Plan, run
from jax_moe_ffi.rewrite.ir import program_from_closed, scan_split, source_line
from jax_moe_ffi.rewrite.report import MissReport, Report, SiteReport

__all__ = ["optimize", "explain", "Report", "SiteReport", "MissReport"]

MODES = ("exact", "dropless")
RECIPES = (None, "blockwise", "mxfp8")  # FP8 expert GEMMs: see ops/grouped_gemm_fp8.py


def _check_opts(mode, recipe, offload, streams):
    if mode not in MODES:
        raise ValueError(f"optimize: mode must be one of {MODES}, got {mode!r}")
    if recipe not in RECIPES:
        raise ValueError(f"optimize: recipe must be one of {RECIPES}, got {recipe!r}")
    del streams
    from jax_moe_ffi import runtime
    return runtime.offload_mode(offload)  # None, "pinned_host", "device" or ((name, space), ...); else ValueError


def _hoist_fp8_weights() -> bool:
    """recipe="blockwise": quantise a scan's expert weights once before the loop (interp.hoistable_fp8_inputs);
    JAX_MOE_FFI_HOIST_FP8_WEIGHTS=0 when optimize() / explain() is called keeps it per iteration in the body."""
    return os.environ.get("JAX_MOE_FFI_HOIST_FP8_WEIGHTS", "1") != "0"


def _is_array(x):
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or hasattr(x, "aval") or \
        isinstance(x, jax.ShapeDtypeStruct)


def _aval_key(x):
    aval = jax.typeof(x) if not isinstance(x, jax.ShapeDtypeStruct) else x
    return (tuple(aval.shape), str(aval.dtype), bool(getattr(aval, "weak_type", False)))


def _static_key(x):
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


class _Entry:
    def __init__(self, plan, out_tree, cacheable):
        self.plan = plan
        self.out_tree = out_tree
        self.cacheable = cacheable


def _trace(fn, args, kwargs, mode, options=None):
    leaves, treedef = jax.tree.flatten((args, kwargs))
    dyn = [i for i, x in enumerate(leaves) if _is_array(x)]

    def flat_fn(*d):
        ls = list(leaves)
        for i, v in zip(dyn, d):
            ls[i] = v
        a, kw = jax.tree.unflatten(treedef, ls)
        return fn(*a, **kw)

    specs = []
    for i in dyn:
        x = leaves[i]
        aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
        specs.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False)))
    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)
    prog = program_from_closed(closed)
    plan = Plan(prog, mode, options=options)
    cacheable = not any(isinstance(c, jax.core.Tracer) for c in closed.consts)
    return _Entry(plan, jax.tree.structure(out_shape), cacheable), leaves, treedef, dyn


def _key(args, kwargs):
    leaves, treedef = jax.tree.flatten((args, kwargs))
    return (treedef, tuple(_aval_key(x) if _is_array(x) else ("static", _static_key(x)) for x in leaves))


def optimize(fn, *, mode="exact", recipe=None, offload=None, streams=True, keep_prevent_cse=False):
    """Rewrite the naive MoE layers in `fn` into dispatch -> grouped GEMM -> combine.

    Returns a function with `fn`'s signature and pytrees. It traces `fn` per input signature (cached;
    non-array leaves are static), finds every MoE site the analysis can prove (see `explain`), and
    evaluates the rewritten program; it composes with `jax.jit`, `jax.grad` (through the ops'
    custom_vjp), `jax.vmap`, `lax.scan` and `jax.checkpoint`.

    mode: "exact" reproduces `fn` (capacity drops and priority order included, within dtype rounding);
      "dropless" ignores expert capacity (every selected pair is computed; the report says so).
    recipe: None (expert GEMMs in the model's dtype), "blockwise" (FP8 E4M3 with 1 x 128 / 128 x 128 float32
      scales: the fast Hopper path) or "mxfp8" (OCP MX operands, multiplied in bf16 on Hopper). FP8 changes
      the numerics by FP8 rounding, so mode="exact" then means exact routing and drops, not exact values.
      With "blockwise", expert weights that a `lax.scan` body reads as stored (the stacked per-layer weights,
      or one closed over) are quantised once before the loop for all iterations (bitwise the per-layer
      quantisation; 3.5-4.6% off the H200 Qwen3-shaped FP8 step). The cost is memory: every layer's FP8 weights
      (2 bytes per expert weight element, both orientations) live for the whole step, +0.9-1.3 GB peak on that
      4-layer step. JAX_MOE_FFI_HOIST_FP8_WEIGHTS=0 when optimize() is called keeps it in the body.
    offload: None, "pinned_host" (True and "host" say the same), "device", or a mapping {tag: "pinned_host" |
      "device"} over runtime.OFFLOAD_NAMES (e.g. {"moe_dispatched_rows": "pinned_host", "moe_expert_hidden":
      "device"}: only the rows cross PCIe) and the per-GEMM names "moe_expert_hidden.<i>" (the i-th expert GEMM
      output; an indexed name overrides its family: {"moe_dispatched_rows": "device", "moe_expert_hidden":
      "device", "moe_expert_hidden.0": "pinned_host"} offloads only the gate projection's output, which on the
      H200 cost 5% of a DeepSeek-shaped step for a peak 0.54 GB lower, where gate and up together cost 22%:
      docs/performance_history.md, "Streams and host offload"). The dispatched rows and the expert
      GEMM outputs are tagged (runtime.tag), and every `jax.checkpoint` region of `fn` that holds a site keeps its
      own policy for everything else but, for the tags, "pinned_host" offloads the dispatched rows and expert
      outputs to host memory and "device" saves the dispatched rows and expert GEMM outputs (with
      recipe="blockwise" also the weights' FP8 quantisation, "moe_fp8_weights") on the device (the
      backward then recomputes no expert GEMM, for more memory; on the H200 that was 16% faster on a DeepSeek-
      shaped scan and 7% slower on a Qwen3-shaped one, where stacking the saved values cost more than the
      recompute: docs/performance_history.md, "Streams and host offload"). The returned function also carries
      `.offload_policy` (runtime.moe_remat_policy) for `jax.checkpoint(fast, policy=...)` around it.
    streams: run the combine, and any side branch beside a site (computed from its tokens, neither feeding nor
      using a site: a shared expert), under GPU stream annotations (runtime.on_stream); XLA reads them with
      `jax_moe_ffi.runtime.apply_xla_flags()` set before the backend starts (XLA's CUDA graphs kept, with
      CONCURRENT scheduling inside them). On the H200 (jaxlib 0.11.2) no step-time gain from the annotations
      was measured, with graphs on or off; the flags themselves took 1.3-2% off the Qwen3 train step: see
      README "Streams and host offload". Under jax.vmap nothing is placed (said once): the ops batch as a
      loop, which XLA:GPU cannot run inside a stream-annotated call (runtime.on_stream).
    keep_prevent_cse: a `jax.checkpoint` region holding a site, directly inside a `lax.scan` / `while_loop` body,
      is rebuilt with prevent_cse=False (the default here): in a loop XLA cannot merge the backward's recompute
      with the forward, and the optimization barrier that prevent_cse=True puts on the recompute's inputs makes
      XLA copy the layer's weights out of the stacked weights every step. True keeps the model's setting.
      The values computed are the same (gradients bitwise on the CPU, tests/test_rewrite.py); on the GPU XLA may
      fuse the backward differently, so bf16 results can differ by rounding. On the H200 Qwen3-shaped train step
      dropping it took 3.0-6.4% off the step (docs/performance_history.md, "Training step", session 26).
    If nothing matches, the function runs unchanged and a warning is given once.
    A scanned model also gains from `jax_moe_ffi.runtime.uninitialized_scan_outputs()` around its jitted step's
    first call (JAX's zero fill of the scans' stacked outputs skipped; explain() names the scans).
    """
    offload = _check_opts(mode, recipe, offload, streams)
    if not isinstance(keep_prevent_cse, (bool, np.bool_)):
        raise TypeError(f"optimize: keep_prevent_cse must be a bool, got {keep_prevent_cse!r}")
    hoist_fp8_weights = _hoist_fp8_weights()  # read once, here: an A/B can build both variants in one process
    cache = {}
    warned = []

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        key = _key(args, kwargs)
        entry = cache.get(key)
        if entry is None:
            entry, _, _, _ = _trace(fn, args, kwargs, mode, {"streams": streams, "offload": offload,
                                                             "recipe": recipe, "keep_prevent_cse": keep_prevent_cse,
                                                             "hoist_fp8_weights": hoist_fp8_weights})
            if entry.cacheable:
                cache[key] = entry
        if not entry.plan.has_sites():
            if not warned:
                warned.append(True)
                misses = entry.plan.all_misses()
                why = "; ".join(sorted({m["reason"] for m in misses}))[:500]
                warnings.warn(f"jax_moe_ffi.optimize: no MoE site found in {_name(fn)}; it runs unchanged"
                              + (f" (near-misses: {why})" if why else ""), RuntimeWarning, stacklevel=2)
            return fn(*args, **kwargs)
        leaves = jax.tree.leaves((args, kwargs))
        dyn = [x for x in leaves if _is_array(x)]
        outs = run(entry.plan, dyn)
        return jax.tree.unflatten(entry.out_tree, outs)

    wrapped.jax_moe_ffi_options = {"mode": mode, "recipe": recipe, "offload": offload, "streams": streams,
                                   "keep_prevent_cse": keep_prevent_cse}
    if offload:
        from jax_moe_ffi import runtime
        # the remat policy for the tagged MoE intermediates (offloaded or saved, per `offload`): use it as
        # jax.checkpoint(layer, policy=fast.offload_policy) (e.g. on a scanned layer body)
        wrapped.offload_policy = runtime.moe_remat_policy(offload)
    wrapped.explain = lambda *a, **kw: explain(fn, *a, mode=mode, recipe=recipe, offload=offload, streams=streams,
                                               keep_prevent_cse=keep_prevent_cse, **kw)
    return wrapped


def _gemm_dtypes_without_cuda_kernel(plan):
    """The operand dtypes of the rewritten expert GEMMs that the CUDA grouped GEMM does not take, sorted."""
    dts = set()
    for p in plan.all_plans():
        for s in p.sites:
            for g in s.gemms.values():
                dts.update((np.dtype(g["w"].dtype), np.dtype(g["rows_from"].dtype)))
        for e in p.ragged:
            dts.update(np.dtype(a.dtype) for a in e.ins[:2])
        for g in p.gathered.values():
            dts.add(np.dtype(g.w.dtype))
    from jax_moe_ffi.ops._common import GPU_DTYPES  # the dtypes the CUDA grouped GEMM takes
    return sorted(str(d) for d in dts if d not in GPU_DTYPES)


def explain(fn, *args, mode="exact", recipe=None, offload=None, streams=True, keep_prevent_cse=False,
            **kwargs) -> Report:
    """What `optimize(fn, mode=...)` rewrites for these arguments (arrays or ShapeDtypeStructs).

    Report.sites: per MoE site the pattern family, E, k, capacity, shapes, source line, estimated FLOPs
    and largest buffer before/after. Report.misses: near-misses with the reason they were left alone.
    """
    offload = _check_opts(mode, recipe, offload, streams)
    entry, _, _, _ = _trace(fn, args, kwargs, mode, {"streams": streams, "offload": offload, "recipe": recipe,
                                                     "keep_prevent_cse": keep_prevent_cse,
                                                     "hoist_fp8_weights": _hoist_fp8_weights()})
    plan = entry.plan
    sites = []
    for s, prog in ((s, p.prog) for p in plan.all_plans() for s in p.sites):
        extra = [EM.capacity_plan(s, prog)[1]] if mode == "exact" and s.S is not None else []
        if EM.residuals_stacked(s.path or "") or offload is not None:
            extra.append("GEMM outputs and dispatched rows behind an optimization barrier: "
                         + ("a lax.scan body with no jax.checkpoint around the site stacks them for the backward"
                            if EM.residuals_stacked(s.path or "") else f"offload={offload!r} saves them")
                         + ", and XLA's GPU dynamic-slice fusion would otherwise clone their custom calls")
        if EM.fold_target(s, prog) is not None:
            extra.append("combine weights folded into the last expert GEMM's lhs rows (sum_j w_j (h_j W) = "
                         "sum_j (w_j h_j) W): the combine is a plain sum and its backward a gather")
        extra = [n for n in extra if n not in s.notes]
        sites.append(SiteReport(family=s.family, E=s.E, k=s.k, capacity=s.C, tokens=s.token_shape,
                                shapes=s.shapes, source=s.source, path=s.path, flops_before=s.flops_before,
                                flops_after=s.flops_after, bytes_before=s.bytes_before,
                                bytes_after=s.bytes_after, dropless=(mode == "dropless" and s.C is not None),
                                notes=list(s.notes) + extra + (["mode='dropless': expert capacity ignored, no token "
                                                        "is dropped (differs from the model when it drops)"]
                                                       if mode == "dropless" and s.C is not None else [])))
    from jax_moe_ffi.rewrite import ragged as RG
    for p in plan.all_plans():
        for e, m in p.ragged.items():
            fl = RG.flops(e)
            nbytes = max(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in list(e.ins[:2]) + e.outs)
            g = e.ins[2].shape[0]
            sites.append(SiteReport(
                family=RG.FAMILY, E=g, k=None, capacity=None, tokens=(e.ins[0].shape[0],),
                shapes={"gemms": [(tuple(e.ins[0].shape), tuple(e.ins[1].shape))]}, source=source_line(e),
                path=p.path, flops_before=fl, flops_after=fl, bytes_before=nbytes, bytes_after=nbytes,
                notes=[f"jax.lax.ragged_dot ({m}) -> " + ("grouped_matmul_wgrad" if m == "wgrad" else
                       "grouped_matmul" + (", transpose_rhs" if m == "fwd_t" else "")) +
                       ": same FLOPs; XLA's GPU ragged_dot is a dense masked dot"]))
    from jax_moe_ffi.rewrite import gathered as GD
    for p in plan.all_plans():
        for e, g in p.gathered.items():
            fl, kk, nn = g.flops()
            item = np.dtype(g.w.dtype).itemsize
            copy = g.rows * kk * nn * item  # the [*B, K, N] weight copy the naive form makes
            sites.append(SiteReport(
                family=GD.FAMILY, E=g.w.shape[0], k=None, capacity=None, tokens=g.B,
                shapes={"gemms": [((g.rows, kk), tuple(g.w.shape))]}, source=source_line(e), path=p.path,
                flops_before=fl, flops_after=fl, bytes_before=copy,
                bytes_after=max(int(np.prod(g.w.shape)), g.rows * max(kk, nn)) * item,
                notes=[f"expert weights gathered per (token, choice) at {source_line(g.gather)} -> rows sorted by "
                       f"expert, grouped_matmul{', transpose_rhs' if g.transpose_rhs else ''}, un-sorted: the "
                       f"{'x'.join(map(str, g.B + (kk, nn)))} weight copy ({copy / 2**20:.1f} MiB) is not made"
                       + ("; ids clamped into [0, E) as the gather clamps them" if g.clip else "")]))
    misses = [MissReport(reason=m["reason"], source=m["source"], op=m["op"], shapes=m["shapes"],
                         path=m.get("path", ""), at=m.get("at")) for m in plan.all_misses()]
    notes = []
    if recipe is not None:
        notes.append(f"recipe={recipe!r}: expert GEMMs take FP8 operands "
                     + ("(E4M3, 1x128 activation / 128x128 weight float32 scales; CUDA FP8 kernel, bf16 wgrad)"
                        if recipe == "blockwise" else "(MXFP8, 1x32 E8M0 scales; multiplied in bf16 on Hopper)")
                     + "; values differ from the model by FP8 rounding")
        if recipe == "blockwise":
            # measured, not modelled: README "Session 29" (one H200, the Qwen3-30B-shaped train_step.py)
            notes.append("recipe='blockwise' costs a quantisation of every FP8 GEMM's rows at run time (about 3 "
                         "bytes moved per element, near the copy rate), which grows with tokens as the FP8 GEMMs' "
                         "saving does; the weights' quantisation is paid once a step. On one H200, experts of "
                         "2048 x 768 (Qwen3-30B): the training step is 0.96x of bf16 at 4 x 2048 tokens and "
                         "1.00-1.015x from 16 x 2048 (the FP8 grouped GEMM forward alone: 1.4-1.8x bf16 on the "
                         "benchmark shapes, with cached weights and its rows quantised beforehand)")
    remats_with_sites = [p for p in plan.all_plans()
                         if p.path.endswith("remat/") and any(q.sites for q in p.all_plans())]
    from jax_moe_ffi.rewrite import interp as _interp
    hoisted = []  # (scan path, number of weights quantised before the loop)
    for p in plan.all_plans():
        for e, subs in p.subplans.items():
            h = _interp.hoistable_fp8_inputs(subs[0]) if e.kind == "scan" else {}
            if h:  # the carry's weights change every iteration: those stay in the body
                nc, nk = scan_split(e.params, e.ins)
                h = [i for i in h if i < nc or i >= nc + nk]
                if h:
                    hoisted.append((p.path + "scan/", len(h)))
    if hoisted:
        notes.append("recipe='blockwise' in a lax.scan: " + ", ".join(f"{n} expert weight(s) of {path}"
                                                                      for path, n in hoisted)
                     + " quantised once before the loop for all its iterations (128x128 tiles, both orientations, "
                       "the stacked weights in one pass), not per iteration in the body and again in a "
                       "jax.checkpoint's recompute; all layers' FP8 weights (2 bytes per element) then live for "
                       "the whole step: JAX_MOE_FFI_HOIST_FP8_WEIGHTS=0 quantises them in the body")
    elif recipe == "blockwise" and remats_with_sites:
        from jax_moe_ffi import runtime
        kept = offload is not None and runtime.offload_placement(offload).get(runtime.FP8_WEIGHTS_NAME) == "device"
        notes.append("recipe='blockwise' inside jax.checkpoint: the weights' FP8 quantisation ("
                     + runtime.PREFIX + runtime.FP8_WEIGHTS_NAME + ") is "
                     + ("saved for the backward" if kept else
                        "recomputed in the backward (offload='device', or {'moe_fp8_weights': 'device'}, keeps it: "
                        "one more copy of the expert weights' bytes, no second quantisation)"))
    if offload is not None:
        from jax_moe_ffi import runtime
        place = runtime.offload_placement(offload)
        what_of = {"pinned_host": "offloaded to pinned host memory",
                   "device": "saved on the device" + (" (the backward recomputes no expert GEMM)"
                                                      if offload == "device" else "")}
        what = "; ".join(", ".join(runtime.PREFIX + n for n in sorted(place) if place[n] == sp) + " are " + what_of[sp]
                         for sp in ("pinned_host", "device") if sp in place.values())
        remats = remats_with_sites
        where = (f"in the {len(remats)} jax.checkpoint region(s) of the function that hold a site, on top of "
                 "each region's own policy" if remats else
                 "no jax.checkpoint region of the function holds a site: wrap the layer in "
                 "jax.checkpoint(fast, policy=fast.offload_policy)")
        notes.append(f"offload={offload!r}: {what}; {where}")
        tagged = _tagged_values(optimize(fn, mode=mode, recipe=recipe, offload=offload, streams=streams),
                                args, kwargs)
        if tagged:
            notes.append("tagged values, each per call of the region that holds it (per layer in a scan): "
                         + "; ".join(f"{n} {t} {_fmt_bytes(b)}" + (f" (x{c})" if c > 1 else "")
                                     for n, (t, b, c) in tagged.items())
                         + " -- choose what to offload by size: each byte crosses PCIe twice per step")
    loop_remats = [e for p in plan.all_plans() if p.loop_body for e, subs in p.subplans.items()
                   if e.kind == "remat" and e.params.get("prevent_cse") and any(q.has_sites() for q in subs)]
    if loop_remats:
        notes.append(f"{len(loop_remats)} jax.checkpoint region(s) with a site directly in a loop body: "
                     + ("prevent_cse=True kept (keep_prevent_cse=True): the backward's recompute reads its inputs "
                        "through an optimization barrier, so XLA copies the layer's weights out of the stacked "
                        "weights every step" if keep_prevent_cse else
                        "rebuilt with prevent_cse=False -- the loop already keeps XLA from merging the backward's "
                        "recompute with the forward, and the barrier prevent_cse=True puts on the recompute's "
                        "inputs would make XLA copy the layer's weights out of the stacked weights every step "
                        "(keep_prevent_cse=True keeps the model's setting)"))
    scans = []  # (path, stacked output bytes, floating stacked input bytes) of the scans that hold a site
    for p in plan.all_plans():
        for e, subs in p.subplans.items():
            if e.kind == "scan" and any(q.has_sites() for q in subs):
                nc, nk = scan_split(e.params, e.ins)
                nbytes = lambda vs: sum(int(np.prod(v.aval.shape)) * np.dtype(v.aval.dtype).itemsize for v in vs
                                        if jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact))
                scans.append((p.path + "scan/", nbytes(e.outs[nk:]), nbytes(e.ins[nc + nk:])))
    if scans:
        notes.append("; ".join(f"lax.scan at {path}: JAX zero-fills "
                               + (f"its stacked outputs ({_fmt_bytes(ys)}) and " if ys else "")
                               + f"the residuals it stacks for a backward before the loop, and under grad the "
                               f"stacked gradients of its inputs (up to {_fmt_bytes(xs)})" for path, ys, xs in scans)
                     + " -- the loop overwrites all of it: `with jax_moe_ffi.runtime.uninitialized_scan_outputs():` "
                       "around the step's first call leaves them unfilled (the Qwen3 train step on an H200: "
                       "1.6-7.6% faster)")
    slow = _gemm_dtypes_without_cuda_kernel(plan) if recipe is None and jax.default_backend() == "gpu" else []
    if slow:
        notes.append(f"expert GEMMs in {', '.join(slow)} on this GPU: the CUDA grouped GEMM takes bfloat16 / float16, "
                     "so these run XLA's fallback (ragged_dot, a dense masked dot: 5.6-24.5 TFLOP/s in bf16 on the H200, benchmarks/results/grouped_gemm_h200_xla.md; "
                     "warned once at run time); cast the experts' weights and inputs to bfloat16 for the CUDA kernels")
    swapped = [n for p in plan.all_plans() for n in _interp.schedule(p) if _interp.router_topk(p, n)]
    if swapped:
        notes.append(f"router top_k: {len(swapped)} swapped for the jax_moe_ffi top_k kernel ("
                     + ", ".join(f"{n.ins[0].aval.str_short()} k={n.params['k']}" for n in swapped)
                     + "; bitwise lax.top_k, which XLA:GPU runs as a sort of every row narrower than 1024)")
    if streams and any(p.sites for p in plan.all_plans()):
        from jax_moe_ffi.rewrite import interp
        side = [b for p in plan.all_plans() for b in interp.side_branches(p, interp.schedule(p)).values()]
        shared = (f"; {len(side)} side branch(es) beside a site (e.g. a shared expert: "
                  f"{', '.join(str(sum(n.name == 'dot_general' for n in b)) + ' dot(s) in ' + str(len(b)) + ' op(s)' for b in side)}) "
                  "on stream 1") if side else "; no side branch (shared expert) found"
        notes.append("streams=True: combine under a GPU stream annotation (runtime.on_stream, stream 2)" + shared
                     + ". XLA reads them with runtime.apply_xla_flags(); on the H200 (jaxlib 0.11.2) no step-time "
                       "gain from the annotations was measured, with CUDA graphs off (the regions ran on their own "
                       "streams) or on (graphs scheduled CONCURRENT: the shared-expert model 87.4-88.2 ms plain, "
                       "88.4-89.0 ms annotated); the flags themselves took 1.3-2% off the Qwen3 train step "
                       "(benchmarks/NOTES.md, session 15)")
    return Report(function=_name(fn), mode=mode, sites=sites, misses=misses, recipe=recipe, offload=offload,
                  streams=streams, notes=notes)


def _tagged_values(fast, args, kwargs) -> dict:
    """{checkpoint name: (dtype[shape], bytes, occurrences)} of the jax_moe_ffi tags in fast's jaxpr, sub-jaxprs
    (scan, jit, checkpoint, custom_vjp bodies) included, in the order they appear."""
    from jax_moe_ffi import runtime
    out = {}

    def walk(jaxpr):
        for e in jaxpr.eqns:
            name = e.params.get("name")
            if isinstance(name, str) and name.startswith(runtime.PREFIX) and e.outvars:
                a = e.outvars[0].aval
                t = f"{np.dtype(a.dtype).name}{list(a.shape)}"
                b = int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                prev = out.get(name)
                out[name] = (t, b, 1) if prev is None else (prev[0], prev[1], prev[2] + 1)
            for p in e.params.values():
                for sub in (p if isinstance(p, (list, tuple)) else [p]):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(lambda *a: fast(*a, **kwargs))(*args).jaxpr)
    return out


def _fmt_bytes(b: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b} B"


def _name(fn):
    f = fn
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__qualname__", getattr(f, "__name__", repr(f)))
