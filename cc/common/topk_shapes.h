// Argument rules of the top_k target, shared by the CPU and CUDA handlers so they cannot disagree.
#pragma once

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"

namespace jax_moe_ffi {

// x [R, N] float32, values [R, k] float32, indices [R, k] s32, 1 <= k <= min(N, max_k), N <= max_n.
inline ffi::Error check_topk_shapes(ffi::AnyBuffer x, ffi::AnyBuffer values, ffi::AnyBuffer::Dimensions id,
                                    int64_t k, int64_t max_n, int64_t max_k, int64_t* rows, int64_t* n) {
  const std::string name = "top_k";
  // float32 only (ops/topk.py: XLA:GPU orders 16-bit ties its own way)
  if (x.element_type() != ffi::DataType::F32) return invalid(name + ": x must be float32");
  auto xd = x.dimensions();
  if (xd.size() != 2) return invalid(name + ": x must be rank 2 [R, N], got " + dims_str(xd));
  *rows = xd[0];
  *n = xd[1];
  if (*n > max_n) {
    return invalid(name + ": rows of at most " + std::to_string(max_n) + " elements here, got N=" + std::to_string(*n));
  }
  if (k < 1 || k > *n || k > max_k) {
    return invalid(name + ": k must be in [1, " + std::to_string(*n < max_k ? *n : max_k) + "] for N = " +
                   std::to_string(*n) + ", got " + std::to_string(k));
  }
  auto vd = values.dimensions();
  if (vd.size() != 2 || vd[0] != *rows || vd[1] != k || values.element_type() != ffi::DataType::F32 ||
      id.size() != 2 || id[0] != *rows || id[1] != k) {
    return invalid(name + ": values / indices must be [R, k] = [" + std::to_string(*rows) + "," + std::to_string(k) +
                   "] (values float32)");
  }
  return ffi::Error::Success();
}

}  // namespace jax_moe_ffi
