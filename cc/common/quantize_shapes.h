// Shape rules of the FP8 quantize targets, shared by the CPU and CUDA handlers (header-only, no Python).
#pragma once

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"

namespace jax_moe_ffi {

// x [..., R, C] seen as [batch, rows, cols] (rank 1: one row).
struct QuantizeView {
  int64_t batch = 1, rows = 1, cols = 0;
};

// Quantised along C (colwise = false) or R (colwise = true) in blocks of `block`, or in 128 x 128 tiles;
// x must have rank >= 2 unless quantised along C in 1 x B blocks. data has x's shape; scale has x's shape
// with the blocked axis (axes, for tiles) divided by the block, rounded up. Fills the view of x.
inline ffi::Error check_quantize_shapes(const char* op, ffi::AnyBuffer::Dimensions xd,
                                        ffi::AnyBuffer::Dimensions dd, ffi::AnyBuffer::Dimensions sd,
                                        int64_t block, bool colwise, bool tiles, QuantizeView* view) {
  const size_t rank = xd.size();
  const bool two_d = colwise || tiles;
  if (rank < (two_d ? 2u : 1u))
    return invalid(std::string(op) + ": x must have rank >= " + (two_d ? "2" : "1") + ", got " + dims_str(xd));
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  bool ok = dd.size() == rank && sd.size() == rank;
  for (size_t i = 0; ok && i < rank; ++i) {
    int64_t want = xd[i];
    if (i + 1 == rank && !colwise) want = cdiv(xd[i], block);
    if (i + 2 == rank && (colwise || tiles)) want = cdiv(xd[i], block);
    ok = dd[i] == xd[i] && sd[i] == want;
  }
  if (!ok)
    return invalid(std::string(op) + ": x " + dims_str(xd) + " quantised in blocks of " + std::to_string(block) +
                   (tiles ? "x128" : colwise ? " along axis -2" : " along axis -1") +
                   " needs data of the same shape and a matching scale, got data " + dims_str(dd) + " and scale " +
                   dims_str(sd));
  view->cols = xd[rank - 1];
  view->rows = rank >= 2 ? xd[rank - 2] : 1;
  view->batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) view->batch *= xd[i];
  return ffi::Error::Success();
}

}  // namespace jax_moe_ffi
