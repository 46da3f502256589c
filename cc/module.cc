// nanobind module of the CPU handlers: `targets()` returns {ffi_target_name: PyCapsule}.
// Each op family's .cc file defines its handler symbols; this file only lists them.
// The CUDA handlers live in a separate plain shared library (no Python ABI), loaded by ctypes.
#include <nanobind/nanobind.h>

#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

// cpu/grouped_gemm.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmAccCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmWgradCpu);
// cpu/dispatch.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiDispatchPlanCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiDispatchCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiCombineCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiCombineBwdCpu);
// cpu/quantize.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiQuantizeMxfp8Cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiQuantizeBlockwiseCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiQuantizeTilesTransposedCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiQuantizeGroupsTransposedCpu);
// cpu/topk.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxMoeFfiTopKCpu);

namespace {

template <typename Fn>
nb::capsule encapsulate(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

nb::dict targets() {
  nb::dict d;
  d["jax_moe_ffi_grouped_gemm"] = encapsulate(JaxMoeFfiGroupedGemmCpu);
  d["jax_moe_ffi_grouped_gemm_acc"] = encapsulate(JaxMoeFfiGroupedGemmAccCpu);
  d["jax_moe_ffi_grouped_gemm_wgrad"] = encapsulate(JaxMoeFfiGroupedGemmWgradCpu);
  d["jax_moe_ffi_dispatch_plan"] = encapsulate(JaxMoeFfiDispatchPlanCpu);
  d["jax_moe_ffi_dispatch"] = encapsulate(JaxMoeFfiDispatchCpu);
  d["jax_moe_ffi_combine"] = encapsulate(JaxMoeFfiCombineCpu);
  d["jax_moe_ffi_combine_bwd"] = encapsulate(JaxMoeFfiCombineBwdCpu);
  d["jax_moe_ffi_quantize_mxfp8"] = encapsulate(JaxMoeFfiQuantizeMxfp8Cpu);
  d["jax_moe_ffi_quantize_blockwise"] = encapsulate(JaxMoeFfiQuantizeBlockwiseCpu);
  d["jax_moe_ffi_quantize_tiles_t"] = encapsulate(JaxMoeFfiQuantizeTilesTransposedCpu);
  d["jax_moe_ffi_quantize_groups_t"] = encapsulate(JaxMoeFfiQuantizeGroupsTransposedCpu);
  d["jax_moe_ffi_top_k"] = encapsulate(JaxMoeFfiTopKCpu);
  return d;
}

}  // namespace

NB_MODULE(_jax_moe_ffi_cpu, m) {
  m.doc() = "CPU XLA FFI handlers of jax_moe_ffi";
  m.def("targets", &targets, "{ffi target name: capsule of the typed FFI handler}");
}
