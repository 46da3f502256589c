"""jax_moe_ffi: fast Mixture-of-Experts for JAX on NVIDIA GPUs (XLA FFI custom calls).

Public API only; see README.md.
"""
from jax_moe_ffi import _registry

_registry.register_all()

from jax_moe_ffi.ops.grouped_gemm import (  # noqa: E402
    grouped_matmul, grouped_matmul_acc, grouped_matmul_wgrad, grouped_matmuls_shared_lhs)
from jax_moe_ffi.ops.grouped_gemm_fp8 import Fp8Weights, quantize_weights  # noqa: E402
from jax_moe_ffi.ops.dispatch import MoeRouting, moe_combine, moe_dispatch, moe_dispatch_rows  # noqa: E402
from jax_moe_ffi.ops.ep import EpRouting, ep_combine, ep_dispatch  # noqa: E402
from jax_moe_ffi.ops.topk import top_k  # noqa: E402
from jax_moe_ffi.ops.quantize import (  # noqa: E402
    QuantizedArray, dequantize, from_swizzled_scales, quantize, quantize_groups_transposed, quantize_tiles_transposed,
    to_swizzled_scales)
from jax_moe_ffi import reference  # noqa: E402
from jax_moe_ffi import runtime  # noqa: E402
from jax_moe_ffi.rewrite import Report, explain, optimize  # noqa: E402
from jax_moe_ffi.export import export_disabled_checks  # noqa: E402

__version__ = "0.1.0"

__all__ = ["grouped_matmul", "grouped_matmul_wgrad", "grouped_matmul_acc", "grouped_matmuls_shared_lhs",
           "quantize_weights", "Fp8Weights", "moe_dispatch", "moe_dispatch_rows", "moe_combine", "MoeRouting",
           "ep_dispatch", "ep_combine", "EpRouting", "top_k",
           "QuantizedArray", "quantize", "quantize_tiles_transposed", "quantize_groups_transposed", "dequantize",
           "to_swizzled_scales", "from_swizzled_scales",
           "reference", "runtime", "export_disabled_checks", "optimize", "explain", "Report"]
