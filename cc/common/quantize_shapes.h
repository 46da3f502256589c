// Argument rules of the FP8 quantize targets (dtypes, block sizes, shapes), shared by the CPU and CUDA
// handlers so they cannot disagree (header-only, no Python).
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

// Everything a quantize call is checked for. block_rows x block_cols: 1 x 32 (MXFP8), 1 x 128 or 128 x 128
// (blockwise); colwise: 1 x B blocks along R instead of C. Fills the view of x.
inline ffi::Error check_quantize_call(const char* op, const ffi::AnyBuffer& x, ffi::DataType data_type,
                                      ffi::AnyBuffer::Dimensions dd, ffi::AnyBuffer::Dimensions sd,
                                      int64_t block_rows, int64_t block_cols, bool colwise, QuantizeView* view) {
  const ffi::DataType t = x.element_type();
  if (t != ffi::DataType::F32 && t != ffi::DataType::BF16 && t != ffi::DataType::F16)
    return invalid(std::string(op) + ": x must be float32/bfloat16/float16");
  if (data_type != ffi::DataType::F8E4M3FN && data_type != ffi::DataType::F8E5M2)
    return invalid(std::string(op) + ": data must be float8_e4m3fn or float8_e5m2");
  const bool tiles = block_rows > 1;
  if (tiles && colwise)
    return invalid(std::string(op) + ": colwise applies to 1x" + std::to_string(block_cols) +
                   " blocks, not tiles");
  return check_quantize_shapes(op, x.dimensions(), dd, sd, block_cols, colwise, tiles, view);
}

// jax_moe_ffi_quantize_tiles_t: x [..., R, C] in 128 x 128 tiles; data_t [..., C, R] (the codes transposed)
// and data either x's shape or shape (0,) (not wanted), both of one FP8 type; scale [..., ceil(R/128),
// ceil(C/128)] (the tiles of x, not of the transpose). Fills the view of x.
inline ffi::Error check_quantize_tiles_t_call(const ffi::AnyBuffer& x, const ffi::AnyBuffer& data,
                                              const ffi::AnyBuffer& data_t, ffi::AnyBuffer::Dimensions sd,
                                              QuantizeView* view) {
  const char* op = "quantize_tiles_t";
  if (auto e = check_quantize_call(op, x, data_t.element_type(), x.dimensions(), sd, 128, 128, false, view);
      e.failure())
    return e;
  const auto xd = x.dimensions(), td = data_t.dimensions(), dd = data.dimensions();
  const size_t rank = xd.size();
  bool ok = td.size() == rank && td[rank - 1] == xd[rank - 2] && td[rank - 2] == xd[rank - 1];
  for (size_t i = 0; ok && i + 2 < rank; ++i) ok = td[i] == xd[i];
  if (!ok)
    return invalid(std::string(op) + ": data_t must be x " + dims_str(xd) +
                   " with its last two axes swapped, got " + dims_str(td));
  const bool plain = !(dd.size() == 1 && dd[0] == 0);  // shape (0,): not wanted (x has rank >= 2)
  bool same = dd.size() == rank;
  for (size_t i = 0; same && i < rank; ++i) same = dd[i] == xd[i];
  if ((plain && !same) || data.element_type() != data_t.element_type())
    return invalid(std::string(op) + ": data must have x's shape " + dims_str(xd) +
                   " (or no elements) and data_t's dtype, got " + dims_str(dd));
  return ffi::Error::Success();
}

}  // namespace jax_moe_ffi
