"""Family (5): MoE code that already calls `jax.lax.ragged_dot` / `ragged_dot_general` (a grouped matmul
written the modern way, e.g. MaxText's sparse_matmul path without megablox). On GPU XLA runs it as a dense
masked dot (5-47 TFLOP/s on an H200); the op is exactly `grouped_matmul`'s contract, so the pass swaps it:

  mode "fwd"   : lhs [M,K] ragged in M, rhs [G,K,N] grouped in G, contract K   -> grouped_matmul
  mode "fwd_t" : the same with rhs [G,N,K] (contract its last axis)           -> grouped_matmul(transpose_rhs)
  mode "wgrad" : lhs [M,K] and dout [M,N] both ragged in M, contract M        -> grouped_matmul_wgrad

Operands of two float dtypes (bf16 rows, f32 weights) are both converted to the output dtype first, as XLA
does (a float32 output: widened, exactly; a bf16 output: the f32 operand rounded to bf16).

Anything else (batch dimensions, group_offset, other ragged layouts, an operand or output that is not a
float) is left to XLA and reported as a near-miss with the reason.
The swap is exact up to float32 accumulation order; gradients go through the ops' custom_vjp (the same
products XLA's transpose rules would form).
"""
from __future__ import annotations

import numpy as np

FAMILY = "ragged"
PRIMITIVE = "ragged_dot_general"
FLOAT = (np.dtype(np.float32), np.dtype("bfloat16"), np.dtype(np.float16))


def _dims(e):
    dn = e.params["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    return (tuple(lc), tuple(rc), tuple(lb), tuple(rb), tuple(dn.lhs_ragged_dimensions),
            tuple(dn.rhs_group_dimensions))


def classify(e):
    """(mode, None) when the equation is one of the three supported forms, else (None, reason)."""
    lhs, rhs, gs = e.ins[:3]
    lc, rc, lb, rb, lr, rg = _dims(e)
    if e.params.get("group_offset") is not None or len(e.ins) > 3:
        return None, "ragged_dot with a group_offset (a shard of the groups) is left to XLA"
    if lb or rb:
        return None, "ragged_dot with batch dimensions is left to XLA"
    if np.dtype(lhs.dtype) not in FLOAT or np.dtype(rhs.dtype) not in FLOAT:
        return None, f"operands must be float (f32/bf16/f16), got {lhs.dtype} and {rhs.dtype}"
    pet = e.params.get("preferred_element_type")
    if pet is not None and np.dtype(pet) not in FLOAT:
        return None, f"output dtype {np.dtype(pet)} is not a float type (f32/bf16/f16)"
    if gs.ndim != 1 or not np.issubdtype(np.dtype(gs.dtype), np.integer):
        return None, f"group_sizes must be a rank-1 integer array, got {gs.aval.str_short()}"
    if lhs.ndim == 2 and rhs.ndim == 3 and lr == (0,) and rg == (0,) and lc == (1,) and rc in ((1,), (2,)):
        return ("fwd" if rc == (1,) else "fwd_t"), None
    if lhs.ndim == 2 and rhs.ndim == 2 and lr == (0,) and rg == () and lc == (0,) and rc == (0,):
        return "wgrad", None
    return None, ("ragged_dot layout not one of grouped_matmul's three (lhs [M,K] x rhs [G,K,N] or [G,N,K], "
                  f"or the ragged contraction over M): contracting {lc}/{rc}, ragged {lr}, group {rg}")


def emit(e, mode, vals, recipe=None):
    """The equation's value through the package's grouped GEMM ops (forward forms with optimize's FP8
    `recipe` when one is given; the ragged contraction has no FP8 form and stays in the input dtype)."""
    from jax_moe_ffi.ops.grouped_gemm import grouped_matmul, grouped_matmul_wgrad
    lhs, rhs, gs = vals[:3]
    out = e.outs[0]
    if lhs.dtype != rhs.dtype:  # mixed operands (e.g. bf16 rows, f32 weights): XLA converts both to the output
        lhs, rhs = lhs.astype(out.dtype), rhs.astype(out.dtype)  # dtype (widening to f32, or narrowing to bf16)
    pet = e.params.get("preferred_element_type")
    # an output narrower than float32 and not the input dtype (e.g. f32 operands, bf16 out): float32
    # accumulation rounded once to the output dtype, as XLA's dot does
    pet = None if pet is None or np.dtype(pet) == np.dtype(lhs.dtype) else np.dtype(np.float32)
    if mode == "wgrad":
        r = grouped_matmul_wgrad(lhs, rhs, gs, preferred_element_type=pet)
    else:
        r = grouped_matmul(lhs, rhs, gs, preferred_element_type=pet, transpose_rhs=(mode == "fwd_t"),
                           recipe=recipe)
    return r.astype(out.dtype)


def flops(e):
    lhs, rhs = e.ins[:2]
    m, k = lhs.shape
    n = rhs.shape[-1] if rhs.ndim == 2 else (rhs.shape[2] if _dims(e)[1] == (1,) else rhs.shape[1])
    return 2 * m * k * n
