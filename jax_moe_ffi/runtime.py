"""XLA flags, GPU stream placement and host offload for MoE layers (issue 7).

What the rewrite pass (`jax_moe_ffi.rewrite.optimize(..., streams=, offload=)`) calls:

- ``on_stream(fn, stream_id=1) -> fn'``: same signature and pytrees; ``fn``'s ops are placed on GPU stream
  ``stream_id`` (>= 1; 0 is XLA's main compute stream) through ``jax.experimental.compute_on`` (a ``call``
  carrying the frontend attribute ``_xla_stream_annotation="<id>"``). Differentiable, works under
  ``jit``/``vmap``/``scan``/``checkpoint``; harmless on CPU (the attribute is ignored there). Where the
  installed JAX has no function-form ``compute_on`` it returns ``fn`` itself and warns once.
  ``streams_supported()`` says which case applies. Nested ``on_stream`` calls run on the outer stream
  (JAX forbids nested ``compute_on``). Suggested ids: ``SHARED_EXPERT_STREAM``, ``DISPATCH_STREAM``.
  Only that outer ``call`` carries the annotation: ``fn`` is traced with JAX's per-op compute type unset, so
  no op inside the region, and nothing in a computation nested in it, is annotated (see "Why only the call"
  below; where that setting is missing, ``on_stream`` is a no-op with a warning).
- ``tag(x, name) -> x``: ``jax.ad_checkpoint.checkpoint_name`` with the ``"jax_moe_ffi/"`` prefix; tag
  MoE intermediates with the names in ``OFFLOAD_NAMES`` (``"moe_dispatched_rows"``, ``"moe_expert_hidden"``,
  ``"moe_expert_out"``). The pass tags each expert GEMM output by its index, ``"moe_expert_hidden.<i>"``
  (``hidden_name``); policies given ``"moe_expert_hidden"`` cover every index. An identity outside
  ``jax.checkpoint``.
- ``offload_policy(names=OFFLOAD_NAMES, *, save=(), others="recompute")``: a ``jax.checkpoint`` policy that
  offloads the tagged values device -> ``pinned_host`` (``save_and_offload_only_these_names``); with
  ``others="save"`` every untagged residual stays on the device instead of being recomputed.
- ``remat_with_offload(fn, names=OFFLOAD_NAMES, **policy_kw)``: ``jax.checkpoint(fn, policy=...)``;
  use it on the per-layer body of a ``lax.scan`` over layers.
- ``moe_remat_policy(offload, base=None)``: what ``optimize(offload="pinned_host" | "device")`` puts on the
  model's own ``jax.checkpoint`` regions that hold MoE sites (``OFFLOAD_MODES``: host offload of the dispatched
  rows and expert outputs, or the dispatched rows and every expert GEMM output kept on the device, so no expert
  GEMM is recomputed in the backward); ``base`` (the region's own policy) decides everything untagged.

For users and benchmarks: ``xla_flags()`` / ``apply_xla_flags()`` (checked against the installed jaxlib and
PJRT plugins), ``memory_report(fn, *args)`` (compiled memory analysis), ``offloaded_bytes(fn, *args)``
(bytes of residuals kept in host memory), ``device_peak_bytes()`` (``Device.memory_stats()``) and
``lowered_text(fn, *args, platform=)`` (StableHLO, also cross-lowered for ``"cuda"`` from a CPU machine), and
``uninitialized_scan_outputs()`` (a ``with`` block: scans lowered inside leave their stacked outputs uninitialised
instead of zero-filling them first; see its docstring).

Why only the call. With JAX 0.11.2 and ``--xla_gpu_experimental_stream_annotation=true`` on an H200, a combine
under ``on_stream`` inside ``lax.scan`` + ``jax.checkpoint`` + ``grad`` failed to compile with "NOT_FOUND: No
ExecutionStreamId found for %call-start.9 ... only reachable through embedded calls". The chain (steps 2-3 as
seen in the HLO that XLA dumped before ExplicitStreamAnnotationAsyncWrapper on the H200; step 4 from XLA's source):

1. JAX's function-form ``compute_on`` traces ``fn`` under ``extend_compute_type("gpu_stream:N")``
   (jax/_src/compute_on.py), so every equation inside records ``ctx.compute_type``, and
   ``mlir.lower_per_platform`` -> ``wrap_compute_type_in_place`` (jax/_src/interpreters/mlir.py) puts
   ``_xla_stream_annotation="N", inlineable="false"`` on *every* op it lowers -- also on the ops inside the
   ``stablehlo.case`` that ``lax.platform_dependent`` (``ops._common.on_platforms``) stages, and inside
   out-of-line ``func.call``s (``jnp.where``, ``jax.nn.silu``, ...).
2. The case keeps one branch for the one platform lowered for. Under ``grad`` + ``scan`` its index is a
   residual that enters the loop body as a parameter, so it is not folded away (without scan it is, and the same
   region compiles); XLA replaced the one-branch conditional by a ``call`` of its branch that carries the
   conditional's attributes and stays un-inlined (CallInliner keeps stream-annotated calls when the flag is on):
   ``%call = call(%cond.8.0), to_apply=%region_7.20,
   frontend_attributes={_xla_stream_annotation="2",inlineable="false"}`` inside the compute_on computation,
   with the annotated ``jax_moe_ffi_combine`` custom call in ``%region_7.20``.
3. ``ExplicitStreamAnnotationAsyncWrapper`` (xla/backends/gpu/transforms/
   explicit_stream_annotation_async_wrapper.cc, post-fusion) makes *every* annotated instruction async, callers
   first: the outer compute_on call becomes a call-start, and ``ClearSchedulingAnnotations`` clears the
   annotations of the instructions *directly* in its called computation only -- so the branch call stays a plain
   call, but the custom call one level further down is still annotated, is wrapped by ``CreateCallInstruction``
   into ``%called_computation.5`` (hence a call-start carrying the ffi_call's metadata) and becomes a second
   call-start nested inside the first one's async computation.
4. ``ExecutionStreamAssignment`` (xla/service/gpu/execution_stream_assignment.cc) walks from ENTRY, gives ids to
   scope-start ops and descends only through kCall/kConditional/kWhile -- never into an async-start's wrapped
   computation -- so the nested call-start has no id and ``GetExecutionStreamId`` fails while emitting thunks.

So the culprit is an annotated instruction in a computation nested *inside* the annotated call (here the
platform-dependent conditional's branch); the while loop only keeps that conditional alive, and while-loop double
buffering is not involved. Tracing ``fn`` with the compute type unset leaves the annotation on the one ``call``
that ``_compute_on_lowering`` emits (XLA clears inner annotations itself anyway); the conditional, now
unannotated, is inlined by XLA as usual (none is left in the compiled H200 HLO), and the whole called
computation runs on the annotated stream.

What a CPU machine can show: stream annotations in the lowered and compiled HLO; offload as host-memory
residuals in the jaxpr and as ``annotate_device_placement`` custom calls (``_xla_buffer_placement =
"pinned_host"``) in StableHLO lowered for ``cuda``. JAX lowers the offload to nothing on CPU, so the CPU
compiled HLO and memory analysis do not change; the memory saving is measured on the GPU.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import inspect
import mmap
import os
import re
import shlex
import threading
import warnings

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name

__all__ = ["xla_flags", "apply_xla_flags", "flag_available", "backend_initialized", "on_stream",
           "streams_supported", "tag", "hidden_name", "offload_policy", "remat_with_offload", "OFFLOAD_NAMES",
           "FP8_WEIGHTS_NAME", "OFFLOAD_MODES", "offload_mode", "offload_placement", "moe_remat_policy",
           "PREFIX", "SHARED_EXPERT_STREAM", "DISPATCH_STREAM", "memory_report", "offloaded_bytes",
           "device_peak_bytes", "lowered_text", "uninitialized_scan_outputs"]

# ============================================================================================ XLA flags
_T = "true"


def _flag_table(latency_hiding, multistream, collective_pipelining, loop_double_buffering,
                pipelined_host_offload, command_buffer, graph_scheduling):
    """(name, value) candidates; XLA defaults noted where we merely pin them."""
    flags = []
    if latency_hiding:  # default false: schedule async work (collectives, other streams) to overlap compute
        flags += [("xla_gpu_enable_latency_hiding_scheduler", _T),
                  ("xla_gpu_enable_highest_priority_async_stream", _T)]  # default true in new XLA; pinned
    if multistream:  # honour `_xla_stream_annotation` (default true in new XLA, false in older ones)
        flags += [("xla_gpu_experimental_stream_annotation", _T)]
    if collective_pipelining:  # overlap layer i's collectives with layer i+-1's compute in scanned layers
        flags += [("xla_gpu_enable_pipelined_all_gather", _T), ("xla_gpu_enable_pipelined_reduce_scatter", _T),
                  ("xla_gpu_enable_pipelined_all_reduce", _T)]
    if loop_double_buffering:  # unroll scan-over-layers loops by 2 so both halves can overlap
        flags += [("xla_gpu_enable_while_loop_double_buffering", _T)]
    if pipelined_host_offload:  # opt-in upstream: prefetch offloaded residuals one loop iteration ahead
        flags += [("xla_gpu_enable_pipelined_host_offloading", _T)]
    if command_buffer not in (None, "xla"):  # e.g. "FUSION,CUSTOM_CALL", or "" to turn CUDA graphs off
        flags += [("xla_gpu_enable_command_buffer", command_buffer)]
    if graph_scheduling and command_buffer != "":
        # Concurrency inside XLA's CUDA graphs: CONCURRENT builds each graph as a DAG of its commands' buffer
        # dependencies, so independent kernels (the optimizer's per-parameter updates, attention beside the
        # router, a shared expert beside the routed path) may run at once (XLA's default, LHS, follows the
        # latency-hiding schedule's order). Measured on the H200, jaxlib 0.11.2 (benchmarks/NOTES.md, session 15).
        flags += [("xla_gpu_command_buffer_scheduling_mode", graph_scheduling)]
    return flags


def xla_flags(*, latency_hiding: bool = True, multistream: bool = True, collective_pipelining: bool = True,
              loop_double_buffering: bool = False, pipelined_host_offload: bool = False,
              command_buffer: str | None = None, graph_scheduling: str | None = "CONCURRENT",
              extra: dict | None = None, strict: bool = False) -> list[str]:
    """XLA GPU flags for MoE overlap, as ``["--name=value", ...]``, each present in the installed jaxlib.

    A flag name missing from the installed binaries (stale for this version) is dropped with a warning, or
    raises ``ValueError`` when ``strict``. ``extra`` adds ``{name: value}`` flags, checked the same way.
    ``command_buffer``: ``None`` (or ``"xla"``) keeps XLA's command buffers (CUDA graphs, on by default);
    ``""`` turns them off; a list such as ``"FUSION,CUSTOM_CALL"`` replaces XLA's. ``graph_scheduling``: the
    command-buffer scheduling mode (``"CONCURRENT"``, the default here; ``None`` keeps XLA's ``LHS``).
    Why these defaults (H200, jaxlib 0.11.2, benchmarks/NOTES.md sessions 7 and 15): with command buffers off the
    stream-annotated regions did run on streams of their own but no step got faster, while the graphs' absence
    cost 1-3% (the shared-expert model, session 15 call 3; the Qwen3 train step, session 7); CONCURRENT graph
    scheduling took 1.5-2.4% off the Qwen3 train step (exact, dropless and FP8, two or three alternating pairs
    each; peak memory +16-48 MB bf16, +0.7 GB FP8). XLA's ``CONCURRENT_REGIONS`` mode failed to compile the scanned model there (an XLA RET_CHECK).
    """
    table = _flag_table(latency_hiding, multistream, collective_pipelining, loop_double_buffering,
                        pipelined_host_offload, command_buffer, graph_scheduling)
    table += [(k.lstrip("-"), str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (extra or {}).items()]
    missing = [name for name, _ in table if not flag_available(name)]
    if missing:
        msg = f"XLA flags not known to the installed jaxlib {_jaxlib_version()}: {missing}"
        if not _xla_binaries():
            msg = f"cannot check XLA flags: no jaxlib binary with XLA's flag registry was found: {missing}"
        if strict:
            raise ValueError(msg)
        warnings.warn(msg + " (dropped)", stacklevel=2)
    return [f"--{name}={value}" for name, value in table if name not in missing]


def _jaxlib_version() -> str:
    import jaxlib
    return getattr(jaxlib, "__version__", "?")


def backend_initialized() -> bool:
    """True once a JAX backend exists (XLA_FLAGS is read when the first backend starts)."""
    from jax._src import xla_bridge as xb
    fn = getattr(xb, "backends_are_initialized", None)
    return bool(fn()) if fn is not None else bool(getattr(xb, "_backends", {}))


def _flag_name(token: str) -> str:
    return token.lstrip("-").split("=", 1)[0]


def apply_xla_flags(**kwargs) -> list[str]:
    """Appends ``xla_flags(**kwargs)`` to ``os.environ["XLA_FLAGS"]``; returns the flags added.

    Flags the user already set keep the user's value; nothing is duplicated. Must run before the first
    JAX computation: raises ``RuntimeError`` if a backend is already initialised (it would ignore them).
    """
    if backend_initialized():
        raise RuntimeError("jax_moe_ffi.runtime.apply_xla_flags: a JAX backend is already initialised, so new "
                           "XLA_FLAGS would be ignored; call it before the first JAX computation (or set XLA_FLAGS "
                           "in the environment)")
    current = os.environ.get("XLA_FLAGS", "")
    try:
        tokens = shlex.split(current)
    except ValueError:
        tokens = current.split()
    have = {_flag_name(t) for t in tokens}
    added = [f for f in xla_flags(**kwargs) if _flag_name(f) not in have]
    if added:
        os.environ["XLA_FLAGS"] = " ".join([current.strip(), *added]).strip()
    return added


@functools.lru_cache(maxsize=None)
def _xla_binaries() -> tuple[str, ...]:
    """jaxlib's shared objects and PJRT plugins (jax_plugins/*) that hold an XLA flag registry."""
    import jaxlib
    dirs = [os.path.dirname(jaxlib.__file__)]
    spec = importlib.util.find_spec("jax_plugins")
    dirs += list(spec.submodule_search_locations or []) if spec else []
    files = {f for d in dirs for f in glob.glob(os.path.join(d, "**", "*.so*"), recursive=True)}
    return tuple(sorted(f for f in files if _contains(f, b"xla_dump_to")))


@functools.lru_cache(maxsize=None)
def _contains(path: str, name: bytes) -> bool:
    """`name` occurs in the file as a whole identifier (next byte not [a-z0-9_], or a new `xla_` name)."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            i = mm.find(name)
            while i >= 0:
                nxt = mm[i + len(name):i + len(name) + 4]
                if not re.match(rb"[a-z0-9_]", nxt[:1]) or nxt == b"xla_":
                    return True
                i = mm.find(name, i + 1)
    except (OSError, ValueError):  # unreadable or empty file
        pass
    return False


def flag_available(name: str) -> bool:
    """True if the XLA flag ``name`` is compiled into jaxlib and every installed XLA PJRT plugin."""
    bins = _xla_binaries()
    key = _flag_name(name).encode()
    return bool(bins) and all(_contains(b, key) for b in bins)


# ============================================================================================== streams
SHARED_EXPERT_STREAM = 1
DISPATCH_STREAM = 2
_local = threading.local()
_warned: set = set()


def _warn_once(key: str, msg: str):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=3)


def _compute_on_impl():
    """The function form of compute_on: ``compute_on2`` (JAX 0.10) or ``compute_on`` (JAX >= 0.11); else None."""
    try:
        from jax.experimental import compute_on as mod
    except ImportError:
        return None
    for fn in (getattr(mod, "compute_on2", None), getattr(mod, "compute_on", None)):
        if fn is not None and "out_memory_spaces" in inspect.signature(fn).parameters:
            return fn
    return None


def streams_supported() -> bool:
    """Whether ``on_stream`` can annotate streams with the installed JAX."""
    return _compute_on_impl() is not None and _compute_type_config() is not None


def _compute_type_config():
    """JAX's per-equation compute-type setting (``jax._src.config.compute_on_context_manager``, private), or None
    where this JAX has none. ``core.JaxprEqnContext`` reads it for every equation it records."""
    try:
        from jax._src import config as jax_config
        cm = jax_config.compute_on_context_manager
    except (ImportError, AttributeError):
        return None
    return cm if hasattr(cm, "swap_local") and hasattr(cm, "set_local") else None


@contextlib.contextmanager
def _compute_type_unset(cm):
    """Traces with no compute type, so ``mlir.wrap_compute_type_in_place`` annotates none of the ops traced."""
    prev = cm.swap_local(None)
    try:
        yield
    finally:
        cm.set_local(prev)


def _under_vmap() -> bool:
    """Whether a jax.vmap is being traced around this call (also from outside a jax.jit: the jit's trace keeps the
    vmap's as its parent). Our ops batch sequentially, as a while loop; inside a stream-annotated call that loop's
    asynchronous fusions got no stream from XLA:GPU (H100, JAX 0.11.2: "No ExecutionStreamId found for
    %fusion-start ... in compute_on/.../while/body"), so no region is placed under a vmap. Not seen: a vmap of a
    jax.jit whose trace JAX reuses from its cache (the same function traced before without the vmap); give such a
    function optimize(..., streams=False)."""
    try:
        from jax._src import core
        from jax._src.interpreters import batching
        trace = core.trace_ctx.trace
    except (ImportError, AttributeError):  # a JAX without these internals: place as asked
        return False
    while trace is not None:
        if isinstance(trace, batching.BatchTrace):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


def on_stream(fn, stream_id: int = SHARED_EXPERT_STREAM):
    """Wraps ``fn`` so its ops run on GPU stream ``stream_id`` (see the module docstring)."""
    if not isinstance(stream_id, (int, np.integer)) or isinstance(stream_id, bool) or stream_id < 1:
        raise ValueError(f"on_stream: stream_id must be an int >= 1 (0 is the main stream), got {stream_id!r}")
    impl = _compute_on_impl()
    if impl is None:
        _warn_once("on_stream", f"jax_moe_ffi.runtime.on_stream: JAX {jax.__version__} has no function-form "
                                "compute_on; stream placement is a no-op")
        return fn
    cm = _compute_type_config()
    if cm is None:  # annotated inner ops would not compile on GPU (module docstring): rather no placement
        _warn_once("on_stream", f"jax_moe_ffi.runtime.on_stream: JAX {jax.__version__} has no compute-type "
                                "config to clear inside the region; stream placement is a no-op")
        return fn

    def body(args, kwargs):
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            with _compute_type_unset(cm):  # only the compute_on call is annotated ("Why only the call")
                return fn(*args, **kwargs)
        finally:
            _local.depth -= 1

    placed = impl(body, compute_type=f"gpu_stream:{int(stream_id)}", out_memory_spaces=jax.memory.Space.Device)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if getattr(_local, "depth", 0):  # already inside on_stream: JAX forbids nesting, keep the outer stream
            return fn(*args, **kwargs)
        if _under_vmap():
            _warn_once("on_stream_vmap", "jax_moe_ffi.runtime.on_stream: under jax.vmap the region runs on the main "
                                         "stream (the ops batch as a loop, and XLA:GPU cannot give a stream to the "
                                         "asynchronous ops in a loop inside an annotated call)")
            return fn(*args, **kwargs)
        return placed(args, kwargs)

    return wrapped


# ========================================================================================= host offload
PREFIX = "jax_moe_ffi/"
OFFLOAD_NAMES = ("moe_dispatched_rows", "moe_expert_hidden", "moe_expert_out")
# The expert GEMM outputs of a site are tagged one by one: "moe_expert_hidden.0", ".1", ... in the order the
# expert body uses them (gate, then up, for SwiGLU experts). "moe_expert_hidden" names all of them; an indexed
# name picks one, so that a policy can offload only as many bytes as PCIe hides behind the layer's compute.
HIDDEN_INDICES = 16  # indexed names; an expert body with more GEMMs tags the rest with the family name
# grouped_matmul(recipe="blockwise") tags its weight quantisation (both kernel orientations) with this name: saved
# by a policy, the backward of a rematerialised layer does not quantise the weights again. Not in OFFLOAD_NAMES
# (whose members the offload helpers send to the host by default): it is saved on the device by
# optimize(offload="device"), or placed like any tag by optimize(offload={"moe_fp8_weights": ...}).
FP8_WEIGHTS_NAME = "moe_fp8_weights"


def _full(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"checkpoint names must be non-empty strings, got {name!r}")
    return name if name.startswith(PREFIX) else PREFIX + name


def hidden_name(index: int) -> str:
    """The tag of a site's `index`-th expert GEMM output."""
    if not 0 <= index < HIDDEN_INDICES:
        raise ValueError(f"expert GEMM output index must be in [0, {HIDDEN_INDICES}), got {index}")
    return f"moe_expert_hidden.{index}"


def _expand(name: str) -> list[str]:
    """A family name and every indexed name it covers ("moe_expert_hidden" -> itself, ".0" .. ".15")."""
    full = _full(name)
    if full == PREFIX + "moe_expert_hidden":
        return [full] + [PREFIX + hidden_name(i) for i in range(HIDDEN_INDICES)]
    return [full]


def _names(names) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    out = []
    for n in names:
        out += [e for e in _expand(n) if e not in out]
    return out


def _known_tag(name) -> bool:
    """A name optimize(offload={...}) accepts: one of OFFLOAD_NAMES or an indexed expert GEMM output."""
    if name in OFFLOAD_NAMES or name == FP8_WEIGHTS_NAME:
        return True
    fam, _, idx = str(name).partition(".")
    return fam == "moe_expert_hidden" and idx.isdigit() and int(idx) < HIDDEN_INDICES and str(int(idx)) == idx


def tag(x, name: str):
    """``checkpoint_name(x, "jax_moe_ffi/" + name)``: marks ``x`` (array or pytree) for a remat policy."""
    return checkpoint_name(x, _full(name))


def offload_policy(names=OFFLOAD_NAMES, *, save=(), others: str = "recompute"):
    """``jax.checkpoint`` policy: tagged ``names`` are offloaded device -> pinned_host, ``save`` names stay on
    the device; every other residual is recomputed (``others="recompute"``) or kept (``others="save"``)."""
    return _policy(_names(names), _names(save), others)


def _policy(offloaded: list[str], saved: list[str], others: str):
    """offload_policy over full, already expanded names."""
    base = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=saved, names_which_can_be_offloaded=offloaded,
        offload_src="device", offload_dst="pinned_host")
    if others == "recompute":
        return base
    if others != "save":
        raise ValueError(f"offload_policy: others must be 'recompute' or 'save', got {others!r}")
    recompute = base(None)  # the upstream policy's "recompute" answer for an unnamed primitive

    def policy(prim, *args, **params):
        out = base(prim, *args, **params)
        return True if out is recompute else out
    return policy


# What optimize(offload=...) does with the tags in jax.checkpoint regions (the model's own, and the
# `.offload_policy` it returns): "pinned_host" moves the dispatched rows and the expert outputs to host
# memory; "device" keeps the dispatched rows and every expert GEMM output on the device, so the backward
# recomputes none of the expert GEMMs (only elementwise work and the router), at the cost of that memory.
OFFLOAD_MODES = {"pinned_host": ("moe_dispatched_rows", "moe_expert_out"),
                 "device": ("moe_dispatched_rows", "moe_expert_hidden", FP8_WEIGHTS_NAME)}


def _space(v, where):
    if v is True or v in ("host", "pinned_host"):
        return "pinned_host"
    if v == "device":
        return "device"
    raise ValueError(f"optimize: offload{where} must be 'pinned_host' (or True / 'host') or 'device', got {v!r}")


def offload_mode(offload):
    """optimize's `offload` argument as None, "pinned_host", "device" (True and "host" mean "pinned_host") or,
    for a mapping {tag name: "pinned_host" | "device"} over OFFLOAD_NAMES (e.g. only the dispatched rows to
    the host, the GEMM outputs kept on the device), a sorted tuple of (name, space) pairs (hashable);
    anything else is a ValueError naming the argument."""
    if offload is None or offload is False:
        return None
    if isinstance(offload, dict) or (isinstance(offload, tuple) and all(isinstance(p, tuple) for p in offload)):
        items = dict(offload)
        bad = sorted(n for n in items if not _known_tag(n))
        if bad or not items:
            raise ValueError(f"optimize: offload mapping keys must be tag names from {OFFLOAD_NAMES} (or "
                             f"'moe_expert_hidden.<i>', i < {HIDDEN_INDICES}: the i-th expert GEMM output, or "
                             f"{FP8_WEIGHTS_NAME!r}: the FP8 weight quantisation), got "
                             f"{sorted(items) if items else 'an empty mapping'}")
        return tuple(sorted((n, _space(v, f"[{n!r}]")) for n, v in items.items()))
    return _space(offload, "")


def offload_placement(offload) -> dict:
    """{tag name: "pinned_host" | "device"} that `offload` (anything offload_mode accepts but None) means."""
    mode = offload_mode(offload)
    if mode is None:
        raise ValueError("offload is off (None)")
    if isinstance(mode, tuple):
        return dict(mode)
    return {n: mode for n in OFFLOAD_MODES[mode]}


def moe_remat_policy(offload, base=None):
    """The ``jax.checkpoint`` policy for `offload` (see OFFLOAD_MODES and offload_mode): the tagged MoE names are
    offloaded to ``pinned_host`` or saved on the device; every other primitive is decided by `base` (a
    checkpoint policy; None: recomputed, ``jax.checkpoint``'s default)."""
    if offload_mode(offload) is None:
        raise ValueError("moe_remat_policy: offload is off (None)")
    place = offload_placement(offload)
    # An indexed name overrides its family: {"moe_expert_hidden": "device", "moe_expert_hidden.0":
    # "pinned_host"} offloads the first expert GEMM output and saves the others.
    concrete = {}
    for n in sorted(place, key=lambda n: "." in n):  # families first, then the indexed names over them
        for e in _expand(n):
            concrete[e] = place[n]
    moe = _policy([n for n, v in concrete.items() if v == "pinned_host"],
                  [n for n, v in concrete.items() if v == "device"], "recompute")
    untagged = moe(None)  # the upstream policy's answer for a primitive it does not name
    if base is None:
        return moe

    def policy(prim, *args, **params):
        out = moe(prim, *args, **params)
        return base(prim, *args, **params) if out is untagged else out
    return policy


def remat_with_offload(fn, names=OFFLOAD_NAMES, **policy_kw):
    """``jax.checkpoint(fn, policy=offload_policy(names, **policy_kw))``, e.g. for a scanned layer body."""
    return jax.checkpoint(fn, policy=offload_policy(names, **policy_kw))


# ====================================================================================== measurement
def _nbytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def memory_report(fn, *args, **kwargs) -> dict:
    """Compiled memory analysis of ``jax.jit(fn)`` on ``args``: the ``*_bytes`` fields, ``peak_bytes``.

    ``peak_bytes`` is XLA's ``peak_memory_in_bytes`` where the backend reports it, else
    argument + output + temp - alias (``peak_source`` says which).
    """
    stats = jax.jit(fn).lower(*args, **kwargs).compile().memory_analysis()
    if stats is None:
        return {}
    fields = {k: getattr(stats, k) for k in dir(stats) if not k.startswith("_")}
    out = {k.replace("_size_in_bytes", "_bytes").replace("_in_bytes", "_bytes"): int(v)
           for k, v in fields.items() if isinstance(v, (int, np.integer))}
    peak = out.get("peak_memory_bytes", 0)
    if peak > 0:
        out.update(peak_bytes=peak, peak_source="peak_memory_in_bytes")
    else:
        est = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out.get("alias_bytes", 0)
        out.update(peak_bytes=est, peak_source="argument+output+temp-alias")
    return out


def offloaded_bytes(fn, *args) -> int:
    """Bytes of ``fn``'s backward residuals that live in host memory (what the offload policy moved)."""
    jaxpr = jax.make_jaxpr(lambda *a: jax.vjp(fn, *a)[1])(*args)
    host = jax.memory.Space.Host
    return sum(_nbytes(a) for a in jaxpr.out_avals if getattr(a, "memory_space", None) == host)


def device_peak_bytes(device=None) -> int | None:
    """``peak_bytes_in_use`` from ``Device.memory_stats()`` (None where the backend has no stats, e.g. CPU)."""
    stats = (device or jax.local_devices()[0]).memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def lowered_text(fn, *args, platform: str | None = None) -> str:
    """StableHLO of ``jax.jit(fn)`` on ``args``, lowered for ``platform`` ("cuda", "cpu"; default: this one)."""
    traced = jax.jit(fn).trace(*args)
    return traced.lower(lowering_platforms=(platform,) if platform else None).as_text()


# ================================================================== scan outputs without a zero fill
# lax.scan lowers to a while loop that writes each step's outputs into stacked [length, ...] buffers, and JAX
# (<= 0.11) creates those buffers as a broadcast zero (`loops._empty_array`, with a TODO to use `lax.empty` once
# "AllocateBuffer issues are fixed"). Every element is overwritten by the loop, so the fill is pure memory
# traffic: in a scanned training step it zero-fills the forward's stacked residuals and the backward's stacked
# weight gradients (the session-26 profile of benchmarks/train_step.py: 27 broadcast fusions, 3.3 ms a step).
# `lax.empty` lowers to XLA's AllocateBuffer custom call on GPU/TPU (no kernel) and to the same zero broadcast on
# CPU. Opt-in and scoped: it changes how JAX lowers every scan traced and lowered inside the `with` block.
_SCAN_EMPTY_LOCK = threading.RLock()  # re-entrant: a block nested in a block
_SCAN_EMPTY_CLEARED: list = []  # non-empty once a block has cleared JAX's caches


def _scan_loops_module():
    try:
        from jax._src.lax.control_flow import loops
    except ImportError:
        return None
    fn = getattr(loops, "_empty_array", None)
    if fn is None or list(inspect.signature(fn).parameters) != ["prefix", "length_spec", "aval"]:
        return None
    if "out_sharding" not in inspect.signature(jax.lax.empty).parameters:
        return None
    return loops


def _plain_device_aval(aval) -> bool:
    """Whether the knob may leave this stacked output uninitialised: device memory, no explicit sharding, not
    varying over a shard_map axis (everything else keeps JAX's zero fill)."""
    from jax._src import core
    if getattr(aval, "memory_space", core.MemorySpace.Device) != core.MemorySpace.Device:
        return False
    if tuple(getattr(getattr(aval, "mat", None), "varying", ()) or ()):
        return False
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    spec = getattr(sharding, "spec", ())
    return (mesh is None or getattr(mesh, "empty", True)) and all(p is None for p in spec)


@contextlib.contextmanager
def uninitialized_scan_outputs(enable: bool = True):
    """Within the block, ``lax.scan``'s stacked outputs start as uninitialised buffers (``lax.empty``: XLA's
    AllocateBuffer on GPU) instead of a zero fill. Results are unchanged (the loop writes every element); what
    goes is one full write of every stacked output before each scan runs. Use it around the first call (the
    lowering) of a jitted step::

        step = jax.jit(train_step)
        with jax_moe_ffi.runtime.uninitialized_scan_outputs():
            state = step(state, batch)   # traced, lowered and compiled here; later calls reuse it

    The first block entered in a process clears JAX's caches (``jax.clear_caches()``: functions lowered earlier
    are lowered again on their next call, here with the knob); later blocks do not, so a block around every step
    call costs nothing after the first, and a function first lowered outside any block keeps the zero fill.
    Executables compiled inside are kept after the block; blocks may nest.

    Outputs in host memory, with explicit shardings or inside ``shard_map`` keep JAX's zero fill. Where the
    installed JAX lacks the internals this relies on, the block warns once and changes nothing. A program jitted
    over several devices (sharded inputs) has avals that carry the mesh, so its scans keep the zero fill too (how
    XLA's SPMD partitioner would place an uninitialised buffer is not checked; 8 CPU devices in the tests): the
    knob is measured on one GPU, and with more than one device visible the block says so once."""
    loops = _scan_loops_module() if enable else None
    if loops is None:
        if enable:
            _warn_once("scan-empty", "uninitialized_scan_outputs: this JAX version has no compatible "
                       "lax.scan output allocation; scans keep their zero-filled outputs")
        yield False
        return
    if jax.device_count() > 1:
        _warn_once("scan-empty-multi", "uninitialized_scan_outputs: measured on one GPU; scans in programs "
                   "partitioned over several devices (sharded avals) keep JAX's zero fill")
    original = loops._empty_array

    def empty_array(prefix, length_spec, aval):
        if not _plain_device_aval(aval):
            return original(prefix, length_spec, aval)
        return jax.lax.empty((*prefix, *aval.shape), aval.dtype)

    with _SCAN_EMPTY_LOCK:
        # JAX caches lowerings by jaxpr: a function lowered before the first block would come back zero-filled.
        # Only the first entry clears them -- a block entered around every step must not recompile every step.
        if not _SCAN_EMPTY_CLEARED:
            jax.clear_caches()
            _SCAN_EMPTY_CLEARED.append(True)
        loops._empty_array = empty_array
        try:
            yield True
        finally:
            loops._empty_array = original
