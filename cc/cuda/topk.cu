// CUDA top-k over the last axis of narrow rows (N <= 1024), exported as an XLA typed-FFI handler:
//
//   JaxMoeFfiTopKCuda -> target "jax_moe_ffi_top_k"
//       x [R, N] f32 -> values [R, k] f32, indices [R, k] s32; attr k (1..32, <= N)
//
// Why: XLA:GPU sorts every row of a narrow top-k (its own top-k kernel starts at 1,024 elements a row): 29 us
// for a [8192, 128] router with k = 8 on the H200. Here one warp owns a row: lane l holds elements l, l+32, ...
// in registers (coalesced loads), sorted per lane, and each of the k rounds is two warp reductions in the order
// of common/topk_order.h (lax.top_k's); the winning lane writes the value and index.
// (First version: a per-lane scan and a 5-step shuffle argmax per round, 17 us at [8192, 128], k = 8.)
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"
#include "common/topk_order.h"
#include "xla/ffi/api/ffi.h"

#define JMF_EXPORT extern "C" __attribute__((visibility("default")))
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiTopKCuda(XLA_FFI_CallFrame* call_frame);

namespace jax_moe_ffi {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// kPerLane: elements per lane (N <= 32 * kPerLane). Each lane sorts its elements once (unrolled compare-swaps,
// registers only); each round is then two warp reductions over the lanes' heads -- the largest key
// (__reduce_max_sync), then the lowest index holding it (__reduce_min_sync) -- and the winning lane pops its
// head. Keys are TotalOrderKey as unsigned (the bits are recovered from them: the map is an involution).
template <int kPerLane>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    TopKRowsKernel(const uint32_t* __restrict__ x, int64_t rows, int n, int k, uint32_t* __restrict__ values,
                   int32_t* __restrict__ indices) {
  constexpr uint32_t kNone = 0xffffffffu;  // index of an exhausted slot: loses every index comparison
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps only
  const uint32_t* xr = x + row * n;
  uint32_t key[kPerLane];  // TotalOrderKey ^ 0x80000000: the top-k order as unsigned (larger first)
  uint32_t idx[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int j = lane + 32 * i;
    const bool in = j < n;
    key[i] = in ? static_cast<uint32_t>(topk::TotalOrderKey(xr[j])) ^ 0x80000000u : 0u;
    idx[i] = in ? static_cast<uint32_t>(j) : kNone;
  }
  // sort the lane's elements: larger key first, equal keys by lower index (exhausted slots last)
#pragma unroll
  for (int a = 0; a < kPerLane; ++a) {
#pragma unroll
    for (int b = kPerLane - 1; b > a; --b) {
      const bool swap = key[b] > key[b - 1] || (key[b] == key[b - 1] && idx[b] < idx[b - 1]);
      const uint32_t kb = key[b], ib = idx[b];
      key[b] = swap ? key[b - 1] : kb;
      idx[b] = swap ? idx[b - 1] : ib;
      key[b - 1] = swap ? kb : key[b - 1];
      idx[b - 1] = swap ? ib : idx[b - 1];
    }
  }
  for (int r = 0; r < k; ++r) {
    const uint32_t best_key = __reduce_max_sync(0xffffffffu, key[0]);
    const uint32_t best_idx = __reduce_min_sync(0xffffffffu, key[0] == best_key ? idx[0] : kNone);
    if (idx[0] == best_idx) {  // one lane (indices are distinct; k <= n keeps a real element in the race)
      const int32_t ordered = static_cast<int32_t>(best_key ^ 0x80000000u);
      values[row * k + r] = static_cast<uint32_t>(topk::TotalOrderKey(static_cast<uint32_t>(ordered)));
      indices[row * k + r] = static_cast<int32_t>(best_idx);
#pragma unroll
      for (int i = 0; i + 1 < kPerLane; ++i) {
        key[i] = key[i + 1];
        idx[i] = idx[i + 1];
      }
      key[kPerLane - 1] = 0u;
      idx[kPerLane - 1] = kNone;
    }
  }
}

template <int kPerLane>
void Launch(cudaStream_t stream, const void* x, int64_t rows, int n, int k, void* values, int32_t* indices) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  TopKRowsKernel<kPerLane><<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(
      static_cast<const uint32_t*>(x), rows, n, k, static_cast<uint32_t*>(values), indices);
}

void LaunchForWidth(cudaStream_t stream, const void* x, int64_t rows, int n, int k, void* values,
                    int32_t* indices) {
  if (n <= 32) return Launch<1>(stream, x, rows, n, k, values, indices);
  if (n <= 64) return Launch<2>(stream, x, rows, n, k, values, indices);
  if (n <= 128) return Launch<4>(stream, x, rows, n, k, values, indices);
  if (n <= 256) return Launch<8>(stream, x, rows, n, k, values, indices);
  if (n <= 512) return Launch<16>(stream, x, rows, n, k, values, indices);
  return Launch<32>(stream, x, rows, n, k, values, indices);
}

ffi::Error TopKImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                    ffi::Result<ffi::Buffer<ffi::DataType::S32>> indices, int64_t k) {
  const std::string name = "top_k";
  const ffi::DataType t = x.element_type();
  // float32 only (ops/topk.py: XLA:GPU orders 16-bit ties its own way)
  if (t != ffi::DataType::F32) return invalid(name + ": x must be float32");
  auto xd = x.dimensions();
  if (xd.size() != 2) return invalid(name + ": x must be rank 2 [R, N], got " + dims_str(xd));
  const int64_t rows = xd[0], n = xd[1];
  if (n > 1024) return invalid(name + ": rows of at most 1024 elements on CUDA, got N=" + std::to_string(n));
  if (k < 1 || k > n || k > 32) {
    return invalid(name + ": k must be in [1, min(32, N = " + std::to_string(n) + ")], got " + std::to_string(k));
  }
  auto vd = values->dimensions();
  auto id = indices->dimensions();
  if (vd.size() != 2 || vd[0] != rows || vd[1] != k || values->element_type() != t || id.size() != 2 ||
      id[0] != rows || id[1] != k) {
    return invalid(name + ": values / indices must be [R, k] = [" + std::to_string(rows) + "," + std::to_string(k) +
                   "] (values in x's dtype)");
  }
  if (rows == 0) return ffi::Error::Success();
  if ((rows + kWarpsPerBlock - 1) / kWarpsPerBlock > 0x7fffffff) {
    return invalid(name + ": too many rows for one launch: " + std::to_string(rows));
  }
  const int ni = static_cast<int>(n), ki = static_cast<int>(k);
  LaunchForWidth(stream, x.untyped_data(), rows, ni, ki, values->untyped_data(), indices->typed_data());
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("jax_moe_ffi: CUDA error in the top_k launch: ") +
                                                     cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi

// Command-buffer compatible: one kernel, stream-ordered, no host sync.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiTopKCuda, jax_moe_ffi::cuda::TopKImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                       // x [R, N]
                                  .Ret<xla::ffi::AnyBuffer>()                       // values [R, k]
                                  .Ret<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // indices [R, k]
                                  .Attr<int64_t>("k"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
