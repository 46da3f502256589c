"""Numerics helpers shared by the pass tests."""
import jax
import numpy as np


def rel(a, b):
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def tree_rel(a, b):
    """The largest rel over matching leaves of two pytrees."""
    return max(rel(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def cpu_lowered_text(fn, *args):
    """The program jit(fn) lowers to for the CPU, on any backend. The float32 tests read the HLO structure there: on
    a GPU the CUDA grouped GEMM takes bf16 / fp16 only, so float32 lowers to XLA's fallback (session 36)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",)).as_text()


def assert_stays_as_written(fn, *args, reason=None):
    """explain finds no site in fn (a near-miss whose reason holds `reason`, if given), optimize warns that no site
    was found, and its output is fn's, bitwise. Returns the report."""
    import pytest

    import jax_moe_ffi as jmf
    r = jmf.explain(fn, *args)
    assert not r.sites, str(r)
    if reason is not None:
        assert any(reason in m.reason for m in r.misses), str(r)
    with pytest.warns(RuntimeWarning, match="no MoE site"):
        y = jmf.optimize(fn)(*args)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(fn(*args)))
    return r
