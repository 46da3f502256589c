// CPU top-k over the last axis as a typed XLA FFI handler (semantics: jax_moe_ffi/ops/topk.py):
//
//   jax_moe_ffi_top_k : x [R, N] f32 -> values [R, k] f32, indices [R, k] s32; attr k.
//
// Order of jax.lax.top_k: descending in the float total order, equal values by lower index. The total order
// is an integer order on the bits (TotalOrderKey), so the comparison is exact and NaNs sort like XLA's.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/ffi_helpers.h"
#include "common/topk_order.h"
#include "common/topk_shapes.h"

namespace jax_moe_ffi {
namespace {

uint32_t OrderBits(const void* base, int64_t i) {
  uint32_t b;
  std::memcpy(&b, static_cast<const char*>(base) + 4 * i, 4);
  return b;
}

ffi::Error TopKCpu(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                   ffi::Result<ffi::Buffer<ffi::DataType::S32>> indices, int64_t k) {
  int64_t rows = 0, n = 0;
  ffi::Error err = check_topk_shapes(x, *values, indices->dimensions(), k, INT64_MAX, INT64_MAX, &rows, &n);
  if (err.failure()) return err;
  std::vector<int64_t> order(n);
  std::vector<int32_t> keys(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      keys[j] = topk::TotalOrderKey(OrderBits(x.untyped_data(), r * n + j));
      order[j] = j;
    }
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return topk::Before(keys[a], a, keys[b], b);
    });
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(static_cast<char*>(values->untyped_data()) + (r * k + j) * 4,
                  static_cast<const char*>(x.untyped_data()) + (r * n + order[j]) * 4, 4);
      indices->typed_data()[r * k + j] = static_cast<int32_t>(order[j]);
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiTopKCpu, jax_moe_ffi::TopKCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()                       // x [R, N]
                                  .Ret<xla::ffi::AnyBuffer>()                       // values [R, k]
                                  .Ret<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // indices [R, k]
                                  .Attr<int64_t>("k"));
