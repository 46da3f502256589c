"""Grouped matmul for dropless MoE: `grouped_matmul` (forward, with dgrad as its transposed form) and
`grouped_matmul_wgrad`, as XLA FFI calls with a `jax.custom_vjp`.

Contract (DESIGN.md): `grouped_matmul(lhs[M,K], rhs[G,K,N], group_sizes[G])` equals
`jax.lax.ragged_dot`; rows at/after sum(group_sizes) are zero. Group sizes stay on the device.
Group-size rule for bad values: negative sizes count as 0 and groups are clipped to the M rows
(a group running past M is truncated, later groups are empty). No value reads or writes out of bounds.
"""
from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jax_moe_ffi import _registry
from jax_moe_ffi.ops import _common as c

FWD_TARGET = "jax_moe_ffi_grouped_gemm"
ACC_TARGET = "jax_moe_ffi_grouped_gemm_acc"
WGRAD_TARGET = "jax_moe_ffi_grouped_gemm_wgrad"
# Two products of one lhs in one CUDA launch of 2G problems (one setup, one persistent grid, one tail): the
# forward and the weight gradients of grouped_matmuls_shared_lhs' pairs. CUDA only; elsewhere the pair is two
# calls of the targets above (the same values). Default since session 11 (H200: 20-25 us less kernel time per
# pair); JAX_MOE_FFI_PAIR_LAUNCH=0 runs two launches (A/B).
PAIR_TARGET = "jax_moe_ffi_grouped_gemm_pair"
WGRAD_PAIR_TARGET = "jax_moe_ffi_grouped_gemm_wgrad_pair"
# The lhs gradient of such a pair, dout0 . rhs0^T + dout1 . rhs1^T, as one GEMM whose K loop runs over both
# products into one float32 accumulator (cc/cuda/two_product_mainloop.cuh): no read-back of a first product,
# one rounding. CUDA only (elsewhere two float32 products, added, rounded once). Default since session 11 (H200,
# Qwen3 layer: 686 us for both products vs 826 us as dgrad + accumulating dgrad); JAX_MOE_FFI_SUM_DGRAD=0 runs
# the second dgrad accumulating into the first in its epilogue (A/B).
SUM_TARGET = "jax_moe_ffi_grouped_gemm_sum"


def _pair_launch() -> bool:
    return os.environ.get("JAX_MOE_FFI_PAIR_LAUNCH", "1") == "1"


def _sum_dgrad() -> bool:
    return os.environ.get("JAX_MOE_FFI_SUM_DGRAD", "1") == "1"


def _cuda_unusable(target: str, dtype) -> str | None:
    """Why the CUDA kernel cannot take this call, or None."""
    if target not in _registry.cuda_targets:
        return f"the CUDA library is not loaded ({_registry.cuda_load_error})"
    if jnp.dtype(dtype) not in c.GPU_DTYPES:
        return f"the CUDA kernel takes bfloat16/float16, got {jnp.dtype(dtype)} (XLA's ragged_dot runs instead)"
    return None


def _cuda_workspace_bytes(groups: int) -> int:
    """Device workspace of the CUDA handlers: per-group shapes/pointers/strides (< 256 B a group), per-group
    TMA descriptors where the kernel takes them prebuilt (3 x 128 B a group) and CUTLASS's per-SM TMA
    descriptors (< 1 KiB an SM; 1 MiB covers 1024 SMs). The handler checks it."""
    return 640 * groups + (1 << 20)


def _fwd_call(lhs, rhs, group_sizes, transpose_rhs: bool, out_dtype):
    m = lhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    out = jax.ShapeDtypeStruct((m, n), out_dtype)
    ws = jax.ShapeDtypeStruct((_cuda_workspace_bytes(rhs.shape[0]),), jnp.uint8)
    cpu_call = jax.ffi.ffi_call(FWD_TARGET, out, vmap_method="sequential")
    cuda_call = jax.ffi.ffi_call(FWD_TARGET, (out, ws), vmap_method="sequential")

    def cpu_fn(a, b, s):
        return cpu_call(a, b, s, transpose_rhs=np.bool_(transpose_rhs))

    def cuda_fn(a, b, s):
        return cuda_call(a, b, s, transpose_rhs=np.bool_(transpose_rhs))[0]

    def xla_fn(a, b, s):
        bb = jnp.swapaxes(b, 1, 2) if transpose_rhs else b
        return jax.lax.ragged_dot(a, bb, s, preferred_element_type=out_dtype)

    return c.on_platforms(FWD_TARGET, (lhs, rhs, group_sizes), cpu=cpu_fn, cuda=cuda_fn, fallback=xla_fn,
                          cuda_unusable=_cuda_unusable(FWD_TARGET, lhs.dtype))


def _acc_call(lhs, rhs, group_sizes, addend, transpose_rhs: bool):
    """addend + grouped product, summed in float32 and rounded once to addend's dtype; out aliases addend."""
    out = jax.ShapeDtypeStruct(addend.shape, addend.dtype)
    ws = jax.ShapeDtypeStruct((_cuda_workspace_bytes(rhs.shape[0]),), jnp.uint8)
    cpu_call = jax.ffi.ffi_call(ACC_TARGET, out, vmap_method="sequential", input_output_aliases={3: 0})
    cuda_call = jax.ffi.ffi_call(ACC_TARGET, (out, ws), vmap_method="sequential", input_output_aliases={3: 0})

    def cpu_fn(a, b, s, acc):
        return cpu_call(a, b, s, acc, transpose_rhs=np.bool_(transpose_rhs))

    def cuda_fn(a, b, s, acc):
        return cuda_call(a, b, s, acc, transpose_rhs=np.bool_(transpose_rhs))[0]

    def xla_fn(a, b, s, acc):
        bb = jnp.swapaxes(b, 1, 2) if transpose_rhs else b
        prod = jax.lax.ragged_dot(a, bb, s, preferred_element_type=jnp.float32)
        return (prod + acc.astype(jnp.float32)).astype(acc.dtype)

    return c.on_platforms(ACC_TARGET, (lhs, rhs, group_sizes, addend), cpu=cpu_fn, cuda=cuda_fn, fallback=xla_fn,
                          cuda_unusable=_cuda_unusable(ACC_TARGET, lhs.dtype))


def _wgrad_call(lhs, dout, group_sizes, out_dtype):
    g = group_sizes.shape[0]
    out = jax.ShapeDtypeStruct((g, lhs.shape[1], dout.shape[1]), out_dtype)
    ws = jax.ShapeDtypeStruct((_cuda_workspace_bytes(g),), jnp.uint8)
    cpu_call = jax.ffi.ffi_call(WGRAD_TARGET, out, vmap_method="sequential")
    cuda_call = jax.ffi.ffi_call(WGRAD_TARGET, (out, ws), vmap_method="sequential")

    def cuda_fn(a, d, s):
        return cuda_call(a, d, s)[0]

    def xla_fn(a, d, s):
        dims = jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([0], [0]), ([], [])),
            lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
        return jax.lax.ragged_dot_general(a, d, s, dims, preferred_element_type=out_dtype)

    return c.on_platforms(WGRAD_TARGET, (lhs, dout, group_sizes), cpu=cpu_call, cuda=cuda_fn, fallback=xla_fn,
                          cuda_unusable=_cuda_unusable(WGRAD_TARGET, lhs.dtype))


def _fwd_pair_call(lhs, rhs0, rhs1, group_sizes, transpose_rhs: bool, out_dtype):
    """(lhs . rhs0, lhs . rhs1) per group; rhs0 and rhs1 of one shape and dtype."""
    m = lhs.shape[0]
    n = rhs0.shape[1] if transpose_rhs else rhs0.shape[2]
    out = jax.ShapeDtypeStruct((m, n), out_dtype)
    ws = jax.ShapeDtypeStruct((_cuda_workspace_bytes(2 * rhs0.shape[0]),), jnp.uint8)
    cuda_call = jax.ffi.ffi_call(PAIR_TARGET, (out, out, ws), vmap_method="sequential")
    cpu_call = jax.ffi.ffi_call(FWD_TARGET, out, vmap_method="sequential")
    tr = np.bool_(transpose_rhs)

    def cpu_fn(a, b0, b1, s):
        return cpu_call(a, b0, s, transpose_rhs=tr), cpu_call(a, b1, s, transpose_rhs=tr)

    def cuda_fn(a, b0, b1, s):
        return tuple(cuda_call(a, b0, b1, s, transpose_rhs=tr)[:2])

    def xla_fn(a, b0, b1, s):
        sw = (lambda b: jnp.swapaxes(b, 1, 2)) if transpose_rhs else (lambda b: b)
        return tuple(jax.lax.ragged_dot(a, sw(b), s, preferred_element_type=out_dtype) for b in (b0, b1))

    return c.on_platforms(PAIR_TARGET, (lhs, rhs0, rhs1, group_sizes), cpu=cpu_fn, cuda=cuda_fn, fallback=xla_fn,
                          cuda_unusable=_cuda_unusable(PAIR_TARGET, lhs.dtype))


def _wgrad_pair_call(lhs, dout0, dout1, group_sizes, out_dtype):
    """(lhs_g^T dout0_g, lhs_g^T dout1_g) per group; dout0 and dout1 of one shape and dtype."""
    g = group_sizes.shape[0]
    out = jax.ShapeDtypeStruct((g, lhs.shape[1], dout0.shape[1]), out_dtype)
    ws = jax.ShapeDtypeStruct((_cuda_workspace_bytes(2 * g),), jnp.uint8)
    cuda_call = jax.ffi.ffi_call(WGRAD_PAIR_TARGET, (out, out, ws), vmap_method="sequential")
    cpu_call = jax.ffi.ffi_call(WGRAD_TARGET, out, vmap_method="sequential")

    def cpu_fn(a, d0, d1, s):
        return cpu_call(a, d0, s), cpu_call(a, d1, s)

    def cuda_fn(a, d0, d1, s):
        return tuple(cuda_call(a, d0, d1, s)[:2])

    def xla_fn(a, d0, d1, s):
        dims = jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([0], [0]), ([], [])),
            lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
        return tuple(jax.lax.ragged_dot_general(a, d, s, dims, preferred_element_type=out_dtype) for d in (d0, d1))

    return c.on_platforms(WGRAD_PAIR_TARGET, (lhs, dout0, dout1, group_sizes), cpu=cpu_fn, cuda=cuda_fn,
                          fallback=xla_fn, cuda_unusable=_cuda_unusable(WGRAD_PAIR_TARGET, lhs.dtype))


def _sum_call(lhs0, rhs0, lhs1, rhs1, group_sizes):
    """lhs0 . rhs0[g]^T + lhs1 . rhs1[g]^T per group (rhs [G,N,K]; both pairs of one shape and dtype), in
    lhs0's dtype, rounded once from float32."""
    m, n = lhs0.shape[0], rhs0.shape[1]
    out = jax.ShapeDtypeStruct((m, n), lhs0.dtype)
    ws = jax.ShapeDtypeStruct((_cuda_workspace_bytes(rhs0.shape[0]),), jnp.uint8)
    cuda_call = jax.ffi.ffi_call(SUM_TARGET, (out, ws), vmap_method="sequential")
    cpu_call = jax.ffi.ffi_call(FWD_TARGET, jax.ShapeDtypeStruct((m, n), jnp.float32), vmap_method="sequential")
    tr = np.bool_(True)

    def cpu_fn(a0, b0, a1, b1, s):
        return (cpu_call(a0, b0, s, transpose_rhs=tr) + cpu_call(a1, b1, s, transpose_rhs=tr)).astype(lhs0.dtype)

    def cuda_fn(a0, b0, a1, b1, s):
        return cuda_call(a0, b0, a1, b1, s, transpose_rhs=tr)[0]

    def xla_fn(a0, b0, a1, b1, s):
        prods = [jax.lax.ragged_dot(a, jnp.swapaxes(b, 1, 2), s, preferred_element_type=jnp.float32)
                 for a, b in ((a0, b0), (a1, b1))]
        return (prods[0] + prods[1]).astype(lhs0.dtype)

    return c.on_platforms(SUM_TARGET, (lhs0, rhs0, lhs1, rhs1, group_sizes), cpu=cpu_fn, cuda=cuda_fn,
                          fallback=xla_fn, cuda_unusable=_cuda_unusable(SUM_TARGET, lhs0.dtype))


def _check_gmm(lhs, rhs, group_sizes, transpose_rhs, preferred_element_type):
    op = "grouped_matmul"
    c.check_rank(op, "lhs", lhs, 2, "[M, K]")
    c.check_rank(op, "rhs", rhs, 3, "[G, N, K]" if transpose_rhs else "[G, K, N]")
    c.check_float(op, "lhs", lhs)
    c.check_float(op, "rhs", rhs)
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"{op}: `lhs` and `rhs` must have the same dtype, got {lhs.dtype} and {rhs.dtype}")
    k_rhs = rhs.shape[2] if transpose_rhs else rhs.shape[1]
    if lhs.shape[1] != k_rhs:
        raise ValueError(f"{op}: contraction sizes differ: `lhs` {tuple(lhs.shape)} has K={lhs.shape[1]} "
                         f"but `rhs` {tuple(rhs.shape)} has K={k_rhs}")
    gs = c.check_group_sizes(op, group_sizes, rhs.shape[0])
    return gs, c.out_dtype(op, lhs.dtype, preferred_element_type)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm(lhs, rhs, group_sizes, transpose_rhs, out_dtype):
    return _fwd_call(lhs, rhs, group_sizes, transpose_rhs, out_dtype)


def _gmm_fwd(lhs, rhs, group_sizes, transpose_rhs, out_dtype):
    # Calls the custom_vjp function itself (not the raw FFI call) so higher-order grads work.
    return _gmm(lhs, rhs, group_sizes, transpose_rhs, out_dtype), (lhs, rhs, group_sizes)


def _gmm_bwd(transpose_rhs, out_dtype, res, dout):
    lhs, rhs, group_sizes = res
    dout = dout.astype(lhs.dtype)  # the kernels take operands of one dtype
    # dlhs = dout . rhs^T: the same kernel with the transposed-rhs flag (no materialised transpose).
    dlhs = _gmm(dout, rhs, group_sizes, not transpose_rhs, lhs.dtype)
    if transpose_rhs:  # rhs[g] is [N, K]: drhs[g] = dout_g^T . lhs_g
        drhs = _wgrad(dout, lhs, group_sizes, rhs.dtype)
    else:
        drhs = _wgrad(lhs, dout, group_sizes, rhs.dtype)
    return dlhs, drhs, c.float0_zeros(group_sizes)


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _gmm_acc(lhs, rhs, group_sizes, addend, transpose_rhs):
    return _acc_call(lhs, rhs, group_sizes, addend, transpose_rhs)


def _gmm_acc_fwd(lhs, rhs, group_sizes, addend, transpose_rhs):
    return _gmm_acc(lhs, rhs, group_sizes, addend, transpose_rhs), (lhs, rhs, group_sizes)


def _gmm_acc_bwd(transpose_rhs, res, dout):
    # out = addend + lhs . rhs: the product's gradients as in grouped_matmul, the addend's is dout itself
    dlhs, drhs, dgs = _gmm_bwd(transpose_rhs, dout.dtype, res, dout)
    return dlhs, drhs, dgs, dout


_gmm_acc.defvjp(_gmm_acc_fwd, _gmm_acc_bwd)


def _pairable(a, b, ta=None, tb=None) -> bool:
    """Two operands one pair launch can take: same shape and dtype (and layout / out dtype when given)."""
    return _pair_launch() and a.shape == b.shape and a.dtype == b.dtype and ta == tb


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm_shared_lhs(lhs, rhss, group_sizes, transpose_rhs, out_dtypes):
    if len(rhss) == 2 and _pairable(rhss[0], rhss[1], (transpose_rhs[0], out_dtypes[0]),
                                    (transpose_rhs[1], out_dtypes[1])):
        return _fwd_pair_call(lhs, rhss[0], rhss[1], group_sizes, transpose_rhs[0], out_dtypes[0])
    return tuple(_gmm(lhs, r, group_sizes, t, o) for r, t, o in zip(rhss, transpose_rhs, out_dtypes))


def _gmm_shared_lhs_fwd(lhs, rhss, group_sizes, transpose_rhs, out_dtypes):
    return _gmm_shared_lhs(lhs, rhss, group_sizes, transpose_rhs, out_dtypes), (lhs, rhss, group_sizes)


def _gmm_shared_lhs_bwd(transpose_rhs, out_dtypes, res, douts):
    # dlhs = sum_i dout_i . rhs_i^T: the first dgrad writes it, each later one adds its product in the
    # GEMM epilogue (grouped_matmul_acc) -- no separate [M, K] add per extra GEMM; for a pair (unless
    # JAX_MOE_FFI_SUM_DGRAD=0), both products in one GEMM (_gmm_sum).
    lhs, rhss, group_sizes = res
    douts = [d.astype(lhs.dtype) for d in douts]
    if (_sum_dgrad() and len(rhss) == 2 and not any(transpose_rhs) and rhss[0].shape == rhss[1].shape
            and rhss[0].dtype == rhss[1].dtype == lhs.dtype):
        # one GEMM over both products (rhs [G,K,N] is the [G,N,K] operand of the dgrad form)
        dlhs = _gmm_sum(douts[0], rhss[0], douts[1], rhss[1], group_sizes)
    else:
        dlhs = None
        for rhs, tr, dout in zip(rhss, transpose_rhs, douts):
            if dlhs is None:
                dlhs = _gmm(dout, rhs, group_sizes, not tr, lhs.dtype)
            else:
                dlhs = _gmm_acc(dout, rhs, group_sizes, dlhs, not tr)
    if (len(rhss) == 2 and not any(transpose_rhs) and rhss[0].dtype == rhss[1].dtype
            and _pairable(douts[0], douts[1])):  # both weight gradients lhs^T . dout_i in one launch
        drhss = list(_wgrad_pair(lhs, douts[0], douts[1], group_sizes, rhss[0].dtype))
    else:
        drhss = [_wgrad(dout, lhs, group_sizes, rhs.dtype) if tr else _wgrad(lhs, dout, group_sizes, rhs.dtype)
                 for rhs, tr, dout in zip(rhss, transpose_rhs, douts)]
    return dlhs, tuple(drhss), c.float0_zeros(group_sizes)


_gmm_shared_lhs.defvjp(_gmm_shared_lhs_fwd, _gmm_shared_lhs_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _wgrad(lhs, dout, group_sizes, out_dtype):
    return _wgrad_call(lhs, dout, group_sizes, out_dtype)


def _wgrad_fwd(lhs, dout, group_sizes, out_dtype):
    return _wgrad(lhs, dout, group_sizes, out_dtype), (lhs, dout, group_sizes)


def _wgrad_bwd(out_dtype, res, dw):
    # out[g] = lhs_g^T dout_g  =>  dlhs_g = dout_g dw[g]^T, ddout_g = lhs_g dw[g].
    lhs, dout, group_sizes = res
    dw = dw.astype(lhs.dtype)
    dlhs = _gmm(dout, dw, group_sizes, True, lhs.dtype)
    ddout = _gmm(lhs, dw, group_sizes, False, dout.dtype)
    return dlhs, ddout, c.float0_zeros(group_sizes)


_wgrad.defvjp(_wgrad_fwd, _wgrad_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _wgrad_pair(lhs, dout0, dout1, group_sizes, out_dtype):
    return _wgrad_pair_call(lhs, dout0, dout1, group_sizes, out_dtype)


def _wgrad_pair_fwd(lhs, dout0, dout1, group_sizes, out_dtype):
    return _wgrad_pair(lhs, dout0, dout1, group_sizes, out_dtype), (lhs, dout0, dout1, group_sizes)


def _wgrad_pair_bwd(out_dtype, res, dws):
    # the two _wgrad backwards, their lhs gradients summed (second-order gradients through a pair)
    lhs, dout0, dout1, group_sizes = res
    dl0, dd0, _ = _wgrad_bwd(out_dtype, (lhs, dout0, group_sizes), dws[0])
    dl1, dd1, _ = _wgrad_bwd(out_dtype, (lhs, dout1, group_sizes), dws[1])
    return (dl0.astype(jnp.float32) + dl1.astype(jnp.float32)).astype(lhs.dtype), dd0, dd1, \
        c.float0_zeros(group_sizes)


_wgrad_pair.defvjp(_wgrad_pair_fwd, _wgrad_pair_bwd)


@jax.custom_vjp
def _gmm_sum(lhs0, rhs0, lhs1, rhs1, group_sizes):
    """lhs0 . rhs0[g]^T + lhs1 . rhs1[g]^T per group, rhs [G,N,K]."""
    return _sum_call(lhs0, rhs0, lhs1, rhs1, group_sizes)


def _gmm_sum_fwd(lhs0, rhs0, lhs1, rhs1, group_sizes):
    return _gmm_sum(lhs0, rhs0, lhs1, rhs1, group_sizes), (lhs0, rhs0, lhs1, rhs1, group_sizes)


def _gmm_sum_bwd(res, dout):
    # each product's own gradients (second-order gradients through the lhs gradient of a pair)
    lhs0, rhs0, lhs1, rhs1, group_sizes = res
    dout = dout.astype(lhs0.dtype)
    return (_gmm(dout, rhs0, group_sizes, False, lhs0.dtype), _wgrad(dout, lhs0, group_sizes, rhs0.dtype),
            _gmm(dout, rhs1, group_sizes, False, lhs1.dtype), _wgrad(dout, lhs1, group_sizes, rhs1.dtype),
            c.float0_zeros(group_sizes))


_gmm_sum.defvjp(_gmm_sum_fwd, _gmm_sum_bwd)


def grouped_matmul(lhs, rhs, group_sizes, *, preferred_element_type=None, recipe=None,
                   transpose_rhs: bool = False, fp8_grad_dtype: str = "e4m3", fp8_wgrad: bool = False,
                   fp8_weights=None):
    """Grouped matmul: `out[i] = lhs[i] @ rhs[g(i)]`, the semantics of `jax.lax.ragged_dot`.

    Args:
      lhs: [M, K] float32/bfloat16/float16, rows sorted by group.
      rhs: [G, K, N] (or [G, N, K] with `transpose_rhs=True`), same dtype as lhs.
      group_sizes: [G] integer, rows per group, on the device (never read by the host).
      preferred_element_type: output dtype, None (= input dtype) or float32. Accumulation is float32.
      recipe: None (operands as given), "blockwise" (FP8 E4M3, 1 x 128 activation blocks, 128 x 128 weight
        tiles: the fast Hopper path) or "mxfp8" (OCP MX, 1 x 32 blocks; on Hopper exact MXFP8 operands
        multiplied in bf16). See `jax_moe_ffi.ops.grouped_gemm_fp8`.
      fp8_grad_dtype: with a recipe, the FP8 format of the incoming gradient: "e4m3" or "e5m2".
      fp8_wgrad: with recipe="blockwise", the weight gradient in FP8 too (1 x 128 blocks along each group's
        tokens, groups padded to 128 tokens). Off by default: on the H200 its kernel is only 1.07-1.20x the
        bf16 wgrad (session 16; 2-5% more with session 17's overlapped mainloop) and quantising both operands
        costs more than that (benchmarks/NOTES.md).
        False: the weight gradient in the input dtype. Ignored by "mxfp8".
      fp8_weights: with recipe="blockwise", `quantize_weights(rhs, transpose_rhs=...)` made beforehand (e.g. once
        per step for all micro-batches): used instead of quantising rhs in this call. rhs still receives the
        weight gradient. None (default): rhs is quantised here.
    Returns [M, N]; rows at/after sum(group_sizes) are zero.
    """
    lhs = jnp.asarray(lhs)
    rhs = jnp.asarray(rhs)
    group_sizes = jnp.asarray(group_sizes)
    gs, odt = _check_gmm(lhs, rhs, group_sizes, transpose_rhs, preferred_element_type)
    if recipe is not None:
        from jax_moe_ffi.ops.grouped_gemm_fp8 import grouped_matmul_fp8
        return grouped_matmul_fp8(lhs, rhs, gs, recipe=recipe, out_dtype=odt, transpose_rhs=bool(transpose_rhs),
                                  grad_dtype=fp8_grad_dtype, fp8_wgrad=fp8_wgrad, fp8_weights=fp8_weights)
    if fp8_weights is not None:
        raise ValueError("grouped_matmul: `fp8_weights` need recipe='blockwise', got recipe=None")
    return _gmm(lhs, rhs, gs, bool(transpose_rhs), odt)


def grouped_matmul_acc(lhs, rhs, group_sizes, addend, *, transpose_rhs: bool = False):
    """`addend + grouped_matmul(lhs, rhs, group_sizes)`, the sum taken in float32 inside the GEMM's epilogue
    and rounded once to `addend`'s dtype; rows outside every group are `addend`'s. `addend` [M, N] has
    the input dtype or float32; its buffer is reused for the output (XLA aliases them)."""
    op = "grouped_matmul_acc"
    lhs, rhs, group_sizes, addend = (jnp.asarray(a) for a in (lhs, rhs, group_sizes, addend))
    gs, _ = _check_gmm(lhs, rhs, group_sizes, transpose_rhs, None)
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    if tuple(addend.shape) != (lhs.shape[0], n):
        raise ValueError(f"{op}: `addend` must be [M, N] = {(lhs.shape[0], n)}, got {tuple(addend.shape)}")
    if jnp.dtype(addend.dtype) not in (jnp.dtype(lhs.dtype), jnp.dtype(jnp.float32)):
        raise TypeError(f"{op}: `addend` must have the input dtype {jnp.dtype(lhs.dtype)} or float32 (the "
                        f"output takes its dtype), got {addend.dtype}")
    return _gmm_acc(lhs, rhs, gs, addend, bool(transpose_rhs))


def grouped_matmuls_shared_lhs(lhs, rhss, group_sizes, *, transpose_rhs=False, preferred_element_type=None,
                               recipe=None, fp8_grad_dtype: str = "e4m3", fp8_wgrad: bool = False, fp8_weights=None):
    """`[grouped_matmul(lhs, rhs) for rhs in rhss]` -- e.g. the gate and up projections of one set of
    dispatched rows -- with one backward difference: the lhs gradient (a sum over the products) is
    accumulated in the dgrad GEMMs' epilogues instead of by separate adds. `transpose_rhs` and
    `preferred_element_type` are one value or one per rhs. `recipe`, `fp8_grad_dtype`, `fp8_wgrad` as in
    `grouped_matmul`; `fp8_weights` None or one `quantize_weights` result (or None) per rhs. With
    recipe="blockwise" the shared lhs is quantised once and, for E4M3 gradients and a bfloat16 lhs, the lhs
    gradient is summed in the FP8 dgrads' epilogues (float32, one rounding)."""
    lhs = jnp.asarray(lhs)
    rhss = tuple(jnp.asarray(r) for r in rhss)
    if not rhss:
        raise ValueError("grouped_matmuls_shared_lhs: `rhss` is empty")
    group_sizes = jnp.asarray(group_sizes)
    trs = tuple(transpose_rhs) if isinstance(transpose_rhs, (tuple, list)) else (transpose_rhs,) * len(rhss)
    pets = (tuple(preferred_element_type) if isinstance(preferred_element_type, (tuple, list))
            else (preferred_element_type,) * len(rhss))
    if len(trs) != len(rhss) or len(pets) != len(rhss):
        raise ValueError("grouped_matmuls_shared_lhs: `transpose_rhs` / `preferred_element_type` need one "
                         f"value or one per rhs ({len(rhss)})")
    gs, odts = None, []
    for r, t, p in zip(rhss, trs, pets):
        gs, odt = _check_gmm(lhs, r, group_sizes, t, p)
        odts.append(odt)
    if recipe is not None:
        from jax_moe_ffi.ops.grouped_gemm_fp8 import grouped_matmuls_shared_lhs_fp8
        return grouped_matmuls_shared_lhs_fp8(lhs, rhss, gs, recipe=recipe, transpose_rhs=tuple(bool(t) for t in trs),
                                              out_dtypes=tuple(odts), grad_dtype=fp8_grad_dtype, fp8_wgrad=fp8_wgrad,
                                              fp8_weights=fp8_weights)
    if fp8_weights is not None:
        raise ValueError("grouped_matmuls_shared_lhs: `fp8_weights` need recipe='blockwise', got recipe=None")
    return list(_gmm_shared_lhs(lhs, rhss, gs, tuple(bool(t) for t in trs), tuple(odts)))


def grouped_matmul_wgrad(lhs, dout, group_sizes, *, preferred_element_type=None):
    """Ragged-contraction grouped matmul: `out[g] = lhs[rows_g].T @ dout[rows_g]`, [G, K, N].

    The weight gradient of `grouped_matmul`; empty groups give zeros.
    """
    op = "grouped_matmul_wgrad"
    lhs = jnp.asarray(lhs)
    dout = jnp.asarray(dout)
    group_sizes = jnp.asarray(group_sizes)
    c.check_rank(op, "lhs", lhs, 2, "[M, K]")
    c.check_rank(op, "dout", dout, 2, "[M, N]")
    c.check_float(op, "lhs", lhs)
    c.check_float(op, "dout", dout)
    if lhs.dtype != dout.dtype:
        raise TypeError(f"{op}: `lhs` and `dout` must have the same dtype, got {lhs.dtype} and {dout.dtype}")
    if lhs.shape[0] != dout.shape[0]:
        raise ValueError(f"{op}: `lhs` {tuple(lhs.shape)} and `dout` {tuple(dout.shape)} must have the same M")
    if group_sizes.ndim != 1:
        raise ValueError(f"{op}: `group_sizes` must be rank 1 [G], got shape {tuple(group_sizes.shape)}")
    gs = c.check_group_sizes(op, group_sizes, group_sizes.shape[0])
    return _wgrad(lhs, dout, gs, c.out_dtype(op, lhs.dtype, preferred_element_type))
