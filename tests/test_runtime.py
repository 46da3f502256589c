"""jax_moe_ffi.runtime: XLA flags checked against the installed jaxlib, stream annotation, host offload of
MoE activations (inside a scan over layers), memory reports. CPU only; fresh random inputs every run."""
import glob
import json
import os
import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import jax_moe_ffi as jmf
from jax_moe_ffi import models
from jax_moe_ffi import runtime as rt

ALL_OPTIONS = dict(latency_hiding=True, multistream=True, collective_pipelining=True, loop_double_buffering=True,
                   pipelined_host_offload=True, command_buffer="FUSION,CUSTOM_CALL")


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape and np.all(np.isfinite(a))
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def tree_rel_err(a, b):
    return max(rel_err(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def key():
    return jax.random.key(np.random.SeedSequence().entropy % (2**31))


# ---------------------------------------------------------------------------------------------- flags
def _jaxlib_binary_names():
    """Identifiers `xla_...` found in the installed jaxlib's shared objects (this test's own scan)."""
    found = set()
    for path in glob.glob(os.path.join(os.path.dirname(jaxlib.__file__), "**", "*.so*"), recursive=True):
        with open(path, "rb") as fh:
            data = fh.read()
        # names may sit in concatenated string tables: split at every "xla_" start
        for m in re.finditer(rb"xla_[a-z0-9_]+", data):
            found.update(b"xla_" + p for p in m.group().split(b"xla_") if p)
    return found


def test_command_buffers_kept_with_concurrent_graph_scheduling_by_default():
    # Since session 15: XLA's CUDA graphs stay on (turning them off cost 1.5-3% on the H200 and the streams
    # gained nothing without them), scheduled CONCURRENT inside.
    default = rt.xla_flags(multistream=True)
    assert not any("enable_command_buffer" in f for f in default)
    assert "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT" in default
    assert "--xla_gpu_experimental_stream_annotation=true" in default
    off = rt.xla_flags(command_buffer="")  # graphs off: no scheduling mode for graphs that do not exist
    assert "--xla_gpu_enable_command_buffer=" in off
    assert not any("scheduling_mode" in f for f in off)
    given = rt.xla_flags(command_buffer="FUSION", graph_scheduling=None)
    assert [f for f in given if "command_buffer" in f] == ["--xla_gpu_enable_command_buffer=FUSION"]
    assert rt.xla_flags(command_buffer="xla") == default
    serial = rt.xla_flags(graph_scheduling="SERIALIZE", extra={"xla_gpu_graph_min_graph_size": 1})
    assert "--xla_gpu_command_buffer_scheduling_mode=SERIALIZE" in serial
    assert "--xla_gpu_graph_min_graph_size=1" in serial


def test_every_flag_is_in_the_installed_jaxlib():
    flags = rt.xla_flags(**ALL_OPTIONS, strict=True)
    names = [f[2:].split("=", 1)[0].encode() for f in flags]
    assert b"xla_gpu_enable_latency_hiding_scheduler" in names and len(names) == 10
    assert all(f.startswith("--") and "=" in f for f in flags)
    known = _jaxlib_binary_names()
    assert b"xla_dump_to" in known  # the scan itself works
    stale = [n for n in names if n not in known]
    assert not stale, f"flags not in jaxlib {jaxlib.__version__}: {stale}"
    # the checker rejects names that are not flags, including truncated real ones
    for bogus in ("xla_gpu_enable_latency_hiding", "xla_gpu_enable_command", "xla_gpu_no_such_flag"):
        assert not rt.flag_available(bogus) and bogus.encode() not in known


def test_stale_flags_dropped_or_raised():
    with pytest.warns(UserWarning, match="xla_gpu_no_such_flag"):
        flags = rt.xla_flags(extra={"xla_gpu_no_such_flag": True, "xla_gpu_enable_while_loop_double_buffering": True})
    assert "--xla_gpu_enable_while_loop_double_buffering=true" in flags
    assert not any("no_such" in f for f in flags)
    with pytest.raises(ValueError, match="xla_gpu_no_such_flag"):
        rt.xla_flags(extra={"--xla_gpu_no_such_flag": 1}, strict=True)
    assert rt.xla_flags(latency_hiding=False, multistream=False, collective_pipelining=False,
                        graph_scheduling=None) == []


_CHILD = """
import json, os, sys
from jax_moe_ffi import runtime as rt
added = rt.apply_xla_flags(**json.loads(sys.argv[1]))
again = rt.apply_xla_flags(**json.loads(sys.argv[1]))
import jax, jax.numpy as jnp
y = float(jax.jit(lambda x: jnp.sum(x * x))(jnp.arange(4.0)))   # XLA parses XLA_FLAGS here; dies on unknown ones
print(json.dumps({"added": added, "again": again, "env": os.environ["XLA_FLAGS"], "y": y}))
"""


def test_apply_xla_flags_in_fresh_process():
    env = dict(os.environ, XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_hlo_as_text",
               JAX_PLATFORMS="cpu")
    opts = {k: v for k, v in ALL_OPTIONS.items()}
    p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(opts)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["y"] == 14.0 and out["again"] == []
    tokens = out["env"].split()
    names = [t.lstrip("-").split("=")[0] for t in tokens]
    assert len(names) == len(set(names)), tokens  # no duplicates
    assert "--xla_gpu_enable_latency_hiding_scheduler=false" in tokens  # the user's value wins
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in out["added"]
    assert "--xla_gpu_experimental_stream_annotation=true" in tokens and len(out["added"]) == 9


def test_apply_xla_flags_after_backend_start_raises(monkeypatch):
    jax.devices()
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_hlo_as_text")
    assert rt.backend_initialized()
    with pytest.raises(RuntimeError, match="already initialised"):
        rt.apply_xla_flags()
    assert os.environ["XLA_FLAGS"] == "--xla_dump_hlo_as_text"


# -------------------------------------------------------------------------------------------- streams
def shared_expert(x, w_up, w_down):
    return jax.nn.silu(x @ w_up) @ w_down


def test_on_stream_annotation_and_numerics():
    assert rt.streams_supported()  # JAX 0.10 (compute_on2) and 0.11 (compute_on) both have it
    k1, k2, k3 = jax.random.split(key(), 3)
    x, wu, wd = (jax.random.normal(k1, (16, 32)), jax.random.normal(k2, (32, 64)) / 6,
                 jax.random.normal(k3, (64, 32)) / 8)
    placed = rt.on_stream(shared_expert, 3)
    text = rt.lowered_text(placed, x, wu, wd)
    assert re.search(r'call @\w+\(.*_xla_stream_annotation = "3"', text), text
    assert '_xla_stream_annotation = "3"' not in rt.lowered_text(shared_expert, x, wu, wd)
    assert '_xla_stream_annotation = "3"' in rt.lowered_text(placed, x, wu, wd, platform="cuda")
    compiled = jax.jit(placed).lower(x, wu, wd).compile().as_text()
    assert '_xla_stream_annotation="3"' in compiled  # survives XLA's CPU pipeline too
    assert rel_err(jax.jit(placed)(x, wu, wd), shared_expert(x, wu, wd)) < 1e-6

    def loss(f):
        return lambda *a: jnp.sum(jnp.tanh(f(*a)) * x)
    g = jax.jit(jax.grad(loss(placed), argnums=(0, 1, 2)))
    assert tree_rel_err(g(x, wu, wd), jax.grad(loss(shared_expert), argnums=(0, 1, 2))(x, wu, wd)) < 1e-5
    assert '_xla_stream_annotation = "3"' in g.lower(x, wu, wd).as_text()  # the backward is placed too


def _placed_roundtrip(t=24, d=16, e=4, k=2):
    """Random tokens, expert ids and weights; a dispatch -> combine round trip, and it placed on the dispatch
    stream."""
    x = jax.random.normal(key(), (t, d))
    ids = jax.random.randint(key(), (t, k), 0, e)
    w = jax.random.uniform(key(), (t, k))

    def roundtrip(x, ids, w):
        rows, _, routing = jmf.moe_dispatch(x, ids, e)
        return jmf.moe_combine(rows * 2.0, routing, w)
    return x, ids, w, roundtrip, rt.on_stream(roundtrip, rt.DISPATCH_STREAM)


def test_on_stream_with_ffi_dispatch_and_nesting():
    x, ids, w, roundtrip, placed = _placed_roundtrip()
    text = rt.lowered_text(placed, x, ids, w)
    assert '_xla_stream_annotation = "2"' in text and "jax_moe_ffi_dispatch" in text
    want = 2.0 * jnp.sum(w, axis=1, keepdims=True) * x
    assert rel_err(jax.jit(placed)(x, ids, w), want) < 1e-5
    outer = rt.on_stream(lambda x, ids, w: placed(x, ids, w) + 1.0, 1)  # nested: runs on the outer stream
    text = rt.lowered_text(outer, x, ids, w)
    assert '_xla_stream_annotation = "1"' in text and '_xla_stream_annotation = "2"' not in text
    assert rel_err(jax.jit(outer)(x, ids, w), want + 1.0) < 1e-5


def _funcs(text):
    """StableHLO text -> {function name: its text}."""
    return {m.group(1): m.group(0) for m in re.finditer(r"func\.func (?:\w+ )?@([\w.$-]+)\(.*?\n  }", text, re.S)}


def _region(funcs, name):
    """The text of function `name` and of every function it calls, transitively."""
    seen, todo = set(), [name]
    while todo:
        f = todo.pop()
        if f not in seen and f in funcs:
            seen.add(f)
            todo += re.findall(r"call @([\w.$-]+)", funcs[f])
    return "".join(funcs[f] for f in seen)


def stream_regions(text):
    """(annotated ops, {compute_on function: region text}) of a lowered module."""
    annotated = [l.strip() for l in text.splitlines() if "_xla_stream_annotation" in l]
    funcs = _funcs(text)
    called = {c for l in annotated for c in re.findall(r"call @([\w.$-]+)\(", l)}
    return annotated, {c: _region(funcs, c) for c in called}


def test_on_stream_annotates_only_the_call():
    """XLA (ExplicitStreamAnnotationAsyncWrapper + ExecutionStreamAssignment) fails to compile an annotated op in a
    computation nested inside the annotated call (a conditional branch, an inner call): only the call carries it."""
    k1, k2, k3 = jax.random.split(key(), 3)
    x, wu, wd = (jax.random.normal(k1, (16, 32)), jax.random.normal(k2, (32, 64)) / 6,
                 jax.random.normal(k3, (64, 32)) / 8)

    def nested(x, wu, wd):  # jax.nn.silu and jnp.where lower to inner func.calls, lax.cond to a case
        h = jnp.where(x > 0, x, 0.1 * x)
        h = jax.lax.cond(jnp.sum(h) > 0, lambda a: shared_expert(a, wu, wd), lambda a: a @ wu @ wd, h)
        return jnp.tanh(h)
    placed = rt.on_stream(nested, 2)
    loss = lambda *a: jnp.sum(placed(*a) * x)
    for fn in (placed, jax.grad(loss, argnums=(0, 1, 2))):
        for platform in ("cpu", "cuda"):
            text = rt.lowered_text(fn, x, wu, wd, platform=platform)
            annotated, regions = stream_regions(text)
            assert annotated and regions, text
            assert all(re.search(r"call @compute_on[\w.$-]*\(", l) for l in annotated), annotated
            for name, body in regions.items():
                assert "_xla_stream_annotation" not in body, name
                assert "stablehlo.case" in body  # the lax.cond is there, nested in the region, unannotated
    assert rel_err(jax.jit(placed)(x, wu, wd), nested(x, wu, wd)) < 1e-6


def test_on_stream_ffi_ops_under_grad_annotate_only_calls():
    """The FFI ops route through lax.platform_dependent (a conditional): under grad its branch and the custom_vjp
    rules are traced later by JAX, outside on_stream's Python call; they must stay unannotated too."""
    x, ids, w, roundtrip, placed = _placed_roundtrip()
    grad = jax.grad(lambda x, w: jnp.sum(placed(x, ids, w) ** 2), argnums=(0, 1))
    for platform in ("cpu", "cuda"):  # cuda without the CUDA library here: the pure-JAX fallback, inner calls
        annotated, regions = stream_regions(rt.lowered_text(grad, x, w, platform=platform))
        assert len(regions) >= 2 and all(re.search(r"call @compute_on[\w.$-]*\(", l) for l in annotated)
        bodies = "".join(regions.values())
        assert "stablehlo.case" in bodies and "_xla_stream_annotation" not in bodies
        assert platform != "cpu" or "jax_moe_ffi_combine_bwd" in bodies
    want = jax.grad(lambda x, w: jnp.sum(roundtrip(x, ids, w) ** 2), argnums=(0, 1))(x, w)
    assert tree_rel_err(jax.jit(grad)(x, w), want) < 1e-5


@pytest.mark.parametrize("missing", ["_compute_on_impl", "_compute_type_config"])
def test_on_stream_unsupported_is_noop_with_one_warning(monkeypatch, missing):
    assert rt.streams_supported()
    monkeypatch.setattr(rt, missing, lambda: None)
    monkeypatch.setattr(rt, "_warned", set())
    assert not rt.streams_supported()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fns = [rt.on_stream(shared_expert, 1), rt.on_stream(jnp.sin, 2)]
    assert fns == [shared_expert, jnp.sin]
    assert len([r for r in rec if "no-op" in str(r.message)]) == 1


@pytest.mark.parametrize("bad", [0, -1, "1", 1.0, True])
def test_on_stream_rejects_bad_ids(bad):
    with pytest.raises(ValueError, match="stream_id"):
        rt.on_stream(jnp.sin, bad)


# ---------------------------------------------------------------------------------------- host offload
T, D, F, E, K, L = 32, 16, 24, 4, 2, 2


def moe_layer(p, x):
    """Dropless MoE on the package ops, MoE intermediates tagged for offload; residual connection."""
    weights, experts, _ = models._router(p, x, K)
    rows, sizes, routing = jmf.moe_dispatch(x, experts, E)
    rows = rt.tag(rows, "moe_dispatched_rows")
    h = jax.nn.silu(jmf.grouped_matmul(rows, p["w_gate"], sizes)) * jmf.grouped_matmul(rows, p["w_up"], sizes)
    h = rt.tag(h, "moe_expert_hidden")
    y = rt.tag(jmf.grouped_matmul(h, p["w_down"], sizes), "moe_expert_out")
    return x + jmf.moe_combine(y, routing, weights)


def make_model(layer):
    def model(stacked, x):
        y, _ = jax.lax.scan(lambda c, p: (layer(p, c), None), x, stacked)
        return jnp.sum(jnp.sin(y) * y)
    return model


@pytest.fixture(scope="module")
def moe_inputs():
    ks = jax.random.split(key(), L + 1)
    layers = [models.init_moe_params(k, D, F, E) for k in ks[:L]]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    return stacked, jax.random.normal(ks[L], (T, D)), layers


def test_offload_model_forward_matches_dense_reference(moe_inputs):
    stacked, x, layers = moe_inputs
    want = x
    for p in layers:
        want = want + models.dense_moe(p, want, K)
    got = jax.lax.scan(lambda c, p: (rt.remat_with_offload(moe_layer)(p, c), None), x, stacked)[0]
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("others", ["recompute", "save"])
def test_offload_gradients_equal_and_residuals_on_host(moe_inputs, others):
    stacked, x, _ = moe_inputs
    plain = make_model(moe_layer)
    off = make_model(rt.remat_with_offload(moe_layer, others=others))
    g_plain = jax.jit(jax.grad(plain, argnums=(0, 1)))(stacked, x)
    g_off = jax.jit(jax.grad(off, argnums=(0, 1)))(stacked, x)
    assert tree_rel_err(g_off, g_plain) < 1e-5
    # what moved: per layer rows[R,D], hidden[R,F], expert out[R,D] in float32, stacked over L layers
    r = T * K
    assert rt.offloaded_bytes(off, stacked, x) == L * r * (D + F + D) * 4
    assert rt.offloaded_bytes(plain, stacked, x) == 0
    only_hidden = make_model(rt.remat_with_offload(moe_layer, ["moe_expert_hidden"], others=others))
    assert rt.offloaded_bytes(only_hidden, stacked, x) == L * r * F * 4


def test_offload_annotations_in_hlo(moe_inputs):
    stacked, x, _ = moe_inputs
    grad = jax.grad(make_model(rt.remat_with_offload(moe_layer)))
    jaxpr = str(jax.make_jaxpr(grad)(stacked, x))
    assert "jax_moe_ffi/moe_expert_hidden" in jaxpr and "<host>" in jaxpr
    # JAX lowers the memory-space move to nothing on CPU; the GPU lowering (made here) carries it
    cuda = rt.lowered_text(grad, stacked, x, platform="cuda")
    to_host = cuda.count('_xla_buffer_placement = "pinned_host"')
    assert to_host >= 3 and "annotate_device_placement" in cuda
    plain = rt.lowered_text(jax.grad(make_model(jax.checkpoint(moe_layer))), stacked, x, platform="cuda")
    assert "pinned_host" not in plain


def test_offload_policy_names_and_errors():
    pol = rt.offload_policy("moe_expert_hidden")
    assert pol is not None and rt.offload_policy(("jax_moe_ffi/moe_expert_hidden",)) is not None
    with pytest.raises(ValueError, match="others"):
        rt.offload_policy(others="sometimes")
    with pytest.raises(ValueError):  # a name both saved and offloaded
        rt.offload_policy(["moe_expert_hidden"], save=["jax_moe_ffi/moe_expert_hidden"])
    x = jax.random.normal(key(), (5, 3))
    assert rt.tag(x, "moe_dispatched_rows") is x or np.array_equal(rt.tag(x, "moe_dispatched_rows"), x)


# ------------------------------------------------------------------------------------------- memory
def test_memory_report_counts_arguments_and_outputs():
    m, n = np.random.randint(8, 64, size=2)
    a, b = jax.random.normal(key(), (m, n)), jax.random.normal(key(), (n, m))
    rep = rt.memory_report(lambda a, b: (a @ b, jnp.tanh(a)), a, b)
    assert rep["argument_bytes"] == 2 * m * n * 4
    out = (m * m + m * n) * 4
    assert out <= rep["output_bytes"] <= out + 64  # CPU adds the output tuple's pointer table
    assert rep["peak_bytes"] >= rep["argument_bytes"] + rep["output_bytes"] - rep["alias_bytes"]
    assert {"temp_bytes", "host_temp_bytes", "peak_source"} <= rep.keys()
    peak = rt.device_peak_bytes()
    assert peak is None or peak >= 0


def test_moe_remat_policy_adds_the_tags_to_the_regions_own_policy():
    """optimize(offload=...) wraps a checkpoint region's policy: the region's own choices stay (its dots are still
    saved) and the MoE tags of the mode are added (saved on the device, or offloaded to host memory)."""
    from jax._src.ad_checkpoint import saved_residuals  # public jax.ad_checkpoint only prints them

    def f(w, x):
        h = rt.tag(jnp.sin(jnp.tanh(x @ w)), "moe_expert_hidden")
        y = rt.tag(jnp.cos(h) @ w, "moe_expert_out")
        return jnp.sum(jnp.exp(y))

    w, x = jnp.full((8, 8), 0.1), jnp.ones((4, 8))
    base = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    saved = lambda pol: " | ".join(d for _, d in saved_residuals(jax.checkpoint(f, policy=pol), w, x))
    own = saved(base)
    assert "dot_general" in own and "moe_expert" not in own
    dev = saved(rt.moe_remat_policy("device", base=base))
    assert "dot_general" in dev and "jax_moe_ffi/moe_expert_hidden" in dev and "moe_expert_out" not in dev
    host = saved(rt.moe_remat_policy("pinned_host", base=base))
    assert "dot_general" in host and "moe_expert_hidden" not in host
    dev_only = saved(rt.moe_remat_policy("device"))
    assert "jax_moe_ffi/moe_expert_hidden" in dev_only and "dot_general" not in dev_only
    assert rt.offload_mode(True) == rt.offload_mode("host") == "pinned_host" and rt.offload_mode(None) is None
    with pytest.raises(ValueError, match="offload"):
        rt.offload_mode("nvme")
    mixed = {"moe_expert_out": "pinned_host", "moe_expert_hidden": "device"}  # per-name placement
    assert rt.offload_mode(mixed) == (("moe_expert_hidden", "device"), ("moe_expert_out", "pinned_host"))
    assert rt.offload_placement(rt.offload_mode(mixed)) == mixed
    mix = saved_residuals(jax.checkpoint(f, policy=rt.moe_remat_policy(mixed)), w, x)
    on_host = [a for a, _ in mix if getattr(a, "memory_space", None) == jax.memory.Space.Host]
    on_dev = [d for a, d in mix if getattr(a, "memory_space", None) != jax.memory.Space.Host]
    assert len(on_host) == 1 and any("jax_moe_ffi/moe_expert_hidden" in d for d in on_dev), mix
    for bad, needle in (({"moe_router": "device"}, "tag names"), ({}, "empty"),
                        ({"moe_expert_out": "disk"}, r"offload\['moe_expert_out'\]")):
        with pytest.raises(ValueError, match=needle):
            rt.offload_mode(bad)
    g0 = jax.grad(f, (0, 1))(w, x)
    for pol in (rt.moe_remat_policy("device", base=base), rt.moe_remat_policy("pinned_host", base=base),
                rt.moe_remat_policy(mixed)):
        for a, b in zip(jax.grad(jax.checkpoint(f, policy=pol), (0, 1))(w, x), g0):
            np.testing.assert_allclose(a, b, rtol=1e-5)


# ---------------------------------------------------------------- scan outputs without the zero fill
def _scanned_layers(ws, h):
    """A scan over stacked layer weights with stacked per-layer outputs; its gradient's scan stacks dW."""
    def layer(h, w):
        y = jnp.tanh(h @ w)
        return y, jnp.sum(y * y, axis=-1)
    return jax.lax.scan(layer, h, ws)


def _cuda_text(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_uninitialized_scan_outputs_allocates_instead_of_zero_filling():
    ws = jax.random.normal(key(), (3, 16, 16)) / 4
    h = jax.random.normal(key(), (5, 16))
    loss = lambda ws, h: jnp.sum(_scanned_layers(ws, h)[1]) + jnp.sum(_scanned_layers(ws, h)[0] ** 2)
    grad = jax.value_and_grad(loss, argnums=(0, 1))
    before = _cuda_text(grad, ws, h)
    with rt.uninitialized_scan_outputs() as active:
        assert active
        # a new function object: JAX caches lowerings, and only a process's first block clears the caches
        inside = _cuda_text(lambda ws, h: grad(ws, h), ws, h)
        got = jax.jit(lambda ws, h: grad(ws, h))(ws, h)
    # forward scans stack the per-layer sums (and the residuals for the backward); the backward scan stacks dW
    assert "AllocateBuffer" not in before
    assert inside.count("AllocateBuffer") >= 3, inside.count("AllocateBuffer")
    zero_splats = lambda t: len(re.findall(r"stablehlo.broadcast_in_dim %cst\w*, dims = \[\] : \(tensor<f32>\) -> "
                                           r"tensor<3x", t))
    assert zero_splats(inside) < zero_splats(before)
    # the zero fill was dead: values and gradients are those of the default lowering (CPU lowers lax.empty to
    # zeros, so here this checks the block breaks nothing; the GPU A/B in benchmarks/train_step.py compares losses)
    want = jax.jit(jax.value_and_grad(lambda ws, h: loss(ws, h) + 0.0, argnums=(0, 1)))(ws, h)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    # the original allocation is back after the block (a fresh function: lowerings are cached by jaxpr)
    after = _cuda_text(jax.value_and_grad(lambda ws, h: loss(ws, h) * 1.0, argnums=(0, 1)), ws, h)
    assert "AllocateBuffer" not in after


def test_uninitialized_scan_outputs_keeps_host_and_disabled_cases(monkeypatch):
    ws = jax.random.normal(key(), (2, 8, 8))
    h = jax.random.normal(key(), (4, 8))
    fn = lambda ws, h: _scanned_layers(ws, h)[1]
    with rt.uninitialized_scan_outputs(enable=False) as active:
        assert not active and "AllocateBuffer" not in _cuda_text(lambda a, b: fn(a, b) + 1.0, ws, h)
    # a JAX without the internals: one warning, nothing changed
    from jax._src.lax.control_flow import loops
    monkeypatch.setattr(loops, "_empty_array", lambda prefix, aval: None)
    rt._warned.discard("scan-empty")
    with pytest.warns(UserWarning, match="zero-filled"):
        with rt.uninitialized_scan_outputs() as active:
            assert not active
    monkeypatch.undo()
    # more than one device: a warning that partitioned programs are not checked (the knob still applies)
    monkeypatch.setattr(jax, "device_count", lambda *a: 8)
    rt._warned.discard("scan-empty-multi")
    with pytest.warns(UserWarning, match="partitioned"):
        with rt.uninitialized_scan_outputs() as active:
            assert active
    monkeypatch.undo()
    from jax._src import core
    host = core.ShapedArray((4,), jnp.float32, memory_space=core.MemorySpace.Host)
    dev = core.ShapedArray((4,), jnp.float32)
    assert not rt._plain_device_aval(host) and rt._plain_device_aval(dev)


def poison_free_device_memory(fraction: float = 0.8):
    """Fills most of the device's free memory with NaN and frees it again: a buffer that is later allocated
    there and not fully written reads NaN."""
    stats = jax.local_devices()[0].memory_stats()
    chunk = 1 << 30
    held = [jnp.full((chunk // 4,), jnp.nan, jnp.float32)
            for _ in range(int((stats["bytes_limit"] - stats["bytes_in_use"]) * fraction) // chunk)]
    jax.block_until_ready(held)
    assert held, stats
    del held


@pytest.mark.gpu
@pytest.mark.parametrize("layers", [1, 3])
def test_gpu_uninitialized_scan_outputs_leave_no_element_unwritten(layers):
    fn, args = examples_decoder_scan(layers)
    fast = jmf.optimize(fn, offload="device")
    vg = jax.value_and_grad(lambda p, x: jnp.sum(jnp.tanh(fast(p, x)) ** 2), (0, 1))
    want = jax.jit(vg)(*args)
    with rt.uninitialized_scan_outputs():
        step = jax.jit(lambda p, x: vg(p, x))
        assert "AllocateBuffer" in step.lower(*args).as_text()
        step(*args)  # compiled here
    poison_free_device_memory()
    got = step(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.all(np.isfinite(a))
        # bf16 through the CUDA kernels: the two executables may differ in XLA's own rounding, not by garbage
        assert rel_err(a, b) < 1e-3
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2 * float(np.max(np.abs(b))))


def examples_decoder_scan(layers):
    from jax_moe_ffi import examples
    return examples.decoder_scan(tokens=512, d_model=128, d_ff=256, experts=8, layers=layers, dtype=jnp.bfloat16,
                                 seed=int(np.random.SeedSequence().entropy % 1000))


def test_explain_points_at_the_scan_zero_fill():
    from jax_moe_ffi import examples
    from jax_moe_ffi.rewrite import _fmt_bytes
    fn, (stacked, x) = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=4, layers=3)
    notes = " ".join(jmf.explain(fn, stacked, x).notes)
    xs_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(stacked))
    assert "zero-fills" in notes and "uninitialized_scan_outputs" in notes, notes
    assert f"up to {_fmt_bytes(xs_bytes)}" in notes, (notes, xs_bytes)
    # no scan, no note
    plain = lambda p, x: models.dense_moe(p, x, 2)
    p0 = jax.tree.map(lambda a: a[0], stacked)
    assert "zero-fills" not in " ".join(jmf.explain(plain, p0, x).notes)


def test_uninitialized_scan_outputs_block_per_step_does_not_recompile():
    ws = jax.random.normal(key(), (2, 8, 8))
    h = jax.random.normal(key(), (4, 8))
    traces = []

    def loss(ws, h):
        traces.append(1)  # runs once per trace: a cleared cache would trace (and compile) again
        return _scanned_layers(ws, h)[1].sum()

    step = jax.jit(loss)
    with rt.uninitialized_scan_outputs():
        first = step(ws, h)
    for _ in range(3):  # a block around every call: traced and compiled once
        with rt.uninitialized_scan_outputs():
            np.testing.assert_array_equal(step(ws, h), first)
    assert len(traces) == 1, len(traces)
    # blocks nest (no deadlock), and the outer block's allocation is back after the inner one
    from jax._src.lax.control_flow import loops
    original = loops._empty_array
    with rt.uninitialized_scan_outputs():
        outer = loops._empty_array
        with rt.uninitialized_scan_outputs():
            assert loops._empty_array is not original
        assert loops._empty_array is outer
    assert loops._empty_array is original


def test_uninitialized_scan_outputs_with_key_and_narrow_dtypes():
    """Stacked PRNG keys (an extended dtype) and int4 outputs: lowered for cuda with AllocateBuffer, and the
    same values as JAX's zero-filled scan."""
    def f(k, x):
        def body(c, xi):
            k1, k2 = jax.random.split(c)
            return k1, (k2, xi.astype(jnp.int4), jax.random.uniform(k2, (3,)))
        return jax.lax.scan(body, k, x)
    k, x = jax.random.key(int(np.random.SeedSequence().entropy % 1000)), jnp.arange(8).reshape(4, 2) % 7
    want = jax.jit(f)(k, x)
    with rt.uninitialized_scan_outputs():
        g = lambda k, x: f(k, x)
        assert "AllocateBuffer" in _cuda_text(g, k, x)
        got = jax.jit(g)(k, x)
    np.testing.assert_array_equal(jax.random.key_data(got[1][0]), jax.random.key_data(want[1][0]))
    for a, b in zip(jax.tree.leaves(got[1][1:]), jax.tree.leaves(want[1][1:])):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


_SHARDED_SCAN = r'''
import jax, jax.numpy as jnp, numpy as np, warnings
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax_moe_ffi import runtime as rt
mesh = Mesh(np.array(jax.devices()).reshape(8), ("d",))
def loss(ws, h):
    return jnp.sum(jax.lax.scan(lambda c, w: (c, jnp.tanh(c @ w)), h, ws)[1] ** 2)
ws, h = jnp.ones((4, 64, 32)), jnp.ones((16, 64))
wss = jax.device_put(ws, NamedSharding(mesh, P(None, "d", None)))
hs = jax.device_put(h, NamedSharding(mesh, P(None, "d")))
with warnings.catch_warnings(record=True) as w, rt.uninitialized_scan_outputs():
    warnings.simplefilter("always")
    sharded = jax.jit(jax.grad(loss)).trace(wss, hs).lower(lowering_platforms=("cuda",)).as_text()
    single = jax.jit(jax.grad(lambda a, b: loss(a, b) * 1.0)).trace(ws, h).lower(lowering_platforms=("cuda",)).as_text()
print("RESULT", "AllocateBuffer" in sharded, "AllocateBuffer" in single, any("partitioned" in str(x.message) for x in w))
'''


def test_uninitialized_scan_outputs_leaves_partitioned_programs_alone():
    """On 8 devices, a jit over sharded inputs: the avals carry the mesh, so its scans keep JAX's zero fill (no
    AllocateBuffer whose partitioning would be unchecked); a single-device program in the same process gets the
    allocation; the block warns once that partitioned programs are left alone."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    proc = subprocess.run([sys.executable, "-c", _SHARDED_SCAN], env=env, capture_output=True, text=True, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    assert line[-1].split()[1:] == ["False", "True", "True"], line
