// The order of jax.lax.top_k, shared by cpu/topk.cc and cuda/topk.cu: descending in the float total order
// (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN), equal values by lower index.
#pragma once

#include <cstdint>

#include "common/ffi_helpers.h"  // JMF_HD

namespace jax_moe_ffi {
namespace topk {

// A signed integer with the float total order of the bit pattern `bits` (a float32, or a 16-bit float in the
// high half): negative values have their magnitude bits flipped, so larger magnitudes sort lower.
JMF_HD int32_t TotalOrderKey(uint32_t bits) {
  const int32_t b = static_cast<int32_t>(bits);
  return b ^ static_cast<int32_t>((static_cast<uint32_t>(b >> 31)) >> 1);
}

// Whether (key_a, index_a) comes before (key_b, index_b) in top-k order.
JMF_HD bool Before(int32_t key_a, int64_t index_a, int32_t key_b, int64_t index_b) {
  return key_a > key_b || (key_a == key_b && index_a < index_b);
}

}  // namespace topk
}  // namespace jax_moe_ffi
