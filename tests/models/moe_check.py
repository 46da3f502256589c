"""Shared checks for the third-party model group (tests/models): numerics, site counts, HLO.

Every model test goes through `check_model`: `explain` must find exactly the MoE sites the model has,
`optimize` must reproduce the original function (f32, rel <= 1e-5), the lowered HLO of the optimized
function must call `jax_moe_ffi_grouped_gemm` once per expert GEMM and hold no dense all-experts dot,
and the gradient of a scalar loss must match the original's (rel <= 1e-5, or <= 4x the model's own
jit-vs-eager gradient error where that is larger: whole f32 backbones). Results go to `RESULTS`, which the
conftest prints at the end of the run.
"""
from __future__ import annotations

import importlib
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_moe_ffi.rewrite import explain, optimize

TOL = 1e-5
GRAD_TOL = 1e-5
GRAD_NOISE_FACTOR = 4  # see check_model: the gradient bound is max(GRAD_TOL, 4 x the model's own jit-vs-eager error)
GG = "jax_moe_ffi_grouped_gemm"
REQUIRED = os.environ.get("JMF_MODELS_REQUIRED") == "1"  # .ci/models.sh: a missing library is an error
RESULTS: list[dict] = []  # one row per checked model, printed by conftest.pytest_terminal_summary


def require(module: str, install_hint: str):
    """Import a third-party library; without it the module is skipped with a reason (an error under
    JMF_MODELS_REQUIRED=1, which .ci/models.sh sets)."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # ImportError, or a library that fails at import
        if REQUIRED:
            raise
        pytest.skip(f"third-party model group: {module} not importable ({type(e).__name__}: {e}); "
                    f"run .ci/models.sh ({install_hint})", allow_module_level=True)


def seed() -> int:
    return int(np.random.SeedSequence().entropy % (2**31))


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    assert np.isfinite(a).all() and np.isfinite(b).all(), "non-finite values"
    assert nb > 0, "the reference is all zeros: the check would prove nothing"
    return float(np.linalg.norm(a - b) / nb)


def tree_rel(a, b) -> float:
    """Largest per-leaf relative error; a leaf whose reference is exactly zero must come out (near) zero."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if y.size == 0:
            continue
        if not np.any(y):
            assert np.abs(x).max() <= 1e-6, ("a zero leaf came out nonzero", float(np.abs(x).max()))
            continue
        worst = max(worst, rel(x, y))
    return worst


def dot_result_sizes(hlo_text: str) -> list[int]:
    """Element counts of every dot_general result in StableHLO text."""
    sizes = []
    for line in hlo_text.splitlines():
        if "dot_general" not in line:
            continue
        m = re.search(r"->\s*tensor<([0-9x]+)x[a-z]+[0-9]*>", line)
        if m:
            sizes.append(int(np.prod([int(s) for s in m.group(1).split("x")])))
    return sizes


def grouped_gemm_calls(hlo_text: str) -> int:
    return len(re.findall(rf"{GG}(?![_a-z])", hlo_text))


def check_model(name, fn, args, *, expected_sites, family, E, k, dense_dot_floor, capacity=None,
                loss_argnums=(0,), grad=True, mode="exact", reference=None, seed_=None, extra=None):
    """Run the standard checks; returns the `Report`.

    fn(*args) -> array or pytree of arrays (the first leaf is the MoE output).
    expected_sites: the number of MoE layers the model has (counted from its config, not from explain).
    dense_dot_floor: every dot of the optimized HLO must be smaller than this many elements (pick E*T*min(D, F):
      the size of the smallest all-experts intermediate of the naive code).
    reference: the answer to compare `optimize(fn, mode=mode)` with (default: fn itself).
    """
    ctx = f"{name} seed={seed_}"
    report = explain(fn, *args, mode=mode)
    row = {"model": name, "mode": mode, "sites_expected": expected_sites, "sites_found": len(report.sites),
           "families": sorted({s.family for s in report.sites}), "misses": len(report.misses)}
    RESULTS.append(row)
    assert len(report.sites) == expected_sites, (ctx, str(report))
    assert all(s.family == family for s in report.sites), (ctx, str(report))
    assert all(s.E == E and s.k == k for s in report.sites), (ctx, str(report))
    if capacity is not None:
        assert all(s.capacity == capacity for s in report.sites), (ctx, capacity, str(report))
    assert not report.misses, (ctx, str(report))

    ofn = optimize(fn, mode=mode)
    y0 = fn(*args) if reference is None else reference
    y1 = jax.jit(ofn)(*args)
    assert jax.tree.structure(y1) == jax.tree.structure(y0), ctx
    for a, b in zip(jax.tree.leaves(y1), jax.tree.leaves(y0)):
        assert a.shape == b.shape and a.dtype == b.dtype, (ctx, a.shape, b.shape, a.dtype, b.dtype)
    err = tree_rel(y1, y0)
    row["rel_fwd"] = err
    assert err <= TOL, (ctx, "forward rel err", err)

    before = jax.jit(fn).lower(*args).as_text()
    after = jax.jit(ofn).lower(*args).as_text()
    n_gemms = sum(len(s.shapes.get("gemms", [])) for s in report.sites)
    row["grouped_gemm_calls"] = grouped_gemm_calls(after)
    assert GG not in before, ctx
    assert grouped_gemm_calls(after) == n_gemms, (ctx, grouped_gemm_calls(after), n_gemms)
    big_before = [s for s in dot_result_sizes(before) if s >= dense_dot_floor]
    big_after = [s for s in dot_result_sizes(after) if s >= dense_dot_floor]
    assert big_before, (ctx, "the naive model should have all-experts dots", dot_result_sizes(before))
    assert not big_after, (ctx, "all-experts dots left after optimize", big_after)

    if grad and mode == "exact":
        def loss(f):
            def scalar_loss(*a):
                y = jax.tree.leaves(f(*a))[0]
                return jnp.sum(jnp.sin(y) * jnp.cos(jnp.arange(y.size, dtype=y.dtype).reshape(y.shape)))
            return scalar_loss
        g0 = jax.grad(loss(fn), argnums=loss_argnums)(*args)
        g1 = jax.jit(jax.grad(loss(ofn), argnums=loss_argnums))(*args)
        gerr = tree_rel(g1, g0)
        # The model's own rounding noise: its unmodified gradient under jit (XLA fuses and reorders) against
        # the eager one. Whole backbones in f32 reach 4e-6 of it on some seeds (Gemma4: the grads of small
        # norm-scale leaves), so a fixed 1e-5 failed at random on correct rewrites. A rewrite is within
        # rounding when its error is at most a few times that noise; wrong routing or a dropped term gives
        # errors of 1e-3 and more.
        base = tree_rel(jax.jit(jax.grad(loss(fn), argnums=loss_argnums))(*args), g0)
        row["rel_grad"], row["rel_grad_base"] = gerr, base
        assert gerr <= max(GRAD_TOL, GRAD_NOISE_FACTOR * base), (ctx, "gradient rel err", gerr, "own jit noise", base)
        hb = jax.jit(jax.grad(loss(ofn), argnums=loss_argnums)).lower(*args).as_text()
        assert GG in hb and f"{GG}_wgrad" in hb, ctx
    row["ok"] = True
    if extra:
        row.update(extra)
    return report
