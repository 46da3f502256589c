// CUDA (SM90a / Hopper) grouped GEMM handlers for jax_moe_ffi.
//
// Exported XLA typed-FFI handlers (plain C symbols, loaded from Python with ctypes and registered
// with jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(lib.Symbol), platform="CUDA")):
//
//   JaxMoeFfiGroupedGemmCuda       -> target "jax_moe_ffi_grouped_gemm"
//       out[M,N] = lhs[rows_g, :] . rhs[g]      (rhs [G,K,N], transpose_rhs = false)
//       out[M,N] = lhs[rows_g, :] . rhs[g]^T    (rhs [G,N,K], transpose_rhs = true: the dgrad)
//       rows at/after the clipped total of group_sizes are written as zero.
//   JaxMoeFfiGroupedGemmWgradCuda  -> target "jax_moe_ffi_grouped_gemm_wgrad"
//       out[g] = lhs[rows_g, :]^T . dout[rows_g, :]   (out [G,K,N]); empty groups are zero.
//   JaxMoeFfiGroupedGemmPairCuda / JaxMoeFfiGroupedGemmWgradPairCuda
//                                  -> "jax_moe_ffi_grouped_gemm_pair" / "..._wgrad_pair": two of the
//       above that share lhs and group_sizes (rhs0/rhs1 or dout0/dout1 -> out0/out1) in one launch
//       of 2G problems (grouped_gemm_run.cuh, LaunchOperands).
//
// How one call runs (everything stream-ordered on XLA's stream; group sizes never leave the GPU):
//   1. a setup kernel scans group_sizes; its block 0 writes, for every group, the CUTLASS problem
//      shape, base pointers and strides into the workspace (a u8 output of the call), and all its
//      blocks write zeros to the rows / groups that no GEMM tile covers (grouped_gemm_run.cuh, Zero);
//   2. one CUTLASS pointer-array grouped GEMM (TMA + warp-specialised, persistent) does the math.
//      It is launched with device-only problem shapes, so its grid is the persistent grid
//      (<= #SMs CTAs) and its tile scheduler walks the groups on the device.
//
// Declared command-buffer (CUDA graph) compatible: the workspace is an XLA-owned output rather than
// FFI scratch memory (which XLA frees when the handler returns, and a replayed graph would use).

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"
#include "cuda/grouped_gemm_run.cuh"
#include "xla/ffi/api/ffi.h"

// Exported symbols get default visibility explicitly, so the library also works when built with
// -fvisibility=hidden (declaration before XLA_FFI_DEFINE_HANDLER_SYMBOL's definition).
#define JMF_EXPORT extern "C" __attribute__((visibility("default")))
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmCuda(XLA_FFI_CallFrame* call_frame);
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmWgradCuda(XLA_FFI_CallFrame* call_frame);
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmPairCuda(XLA_FFI_CallFrame* call_frame);
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmWgradPairCuda(XLA_FFI_CallFrame* call_frame);

namespace jax_moe_ffi {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

ffi::Error GroupedGemmImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                           ffi::Buffer<ffi::DataType::S32> group_sizes,
                           ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                           bool transpose_rhs) {
  return RunForwardOrDgrad<false>("grouped_gemm", stream, lhs, rhs, group_sizes, nullptr, out,
                                  workspace, transpose_rhs);
}

// Two products of the same lhs in one launch: out0 = lhs . rhs0, out1 = lhs . rhs1 (rhs1 and out1 of
// rhs0's and out0's shapes and dtypes). One setup, one persistent GEMM over 2G problems, one tail.
ffi::Error GroupedGemmPairImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs0,
                               ffi::AnyBuffer rhs1, ffi::Buffer<ffi::DataType::S32> group_sizes,
                               ffi::Result<ffi::AnyBuffer> out0, ffi::Result<ffi::AnyBuffer> out1,
                               ffi::Result<ffi::AnyBuffer> workspace, bool transpose_rhs) {
  ffi::AnyBuffer second = *out1;
  return RunForwardOrDgrad<false>("grouped_gemm_pair", stream, lhs, rhs0, group_sizes, nullptr, out0,
                                  workspace, transpose_rhs, &rhs1, &second);
}

// dout1 / out1: a pair, out1[g] = lhs_g^T . dout1_g in the same launch.
ffi::Error WgradBody(const char* op, cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer dout,
                     ffi::Buffer<ffi::DataType::S32> group_sizes, ffi::Result<ffi::AnyBuffer> out,
                     ffi::Result<ffi::AnyBuffer> workspace, const ffi::AnyBuffer* dout1 = nullptr,
                     ffi::AnyBuffer* out1 = nullptr) {
  const std::string name(op);
  const Workspace ws{workspace->untyped_data(), workspace->size_bytes()};
  auto ld = lhs.dimensions();
  auto dd = dout.dimensions();
  auto sd = group_sizes.dimensions();
  auto od = out->dimensions();
  if (ld.size() != 2) return invalid(name + ": lhs must be rank 2, got " + dims_str(ld));
  if (dd.size() != 2 || dd[0] != ld[0]) {
    return invalid(name + ": dout must be [M,N] with M = lhs.shape[0], got lhs " +
                   dims_str(ld) + " and dout " + dims_str(dd));
  }
  if (sd.size() != 1) {
    return invalid(name + ": group_sizes must be rank 1 [G], got " + dims_str(sd));
  }
  const int64_t m = ld[0], k = ld[1], n = dd[1], g = sd[0];
  if (od.size() != 3 || od[0] != g || od[1] != k || od[2] != n) {
    return invalid(name + ": out must be [G,K,N] = [" + std::to_string(g) + "," +
                   std::to_string(k) + "," + std::to_string(n) + "], got " + dims_str(od));
  }
  JMF_RETURN_IF_ERROR(CheckDtypes(op, "lhs", lhs.element_type(), "dout",
                                  dout.element_type(), out->element_type()));
  if (k % 8 != 0 || n % 8 != 0) {
    return invalid(name + ": K and N must be a multiple of 8 (16-byte aligned rows for"
                   " TMA) on CUDA, got K=" + std::to_string(k) + " N=" + std::to_string(n));
  }
  if (m > kInt32Max || k > kInt32Max || n > kInt32Max || g > kInt32Max) {
    return invalid(name + ": M, K, N and G must each be < 2^31 on CUDA, got M=" +
                   std::to_string(m) + " K=" + std::to_string(k) + " N=" + std::to_string(n) +
                   " G=" + std::to_string(g));
  }
  const bool pair = dout1 != nullptr;
  if (pair) {
    if (dout1->element_type() != dout.element_type() || dims_str(dout1->dimensions()) != dims_str(dd)) {
      return invalid(name + ": dout1 must have dout0's shape and dtype, got " + dims_str(dd) + " and " +
                     dims_str(dout1->dimensions()));
    }
    if (out1->element_type() != out->element_type() || dims_str(out1->dimensions()) != dims_str(od)) {
      return invalid(name + ": out1 must have out0's shape and dtype");
    }
    if (2 * g > kInt32Max) return invalid(name + ": 2G problems must be < 2^31, got G=" + std::to_string(g));
  }
  if (g == 0 || k == 0 || n == 0) return ffi::Error::Success();  // empty output
  if (m == 0) {
    // Every group is empty: out is all zeros.
    JMF_CUDA_CHECK(cudaMemsetAsync(out->untyped_data(), 0, out->size_bytes(), stream));
    if (pair) JMF_CUDA_CHECK(cudaMemsetAsync(out1->untyped_data(), 0, out1->size_bytes(), stream));
    return ffi::Error::Success();
  }
  if (!Aligned16(lhs.untyped_data()) || !Aligned16(dout.untyped_data()) ||
      !Aligned16(out->untyped_data()) ||
      (pair && (!Aligned16(dout1->untyped_data()) || !Aligned16(out1->untyped_data())))) {
    return invalid(name + ": lhs, dout and out must be 16-byte aligned on CUDA");
  }
  DeviceInfo dev;
  JMF_RETURN_IF_ERROR(GetDeviceInfo(&dev));
  GemmCall c;
  c.op = Op::kWgrad;
  c.a = lhs.untyped_data();
  c.b = dout.untyped_data();
  c.d = out->untyped_data();
  if (pair) {
    c.b2 = dout1->untyped_data();
    c.d2 = out1->untyped_data();
  }
  c.out_elem_bytes = ffi::ByteWidth(out->element_type());
  c.sizes = group_sizes.typed_data();
  c.m = m;
  c.k = k;
  c.n = n;
  c.g = g;
  return DispatchTypes<false>(lhs.element_type(), out->element_type(), stream, ws, c, dev);
}

ffi::Error GroupedGemmWgradImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer dout,
                                ffi::Buffer<ffi::DataType::S32> group_sizes,
                                ffi::Result<ffi::AnyBuffer> out,
                                ffi::Result<ffi::AnyBuffer> workspace) {
  return WgradBody("grouped_gemm_wgrad", stream, lhs, dout, group_sizes, out, workspace);
}

ffi::Error GroupedGemmWgradPairImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer dout0,
                                    ffi::AnyBuffer dout1, ffi::Buffer<ffi::DataType::S32> group_sizes,
                                    ffi::Result<ffi::AnyBuffer> out0, ffi::Result<ffi::AnyBuffer> out1,
                                    ffi::Result<ffi::AnyBuffer> workspace) {
  ffi::AnyBuffer second = *out1;
  return WgradBody("grouped_gemm_wgrad_pair", stream, lhs, dout0, group_sizes, out0, workspace, &dout1,
                   &second);
}

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi

// Command-buffer compatible: only stream-ordered work, no host sync, and all device memory
// (including the workspace) is owned by XLA, so a CUDA-graph replay sees valid pointers.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmCuda, jax_moe_ffi::cuda::GroupedGemmImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                      // lhs
                                  .Arg<xla::ffi::AnyBuffer>()                      // rhs
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>()                      // out
                                  .Ret<xla::ffi::AnyBuffer>()                      // workspace (u8)
                                  .Attr<bool>("transpose_rhs"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmWgradCuda,
                              jax_moe_ffi::cuda::GroupedGemmWgradImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                      // lhs
                                  .Arg<xla::ffi::AnyBuffer>()                      // dout
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>()                      // out
                                  .Ret<xla::ffi::AnyBuffer>(),                     // workspace (u8)
                              {xla::ffi::Traits::kCmdBufferCompatible});


XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmPairCuda, jax_moe_ffi::cuda::GroupedGemmPairImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                      // lhs
                                  .Arg<xla::ffi::AnyBuffer>()                      // rhs0
                                  .Arg<xla::ffi::AnyBuffer>()                      // rhs1
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>()                      // out0
                                  .Ret<xla::ffi::AnyBuffer>()                      // out1
                                  .Ret<xla::ffi::AnyBuffer>()                      // workspace (u8)
                                  .Attr<bool>("transpose_rhs"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmWgradPairCuda,
                              jax_moe_ffi::cuda::GroupedGemmWgradPairImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                      // lhs
                                  .Arg<xla::ffi::AnyBuffer>()                      // dout0
                                  .Arg<xla::ffi::AnyBuffer>()                      // dout1
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>()                      // out0
                                  .Ret<xla::ffi::AnyBuffer>()                      // out1
                                  .Ret<xla::ffi::AnyBuffer>(),                     // workspace (u8)
                              {xla::ffi::Traits::kCmdBufferCompatible});
