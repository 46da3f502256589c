// CUDA (SM90a) sum of two grouped products in one GEMM, exported as an XLA typed-FFI handler:
//
//   JaxMoeFfiGroupedGemmSumCuda -> target "jax_moe_ffi_grouped_gemm_sum"
//       out[rows_g, :] = lhs0[rows_g, :] . rhs0[g]^T + lhs1[rows_g, :] . rhs1[g]^T
//       (rhs [G,N,K], transpose_rhs = true: the dgrad form); rows no group covers are zero.
//
// Why: the lhs gradient of the gate and up projections (dG . Wg^T + dU . Wu^T). One K loop of 2K into one
// float32 accumulator (TwoProductMainloop): no [M, N] read-back of a first product, one epilogue, one
// rounding (benchmarks/NOTES.md, session 11). Its own translation unit: its CUTLASS instantiations compile
// in parallel with the others.

#include <cuda_runtime.h>

#include <string>

#include "common/ffi_helpers.h"
#include "cuda/grouped_gemm_run.cuh"
#include "cuda/two_product_mainloop.cuh"
#include "xla/ffi/api/ffi.h"

#define JMF_EXPORT extern "C" __attribute__((visibility("default")))
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmSumCuda(XLA_FFI_CallFrame* call_frame);

namespace jax_moe_ffi {
namespace cuda {
namespace {

// The dgrad kernel of GroupedGemm (A row-major, B column-major, no C) with the two-product producer.
// kPrebuiltMaps: the two products' four descriptors per group built before the GEMM (group_tensormaps.cuh) instead
// of the mainloop's own per-SM copies rewritten on each group change (experiment builds: JAX_MOE_FFI_SUM_MAPS=prebuilt,
// compiled, not yet measured). The epilogue (no C) takes prebuilt descriptors either way.
template <class TIn, class Config, bool kPrebuiltMaps = false>
struct GroupedGemmTwoProducts {
  using Plain = GroupedGemm<TIn, TIn, RowMajor, ColMajor, Config>;
  using CollectiveEpilogue = typename Plain::CollectiveEpilogue;
  using PerSmMainloop = TwoProductMainloop<typename Plain::BuilderMainloop>;
  using CollectiveMainloop =
      std::conditional_t<kPrebuiltMaps, PrebuiltTensormapMainloop<PerSmMainloop>, PerSmMainloop>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<GroupShape, CollectiveMainloop, CollectiveEpilogue>;
  using ConfigT = Config;
  static constexpr bool kWithAddend = false;
  // Two more TMA descriptors (256 B) than the stage count CUTLASS's builder chose for: still fits.
  static_assert(sizeof(typename Kernel::SharedStorage) <= cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "two-product kernel: shared memory over the SM90 limit");
};

template <class TIn>
ffi::Error RunSum(cudaStream_t stream, const Workspace& ws, const GemmCall& c, const DeviceInfo& dev) {
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  // The CI compile check (never run): one tile config compiles the template; the others differ only in
  // CUTLASS's own tile parameters. Correct for every shape, if slower for some.
  return RunGroupedGemm<GroupedGemmTwoProducts<TIn, CoopConfig<1, 2>>>(stream, ws, c, dev);
#else
  // The plain dgrad's host rule (static shapes only); JAX_MOE_FFI_GEMM_TILES does not apply here.
  switch (AutoTiles(c)) {
    case Tiles::kSmall:
      return RunGroupedGemm<GroupedGemmTwoProducts<TIn, PingpongConfig>>(stream, ws, c, dev);
    case Tiles::kCoopC1x1:
      return RunGroupedGemm<GroupedGemmTwoProducts<TIn, CoopConfig<1, 1>>>(stream, ws, c, dev);
    default:
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
      if (std::string(EnvOr("JAX_MOE_FFI_SUM_MAPS", "persm")) == "prebuilt")  // per call (A/B in one process)
        return RunGroupedGemm<GroupedGemmTwoProducts<TIn, CoopConfig<1, 2>, true>>(stream, ws, c, dev);
#endif
      return RunGroupedGemm<GroupedGemmTwoProducts<TIn, CoopConfig<1, 2>>>(stream, ws, c, dev);
  }
#endif
}

ffi::Error GroupedGemmSumImpl(cudaStream_t stream, ffi::AnyBuffer lhs0, ffi::AnyBuffer rhs0,
                              ffi::AnyBuffer lhs1, ffi::AnyBuffer rhs1,
                              ffi::Buffer<ffi::DataType::S32> group_sizes, ffi::Result<ffi::AnyBuffer> out,
                              ffi::Result<ffi::AnyBuffer> workspace, bool transpose_rhs) {
  const std::string name = "grouped_gemm_sum";
  const Workspace ws{workspace->untyped_data(), workspace->size_bytes()};
  if (!transpose_rhs) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      name + ": CUDA implements the dgrad form only (rhs [G,N,K], transpose_rhs=True)");
  }
  GroupedGemmDims d;
  JMF_RETURN_IF_ERROR(grouped_gemm_dims(lhs0, rhs0, group_sizes, transpose_rhs, &d));
  JMF_RETURN_IF_ERROR(CheckDtypes(name.c_str(), "lhs0", lhs0.element_type(), "rhs0", rhs0.element_type(),
                                  out->element_type()));
  if (out->element_type() != lhs0.element_type()) {
    return invalid(name + ": out dtype must be the input dtype " + DtypeName(lhs0.element_type()) + ", got " +
                   DtypeName(out->element_type()));
  }
  if (lhs1.element_type() != lhs0.element_type() || dims_str(lhs1.dimensions()) != dims_str(lhs0.dimensions())) {
    return invalid(name + ": lhs1 must have lhs0's shape and dtype, got " + dims_str(lhs0.dimensions()) + " " +
                   DtypeName(lhs0.element_type()) + " and " + dims_str(lhs1.dimensions()) + " " +
                   DtypeName(lhs1.element_type()));
  }
  if (rhs1.element_type() != rhs0.element_type() || dims_str(rhs1.dimensions()) != dims_str(rhs0.dimensions())) {
    return invalid(name + ": rhs1 must have rhs0's shape and dtype, got " + dims_str(rhs0.dimensions()) + " " +
                   DtypeName(rhs0.element_type()) + " and " + dims_str(rhs1.dimensions()) + " " +
                   DtypeName(rhs1.element_type()));
  }
  auto od = out->dimensions();
  if (od.size() != 2 || od[0] != d.m || od[1] != d.n) {
    return invalid(name + ": out must be [M,N] = [" + std::to_string(d.m) + "," + std::to_string(d.n) +
                   "], got " + dims_str(od));
  }
  if (d.k % 8 != 0 || d.n % 8 != 0) {
    return invalid(name + ": K and N must be a multiple of 8 (16-byte aligned rows for TMA) on CUDA, got K=" +
                   std::to_string(d.k) + " N=" + std::to_string(d.n));
  }
  // problem K is round_up(K, 128) + K at most: keep it an int
  if (d.m > kInt32Max || 2 * d.k + 128 > kInt32Max || d.n > kInt32Max || d.g > kInt32Max) {
    return invalid(name + ": M, 2K, N and G must each be < 2^31 on CUDA, got M=" + std::to_string(d.m) +
                   " K=" + std::to_string(d.k) + " N=" + std::to_string(d.n) + " G=" + std::to_string(d.g));
  }
  if (d.m == 0 || d.n == 0) return ffi::Error::Success();  // empty output
  if (d.g == 0 || d.k == 0) {
    JMF_CUDA_CHECK(cudaMemsetAsync(out->untyped_data(), 0, out->size_bytes(), stream));
    return ffi::Error::Success();
  }
  if (!Aligned16(lhs0.untyped_data()) || !Aligned16(rhs0.untyped_data()) || !Aligned16(lhs1.untyped_data()) ||
      !Aligned16(rhs1.untyped_data()) || !Aligned16(out->untyped_data())) {
    return invalid(name + ": lhs0, rhs0, lhs1, rhs1 and out must be 16-byte aligned on CUDA");
  }
  DeviceInfo dev;
  JMF_RETURN_IF_ERROR(GetDeviceInfo(&dev));
  GemmCall c;
  c.op = Op::kDgrad;
  c.a = lhs0.untyped_data();
  c.b = rhs0.untyped_data();
  c.a2 = lhs1.untyped_data();
  c.b2 = rhs1.untyped_data();
  c.d = out->untyped_data();
  c.out_elem_bytes = ffi::ByteWidth(out->element_type());
  c.sizes = group_sizes.typed_data();
  c.m = d.m;
  c.k = d.k;
  c.n = d.n;
  c.g = d.g;
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  if (lhs0.element_type() != ffi::DataType::BF16) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_moe_ffi: this CUDA library was built with JAX_MOE_FFI_CUDA_BF16_ONLY (a compile check): "
                      "bf16 grouped GEMMs only; rebuild without it");
  }
  return RunSum<cutlass::bfloat16_t>(stream, ws, c, dev);
#else
  return lhs0.element_type() == ffi::DataType::BF16 ? RunSum<cutlass::bfloat16_t>(stream, ws, c, dev)
                                                    : RunSum<cutlass::half_t>(stream, ws, c, dev);
#endif
}

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi

// Command-buffer compatible: stream-ordered work only, no host sync, all memory XLA-owned.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmSumCuda, jax_moe_ffi::cuda::GroupedGemmSumImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                      // lhs0
                                  .Arg<xla::ffi::AnyBuffer>()                      // rhs0
                                  .Arg<xla::ffi::AnyBuffer>()                      // lhs1
                                  .Arg<xla::ffi::AnyBuffer>()                      // rhs1
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>()                      // out
                                  .Ret<xla::ffi::AnyBuffer>()                      // workspace (u8)
                                  .Attr<bool>("transpose_rhs"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
