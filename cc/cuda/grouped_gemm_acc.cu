// CUDA (SM90a) accumulate form of the grouped GEMM, exported as an XLA typed-FFI handler:
//
//   JaxMoeFfiGroupedGemmAccCuda -> target "jax_moe_ffi_grouped_gemm_acc"
//       out[M,N] = addend[M,N] + lhs[rows_g, :] . rhs[g]     (rhs [G,K,N], transpose_rhs = false)
//       out[M,N] = addend[M,N] + lhs[rows_g, :] . rhs[g]^T   (rhs [G,N,K], transpose_rhs = true)
//       rows no group covers keep the addend. XLA aliases out to addend (input_output_aliases).
//
// Why: when two expert GEMMs share their lhs (gate and up projections of the same dispatched rows),
// the lhs gradient is the sum of two dgrads. The second dgrad adds the first in its epilogue (C = D,
// beta = 1, f32, one rounding) instead of XLA running an elementwise add over [M, N] afterwards:
// one extra read of [M, N] inside the GEMM instead of two reads and a write in a separate kernel.
// Its own translation unit so that these CUTLASS instantiations compile in parallel with the plain ones.

#include <cuda_runtime.h>

#include "cuda/grouped_gemm_run.cuh"
#include "xla/ffi/api/ffi.h"

#define JMF_EXPORT extern "C" __attribute__((visibility("default")))
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmAccCuda(XLA_FFI_CallFrame* call_frame);

namespace jax_moe_ffi {
namespace cuda {
namespace {

ffi::Error GroupedGemmAccImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                              ffi::Buffer<ffi::DataType::S32> group_sizes, ffi::AnyBuffer addend,
                              ffi::Result<ffi::AnyBuffer> out,
                              ffi::Result<ffi::AnyBuffer> workspace, bool transpose_rhs) {
  return RunForwardOrDgrad<true>("grouped_gemm_acc", stream, lhs, rhs, group_sizes, &addend, out,
                                 workspace, transpose_rhs);
}

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi

// Command-buffer compatible: stream-ordered work only (a device-to-device copy when XLA did not alias
// out to addend), no host sync, all memory XLA-owned.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmAccCuda, jax_moe_ffi::cuda::GroupedGemmAccImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                      // lhs
                                  .Arg<xla::ffi::AnyBuffer>()                      // rhs
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Arg<xla::ffi::AnyBuffer>()                      // addend
                                  .Ret<xla::ffi::AnyBuffer>()                      // out
                                  .Ret<xla::ffi::AnyBuffer>()                      // workspace (u8)
                                  .Attr<bool>("transpose_rhs"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
