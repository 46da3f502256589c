"""Top-k over the last axis of narrow rows (a router's [tokens, experts] scores), bitwise `jax.lax.top_k`.

XLA:GPU runs its own top-k kernel only for rows of at least 1,024 elements; narrower rows get a full sort of
every row followed by a slice (29.4 us of the Qwen3 layer's 1.43 ms forward for [8192, 128], k = 8). Here one
warp holds a row in registers and takes k successive maxima (cc/cuda/topk.cu); the CPU handler
(cc/cpu/topk.cc) does a partial sort. Both order as `lax.top_k` does on float32: descending in the float total
order (NaN above +inf, +0 above -0, -NaN lowest), equal values by lower index. `optimize()` swaps the routers'
`top_k` for this op (bitwise the same values and indices, so routing is unchanged).

float32 only: on the H200, XLA's top_k of bfloat16 rows orders equal values differently from its CPU top_k
(and from the lower-index rule), so a 16-bit kernel could not be bitwise lax.top_k on both. Other dtypes,
rows wider than MAX_ROW or k > MAX_K run `lax.top_k` (said once).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_moe_ffi.ops import _common as c

TARGET = "jax_moe_ffi_top_k"
MAX_ROW = 1024  # a warp's registers: 32 values per lane
MAX_K = 32


def supported(shape, dtype, k: int) -> str | None:
    """Why top_k(x[shape], k) would run lax.top_k instead of this kernel, or None."""
    if len(shape) == 0:
        return "a scalar operand"
    if jnp.dtype(dtype) != jnp.dtype(jnp.float32):
        return f"dtype {jnp.dtype(dtype)} (float32 only: XLA:GPU orders 16-bit ties its own way)"
    if shape[-1] > MAX_ROW:
        return f"rows of {shape[-1]} > {MAX_ROW} elements (XLA's own top-k kernel takes those)"
    if not 1 <= k <= min(MAX_K, shape[-1]):
        return f"k = {k} outside [1, min({MAX_K}, row length {shape[-1]})]"
    return None


def _call(x, k):
    lead, n = x.shape[:-1], x.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    flat = x.reshape(rows, n)
    outs = (jax.ShapeDtypeStruct((rows, k), x.dtype), jax.ShapeDtypeStruct((rows, k), jnp.int32))
    call = jax.ffi.ffi_call(TARGET, outs, vmap_method="sequential")
    vals, idx = c.ffi_on_platforms(TARGET, lambda a: tuple(call(a, k=np.int64(k))),
                                   lambda a: tuple(jax.lax.top_k(a, k)), flat)
    return vals.reshape(*lead, k), idx.reshape(*lead, k)


_top_k = jax.custom_jvp(_call, nondiff_argnums=(1,))


@_top_k.defjvp
def _top_k_jvp(k, primals, tangents):
    (x,), (dx,) = primals, tangents
    vals, idx = _top_k(x, k)
    # as lax.top_k's rule: the tangent of each selected value is the operand's tangent at its index
    return (vals, idx), (jnp.take_along_axis(dx, idx, axis=-1), c.float0_zeros(idx))


def top_k(x, k: int):
    """(values, indices) of the k largest entries along the last axis, exactly as `jax.lax.top_k`."""
    x = jnp.asarray(x)
    k = int(k)
    c.check_float("top_k", "x", x)
    why = supported(x.shape, x.dtype, k)
    if why is not None:
        if not 0 <= k <= (x.shape[-1] if x.ndim else 0):
            raise ValueError(f"top_k: `k` must be in [0, {x.shape[-1] if x.ndim else 0}] (the last axis of `x` "
                             f"{tuple(x.shape)}), got {k}")
        c.warn_once(f"top_k:{why}", f"jax_moe_ffi.top_k: jax.lax.top_k runs instead ({why})")
        return jax.lax.top_k(x, k)
    return _top_k(x, k)
