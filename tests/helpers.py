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
