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

// ---------------------------------------------------------------- quantize_groups_t (FP8 wgrad operands)
// jax_moe_ffi_quantize_groups_t: x [M, C] with group_sizes [G] (the package's rule: negative sizes count as
// 0, groups back to back from row 0, clipped to M) -> the codes transposed and each group's rows padded to
// whole 128-row blocks, so that 1 x 128 blocks along the rows (tokens) never straddle two groups:
//   data_t [C, P] fp8, P = 128 * (ceil(M / 128) + G) (enough for any sizes);
//   scale  [P / 128, C] f32 (block-major: one row of C scales per 128-token block);
//   plan   [2, G + 1] s32: plan[0] the clipped row offsets (group g is rows plan[0][g] .. plan[0][g + 1]),
//          plan[1] the block offsets (group g is blocks plan[1][g] .. plan[1][g + 1] of data_t's columns).
// Padding rows are +0 codes; blocks past plan[1][G] are all-zero blocks (codes 0, scale 1), as quantize
// writes for an all-zero block.
inline int64_t groups_t_padded_rows(int64_t m, int64_t g) { return 128 * ((m + 127) / 128 + g); }

// The plan of one call (sequential: G is small; the CUDA handler runs it in one thread).
JMF_HD void groups_t_plan(const int32_t* sizes, int64_t g, int64_t m, int32_t* row_offsets,
                          int32_t* block_offsets) {
  int64_t row = 0, block = 0;
  row_offsets[0] = 0;
  block_offsets[0] = 0;
  for (int64_t i = 0; i < g; ++i) {
    const GroupRows r = clip_group(row, sizes[i], m);
    row = r.end;
    block += (r.end - r.begin + 127) / 128;
    row_offsets[i + 1] = static_cast<int32_t>(row);
    block_offsets[i + 1] = static_cast<int32_t>(block);
  }
}

struct GroupsTView {
  int64_t m = 0, c = 0, g = 0, p = 0;
};

inline ffi::Error check_quantize_groups_t_call(const ffi::AnyBuffer& x, ffi::AnyBuffer::Dimensions sizes_d,
                                               const ffi::AnyBuffer& data_t, ffi::AnyBuffer::Dimensions sd,
                                               ffi::AnyBuffer::Dimensions pd, GroupsTView* v) {
  const char* op = "quantize_groups_t";
  const ffi::DataType t = x.element_type();
  if (t != ffi::DataType::F32 && t != ffi::DataType::BF16 && t != ffi::DataType::F16)
    return invalid(std::string(op) + ": x must be float32/bfloat16/float16");
  if (data_t.element_type() != ffi::DataType::F8E4M3FN && data_t.element_type() != ffi::DataType::F8E5M2)
    return invalid(std::string(op) + ": data_t must be float8_e4m3fn or float8_e5m2");
  const auto xd = x.dimensions(), td = data_t.dimensions();
  if (xd.size() != 2) return invalid(std::string(op) + ": x must be [M, C], got " + dims_str(xd));
  if (sizes_d.size() != 1) return invalid(std::string(op) + ": group_sizes must be [G], got " + dims_str(sizes_d));
  v->m = xd[0];
  v->c = xd[1];
  v->g = sizes_d[0];
  v->p = groups_t_padded_rows(v->m, v->g);
  if (v->m >= (int64_t{1} << 31) - 128 * (v->g + 1))
    return invalid(std::string(op) + ": M (plus 128 rows of padding per group) must be < 2^31, got M=" +
                   std::to_string(v->m));
  const bool ok = td.size() == 2 && td[0] == v->c && td[1] == v->p && sd.size() == 2 && sd[0] == v->p / 128 &&
                  sd[1] == v->c && pd.size() == 2 && pd[0] == 2 && pd[1] == v->g + 1;
  if (!ok)
    return invalid(std::string(op) + ": x " + dims_str(xd) + " with " + std::to_string(v->g) +
                   " groups needs data_t [" + std::to_string(v->c) + "," + std::to_string(v->p) + "], scale [" +
                   std::to_string(v->p / 128) + "," + std::to_string(v->c) + "] and plan [2," +
                   std::to_string(v->g + 1) + "], got " + dims_str(td) + ", " + dims_str(sd) + ", " + dims_str(pd));
  return ffi::Error::Success();
}

}  // namespace jax_moe_ffi
