// CUDA top-k over the last axis of narrow rows (N <= 1024), exported as an XLA typed-FFI handler:
//
//   JaxMoeFfiTopKCuda -> target "jax_moe_ffi_top_k"
//       x [R, N] f32 -> values [R, k] f32, indices [R, k] s32; attr k (1..32, <= N)
//
// Why: XLA:GPU sorts every row of a narrow top-k (its own top-k kernel starts at 1,024 elements a row): 29 us
// for a [8192, 128] router with k = 8 on the H200. Here one warp owns a row: lane l holds elements l, l+32, ...
// in registers (coalesced loads), and each of the k rounds is a per-lane scan plus a warp argmax (two redux.sync
// reductions) in the order of common/topk_order.h (lax.top_k's), whose winner's owner writes the value and index.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"
#include "common/topk_order.h"
#include "common/topk_shapes.h"
#include "xla/ffi/api/ffi.h"

#define JMF_EXPORT extern "C" __attribute__((visibility("default")))
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiTopKCuda(XLA_FFI_CallFrame* call_frame);

namespace jax_moe_ffi {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// x, values: float32 bit patterns. kPerLane: elements per lane (N <= 32 * kPerLane).
template <int kPerLane>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    TopKRowsKernel(const uint32_t* __restrict__ x, int64_t rows, int n, int k, uint32_t* __restrict__ values,
                   int32_t* __restrict__ indices) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps only
  const uint32_t* xr = x + row * n;
  uint32_t raw[kPerLane];
  int32_t key[kPerLane];
  uint32_t taken = 0;  // bit i: element lane + 32 i is out (selected, or past the row)
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int j = lane + 32 * i;
    if (j < n) {
      raw[i] = xr[j];
      key[i] = topk::TotalOrderKey(raw[i]);
    } else {
      raw[i] = 0u;
      key[i] = 0;
      taken |= 1u << i;
    }
  }
  for (int r = 0; r < k; ++r) {
    int32_t best_key = 0;
    int best_j = -1;  // -1: this lane has nothing left
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int j = lane + 32 * i;
      if (!(taken >> i & 1u) && (best_j < 0 || topk::Before(key[i], j, best_key, best_j))) {
        best_key = key[i];
        best_j = j;
      }
    }
    // The warp's winner in two warp reductions (redux.sync, one instruction each, where a shuffle tree takes
    // five dependent exchanges of key and index): the largest key, then the lowest index among the lanes
    // holding it. A lane with nothing left offers (INT32_MIN, INT32_MAX): INT32_MIN is also a real key (a
    // -NaN), so only the index tells it apart, and any real element's index wins the second reduction.
    const int32_t offered_key = best_j >= 0 ? best_key : INT32_MIN;
    const int32_t warp_key = __reduce_max_sync(0xffffffffu, offered_key);
    const int32_t offered_j = best_j >= 0 && offered_key == warp_key ? best_j : INT32_MAX;
    best_j = __reduce_min_sync(0xffffffffu, offered_j);
    // every lane now holds the row's r-th element's index (k <= n, so one exists); its owner writes it out
    if ((best_j & 31) == lane) {
      const int i = best_j >> 5;
#pragma unroll
      for (int q = 0; q < kPerLane; ++q) {
        if (q == i) {
          values[row * k + r] = raw[q];
          taken |= 1u << q;
        }
      }
      indices[row * k + r] = best_j;
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
  int64_t rows = 0, n = 0;
  ffi::Error err = check_topk_shapes(x, *values, indices->dimensions(), k, 1024, 32, &rows, &n);
  if (err.failure()) return err;
  if (rows == 0) return ffi::Error::Success();
  if ((rows + kWarpsPerBlock - 1) / kWarpsPerBlock > 0x7fffffff) {
    return invalid("top_k: too many rows for one launch: " + std::to_string(rows));
  }
  const int ni = static_cast<int>(n), ki = static_cast<int>(k);
  LaunchForWidth(stream, x.untyped_data(), rows, ni, ki, values->untyped_data(), indices->typed_data());
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("jax_moe_ffi: CUDA error in the top_k launch: ") +
                                                     cudaGetErrorName(launch) + ": " + cudaGetErrorString(launch));
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
