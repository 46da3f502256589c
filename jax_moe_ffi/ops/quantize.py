"""FP8 quantisation: `quantize` -> `QuantizedArray`, `dequantize`, and the cuBLASLt / Transformer Engine
swizzled-scale interop (`to_swizzled_scales` / `from_swizzled_scales`). Issue 6 items 1 and 4.

Recipes (DESIGN.md "Op contracts"; FFI targets `jax_moe_ffi_quantize_mxfp8` and
`jax_moe_ffi_quantize_blockwise`, same names on CPU and CUDA, bit-identical on both):

``recipe="mxfp8"`` -- OCP Microscaling (MX) v1.0, MXFP8:
  * blocks of 32 consecutive elements along `axis`; a last partial block is padded with zeros (which never
    change its maximum). Scale shape = x.shape with the `axis` dimension ceil(n / 32).
  * scale: E8M0, stored as uint8 biased exponent (127 = 2^0, 0 = 2^-127, 255 = NaN):
    X = 2^(floor(log2(amax)) - emax_elem), emax_elem = 8 (E4M3) / 15 (E5M2), the exponent clamped to the
    E8M0 range [-127, 127]. floor(log2) is read from the float32 bits (exact, subnormal inputs included).
  * elements: x / X rounded to nearest, ties to even, saturated to +-448 (E4M3) / +-57344 (E5M2) -- the
    spec's "clamp to the normal range"; E5M2 never produces Inf. x / X is exact (X is a power of two), so
    there is a single rounding. Subnormal FP8 results are kept (E4M3 down to 2^-9, E5M2 down to 2^-16).
    Note the OCP floor rule: a block whose amax has a large mantissa (e.g. amax in (448, 512) * 2^k)
    saturates its largest elements; the relative error stays <= 2^-3 of the block maximum.
  * all-zero block: scale byte 0 (the smallest scale, 2^-127), elements +-0 (signs kept).
  * NaN anywhere in a block: scale byte 255 (E8M0 NaN; by the spec every element of the block then reads
    NaN) and every element of the block is also stored as NaN (0x7F), so the block is NaN whichever part a
    consumer reads.
  * +-Inf in a block (our choice; E4M3 has no Inf and the spec's X = 2^(floor(log2(Inf)) - emax) is
    undefined): the block is treated like a NaN block (scale 255, elements NaN). Saturating Inf to the
    largest value would silently turn an overflow into a finite number and flush the rest of the block.

``recipe="blockwise"`` -- DeepSeek-V3 fine-grained FP8:
  * ``block=(1, 128)`` (default; activations / gradients): 1 x 128 tiles along `axis`; scale shape = x.shape
    with the `axis` dimension ceil(n / 128). ``block=(128, 128)`` (weights): 128 x 128 tiles over the last two
    dimensions (leading dimensions are a batch, e.g. stacked experts [G, K, N]); scale shape
    x.shape[:-2] + (ceil(R / 128), ceil(C / 128)); `axis` must be -1 or -2 and is only recorded.
  * float32 scale s = amax / fp8_max (IEEE float32 division, fp8_max = 448 or 57344), raised to 2^-126 when
    smaller (never a subnormal or zero scale); with ``pow2_scale=True`` s = 2^ceil(log2(amax / fp8_max))
    computed exactly from the bits (clamped to [2^-126, 2^127]), so nothing saturates.
  * elements: RNE(x / s) saturated. Non-power-of-two s: the IEEE float32 quotient x / s, then RNE to FP8
    (what every blockwise implementation computes); power-of-two s: exact, one rounding.
  * all-zero block: scale 1.0, elements +-0. NaN or Inf in a block: scale NaN, elements NaN (as above).

Layout / axes: the kernels quantise along the last axis or, natively, along axis -2 (the "columnwise"
quantisation of a GEMM rhs [..., K, N] along K: data keeps x's layout, scale is [..., ceil(K / B), N]);
128 x 128 tiles cover the last two. Any other `axis` is moved last by the wrapper: XLA transposes x before
the call and data and scale after it (one extra read + write of each). `QuantizedArray.axis` is stored as a
negative index so it stays right under `jax.vmap`.

Differentiation: quantize is not differentiable here (issue 6 gives gradients only to the FP8 grouped GEMM's
custom_vjp). Differentiating through it raises a TypeError that says so; `jax.lax.stop_gradient` on the input
(or an explicit straight-through estimator) are the ways around it.

Bad input: wrong dtype -> TypeError, wrong rank / axis / recipe / block -> ValueError, naming the argument.
"""
from __future__ import annotations

import dataclasses
import operator
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jax_moe_ffi.ops import _common as c

MXFP8_TARGET = "jax_moe_ffi_quantize_mxfp8"
BLOCKWISE_TARGET = "jax_moe_ffi_quantize_blockwise"
TILES_T_TARGET = "jax_moe_ffi_quantize_tiles_t"
GROUPS_T_TARGET = "jax_moe_ffi_quantize_groups_t"

RECIPES = ("mxfp8", "blockwise")
MX_BLOCK = 32
FP8_DTYPES = {"e4m3": jnp.dtype(jnp.float8_e4m3fn), "e5m2": jnp.dtype(jnp.float8_e5m2)}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
E8M0_NAN = 255


@dataclasses.dataclass(frozen=True)
class QuantizedArray:
    """An FP8 tensor with its block scales (a pytree: `data` and `scale` are leaves).

    data:   FP8 codes, x.shape, float8_e4m3fn or float8_e5m2.
    scale:  mxfp8: uint8 E8M0 biased exponents (value 2^(s - 127); 255 = NaN), x.shape with the `axis`
            dimension ceil(n / 32). blockwise: float32, see `quantize`.
    recipe: "mxfp8" or "blockwise".
    axis:   the quantised (contraction) axis, a negative index.
    block:  (rows, cols) of a scaling block: (1, 32) for mxfp8, (1, 128) or (128, 128) for blockwise.
    """
    data: jax.Array
    scale: jax.Array
    recipe: str
    axis: int
    block: tuple = (1, MX_BLOCK)

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def fmt(self) -> str:
        """"e4m3" or "e5m2"."""
        return "e4m3" if jnp.dtype(self.data.dtype) == FP8_DTYPES["e4m3"] else "e5m2"

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        return dequantize(self, dtype)


jax.tree_util.register_dataclass(QuantizedArray, data_fields=["data", "scale"],
                                 meta_fields=["recipe", "axis", "block"])


# ------------------------------------------------------------------------------------ arguments
def _fp8_format(dtype) -> str:
    if isinstance(dtype, str) and dtype.lower() in FP8_DTYPES:
        return dtype.lower()
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        dt = None
    for name, fp8 in FP8_DTYPES.items():
        if dt == fp8:
            return name
    raise TypeError(f"quantize: `dtype` must be 'e4m3' (float8_e4m3fn) or 'e5m2' (float8_e5m2), got {dtype!r}")


def _normalize_axis(op: str, axis, ndim: int) -> int:
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"{op}: `axis` must be an integer, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise ValueError(f"{op}: `axis` {a} is out of range for an array of rank {ndim}")
    return a - ndim if a >= 0 else a


def _block(recipe: str, block) -> tuple:
    if recipe == "mxfp8":
        if block in (None, MX_BLOCK, (1, MX_BLOCK), (MX_BLOCK,)):
            return (1, MX_BLOCK)
        raise ValueError(f"quantize: `block` for recipe='mxfp8' is 32 (OCP MX v1.0), got {block!r}")
    if block in (None, 128, (128,), (1, 128)):
        return (1, 128)
    if block == (128, 128):
        return (128, 128)
    raise ValueError(f"quantize: `block` for recipe='blockwise' must be (1, 128) or (128, 128), got {block!r}")


def _check_x(x, tiles: bool):
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        x = jnp.asarray(x)
    if jnp.dtype(x.dtype) not in c.FLOAT_DTYPES:
        raise TypeError(f"quantize: `x` must be float32, bfloat16 or float16, got {x.dtype}")
    need = 2 if tiles else 1
    if x.ndim < need:
        raise ValueError(f"quantize: `x` must have rank >= {need}"
                         f"{' for 128x128 tiles' if tiles else ''}, got shape {tuple(x.shape)}")
    return jnp.asarray(x)


# ------------------------------------------------------------------------------- platform routing
def _on_platforms(ffi_fn, fallback_fn, target: str, *args):
    return c.ffi_on_platforms(target, ffi_fn, fallback_fn, *args)


def _colwise_fallback(fn):
    """A last-axis reference `fn` applied along axis -2 (the colwise kernels' layout)."""
    def run(a):
        data, scale = fn(jnp.swapaxes(a, -1, -2))
        return jnp.swapaxes(data, -1, -2), jnp.swapaxes(scale, -1, -2)
    return run


def _mxfp8_call(x, fmt: str, colwise: bool):
    """(data, scale) of x quantised along its last axis, or along axis -2 when `colwise` (no transpose:
    data keeps x's layout, scale is x.shape[:-2] + (ceil(R / 32), C))."""
    from jax_moe_ffi import reference

    if colwise:
        sshape = x.shape[:-2] + (-(-x.shape[-2] // MX_BLOCK), x.shape[-1])
    else:
        sshape = x.shape[:-1] + (-(-x.shape[-1] // MX_BLOCK),)
    out = (jax.ShapeDtypeStruct(x.shape, FP8_DTYPES[fmt]), jax.ShapeDtypeStruct(sshape, jnp.uint8))
    call = jax.ffi.ffi_call(MXFP8_TARGET, out, vmap_method="broadcast_all")

    def ffi_fn(a):
        return tuple(call(a, colwise=np.bool_(colwise)))

    def xla_fn(a):
        return reference.quantize_mxfp8_last_axis_reference(a, fmt)

    return _on_platforms(ffi_fn, _colwise_fallback(xla_fn) if colwise else xla_fn, MXFP8_TARGET, x)


def _blockwise_call(x, fmt: str, block: tuple, pow2_scale: bool, colwise: bool):
    """(data, scale) of x quantised in 1 x 128 blocks along the last axis (along axis -2 when `colwise`:
    scale x.shape[:-2] + (ceil(R / 128), C)) or in 128 x 128 tiles over the last two."""
    from jax_moe_ffi import reference

    br, bc = block
    if colwise:
        sshape = x.shape[:-2] + (-(-x.shape[-2] // bc), x.shape[-1])
    else:
        sshape = x.shape[:-1] + (-(-x.shape[-1] // bc),)
    if br > 1:
        sshape = x.shape[:-2] + (-(-x.shape[-2] // br), sshape[-1])
    out = (jax.ShapeDtypeStruct(x.shape, FP8_DTYPES[fmt]), jax.ShapeDtypeStruct(sshape, jnp.float32))
    call = jax.ffi.ffi_call(BLOCKWISE_TARGET, out, vmap_method="broadcast_all")

    def ffi_fn(a):
        return tuple(call(a, block_rows=np.int64(br), block_cols=np.int64(bc), pow2_scale=np.bool_(pow2_scale),
                          colwise=np.bool_(colwise)))

    def xla_fn(a):
        return reference.quantize_blockwise_last_axis_reference(a, fmt, block, pow2_scale)

    return _on_platforms(ffi_fn, _colwise_fallback(xla_fn) if colwise else xla_fn, BLOCKWISE_TARGET, x)


def _tiles_t_call(x, fmt: str, pow2_scale: bool, plain: bool):
    """(data or None, data_t, scale) of x [..., R, C] in 128 x 128 tiles, from one pass over x: data_t
    [..., C, R] is the codes transposed, data [..., R, C] as laid out (only when `plain`), scale
    [..., ceil(R/128), ceil(C/128)] the tiles' scales in x's orientation."""
    from jax_moe_ffi import reference

    r, cols = x.shape[-2:]
    sshape = x.shape[:-2] + (-(-r // 128), -(-cols // 128))
    fp8 = FP8_DTYPES[fmt]
    out = (jax.ShapeDtypeStruct(x.shape if plain else (0,), fp8),
           jax.ShapeDtypeStruct(x.shape[:-2] + (cols, r), fp8), jax.ShapeDtypeStruct(sshape, jnp.float32))
    call = jax.ffi.ffi_call(TILES_T_TARGET, out, vmap_method="sequential")

    def ffi_fn(a):
        return tuple(call(a, pow2_scale=np.bool_(pow2_scale)))

    def xla_fn(a):
        d, sc = reference.quantize_blockwise_last_axis_reference(a, fmt, (128, 128), pow2_scale)
        return (d if plain else jnp.zeros((0,), fp8)), jnp.swapaxes(d, -1, -2), sc

    data, data_t, scale = _on_platforms(ffi_fn, xla_fn, TILES_T_TARGET, x)
    return (data if plain else None), data_t, scale


@partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def _tiles_t(x, fmt, pow2_scale, plain):
    return _tiles_t_call(x, fmt, pow2_scale, plain)


@_tiles_t.defjvp
def _tiles_t_jvp(fmt, pow2_scale, plain, primals, tangents):
    raise TypeError(_NOT_DIFFERENTIABLE)


def quantize_tiles_transposed(x, *, dtype="e4m3", pow2_scale: bool = False, plain: bool = False):
    """128 x 128 blockwise quantisation of x [..., R, C] with the codes written transposed, in one pass over x.

    Returns ``(qt, q)``: ``qt`` equals ``quantize(jnp.swapaxes(x, -1, -2), "blockwise", block=(128, 128))``
    bit for bit (a tile's scale does not depend on its orientation), and ``q`` equals
    ``quantize(x, "blockwise", block=(128, 128))`` when ``plain`` (else None). An FP8 GEMM takes both operands
    K-major: a weight stored [K, N] is needed as [N, K] for the forward and as stored for the dgrad, and this
    writes both without the transpose XLA would run over the FP8 codes.
    """
    fmt = _fp8_format(dtype)
    x = _check_x(x, True)
    if not isinstance(pow2_scale, (bool, np.bool_)):
        raise TypeError(f"quantize_tiles_transposed: `pow2_scale` must be a bool, got {pow2_scale!r}")
    data, data_t, scale = _tiles_t(x, fmt, bool(pow2_scale), bool(plain))
    ax = _normalize_axis("quantize", -1, x.ndim)
    qt = QuantizedArray(data=data_t, scale=jnp.swapaxes(scale, -1, -2), recipe="blockwise", axis=ax,
                        block=(128, 128))
    q = None if data is None else QuantizedArray(data=data, scale=scale, recipe="blockwise", axis=ax,
                                                 block=(128, 128))
    return qt, q


def groups_t_padded_rows(m: int, g: int) -> int:
    """P of quantize_groups_transposed: room for M rows with every one of G groups padded to 128 rows."""
    return 128 * (-(-m // 128) + g)


def _groups_t_call(x, group_sizes, fmt: str):
    from jax_moe_ffi import reference

    m, cols = x.shape
    g = group_sizes.shape[0]
    p = groups_t_padded_rows(m, g)
    out = (jax.ShapeDtypeStruct((cols, p), FP8_DTYPES[fmt]), jax.ShapeDtypeStruct((p // 128, cols), jnp.float32),
           jax.ShapeDtypeStruct((2, g + 1), jnp.int32))
    call = jax.ffi.ffi_call(GROUPS_T_TARGET, out, vmap_method="sequential")

    def ffi_fn(a, s):
        return tuple(call(a, s))

    def xla_fn(a, s):
        return reference.quantize_groups_transposed_reference(a, s, fmt)

    return _on_platforms(ffi_fn, xla_fn, GROUPS_T_TARGET, x, group_sizes)


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _groups_t(x, group_sizes, fmt):
    return _groups_t_call(x, group_sizes, fmt)


@_groups_t.defjvp
def _groups_t_jvp(fmt, primals, tangents):
    raise TypeError(_NOT_DIFFERENTIABLE)


def quantize_groups_transposed(x, group_sizes, *, dtype="e4m3"):
    """Blockwise (1 x 128, float32 scales) quantisation of x [M, C] along its rows, per group: the operand
    layout of the FP8 weight gradient (`grouped_matmul(..., recipe="blockwise")`'s backward), where the
    contraction runs over each group's rows (tokens).

    Each group's rows (the package's group-size rule: negative sizes count as 0, clipped to M) are padded with
    zero rows to whole 128-row blocks so that no block straddles two groups, and the codes are written
    transposed (rows contiguous: FP8 wgmma reads both operands K-major).

    Returns ``(data_t, scale, plan)``: data_t [C, P] FP8 with P = 128 * (ceil(M/128) + G); scale [P/128, C]
    float32 (one row of C scales per 128-row block); plan [2, G+1] int32, plan[0] the groups' row offsets and
    plan[1] their block offsets (group g is columns 128 * plan[1][g] .. 128 * plan[1][g+1] of data_t).
    Columns of padding and of unused blocks are +0 codes with scale 1 (an all-zero block). Scale and code
    rules are `quantize(..., "blockwise")`'s (not pow2). Not differentiable. Bit-identical on CPU and CUDA.
    """
    op = "quantize_groups_transposed"
    fmt = _fp8_format(dtype)
    x = _check_x(x, False)  # dtype; the rank check is this op's own
    if x.ndim != 2:
        raise ValueError(f"{op}: `x` must be [M, C], got shape {tuple(x.shape)}")
    group_sizes = jnp.asarray(group_sizes)
    if group_sizes.ndim != 1:
        raise ValueError(f"{op}: `group_sizes` must be rank 1 [G], got shape {tuple(group_sizes.shape)}")
    gs = c.check_group_sizes(op, group_sizes, group_sizes.shape[0])
    return _groups_t(x, gs, fmt)


# ----------------------------------------------------------------------------------- quantize
_NOT_DIFFERENTIABLE = (
    "jax_moe_ffi.quantize is not differentiable: it returns FP8 codes and block scales, and this package "
    "defines no gradient for it (issue 6 differentiates the FP8 grouped GEMM, not quantize). Apply "
    "jax.lax.stop_gradient to its input, or write a straight-through estimator explicitly, e.g. "
    "x + jax.lax.stop_gradient(dequantize(quantize(x, ...)) - x).")


@partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3, 4, 5))
def _quantize(x, recipe, axis, fmt, block, pow2_scale):
    # axis -1 and -2 are native to the kernels (-2: "colwise", blocks down the rows); any other axis is
    # moved last around the call (XLA transposes).
    colwise = axis == -2 and block[0] == 1
    moved = axis not in (-1, -2) and block[0] == 1
    xt = jnp.moveaxis(x, axis, -1) if moved else x
    if recipe == "mxfp8":
        data, scale = _mxfp8_call(xt, fmt, colwise)
    else:
        data, scale = _blockwise_call(xt, fmt, block, pow2_scale, colwise)
    if moved:
        data = jnp.moveaxis(data, -1, axis)
        scale = jnp.moveaxis(scale, -1, axis)
    return data, scale


@_quantize.defjvp
def _quantize_jvp(recipe, axis, fmt, block, pow2_scale, primals, tangents):
    raise TypeError(_NOT_DIFFERENTIABLE)


def quantize(x, recipe: str, *, axis: int = -1, dtype="e4m3", block=None, pow2_scale: bool = False
             ) -> QuantizedArray:
    """Quantises `x` to FP8 with per-block scales (see the module docstring for the exact rules).

    Args:
      x: float32 / bfloat16 / float16 array, rank >= 1 (>= 2 for 128 x 128 tiles).
      recipe: "mxfp8" (OCP MX v1.0: 32-element blocks, E8M0 scales) or "blockwise" (DeepSeek-V3: float32
        scales over 1 x 128 or 128 x 128 blocks).
      axis: the axis the blocks run along (the GEMM contraction axis); any axis, -1 and -2 need no transpose.
      dtype: "e4m3" (float8_e4m3fn, default) or "e5m2" (float8_e5m2, e.g. for gradients).
      block: mxfp8: 32 (the only size). blockwise: (1, 128) (default) or (128, 128) (tiles over the last two
        dimensions; `axis` must be -1 or -2).
      pow2_scale: blockwise only: round scales up to powers of two (mxfp8 scales always are).
    Returns a `QuantizedArray(data, scale, recipe, axis, block)`.
    """
    if recipe not in RECIPES:
        raise ValueError(f"quantize: `recipe` must be one of {RECIPES}, got {recipe!r}")
    fmt = _fp8_format(dtype)
    blk = _block(recipe, block)
    tiles = blk[0] > 1
    x = _check_x(x, tiles)
    ax = _normalize_axis("quantize", axis, x.ndim)
    if tiles and ax not in (-1, -2):
        raise ValueError(f"quantize: block=(128, 128) tiles the last two dimensions, so `axis` must be -1 or -2 "
                         f"(or {x.ndim - 1} / {x.ndim - 2}), got {axis}")
    if not isinstance(pow2_scale, (bool, np.bool_)):
        raise TypeError(f"quantize: `pow2_scale` must be a bool, got {pow2_scale!r}")
    data, scale = _quantize(x, recipe, ax, fmt, blk, bool(pow2_scale) and recipe == "blockwise")
    return QuantizedArray(data=data, scale=scale, recipe=recipe, axis=ax, block=blk)


# --------------------------------------------------------------------------------- dequantize
def e8m0_to_float32(scale) -> jax.Array:
    """E8M0 bytes (uint8 or float8_e8m0fnu) -> float32 2^(s - 127) by bits: 0 -> 2^-127 (a float32
    subnormal), 255 -> NaN."""
    s = _e8m0_bytes(scale, "e8m0_to_float32", "scale").astype(jnp.uint32)
    bits = jnp.where(s == 0, jnp.uint32(0x00400000), s << 23)
    bits = jnp.where(s == E8M0_NAN, jnp.uint32(0x7FC00000), bits)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _expand(scale, axis: int, block: tuple, shape: tuple):
    """Broadcasts per-block scales to the element shape."""
    br, bc = block
    if br > 1:
        s = jnp.repeat(jnp.repeat(scale, br, axis=-2), bc, axis=-1)
        return s[..., : shape[-2], : shape[-1]]
    s = jnp.repeat(scale, bc, axis=axis)
    return jax.lax.slice_in_dim(s, 0, shape[axis], axis=axis % len(shape))


def dequantize(q: QuantizedArray, dtype=jnp.float32) -> jax.Array:
    """x ~= data * scale per block, in `dtype` (float32 by default; bfloat16 / float16 round once at the end).

    Plain XLA elementwise ops (fused into one pass). FP8 times a power of two is exact in float32; results
    below 2^-126 follow the platform's denormal mode (XLA:CPU flushes them to zero).
    """
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"dequantize: `q` must be a QuantizedArray (from quantize), got {type(q).__name__}")
    dt = jnp.dtype(dtype)
    if dt not in c.FLOAT_DTYPES:
        raise TypeError(f"dequantize: `dtype` must be float32, bfloat16 or float16, got {dt}")
    s = e8m0_to_float32(q.scale) if q.recipe == "mxfp8" else q.scale.astype(jnp.float32)
    full = _expand(s, q.axis, q.block, q.shape)
    return (q.data.astype(jnp.float32) * full).astype(dt)


# -------------------------------------------------------------------------- swizzled-scale interop
# cuBLASLt (CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0) and Transformer Engine (nvte_swizzle_scaling_factors)
# take MXFP8 scales of an operand stored [rows, K] (K, the contraction axis, contiguous) as a [rows, K/32]
# scale matrix padded to 128 x 4 tiles and interleaved within each tile. The layout followed here is
# NVIDIA's documented "1D block scaling factors layout" (cuBLAS docs), as restated by
#   * nvmath-python `nvmath.linalg.advanced.helpers.matmul.get_block_scale_offset` (docs.nvidia.com/cuda/
#     nvmath-python/latest/.../get_block_scale_offset.html), whose worked example for a 128-row operand with
#     8 scale columns gives offset 82 for (row 5, block 2) and 593 for (row 5, block 5), and
#   * cuDNN frontend "MXFP8 scale factor 128x4 layout" (nvidia.github.io/cudnn-frontend/
#     mxfp8-scale-factor-128x4-layout/), and Transformer Engine's swizzle.h ("scale_inv size is padded to
#     128x4 for row-scale and 4x128 for col-scale"; data quantised along K):
#   offset(r, c) = (r // 128 * (C_pad // 4) + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4
# i.e. the 128 x 4 tiles are laid out row-tile-major, each tile is 512 contiguous bytes, and inside a tile
# row r sits in 32-row group r % 128 // 32 at lane r % 32, each lane holding 4 groups x 4 scale columns.
SWIZZLE_ROWS = 128
SWIZZLE_COLS = 4


def _e8m0_bytes(s, op: str, name: str):
    s = jnp.asarray(s)
    if s.dtype == jnp.uint8:
        return s
    if hasattr(jnp, "float8_e8m0fnu") and s.dtype == jnp.dtype(jnp.float8_e8m0fnu):
        return jax.lax.bitcast_convert_type(s, jnp.uint8)
    raise TypeError(f"{op}: `{name}` must hold E8M0 scales as uint8 (or float8_e8m0fnu), got {s.dtype}")


def swizzled_scale_shape(rows: int, scale_cols: int) -> tuple:
    """(rows padded to 128, scale columns padded to 4): the shape of one swizzled scale matrix."""
    return (-(-rows // SWIZZLE_ROWS) * SWIZZLE_ROWS, -(-scale_cols // SWIZZLE_COLS) * SWIZZLE_COLS)


def _scale_matrix(scale, axis: int):
    """The [..., rows, K/32] scale matrix of an operand quantised along `axis` (-1 or -2)."""
    return scale if axis == -1 else jnp.swapaxes(scale, -1, -2)


def _swizzle(s):
    *batch, r, k = s.shape
    rp, kp = swizzled_scale_shape(r, k)
    s = jnp.pad(s, [(0, 0)] * len(batch) + [(0, rp - r), (0, kp - k)])
    nb = len(batch)
    t = s.reshape(*batch, rp // 128, 4, 32, kp // 4, 4)  # row = (rt, rh, rl), col = (ct, cl)
    t = jnp.transpose(t, tuple(range(nb)) + tuple(nb + i for i in (0, 3, 2, 1, 4)))  # (rt, ct, rl, rh, cl)
    return t.reshape(*batch, rp, kp)


def _unswizzle(t, rows: int, k: int):
    *batch, rp, kp = t.shape
    nb = len(batch)
    u = t.reshape(*batch, rp // 128, kp // 4, 32, 4, 4)  # (rt, ct, rl, rh, cl)
    u = jnp.transpose(u, tuple(range(nb)) + tuple(nb + i for i in (0, 3, 2, 1, 4)))  # (rt, rh, rl, ct, cl)
    return u.reshape(*batch, rp, kp)[..., :rows, :k]


def to_swizzled_scales(q: QuantizedArray) -> jax.Array:
    """MXFP8 scales in the 128 x 4 swizzled layout of cuBLASLt / Transformer Engine block-scaled GEMMs.

    The operand is seen as [..., rows, K] with K the quantised axis: `axis=-1` (e.g. lhs [M, K]) uses the
    scale as is; `axis=-2` (e.g. rhs [K, N], "columnwise") uses its transpose, [N, K/32] -- the same tiles,
    which TE describes as "4x128 for col-scale". Leading dimensions are a batch (e.g. experts), each swizzled
    on its own. Returns uint8 [..., round_up(rows, 128), round_up(K/32, 4)] (the shape of TE's padded
    `scale_inv`) whose row-major bytes are the swizzled buffer; `.reshape(*batch, -1)` is the flat buffer
    cuBLASLt reads. Padding entries are 0.
    """
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"to_swizzled_scales: `q` must be a QuantizedArray, got {type(q).__name__}")
    if q.recipe != "mxfp8":
        raise ValueError(f"to_swizzled_scales: `q` must use recipe='mxfp8' (E8M0 scales), got {q.recipe!r}")
    if q.ndim < 2 or q.axis not in (-1, -2):
        raise ValueError(f"to_swizzled_scales: `q` must be quantised along axis -1 or -2 of a rank >= 2 array, "
                         f"got axis {q.axis} of shape {q.shape}")
    return _swizzle(_scale_matrix(q.scale, q.axis))


def from_swizzled_scales(data, swizzled_scales, *, axis: int = -1) -> QuantizedArray:
    """Imports an MXFP8 tensor whose scales are in the 128 x 4 swizzled layout (the inverse of
    `to_swizzled_scales`): `data` [..., rows, K] (axis=-1) or [..., K, rows] (axis=-2), float8_e4m3fn or
    float8_e5m2; `swizzled_scales` uint8 (or float8_e8m0fnu) [..., round_up(rows, 128), round_up(K/32, 4)],
    or flat [..., that product]."""
    op = "from_swizzled_scales"
    data = jnp.asarray(data)
    if jnp.dtype(data.dtype) not in FP8_DTYPES.values():
        raise TypeError(f"{op}: `data` must be float8_e4m3fn or float8_e5m2, got {data.dtype}")
    if data.ndim < 2:
        raise ValueError(f"{op}: `data` must have rank >= 2, got shape {tuple(data.shape)}")
    ax = _normalize_axis(op, axis, data.ndim)
    if ax not in (-1, -2):
        raise ValueError(f"{op}: `axis` must be -1 or -2, got {axis}")
    t = _e8m0_bytes(swizzled_scales, op, "swizzled_scales")
    rows, k = (data.shape[-2], data.shape[-1]) if ax == -1 else (data.shape[-1], data.shape[-2])
    kb = -(-k // MX_BLOCK)
    rp, kp = swizzled_scale_shape(rows, kb)
    batch = tuple(data.shape[:-2])
    if t.shape == batch + (rp * kp,):
        t = t.reshape(batch + (rp, kp))
    if t.shape != batch + (rp, kp):
        raise ValueError(f"{op}: `swizzled_scales` for data {tuple(data.shape)} (axis={ax}) must have shape "
                         f"{batch + (rp, kp)} or {batch + (rp * kp,)}, got {tuple(t.shape)}")
    s = _unswizzle(t, rows, kb)
    scale = s if ax == -1 else jnp.swapaxes(s, -1, -2)
    return QuantizedArray(data=data, scale=scale, recipe="mxfp8", axis=ax, block=(1, MX_BLOCK))
