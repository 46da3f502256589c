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
