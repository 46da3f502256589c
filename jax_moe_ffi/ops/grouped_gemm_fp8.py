"""FP8 grouped matmul: `grouped_matmul(..., recipe="blockwise" | "mxfp8")`.

recipe="blockwise" (DeepSeek-V3; the FP8 recipe Hopper runs fast): the activations are quantised to E4M3
in 1 x 128 blocks along K and the weights in 128 x 128 tiles (float32 scales), and one CUDA call
(`jax_moe_ffi_grouped_gemm_fp8`, CUTLASS's SM90 blockwise-scaled pointer-array kernel) multiplies them
with the scales applied per 128-deep slice of the accumulation, f32 accumulation, bf16 out.
Backward: the incoming gradient is quantised (1 x 128 along N, E4M3 by default or E5M2) and the dgrad
is the same FP8 kernel against the forward's weight quantisation (reused, not recomputed: 128 x 128
tiles are the same along either axis). The kernel reads both operands K-major, so the weight is needed in
both orientations; the forward's one quantisation pass writes the second one too
(quantize_tiles_transposed). The weight gradient (a contraction over each group's tokens) runs in bf16 by default;
`fp8_wgrad=True` runs it in FP8: lhs and the incoming gradient are quantised in 1 x 128 blocks along the tokens,
each group padded to whole 128-token blocks so that no block straddles two groups, and written transposed
(quantize_groups_transposed: both operands K-major); `jax_moe_ffi_grouped_gemm_fp8_wgrad` multiplies them with
per-row scales on both sides. Why not the default: measured on the H200 (session 16), the FP8 wgrad kernel is
1.07-1.20x the bf16 one (two-sided per-row scales make every 128-token promotion an FMUL + FFMA per accumulator,
and each group's short contraction leaves a large epilogue; session 17's overlapped two-sided mainloop added
2-5%), and quantising both operands (0.27-0.52 ms at the benchmark shapes) costs more than it saves.

Weights quantised once: `quantize_weights(rhs)` -> `Fp8Weights`, passed as `grouped_matmul(..., fp8_weights=)`
(micro-batches of one step share it; the weight gradient still goes to rhs).

Products of one lhs (gate and up): `grouped_matmuls_shared_lhs(..., recipe="blockwise")` quantises the rows once
and sums the lhs gradient in the dgrads' epilogues (`jax_moe_ffi_grouped_gemm_fp8_acc`: the FP8 kernel with
C = D, beta = 1; float32 sum, one rounding) instead of an XLA add over [M, K]; its two bf16 weight gradients run
as one pair launch. H200, Qwen3-shaped FP8 train step (session 28): -1.2% a step.

recipe="mxfp8" (OCP MX v1.0, 1 x 32 blocks, E8M0 scales): Hopper has no MX tensor-core instruction.
Operands are quantised to MXFP8 and dequantised to bf16 (E4M3 times a power of two is exact in bf16
for normal values) and multiplied by the bf16 grouped GEMM: the result honours every per-32 scale, at
bf16 speed. Gradients are quantised the same way (straight-through for the quantisers).

CPU (and any non-CUDA backend): the same operands dequantised to float32 and multiplied by the float32
grouped matmul (the CPU FFI kernel), so the FP8 rounding is identical and only the accumulation order
differs from the GPU.
"""
from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jax_moe_ffi import _registry
from jax_moe_ffi.ops import _common as c
from jax_moe_ffi.ops import grouped_gemm as gg
from jax_moe_ffi.ops.quantize import _groups_t_call, _tiles_t_call, dequantize, quantize

FP8_TARGET = "jax_moe_ffi_grouped_gemm_fp8"
FP8_WGRAD_TARGET = "jax_moe_ffi_grouped_gemm_fp8_wgrad"
# The accumulate form: the lhs gradient of grouped_matmuls_shared_lhs(..., recipe="blockwise") (gate and up) is
# the first dgrad, then each later one adding its product in the epilogue, instead of an XLA add over [M, K] per
# extra product. JAX_MOE_FFI_FP8_ACC_DGRAD=0 (read when traced) adds them in XLA instead (A/B).
FP8_ACC_TARGET = "jax_moe_ffi_grouped_gemm_fp8_acc"
RECIPES = ("blockwise", "mxfp8")
GRAD_DTYPES = ("e4m3", "e5m2")
BLOCK = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _workspace_bytes(g: int, m: int, k: int) -> int:
    """Twice (the cluster split launches two kernels, each with its own half): per-group metadata (< 512 B a
    group), per-group TMA descriptors where the kernel takes them prebuilt (3 x 128 B a group), the repacked lhs
    scales (M * K/128 floats) and CUTLASS's per-SM TMA descriptors (1 MiB covers 1024 SMs). The handler checks
    it."""
    return 2 * (896 * g + 4 * m * _cdiv(k, BLOCK) + (1 << 20) + 4096)


def _expand_rows(scale, n_cols: int):
    """[R, ceil(C/128)] block scales -> [R, C]."""
    return jnp.repeat(scale, BLOCK, axis=-1)[..., :n_cols]


def _reference_f32(a, sa, bt, sb, group_sizes):
    """Dequantised operands, float32 grouped matmul (the CPU FFI kernel on CPU, XLA elsewhere), float32 out."""
    m, k = a.shape
    _, n, _ = bt.shape
    a32 = a.astype(jnp.float32) * _expand_rows(sa, k)
    sbt = jnp.swapaxes(sb, 1, 2)  # [G, NB, KB]
    s_full = jnp.repeat(jnp.repeat(sbt, BLOCK, axis=1), BLOCK, axis=2)[:, :n, :k]
    b32 = bt.astype(jnp.float32) * s_full
    return gg._fwd_call(a32, b32, group_sizes, True, jnp.float32)


def _reference_call(a, sa, bt, sb, group_sizes):
    return _reference_f32(a, sa, bt, sb, group_sizes).astype(jnp.bfloat16)


def _acc_reference_call(a, sa, bt, sb, group_sizes, addend):
    """addend + the dequantised product, summed in float32 and rounded once (rows past the groups: addend)."""
    return (_reference_f32(a, sa, bt, sb, group_sizes) + addend.astype(jnp.float32)).astype(jnp.bfloat16)


def _blockwise_call(target, args, reference, aliases=None):
    """One blockwise FP8 kernel call: args = (a [M,K], sa, bt [G,N,K], sb, group_sizes[, addend]); `reference` on CPU
    and wherever the CUDA kernel cannot take the call (said once on a GPU)."""
    a, bt = args[0], args[2]
    m, k = a.shape
    g, n, _ = bt.shape
    out = jax.ShapeDtypeStruct((m, n), jnp.bfloat16)
    ws = jax.ShapeDtypeStruct((_workspace_bytes(g, m, k),), jnp.uint8)
    cuda_call = jax.ffi.ffi_call(target, (out, ws), vmap_method="sequential", input_output_aliases=aliases)

    def cuda_fn(*xs):
        return cuda_call(*xs)[0]

    unusable = None
    if target not in _registry.cuda_targets:
        unusable = f"the CUDA library is not loaded or lacks {target} ({_registry.cuda_load_error})"
    elif k % 16 or n % 8:
        unusable = f"the FP8 kernel needs K % 16 == 0 and N % 8 == 0, got K={k} N={n}"
    return c.on_platforms(target, args, cpu=reference, cuda=cuda_fn, fallback=reference, cuda_unusable=unusable)


def _fp8_call(a, sa, bt, sb, group_sizes):
    """out[M,N] bf16 = blockwise-scaled grouped product. a [M,K] fp8 with sa [M, K/128]; bt [G,N,K] fp8
    (K contiguous) with sb [G, K/128, N/128]."""
    return _blockwise_call(FP8_TARGET, (a, sa, bt, sb, group_sizes), _reference_call)


def _fp8_acc_call(a, sa, bt, sb, group_sizes, addend):
    """addend [M,N] bf16 + _fp8_call(a, sa, bt, sb, group_sizes), summed in float32 in the kernel's epilogue and
    rounded once; XLA aliases the output to addend. a must be E4M3 (the accumulate form's kernels)."""
    return _blockwise_call(FP8_ACC_TARGET, (a, sa, bt, sb, group_sizes, addend), _acc_reference_call, {5: 0})


def _wgrad_reference_call(at, sat, bt, sbt, plan):
    """Dequantised operands, float32 wgrad over the padded groups (zero padding adds nothing)."""
    a32 = at.astype(jnp.float32) * jnp.repeat(sat.T, BLOCK, axis=1)  # [K, P]
    b32 = bt.astype(jnp.float32) * jnp.repeat(sbt.T, BLOCK, axis=1)  # [N, P]
    padded_sizes = (plan[1, 1:] - plan[1, :-1]) * BLOCK
    return gg._wgrad_call(a32.T, b32.T, padded_sizes, jnp.float32).astype(jnp.bfloat16)


def _fp8_wgrad_call(at, sat, bt, sbt, plan):
    """out[G,K,N] bf16 = per group, the blockwise-scaled product of at [K,P] (sat [P/128,K]) and bt [N,P]
    (sbt [P/128,N]) over the group's 128-token blocks (plan from quantize_groups_transposed)."""
    k, p = at.shape
    n = bt.shape[0]
    g = plan.shape[1] - 1
    out = jax.ShapeDtypeStruct((g, k, n), jnp.bfloat16)
    ws = jax.ShapeDtypeStruct((512 * g + (1 << 20) + 4096,), jnp.uint8)
    cuda_call = jax.ffi.ffi_call(FP8_WGRAD_TARGET, (out, ws), vmap_method="sequential")

    def cuda_fn(*args):
        return cuda_call(*args)[0]

    unusable = None
    if FP8_WGRAD_TARGET not in _registry.cuda_targets:
        unusable = f"the CUDA library is not loaded or lacks the FP8 wgrad kernel ({_registry.cuda_load_error})"
    elif k % 8 or n % 8:
        unusable = f"the FP8 wgrad kernel needs K % 8 == 0 and N % 8 == 0, got K={k} N={n}"
    return c.on_platforms(FP8_WGRAD_TARGET, (at, sat, bt, sbt, plan), cpu=_wgrad_reference_call, cuda=cuda_fn,
                          fallback=_wgrad_reference_call, cuda_unusable=unusable)


def _wgrad_fp8(a, b, group_sizes, b_fmt):
    """[G, K, N] bf16: per group g, the sum over its rows r of a[r]^T b[r] (a [M,K], b [M,N]) with FP8 operands,
    a in E4M3 (the kernel's A) and b in `b_fmt`, both in 1 x 128 blocks along the rows of each group."""
    at, sat, plan = _groups_t_call(a, group_sizes, "e4m3")
    bt, sbt, _ = _groups_t_call(b, group_sizes, b_fmt)  # the same plan (same sizes, same M)
    return _fp8_wgrad_call(at, sat, bt, sbt, plan)


def _quant_rows(x, fmt):
    q = quantize(x, "blockwise", dtype=fmt)  # 1 x 128 blocks along the last axis
    return q.data, q.scale


def _weight_quant(rhs, transpose_rhs: bool):
    """((data, scale) for the forward, (data, scale) for the dgrad) of rhs [G,K,N] ([G,N,K] with transpose_rhs),
    each data [G, N', K'] with scale [G, K'/128, N'/128], from one 128 x 128 quantisation pass. FP8 wgmma reads
    both operands K-major: the forward needs [G,N,K], the dgrad [G,K,N], so one of the two is the stored layout
    transposed; the tile kernel writes that copy itself (quantize_tiles_transposed) instead of leaving XLA a
    transpose over the FP8 codes.

    Made outside the custom_vjp, from stop_gradient(rhs) (the weight gradient is the wgrad of lhs and dout,
    bf16 or FP8, not a derivative through the quantiser), and tagged "moe_fp8_weights" (runtime.FP8_WEIGHTS_NAME): a
    jax.checkpoint policy that saves the tag (optimize(offload="device"), or {"moe_fp8_weights": "device"})
    keeps both for the backward instead of quantising the weights again in the recompute; inside the custom_vjp
    they would be invisible to the policy. Both orientations are written even when nothing is differentiated.

    The codes travel as uint8 (a bitcast, no data moved) until inside the custom_vjp: jax.checkpoint passes
    every saved floating-point residual through reduce_precision(exponent_bits=finfo.nexp,
    mantissa_bits=finfo.nmant) (jax/_src/ad_checkpoint.py, _insert_reduce_precision), which for float8_e4m3fn
    (4, 3) treats the top exponent as infinity: every code >= 256 came back as NaN (jax 0.10.2, CPU), whether
    a policy saved the tag or everything. Integers are left alone. The tile kernel is called without
    quantize's custom_jvp, which only refuses differentiation: the input here is stop_gradient's."""
    from jax_moe_ffi import runtime
    wd, wt, ws = _tiles_t_call(jax.lax.stop_gradient(rhs), "e4m3", False, True)  # ws: tiles of rhs as stored
    if transpose_rhs:  # stored [G,N,K] (scale [G,NB,KB]): forward as stored, dgrad transposed [G,K,N]
        ops = (wd, jnp.swapaxes(ws, 1, 2)), (wt, ws)
    else:  # stored [G,K,N] (scale [G,KB,NB]): forward transposed [G,N,K], dgrad as stored
        ops = (wt, ws), (wd, jnp.swapaxes(ws, 1, 2))
    bits = lambda d: jax.lax.bitcast_convert_type(d, jnp.uint8)
    return runtime.tag(tuple((bits(d), sc) for d, sc in ops), runtime.FP8_WEIGHTS_NAME)


@jax.tree_util.register_pytree_node_class
class Fp8Weights:
    """A weight [G, K, N] (or [G, N, K] with transpose_rhs) quantised once for `grouped_matmul(...,
    recipe="blockwise", fp8_weights=...)`: E4M3 codes in 128 x 128 tiles, both K-major orientations (forward and
    dgrad), from `quantize_weights`. A pytree (the arrays are its leaves; shape and orientation are static), so
    it passes through jit, scan and checkpoint. Why: every blockwise grouped_matmul otherwise quantises its weight
    again, a pass over ~4 bytes per weight element (about 1 ms for deepseek-v3's gate_up expert weights on an
    H200: its forward took 3.04 ms quantising them, 2.03 ms with them cached; session 17, grouped_gemm_fp8_h200);
    with gradient accumulation the weights are the same for every micro-batch of a step, so quantise them once
    per step and pass them to each micro-batch."""

    def __init__(self, pairs, shape, transpose_rhs):
        self.pairs = pairs  # ((fwd codes uint8, fwd scale), (dgrad codes uint8, dgrad scale)), tagged
        self.shape = tuple(int(d) for d in shape)
        self.transpose_rhs = bool(transpose_rhs)

    def tree_flatten(self):
        return (self.pairs,), (self.shape, self.transpose_rhs)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    def __repr__(self):
        return f"Fp8Weights(shape={self.shape}, transpose_rhs={self.transpose_rhs})"


def quantize_weights(rhs, *, transpose_rhs: bool = False) -> Fp8Weights:
    """Quantise a grouped-matmul weight once (128 x 128 E4M3 tiles, both orientations the blockwise kernels read)
    for reuse by `grouped_matmul(lhs, rhs, sizes, recipe="blockwise", fp8_weights=...)` across micro-batches.
    No gradient flows through it (stop_gradient): the weight gradient of each grouped_matmul goes to its `rhs`.
    The caller owns staleness: pass weights quantised from the same values as `rhs`, or the products use
    the old ones (by design: that is the point of caching)."""
    rhs = jnp.asarray(rhs)
    if rhs.ndim != 3:
        raise ValueError(f"quantize_weights: `rhs` must be [G, K, N] (or [G, N, K] with transpose_rhs), "
                         f"got shape {rhs.shape}")
    if rhs.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise TypeError(f"quantize_weights: `rhs` must be float32, bfloat16 or float16, got {rhs.dtype}")
    return Fp8Weights(_weight_quant(rhs, bool(transpose_rhs)), rhs.shape, transpose_rhs)


def _check_fp8_weights(w, rhs, transpose_rhs: bool):
    if not isinstance(w, Fp8Weights):
        raise TypeError(f"grouped_matmul: `fp8_weights` must come from quantize_weights(rhs), got {type(w).__name__}")
    if w.shape != tuple(rhs.shape) or w.transpose_rhs != transpose_rhs:
        raise ValueError(f"grouped_matmul: `fp8_weights` were quantised from a weight of shape {w.shape} with "
                         f"transpose_rhs={w.transpose_rhs}, but `rhs` has shape {tuple(rhs.shape)} with "
                         f"transpose_rhs={transpose_rhs}")


def _e4m3(u):
    """The FP8 codes of _weight_quant's uint8 carrier."""
    return jax.lax.bitcast_convert_type(u, jnp.float8_e4m3fn)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _gmm_blockwise(lhs, rhs, wq, group_sizes, transpose_rhs, out_dtype, grad_fmt, fp8_wgrad):
    del rhs  # only its gradient is computed here; wq holds its quantisation
    ad, asc = _quant_rows(lhs, "e4m3")
    (bt, sb), _ = wq
    return _fp8_call(ad, asc, _e4m3(bt), sb, group_sizes).astype(out_dtype)


def _blockwise_fwd(lhs, rhs, wq, group_sizes, transpose_rhs, out_dtype, grad_fmt, fp8_wgrad):
    out = _gmm_blockwise(lhs, rhs, wq, group_sizes, transpose_rhs, out_dtype, grad_fmt, fp8_wgrad)
    return out, (lhs, wq[1], group_sizes)


def _blockwise_bwd(transpose_rhs, out_dtype, grad_fmt, fp8_wgrad, res, dout):
    lhs, (bt, sb), group_sizes = res
    dd, dsc = _quant_rows(dout, grad_fmt)
    dlhs = _fp8_call(dd, dsc, _e4m3(bt), sb, group_sizes).astype(lhs.dtype)
    drhs = _blockwise_drhs(lhs, dout.astype(lhs.dtype), group_sizes, transpose_rhs, grad_fmt, fp8_wgrad)
    return dlhs, drhs, None, c.float0_zeros(group_sizes)  # None: wq (made from stop_gradient(rhs)) has no cotangent


def _blockwise_drhs(lhs, d, group_sizes, transpose_rhs, grad_fmt, fp8_wgrad):
    """The weight gradient of one blockwise product (d: the incoming gradient in lhs's dtype)."""
    if fp8_wgrad:
        if not transpose_rhs:
            drhs = _wgrad_fp8(lhs, d, group_sizes, grad_fmt)
        elif grad_fmt == "e4m3":  # [G,N,K]: the same product with the operands' roles swapped
            drhs = _wgrad_fp8(d, lhs, group_sizes, "e4m3")
        else:  # the kernel's A is E4M3 only: an E5M2 gradient stays B, and XLA transposes the result
            drhs = jnp.swapaxes(_wgrad_fp8(lhs, d, group_sizes, grad_fmt), 1, 2)
        drhs = drhs.astype(lhs.dtype)
    else:
        drhs = (gg._wgrad(d, lhs, group_sizes, lhs.dtype) if transpose_rhs
                else gg._wgrad(lhs, d, group_sizes, lhs.dtype))
    return drhs


_gmm_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def _fp8_acc_dgrad() -> bool:
    return os.environ.get("JAX_MOE_FFI_FP8_ACC_DGRAD", "1") == "1"


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _gmm_blockwise_shared_lhs(lhs, rhss, wqs, group_sizes, transpose_rhs, out_dtypes, grad_fmt, fp8_wgrad):
    del rhss  # only their gradients are computed here; wqs hold their quantisation
    ad, asc = _quant_rows(lhs, "e4m3")  # one quantisation of the shared rows
    return tuple(_fp8_call(ad, asc, _e4m3(bt), sb, group_sizes).astype(o) for ((bt, sb), _), o in zip(wqs, out_dtypes))


def _blockwise_shared_lhs_fwd(lhs, rhss, wqs, group_sizes, transpose_rhs, out_dtypes, grad_fmt, fp8_wgrad):
    outs = _gmm_blockwise_shared_lhs(lhs, rhss, wqs, group_sizes, transpose_rhs, out_dtypes, grad_fmt, fp8_wgrad)
    return outs, (lhs, tuple(w[1] for w in wqs), group_sizes)


def _blockwise_shared_lhs_bwd(transpose_rhs, out_dtypes, grad_fmt, fp8_wgrad, res, douts):
    # dlhs = sum_i dout_i . W_i^T: the first dgrad writes it, each later one adds its product in the epilogue
    # (grouped_gemm_fp8_acc: float32 sum, one rounding) -- E4M3 gradients and a bf16 lhs, the kernels' form;
    # otherwise XLA adds the products as it does for separate grouped_matmuls.
    lhs, dgrad_ops, group_sizes = res
    quant = [_quant_rows(d, grad_fmt) for d in douts]
    acc = _fp8_acc_dgrad() and grad_fmt == "e4m3" and lhs.dtype == jnp.bfloat16
    dlhs = None
    for (dd, dsc), (bt, sb) in zip(quant, dgrad_ops):
        if dlhs is None:
            dlhs = _fp8_call(dd, dsc, _e4m3(bt), sb, group_sizes).astype(lhs.dtype)
        elif acc:
            dlhs = _fp8_acc_call(dd, dsc, _e4m3(bt), sb, group_sizes, dlhs)
        else:
            dlhs = dlhs + _fp8_call(dd, dsc, _e4m3(bt), sb, group_sizes).astype(lhs.dtype)
    ds = [d.astype(lhs.dtype) for d in douts]
    if (not fp8_wgrad and len(ds) == 2 and not any(transpose_rhs)
            and gg._pairable(ds[0], ds[1])):  # both bf16 weight gradients lhs^T . dout_i in one launch
        drhss = tuple(gg._wgrad_pair(lhs, ds[0], ds[1], group_sizes, lhs.dtype))
    else:
        drhss = tuple(_blockwise_drhs(lhs, d, group_sizes, t, grad_fmt, fp8_wgrad) for d, t in zip(ds, transpose_rhs))
    return dlhs, drhss, None, c.float0_zeros(group_sizes)


_gmm_blockwise_shared_lhs.defvjp(_blockwise_shared_lhs_fwd, _blockwise_shared_lhs_bwd)


# ------------------------------------------------------------------------------------------- mxfp8
@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _mx_operand(x, axis):
    """x rounded through MXFP8 (E4M3, blocks of 32 along `axis`); straight-through gradient."""
    return dequantize(quantize(x, "mxfp8", axis=axis), x.dtype)


_mx_operand.defvjp(lambda x, axis: (_mx_operand(x, axis), None), lambda axis, _, g: (g,))


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _mx_grad(y, fmt):
    """Identity forward; the incoming gradient is rounded through MXFP8 (`fmt`) along its last axis."""
    return y


_mx_grad.defvjp(lambda y, fmt: (y, None),
                lambda fmt, _, g: (dequantize(quantize(g, "mxfp8", dtype=fmt), g.dtype),))


def grouped_matmul_fp8(lhs, rhs, group_sizes, *, recipe: str, out_dtype, transpose_rhs: bool = False,
                       grad_dtype: str = "e4m3", fp8_wgrad: bool = False, fp8_weights=None):
    """Called by `grouped_matmul(..., recipe=...)` after its argument checks."""
    if recipe not in RECIPES:
        raise ValueError(f"grouped_matmul: `recipe` must be None or one of {RECIPES}, got {recipe!r}")
    if grad_dtype not in GRAD_DTYPES:
        raise ValueError(f"grouped_matmul: `fp8_grad_dtype` must be one of {GRAD_DTYPES}, got {grad_dtype!r}")
    if fp8_weights is not None and recipe != "blockwise":
        raise ValueError(f"grouped_matmul: `fp8_weights` are 128 x 128 blockwise tiles: they need "
                         f"recipe='blockwise', got recipe={recipe!r}")
    if recipe == "blockwise":
        if not isinstance(fp8_wgrad, (bool, np.bool_)):
            raise TypeError(f"grouped_matmul: `fp8_wgrad` must be a bool, got {fp8_wgrad!r}")
        if fp8_weights is None:
            wq = _weight_quant(rhs, bool(transpose_rhs))
        else:
            _check_fp8_weights(fp8_weights, rhs, bool(transpose_rhs))
            wq = fp8_weights.pairs
        return _gmm_blockwise(lhs, rhs, wq, group_sizes, bool(transpose_rhs), jnp.dtype(out_dtype), grad_dtype,
                              bool(fp8_wgrad))
    half = jnp.bfloat16 if lhs.dtype == jnp.float32 else lhs.dtype
    a = _mx_operand(lhs.astype(half), 1)
    b = _mx_operand(rhs.astype(half), 2 if transpose_rhs else 1)  # blocks along K
    out = gg._gmm(a, b, group_sizes, bool(transpose_rhs), jnp.dtype(out_dtype))
    return _mx_grad(out, grad_dtype)


def grouped_matmuls_shared_lhs_fp8(lhs, rhss, group_sizes, *, recipe: str, transpose_rhs: tuple, out_dtypes: tuple,
                                   grad_dtype: str = "e4m3", fp8_wgrad: bool = False, fp8_weights=None):
    """Called by `grouped_matmuls_shared_lhs(..., recipe=...)` after its argument checks. blockwise: the shared
    lhs quantised once, the lhs gradient summed in the dgrad GEMMs' epilogues (FP8_ACC_TARGET), the two bf16 weight
    gradients of a pair in one launch. mxfp8: the products one by one (its bf16 GEMMs have nothing to share)."""
    fws = tuple(fp8_weights) if fp8_weights is not None else (None,) * len(rhss)
    if len(fws) != len(rhss):
        raise ValueError(f"grouped_matmuls_shared_lhs: `fp8_weights` needs one entry (or None) per rhs "
                         f"({len(rhss)}), got {len(fws)}")
    if recipe != "blockwise" or grad_dtype not in GRAD_DTYPES or not isinstance(fp8_wgrad, (bool, np.bool_)):
        return [grouped_matmul_fp8(lhs, r, group_sizes, recipe=recipe, out_dtype=o, transpose_rhs=t,
                                   grad_dtype=grad_dtype, fp8_wgrad=fp8_wgrad, fp8_weights=w)
                for r, t, o, w in zip(rhss, transpose_rhs, out_dtypes, fws)]  # its checks raise the errors
    wqs = []
    for r, t, w in zip(rhss, transpose_rhs, fws):
        if w is None:
            wqs.append(_weight_quant(r, bool(t)))
        else:
            _check_fp8_weights(w, r, bool(t))
            wqs.append(w.pairs)
    return list(_gmm_blockwise_shared_lhs(lhs, tuple(rhss), tuple(wqs), group_sizes,
                                          tuple(bool(t) for t in transpose_rhs),
                                          tuple(jnp.dtype(o) for o in out_dtypes), grad_dtype, bool(fp8_wgrad)))


__all__ = ["grouped_matmul_fp8", "grouped_matmuls_shared_lhs_fp8", "FP8_ACC_TARGET", "quantize_weights", "Fp8Weights", "RECIPES", "GRAD_DTYPES", "FP8_TARGET", "FP8_WGRAD_TARGET"]
