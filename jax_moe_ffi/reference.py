"""Pure-JAX references of every op: the ground truth for tests, and what `explain` describes."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def clipped_group_bounds(group_sizes: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """[begin, end) rows of each group under the package's group-size rule.

    Negative sizes count as 0; groups run back to back from row 0 and are clipped to [0, m).
    """
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    end = jnp.minimum(jnp.cumsum(sizes), m)
    begin = jnp.concatenate([jnp.zeros((1,), end.dtype), end[:-1]])
    return begin, end


def row_group_ids(group_sizes: jax.Array, m: int) -> jax.Array:
    """Group id of each of the m rows; rows past the clipped total get id G (no group)."""
    _, end = clipped_group_bounds(group_sizes, m)
    return jnp.searchsorted(end, jnp.arange(m), side="right").astype(jnp.int32)


def grouped_matmul(lhs, rhs, group_sizes, *, transpose_rhs=False, preferred_element_type=None):
    """out[i] = lhs[i] @ rhs[g(i)] (or rhs[g(i)].T), rows in no group are zero. Dense: G x the FLOPs."""
    out_dtype = preferred_element_type or lhs.dtype
    m = lhs.shape[0]
    g = rhs.shape[0]
    ids = row_group_ids(group_sizes, m)
    w = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    onehot = (ids[:, None] == jnp.arange(g)[None, :]).astype(jnp.float32)
    per_group = jnp.einsum("mk,gkn->gmn", lhs.astype(jnp.float32), w.astype(jnp.float32),
                           precision=jax.lax.Precision.HIGHEST)
    out = jnp.einsum("mg,gmn->mn", onehot, per_group, precision=jax.lax.Precision.HIGHEST)
    return out.astype(out_dtype)


def grouped_matmul_acc(lhs, rhs, group_sizes, addend, *, transpose_rhs=False):
    """addend + grouped_matmul(lhs, rhs), summed in float32 and rounded once to addend's dtype."""
    prod = grouped_matmul(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32)
    return (prod + addend.astype(jnp.float32)).astype(addend.dtype)


def grouped_matmul_wgrad(lhs, dout, group_sizes, *, preferred_element_type=None):
    """out[g] = lhs[rows_g].T @ dout[rows_g]; empty groups are zero."""
    out_dtype = preferred_element_type or lhs.dtype
    m = lhs.shape[0]
    g = group_sizes.shape[0]
    ids = row_group_ids(group_sizes, m)
    onehot = (ids[:, None] == jnp.arange(g)[None, :]).astype(jnp.float32)
    out = jnp.einsum("mg,mk,mn->gkn", onehot, lhs.astype(jnp.float32), dout.astype(jnp.float32),
                     precision=jax.lax.Precision.HIGHEST)
    return out.astype(out_dtype)


# ------------------------------------------------------------------------------ dispatch / combine
def _dispatch_num_rows_reference(t: int, k: int, e: int, capacity, align: int) -> int:
    """R of moe_dispatch: T*k + min(E, T*k)*(align-1), capped at E*round_up(C, align) with capacity."""
    p = t * k
    r = p + min(e, p) * (align - 1)
    if capacity is not None:
        r = min(r, e * (-(-capacity // align) * align))
    return r


def moe_routing_reference(expert_ids, num_experts: int, *, capacity=None, keep=None, align: int = 1):
    """The routing of `moe_dispatch`, written as the GShard/Switch one-hot cumsum (O(T*k*E) memory).

    A pair (t, j) is a candidate when 0 <= expert_ids[t, j] < E (and keep[t, j] when given); its
    position is the running count of earlier candidates of its expert in flat (token-major,
    choice-minor) order; it is kept unless position >= capacity. Groups are laid out by expert,
    each padded to a multiple of `align`. Returns a `MoeRouting`.
    """
    from jax_moe_ffi.ops.dispatch import MoeRouting

    ids = jnp.asarray(expert_ids)
    t, k = ids.shape
    p = t * k
    e = num_experts
    r = _dispatch_num_rows_reference(t, k, e, capacity, align)
    flat = ids.reshape(p)
    cand = (flat >= 0) & (flat < e)
    if keep is not None:
        cand = cand & jnp.asarray(keep).reshape(p).astype(bool)
    onehot = ((flat[:, None] == jnp.arange(e)[None, :]) & cand[:, None]).astype(jnp.int32)  # [P, E]
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)  # [P]
    kept = cand if capacity is None else cand & (position < capacity)
    counts = jnp.sum(onehot * kept[:, None].astype(jnp.int32), axis=0).astype(jnp.int32)
    group_sizes = ((counts + align - 1) // align * align).astype(jnp.int32)
    offsets = jnp.cumsum(group_sizes) - group_sizes
    row = offsets[jnp.clip(flat, 0, e - 1)] + position
    pos = jnp.where(kept, row, -1).astype(jnp.int32)
    row_pair = jnp.full((r,), -1, jnp.int32).at[jnp.where(kept, row, r)].set(
        jnp.arange(p, dtype=jnp.int32), mode="drop")
    return MoeRouting(pos=pos.reshape(t, k), row_pair=row_pair, counts=counts, group_sizes=group_sizes)


def moe_dispatch_reference(x, expert_ids, num_experts: int, *, capacity=None, keep=None, align: int = 1):
    """(rows[R, D], group_sizes[E], routing) of `moe_dispatch`: rows[r] = x[token of row r], zero rows
    for padding and past the padded total."""
    routing = moe_routing_reference(expert_ids, num_experts, capacity=capacity, keep=keep, align=align)
    k = routing.pos.shape[1]
    rp = routing.row_pair
    rows = jnp.where((rp >= 0)[:, None], x[jnp.maximum(rp, 0) // k], jnp.zeros((), x.dtype))
    return rows, routing.group_sizes, routing


def moe_combine_reference(rows, routing, weights):
    """y[t] = sum_j weights[t, j] * rows[pos[t, j]] over kept pairs (pos >= 0), float32, rows' dtype."""
    pos = routing.pos
    r = rows.shape[0]
    if r == 0:  # nothing kept (capacity 0): no row to gather from
        return jnp.zeros((pos.shape[0], rows.shape[1]), rows.dtype)
    kept = pos >= 0
    gathered = rows.at[jnp.where(kept, pos, r)].get(mode="fill", fill_value=0).astype(jnp.float32)
    contrib = jnp.where(kept[..., None], weights.astype(jnp.float32)[..., None] * gathered, 0.0)
    return jnp.sum(contrib, axis=1).astype(rows.dtype)


# ------------------------------------------------------------------------------------------ FP8
# Pure-JAX FP8 quantisation with the same integer arithmetic as the FFI kernels (common/dtypes.h
# `fp8::`): block maxima of |x| bit patterns, exponents read from bits, RNE + saturation in uint32.
# The GPU fallback of `quantize` when the CUDA library is missing. The one float operation (the
# blockwise non-power-of-two quotient x / s) is XLA's, so it follows the platform's denormal mode.
_FP8_FORMATS = {  # mantissa bits, bias, emax (unbiased exponent of the largest finite), max code
    "e4m3": (3, 7, 8, 0x7E, jnp.float8_e4m3fn, 448.0),
    "e5m2": (2, 15, 15, 0x7B, jnp.float8_e5m2, 57344.0),
}


def _f32_bits(x):
    return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)


def _f32_parts(a):
    """(sig, exp) of |x| bits `a` (uint32): |x| = sig * 2^(exp - 23), sig in [2^23, 2^24) or 0."""
    e = ((a >> 23) & 0xFF).astype(jnp.int32)
    m = a & jnp.uint32(0x7FFFFF)
    p = 31 - jax.lax.clz(m).astype(jnp.int32)  # leading one of a subnormal's mantissa (-1 when m == 0)
    sh = jnp.clip(23 - p, 0, 31).astype(jnp.uint32)
    sig = jnp.where(e != 0, m | jnp.uint32(0x800000), jnp.where(m == 0, jnp.uint32(0), m << sh))
    exp = jnp.where(e != 0, e - 127, -126 - (23 - p))
    return sig, exp


def _fp8_encode(bits, scale_exp, fmt: str):
    """uint8 FP8 codes of float32(bits) * 2^scale_exp: RNE, saturating, NaN -> 0x7F | sign."""
    man, bias, emax, maxcode = _FP8_FORMATS[fmt][:4]
    sign = ((bits >> 24) & 0x80).astype(jnp.uint32)
    a = bits & jnp.uint32(0x7FFFFFFF)
    sig, exp = _f32_parts(a)
    exp = exp + scale_exp
    normal = exp >= 1 - bias
    shift = jnp.where(normal, 23 - man, 23 - man + (1 - bias - exp))
    under = (~normal) & (shift > 24)
    sh = jnp.clip(shift, 1, 24).astype(jnp.uint32)
    q = sig >> sh
    rem = sig & ((jnp.uint32(1) << sh) - 1)
    half = jnp.uint32(1) << (sh - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).astype(jnp.uint32)
    base = jnp.where(normal, (jnp.clip(exp, -bias, emax + 1) + bias - 1) << man, 0).astype(jnp.uint32)
    code = jnp.minimum(base + q, jnp.uint32(maxcode))
    code = jnp.where(exp > emax, jnp.uint32(maxcode), code)
    code = jnp.where(under | (sig == 0), jnp.uint32(0), code)
    code = jnp.where(a == 0x7F800000, jnp.uint32(maxcode), code)
    code = jnp.where(a > 0x7F800000, jnp.uint32(0x7F), code)
    return (sign | code).astype(jnp.uint8)


def _blocks_last(x, b: int):
    """x [..., n] -> [..., ceil(n/b), b] padded with zeros."""
    n = x.shape[-1]
    nb = -(-n // b)
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, nb * b - n)])
    return xp.reshape(x.shape[:-1] + (nb, b))


def quantize_mxfp8_last_axis_reference(x, fmt: str = "e4m3"):
    """(data, scale) of OCP MXFP8 along the last axis; see jax_moe_ffi.ops.quantize for the rules."""
    emax = _FP8_FORMATS[fmt][2]
    n = x.shape[-1]
    bits = _blocks_last(_f32_bits(x), 32)
    amax = jnp.max(bits & jnp.uint32(0x7FFFFFFF), axis=-1)
    special = amax >= 0x7F800000
    _, e = _f32_parts(amax)
    se = jnp.where(amax == 0, -127, jnp.clip(e - emax, -127, 127))
    scale = jnp.where(special, 255, se + 127).astype(jnp.uint8)
    codes = _fp8_encode(bits, -se[..., None], fmt)
    codes = jnp.where(special[..., None], jnp.uint8(0x7F), codes)
    codes = codes.reshape(x.shape[:-1] + (-1,))[..., :n]
    return jax.lax.bitcast_convert_type(codes, _FP8_FORMATS[fmt][4]), scale


def quantize_blockwise_last_axis_reference(x, fmt: str = "e4m3", block=(1, 128), pow2_scale: bool = False):
    """(data, scale) of DeepSeek-V3 blockwise FP8: 1 x 128 blocks along the last axis, or 128 x 128 tiles
    over the last two axes; see jax_moe_ffi.ops.quantize for the rules."""
    man, bias, emax, maxcode, dt, fmax = _FP8_FORMATS[fmt]
    br, bc = block
    bits = _f32_bits(x)
    if br > 1:
        r, n = x.shape[-2:]
        nbr, nbc = -(-r // br), -(-n // bc)
        bp = jnp.pad(bits, [(0, 0)] * (x.ndim - 2) + [(0, nbr * br - r), (0, nbc * bc - n)])
        blk = bp.reshape(x.shape[:-2] + (nbr, br, nbc, bc))
        amax = jnp.max(blk & jnp.uint32(0x7FFFFFFF), axis=(-3, -1))[..., :, None, :, None]
    else:
        blk = _blocks_last(bits, bc)
        amax = jnp.max(blk & jnp.uint32(0x7FFFFFFF), axis=-1, keepdims=True)
    special = amax >= 0x7F800000
    zero = amax == 0
    if pow2_scale:
        sig, e = _f32_parts(amax)
        k = jnp.clip(e - emax + (sig > 0xE00000).astype(jnp.int32), -126, 127)
        sbits = ((k + 127).astype(jnp.uint32) << 23)
        codes = _fp8_encode(blk, -k, fmt)
    else:
        # (the divisor behind a barrier too: XLA would turn / 448 into * (1 / 448))
        s = jax.lax.bitcast_convert_type(amax, jnp.float32) / jax.lax.optimization_barrier(
            jnp.full(amax.shape, fmax, jnp.float32))
        sbits = jnp.maximum(jax.lax.bitcast_convert_type(s, jnp.uint32), jnp.uint32(0x00800000))
        # An IEEE division per element: XLA rewrites x / broadcast(s) as x * (1 / s), which is not the
        # same rounding, so the divisor is materialised behind an optimization barrier.
        div = jax.lax.optimization_barrier(
            jnp.broadcast_to(jax.lax.bitcast_convert_type(sbits, jnp.float32), blk.shape))
        q = jax.lax.bitcast_convert_type(blk, jnp.float32) / div
        codes = _fp8_encode(jax.lax.bitcast_convert_type(q, jnp.uint32), 0, fmt)
    sbits = jnp.where(zero, jnp.uint32(0x3F800000), sbits)
    sbits = jnp.where(special, jnp.uint32(0x7FC00000), sbits)
    codes = jnp.where(zero, ((blk >> 24) & 0x80).astype(jnp.uint8), codes)
    codes = jnp.where(special, jnp.uint8(0x7F), codes)
    scale = jax.lax.bitcast_convert_type(sbits, jnp.float32)
    if br > 1:
        codes = codes.reshape(x.shape[:-2] + (nbr * br, nbc * bc))[..., :r, :n]
        scale = scale[..., :, 0, :, 0]
    else:
        codes = codes.reshape(x.shape[:-1] + (-1,))[..., : x.shape[-1]]
        scale = scale[..., 0]
    return jax.lax.bitcast_convert_type(codes, dt), scale


def quantize_reference(x, recipe: str, *, axis: int = -1, dtype="e4m3", block=None, pow2_scale: bool = False):
    """`jax_moe_ffi.quantize` in pure JAX (same QuantizedArray; moves `axis` last like the wrapper)."""
    from jax_moe_ffi.ops import quantize as qz

    fmt = qz._fp8_format(dtype)
    blk = qz._block(recipe, block)
    x = jnp.asarray(x)
    ax = qz._normalize_axis("quantize_reference", axis, x.ndim)
    moved = ax != -1 and blk[0] == 1
    xt = jnp.moveaxis(x, ax, -1) if moved else x
    if recipe == "mxfp8":
        data, scale = quantize_mxfp8_last_axis_reference(xt, fmt)
    else:
        data, scale = quantize_blockwise_last_axis_reference(xt, fmt, blk, bool(pow2_scale))
    if moved:
        data, scale = jnp.moveaxis(data, -1, ax), jnp.moveaxis(scale, -1, ax)
    return qz.QuantizedArray(data=data, scale=scale, recipe=recipe, axis=ax, block=blk)


def quantize_groups_transposed_reference(x, group_sizes, fmt: str = "e4m3"):
    """The FP8 weight gradient's operand layout (ops.quantize.quantize_groups_transposed): x [M, C] with each
    group's rows padded to whole 128-row blocks, transposed to [C, P] (P = 128 * (ceil(M/128) + G)) and
    quantised in 1 x 128 blocks along P (blockwise, float32 scales). Returns (data_t [C, P], scale [P/128, C],
    plan [2, G+1] int32: clipped row offsets, block offsets). Padding and unused blocks are +0 codes (scale 1)."""
    m, c = x.shape
    g = group_sizes.shape[0]
    p = 128 * (-(-m // 128) + g)
    begin, end = clipped_group_bounds(group_sizes, m)
    blocks = (end - begin + 127) // 128
    zero = jnp.zeros((1,), jnp.int32)
    block_off = jnp.concatenate([zero, jnp.cumsum(blocks).astype(jnp.int32)])
    row_off = jnp.concatenate([zero, end.astype(jnp.int32)])
    pos = jnp.arange(p, dtype=jnp.int32)
    blk = pos // 128
    gid = jnp.clip(jnp.searchsorted(block_off[1:], blk, side="right"), 0, max(g - 1, 0))
    src = row_off[gid] + pos - 128 * block_off[gid]
    valid = (blk < block_off[g]) & (src < row_off[gid + 1]) if g else jnp.zeros((p,), bool)
    xp = jnp.where(valid[:, None], x[jnp.clip(src, 0, max(m - 1, 0))] if m else jnp.zeros((p, c), x.dtype), 0)
    data, scale = quantize_blockwise_last_axis_reference(xp.T.astype(x.dtype), fmt)
    data = jnp.where(valid[None, :], data, jnp.zeros((), data.dtype))  # padding stays +0 in a NaN block
    return data, scale.T, jnp.stack([row_off, block_off])
