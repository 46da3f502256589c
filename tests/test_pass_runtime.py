"""optimize(streams=..., offload=...): stream annotation in the lowered HLO, offload tags + policy, numerics."""
import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_moe_ffi as jmf
from jax_moe_ffi import examples, runtime


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_streams_annotate_the_combine_and_keep_numerics():
    fn, args = examples.mixtral_dense(tokens=64, d_model=32, d_ff=64, experts=8, seed=3)
    on, off = jmf.optimize(fn, streams=True), jmf.optimize(fn, streams=False)
    text_on = jax.jit(on).lower(*args).as_text()
    text_off = jax.jit(off).lower(*args).as_text()
    if runtime.streams_supported():
        assert "_xla_stream_annotation" in text_on
    assert "_xla_stream_annotation" not in text_off
    ref = fn(*args)
    assert _rel(on(*args), ref) < 1e-5 and _rel(off(*args), ref) < 1e-5


def test_offload_tags_and_policy_offload_the_moe_intermediates():
    fn, args = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=4)
    fast = jmf.optimize(fn, offload="pinned_host")
    assert hasattr(fast, "offload_policy")
    layer = jax.checkpoint(fast, policy=fast.offload_policy)
    loss = lambda f: (lambda p, x: jnp.sum(f(p, x) ** 2))
    g = jax.grad(loss(layer), (0, 1))(*args)
    g0 = jax.grad(loss(fn), (0, 1))(*args)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
        assert _rel(a, b) < 1e-4
    # the tagged rows really are held in host memory by the policy; none without tags
    assert runtime.offloaded_bytes(lambda p, x: jnp.sum(layer(p, x) ** 2), *args) > 0
    plain = jax.checkpoint(jmf.optimize(fn), policy=fast.offload_policy)
    assert runtime.offloaded_bytes(lambda p, x: jnp.sum(plain(p, x) ** 2), *args) == 0


def _custom_calls(f, args):
    """{FFI target: count} in the compiled HLO of f's gradient, compiled for the CPU on any backend: on a GPU the
    float32 grouped GEMMs lower to XLA's fallback (the CUDA kernels take bf16 / fp16), so there is nothing to count."""
    loss = lambda p, x: jnp.sum(f(p, x) ** 2)
    args = jax.device_put(args, jax.devices("cpu")[0])
    text = jax.jit(jax.grad(loss, (0, 1))).lower(*args).compile().as_text()
    return collections.Counter(re.findall(r'custom_call_target="(jax_moe_ffi_\w+)"', text))


def _residual_bytes(f, args):
    loss = lambda p, x: jnp.sum(f(p, x) ** 2)
    jaxpr = jax.make_jaxpr(lambda *a: jax.vjp(loss, *a)[1])(*args)
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jaxpr.out_avals)


@pytest.mark.parametrize("fold", ["1", "0"])
def test_offload_device_keeps_expert_gemm_outputs_in_the_models_own_checkpoint(fold, monkeypatch):
    """decoder_scan's layers are under the model's own jax.checkpoint (default policy: recompute everything).
    optimize(offload="device") makes that checkpoint save the dispatched rows and the expert GEMM outputs: the
    backward then re-runs none of the layer's expert GEMMs and no gather (fewer custom calls in the compiled
    gradient, more residual bytes), with the same gradients. Without offload the backward re-runs three GEMMs
    with the weighted combine (its backward reads the down GEMM's output) and two with the combine weights
    folded into the down GEMM (JAX_MOE_FFI_FOLD_COMBINE_WEIGHTS, on by default: nothing needs that output)."""
    monkeypatch.setenv("JAX_MOE_FFI_FOLD_COMBINE_WEIGHTS", fold)
    fn, args = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=6)
    plain, saved = jmf.optimize(fn), jmf.optimize(fn, offload="device")
    cp, cs = _custom_calls(plain, args), _custom_calls(saved, args)
    recomputed = 2 if fold == "1" else 3
    assert cs["jax_moe_ffi_grouped_gemm"] == cp["jax_moe_ffi_grouped_gemm"] - recomputed, (cp, cs)
    assert cs["jax_moe_ffi_dispatch"] == cp["jax_moe_ffi_dispatch"] - 1, (cp, cs)
    assert cs["jax_moe_ffi_grouped_gemm_wgrad"] == cp["jax_moe_ffi_grouped_gemm_wgrad"] == 3
    assert _residual_bytes(saved, args) > _residual_bytes(plain, args)
    assert runtime.offloaded_bytes(lambda p, x: jnp.sum(saved(p, x) ** 2), *args) == 0
    loss = lambda f: (lambda p, x: jnp.sum(f(p, x) ** 2))
    g0 = jax.grad(loss(fn), (0, 1))(*args)
    for f in (plain, saved):
        for a, b in zip(jax.tree.leaves(jax.grad(loss(f), (0, 1))(*args)), jax.tree.leaves(g0)):
            assert _rel(a, b) < 1e-4


def test_offload_pinned_host_reaches_the_models_own_checkpoint():
    """Without wrapping anything: the model's own checkpoint offloads the tagged rows / expert outputs."""
    fn, args = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=7)
    fast = jmf.optimize(fn, offload="pinned_host")
    loss = lambda f: (lambda p, x: jnp.sum(f(p, x) ** 2))
    assert runtime.offloaded_bytes(loss(fast), *args) > 0
    assert runtime.offloaded_bytes(loss(jmf.optimize(fn)), *args) == 0
    g0 = jax.grad(loss(fn), (0, 1))(*args)
    for a, b in zip(jax.tree.leaves(jax.grad(loss(fast), (0, 1))(*args)), jax.tree.leaves(g0)):
        assert _rel(a, b) < 1e-4
    r = jmf.explain(fn, *args, offload=True)
    assert r.offload == "pinned_host" and any("1 jax.checkpoint region" in n for n in r.notes)


def _hlo_computations(text):
    """Compiled HLO text -> {computation: [instruction lines]}."""
    comps, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$", line)
        if m:
            cur = comps.setdefault(m.group(1), [])
        elif cur is not None and line.startswith("  "):
            cur.append(line.strip())
    return comps


def _callees(line):
    names = re.findall(r"(?:to_apply|calls|body|condition|true_computation|false_computation)=%([\w.\-]+)", line)
    for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
        names += re.findall(r"%([\w.\-]+)", group)
    return names


def _nested(comps, name):
    seen, todo = set(), [name]
    while todo:
        c = todo.pop()
        if c not in seen and c in comps:
            seen.add(c)
            todo += [n for line in comps[c] for n in _callees(line)]
    return seen


def test_streams_in_scanned_grad_leave_one_annotated_call_per_region():
    """The structure XLA's GPU stream passes need (see the runtime module docstring): under grad + lax.scan +
    jax.checkpoint, only `call`s carry `_xla_stream_annotation`, and nothing below them does -- no annotated
    instruction and no conditional in any computation they reach (XLA would wrap such an instruction in a second,
    nested call-start that ExecutionStreamAssignment never reaches)."""
    fn, args = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=5)
    fast = jmf.optimize(fn, streams=True)
    loss = lambda f: (lambda p, x: jnp.sum(f(p, x) ** 2))
    step = jax.jit(jax.value_and_grad(loss(fast), (0, 1)))
    lowered = step.lower(*args)
    assert "stablehlo.while" in lowered.as_text()
    for text in (lowered.as_text(), runtime.lowered_text(jax.value_and_grad(loss(fast), (0, 1)), *args,
                                                        platform="cuda")):
        annotated = [l for l in text.splitlines() if "_xla_stream_annotation" in l]
        if runtime.streams_supported():
            assert annotated
        # `call` or `func.call` (JAX 0.12 prints the generic form inside while bodies): the same op
        assert all(re.search(r"= (func\.)?call @compute_on[\w.$-]*\(", l) for l in annotated), annotated
    comps = _hlo_computations(lowered.compile().as_text())
    calls = [(c, l) for c, ls in comps.items() for l in ls
             # (a call-start's call-done carries its attributes too; it calls nothing)
             if "_xla_stream_annotation" in l and " get-tuple-element(" not in l and " call-done(" not in l]
    if runtime.streams_supported():
        assert calls
    for comp, line in calls:
        # the instruction is a call; XLA:GPU has made it an asynchronous call-start on its stream
        assert re.search(r"[\]})] call(-start)?\(", line), line
        below = set().union(*(_nested(comps, c) for c in _callees(line)))
        assert below, line
        for c in below:
            assert not any("_xla_stream_annotation" in l for l in comps[c]), (c, line)
            assert not any(" conditional(" in l for l in comps[c]), (c, line)
    g = step(*args)[1]
    g0 = jax.grad(loss(fn), (0, 1))(*args)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
        assert _rel(a, b) < 1e-4


def test_no_stream_region_under_vmap(monkeypatch):
    """Under jax.vmap the ops batch as a loop, which XLA:GPU cannot place inside a stream-annotated call (H100, JAX
    0.11.2: "No ExecutionStreamId found for %fusion-start"): on_stream then runs on the main stream and says so once,
    whether the vmap is outside or inside a jax.jit; without vmap the region is annotated."""
    if not runtime.streams_supported():
        pytest.skip(f"JAX {jax.__version__} cannot annotate streams")
    monkeypatch.setattr(runtime, "_warned", set())
    x = jax.random.normal(jax.random.PRNGKey(np.random.default_rng().integers(2**31)), (3, 4))
    # (each case a new function: a jit traced before without the vmap would be reused from JAX's trace cache)
    fresh = lambda: runtime.on_stream(lambda x: jnp.sin(x) * 2.0)
    with pytest.warns(UserWarning, match="under jax.vmap"):
        assert "_xla_stream_annotation" not in jax.jit(jax.vmap(fresh())).lower(x).as_text()
    for g in (jax.vmap(jax.jit(fresh())), jax.vmap(fresh())):
        assert "_xla_stream_annotation" not in jax.jit(g).lower(x).as_text()
        np.testing.assert_allclose(np.asarray(g(x)), np.sin(np.asarray(x)) * 2.0, rtol=1e-6)
    assert "_xla_stream_annotation" in jax.jit(fresh()).lower(x[0]).as_text()  # no vmap: annotated


def _shared_expert_problem(seed=5, t=48, d=32, f=16, e=8):
    from jax_moe_ffi import models
    p = models.init_moe_params(jax.random.PRNGKey(seed), d, f, e, jnp.float32)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed + 1), 3)
    p["shared_up"] = jax.random.normal(k1, (d, f)) / d ** 0.5
    p["shared_down"] = jax.random.normal(k2, (f, d)) / f ** 0.5
    x = jax.random.normal(k3, (t, d))
    return (lambda p, x: models.shared_expert_moe(p, x, 2)), p, x


def test_streams_place_the_shared_expert_on_its_own_stream():
    # The shared expert (x @ shared_up -> silu -> @ shared_down) neither feeds the routed site nor uses its
    # output: with streams=True it is one call on SHARED_EXPERT_STREAM holding both of its dots; the combine is
    # on DISPATCH_STREAM; the router's dot stays on the main stream.
    fn, p, x = _shared_expert_problem()
    on = jmf.optimize(fn, streams=True)
    ref = fn(p, x)
    assert _rel(on(p, x), ref) < 1e-5
    g = jax.grad(lambda p, x: jnp.sum(on(p, x) ** 2), (0, 1))(p, x)
    g0 = jax.grad(lambda p, x: jnp.sum(fn(p, x) ** 2), (0, 1))(p, x)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
        assert _rel(a, b) < 1e-5
    if not runtime.streams_supported():
        return
    text = runtime.lowered_text(jax.jit(on), p, x, platform="cuda")
    shared = f'_xla_stream_annotation = "{runtime.SHARED_EXPERT_STREAM}"'
    combine = f'_xla_stream_annotation = "{runtime.DISPATCH_STREAM}"'
    assert text.count(shared) == 1 and text.count(combine) == 1
    # the annotated call's callee holds the shared expert's two dots (shapes [48,32]x[32,16] and [48,16]x[16,32])
    call = next(l for l in text.splitlines() if shared in l)
    callee = re.search(r"call @([\w.\-]+)", call).group(1)
    body = text[text.index(f"func.func private @{callee}"):]
    body = body[: body.index("\n  }") if "\n  }" in body else len(body)]
    assert body.count("stablehlo.dot_general") == 2
    off_text = runtime.lowered_text(jax.jit(jmf.optimize(fn, streams=False)), p, x, platform="cuda")
    assert "_xla_stream_annotation" not in off_text


def test_shared_expert_on_3d_tokens_beside_a_site_that_flattens_them():
    # MaxText's RoutedAndSharedMoE shape: the routed part reads x [B, S, D] reshaped to [B*S, D], the shared expert
    # reads x [B, S, D] itself. Two things must hold: the shared expert's dot over the 3-D function input is not
    # reported as an expert-stacked near-miss (it is a dense layer x[..., D] @ W[D, F]), and it is found as a side
    # branch (through the reshape) and placed on the shared-expert stream.
    from jax_moe_ffi import models
    _, p, x2 = _shared_expert_problem(seed=int(np.random.SeedSequence().entropy % 1000))
    b, s = 4, x2.shape[0] // 4
    x = x2.reshape(b, s, -1)

    def fn(p, x):
        routed = models.dense_moe(p, x.reshape(-1, x.shape[-1]), 2).reshape(x.shape)
        shared = jax.nn.silu(jnp.einsum("bsd,df->bsf", x, p["shared_up"])) @ p["shared_down"]
        return routed + shared

    r = jmf.explain(fn, p, x)
    assert len(r.sites) == 1 and not r.misses, str(r)
    assert any("1 side branch" in n for n in r.notes), str(r)
    on = jmf.optimize(fn, streams=True)
    assert _rel(on(p, x), fn(p, x)) < 1e-5
    if runtime.streams_supported():
        text = runtime.lowered_text(jax.jit(on), p, x, platform="cuda")
        assert text.count(f'_xla_stream_annotation = "{runtime.SHARED_EXPERT_STREAM}"') == 1


def _decoder_without_remat(p, x):
    """examples.decoder_scan's model (models.moe_decoder) without the jax.checkpoint on its layers."""
    from jax_moe_ffi import models
    return models.moe_decoder(p, x, 2, remat=False)


def test_residual_barrier_only_where_scan_residuals_are_stacked():
    """The GEMM outputs / dispatched rows of a site go behind an optimization barrier exactly where a scan may
    stack them for the backward (a scan body without jax.checkpoint, or offload=...): XLA's GPU dynamic-slice
    fusion would otherwise clone the custom calls (see emit._guard_residuals). Values are unchanged."""
    from jax_moe_ffi.rewrite.emit import residuals_stacked
    assert residuals_stacked("scan/") and residuals_stacked("remat/scan/") and residuals_stacked("scan/remat/scan/")
    assert not residuals_stacked("") and not residuals_stacked("scan/remat/") and not residuals_stacked("remat/")
    fn, (stacked, x) = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=8)
    no_remat = _decoder_without_remat

    count = lambda f: jax.jit(f).lower(stacked, x).as_text().count("optimization_barrier")
    assert count(jmf.optimize(no_remat)) > count(no_remat)
    assert count(jmf.optimize(fn)) == count(fn)  # layers under jax.checkpoint: nothing stacked, no barrier
    assert count(jmf.optimize(fn, offload="device")) > count(fn)
    loss = lambda f: (lambda p, x: jnp.sum(f(p, x) ** 2))
    g0 = jax.grad(loss(no_remat), (0, 1))(stacked, x)
    for a, b in zip(jax.tree.leaves(jax.grad(loss(jmf.optimize(no_remat)), (0, 1))(stacked, x)), jax.tree.leaves(g0)):
        assert _rel(a, b) < 1e-4


def test_explain_says_where_the_residual_barrier_goes():
    fn, (stacked, x) = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=9)
    no_remat = _decoder_without_remat
    barrier = lambda r: [n for s in r.sites for n in s.notes if "optimization barrier" in n]
    assert barrier(jmf.explain(no_remat, stacked, x)) and not barrier(jmf.explain(fn, stacked, x))
    assert barrier(jmf.explain(fn, stacked, x, offload="device"))


@pytest.mark.gpu
def test_gpu_scanned_model_without_remat_runs_each_expert_gemm_once():
    """On the GPU, the compiled gradient of a scanned MoE model without jax.checkpoint holds as many grouped-GEMM /
    dispatch calls as the lowered program (XLA's dynamic-slice fusion cloned them before the residual barrier:
    8 GEMM calls compiled from 5 lowered on the H200)."""
    _, (stacked, x) = examples.decoder_scan(tokens=512, d_model=256, d_ff=512, experts=8, seed=10,
                                            dtype=jnp.bfloat16)
    fast = jmf.optimize(_decoder_without_remat)
    loss = lambda p, x: jnp.sum(fast(p, x).astype(jnp.float32) ** 2)
    lowered = jax.jit(jax.grad(loss, (0, 1))).lower(stacked, x)
    want = collections.Counter(re.findall(r"@(jax_moe_ffi_(?:grouped_gemm\w*|dispatch))\(", lowered.as_text()))
    got = collections.Counter(re.findall(r'custom_call_target="(jax_moe_ffi_(?:grouped_gemm\w*|dispatch))"',
                                         lowered.compile().as_text()))
    gemm_calls = sum(v for t, v in want.items() if t.startswith("jax_moe_ffi_grouped_gemm"))
    assert gemm_calls >= 3 and got == want, (want, got)


def test_offload_by_index_places_one_expert_gemm_output():
    """Each expert GEMM output has its own tag (runtime.hidden_name): offloading only the first one of the
    gate/up pair moves half the bytes that the family name moves, the indexed name overrides the family's
    placement, and the gradients are unchanged."""
    fn, args = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=9)
    loss = lambda f: (lambda p, x: jnp.sum(f(p, x) ** 2))
    both = jmf.optimize(fn, offload={"moe_dispatched_rows": "device", "moe_expert_hidden": "pinned_host"})
    first = jmf.optimize(fn, offload={"moe_dispatched_rows": "device", "moe_expert_hidden": "device",
                                      "moe_expert_hidden.0": "pinned_host"})
    second = jmf.optimize(fn, offload={"moe_dispatched_rows": "device", "moe_expert_hidden.1": "pinned_host"})
    b_both, b_first, b_second = (runtime.offloaded_bytes(loss(f), *args) for f in (both, first, second))
    assert b_both > 0 and b_first > 0 and b_first == b_second and b_both == 2 * b_first, (b_both, b_first)
    g0 = jax.grad(loss(fn), (0, 1))(*args)
    for f in (first, second):
        for a, b in zip(jax.tree.leaves(jax.grad(loss(f), (0, 1))(*args)), jax.tree.leaves(g0)):
            assert _rel(a, b) < 1e-4
    assert runtime.hidden_name(1) == "moe_expert_hidden.1"
    for bad in ({"moe_expert_hidden.99": "pinned_host"}, {"moe_expert_hidden.x": "device"},
                {"moe_expert_hidden.01": "device"}):
        with pytest.raises(ValueError, match="moe_expert_hidden.<i>"):
            jmf.optimize(fn, offload=bad)(*args)


def test_explain_lists_the_tagged_values_and_their_sizes():
    """With offload, explain names every tag the pass puts on a site with its dtype, shape and bytes (per layer of
    the scan), so a user can pick what PCIe can carry."""
    fn, args = examples.decoder_scan(tokens=64, d_model=32, d_ff=64, experts=8, seed=10)
    r = jmf.explain(fn, *args, offload={"moe_dispatched_rows": "device", "moe_expert_hidden.0": "pinned_host"})
    note = next(n for n in r.notes if n.startswith("tagged values"))
    import re
    found = dict(re.findall(r"(jax_moe_ffi/[\w.]+) (\w+\[[\d, ]*\])", note))
    assert {"jax_moe_ffi/moe_dispatched_rows", "jax_moe_ffi/moe_expert_hidden.0",
            "jax_moe_ffi/moe_expert_hidden.1"} <= set(found), note
    # the gate output: [R, d_ff] float32, R = the dispatch's rows for 64 tokens x top-k
    m = re.fullmatch(r"float32\[(\d+), 64\]", found["jax_moe_ffi/moe_expert_hidden.0"])
    assert m and int(m.group(1)) >= 64, found
    nbytes = int(m.group(1)) * 64 * 4
    assert f"{nbytes / 1e3:.1f} kB" in note, (nbytes, note)
    assert "tagged values" not in " ".join(jmf.explain(fn, *args).notes)
