// CPU token dispatch / combine as typed XLA FFI handlers: the reference implementation of the op
// family and what CI runs. Index rules live in common/dispatch_plan.h (shared with CUDA).
//
//   jax_moe_ffi_dispatch_plan : expert_ids[T,k], keep[T,k]|[0] -> pos, row_pair, counts, group_sizes, workspace
//   jax_moe_ffi_dispatch      : x[T,D], pos[T,k], row_pair[R], scale[P]|[0] -> rows[R,D]   (rows[r] = scale[p] * x[p / k])
//   jax_moe_ffi_combine       : rows[R,D], pos[T,k], weights[T,k]  -> y[T,D]      (f32 accumulation)
//   jax_moe_ffi_combine_bwd   : dy[T,D], rows[R,D], row_pair[R], weights[T,k] -> drows[R,D], dweights[T,k]
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dispatch_plan.h"
#include "common/dtypes.h"
#include "common/ffi_helpers.h"

namespace jax_moe_ffi {
namespace {

bool is_float_type(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

size_t width_of(ffi::DataType t) { return t == ffi::DataType::F32 ? 4 : 2; }

// Reads row `row` (n elements) of a float-like buffer into float32.
void load_row(ffi::DataType type, const void* data, int64_t row, int64_t n, float* dst) {
  switch (type) {
    case ffi::DataType::F32:
      std::memcpy(dst, static_cast<const float*>(data) + row * n, n * sizeof(float));
      break;
    case ffi::DataType::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
      break;
    }
    default: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
    }
  }
}

// Writes n float32 values to row `row`, rounding to nearest even.
void store_row(ffi::DataType type, void* data, int64_t row, int64_t n, const float* src) {
  switch (type) {
    case ffi::DataType::F32:
      std::memcpy(static_cast<float*>(data) + row * n, src, n * sizeof(float));
      break;
    case ffi::DataType::BF16: {
      uint16_t* dst = static_cast<uint16_t*>(data) + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
      break;
    }
    default: {
      uint16_t* dst = static_cast<uint16_t*>(data) + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
    }
  }
}

// ------------------------------------------------------------------------------------------ plan
ffi::Error DispatchPlanCpu(ffi::Buffer<ffi::S32> expert_ids, ffi::Buffer<ffi::PRED> keep,
                           ffi::Result<ffi::Buffer<ffi::S32>> pos,
                           ffi::Result<ffi::Buffer<ffi::S32>> row_pair,
                           ffi::Result<ffi::Buffer<ffi::S32>> counts,
                           ffi::Result<ffi::Buffer<ffi::S32>> group_sizes,
                           ffi::Result<ffi::Buffer<ffi::S32>> workspace, int64_t capacity,
                           int64_t align, int64_t chunk) {
  PlanDims d;
  if (auto err = plan_dims(expert_ids, keep, pos->dimensions(), row_pair->dimensions(),
                           counts->dimensions(), group_sizes->dimensions(), align, chunk, &d);
      err.failure())
    return err;
  const int32_t* ids = expert_ids.typed_data();
  const bool* kp = d.has_keep ? keep.typed_data() : nullptr;
  int32_t* pos_out = pos->typed_data();
  int32_t* rp = row_pair->typed_data();
  int32_t* cnt = counts->typed_data();
  int32_t* gs = group_sizes->typed_data();

  // Pass 1: running count (rank) of each kept-candidate pair within its expert, in flat order.
  std::vector<int64_t> seen(d.e, 0);
  for (int64_t p = 0; p < d.p; ++p) {
    int32_t e = ids[p];
    bool ok = e >= 0 && e < d.e && (kp == nullptr || kp[p]);
    if (!ok) {
      pos_out[p] = -1;
      continue;
    }
    int64_t rank = seen[e]++;
    pos_out[p] = (capacity >= 0 && rank >= capacity) ? -1 : static_cast<int32_t>(rank);
  }
  // Pass 2: kept counts, padded sizes, group offsets.
  std::vector<int64_t> offset(d.e);
  int64_t total = 0;
  for (int64_t e = 0; e < d.e; ++e) {
    int64_t c = capacity >= 0 ? std::min(seen[e], capacity) : seen[e];
    int64_t padded = round_up(c, align);
    cnt[e] = static_cast<int32_t>(c);
    gs[e] = static_cast<int32_t>(padded);
    offset[e] = total;
    total += padded;
  }
  if (total > d.r)
    return invalid("dispatch_plan: padded total " + std::to_string(total) + " exceeds the " +
                   std::to_string(d.r) + " rows of the output (the caller's row bound is wrong)");
  // Pass 3: rows of kept pairs; every other row is padding (-1).
  std::fill(rp, rp + d.r, -1);
  for (int64_t p = 0; p < d.p; ++p) {
    if (pos_out[p] < 0) continue;
    int64_t row = offset[ids[p]] + pos_out[p];
    if (row >= d.r) return invalid("dispatch_plan: internal error, row out of range");  // never OOB
    pos_out[p] = static_cast<int32_t>(row);
    rp[row] = static_cast<int32_t>(p);
  }
  // The workspace is the CUDA path's scratch (an output so the call stays graph-capturable).
  int64_t w = 1;
  for (auto v : workspace->dimensions()) w *= v;
  std::memset(workspace->typed_data(), 0, w * sizeof(int32_t));
  return ffi::Error::Success();
}

// -------------------------------------------------------------------------------------- dispatch
// Rows are copied verbatim (unscaled) or as round(scale[p] * x) (the backward of combine).
// FP8 seam: fused quantisation of the dispatched rows (issue: FP8) will add a `quant` attribute and
// data/scale results; the store below is where a row would be quantised instead of copied.
ffi::Error DispatchCpu(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> pos, ffi::Buffer<ffi::S32> row_pair,
                       ffi::Buffer<ffi::F32> scale, ffi::Result<ffi::AnyBuffer> rows, int64_t top_k) {
  RowsDims d;
  if (auto err = rows_dims("dispatch", x.dimensions(), "x", rows->dimensions(), "rows", top_k, &d);
      err.failure())
    return err;
  if (auto err = dispatch_index_dims(pos.dimensions(), row_pair.dimensions(), scale.element_count(), d);
      err.failure())
    return err;
  const int64_t scale_n = static_cast<int64_t>(scale.element_count());
  if (!is_float_type(x.element_type()) || rows->element_type() != x.element_type())
    return invalid("dispatch: x must be float32/bfloat16/float16 and rows of the same dtype");

  const ffi::DataType type = x.element_type();
  const size_t row_bytes = width_of(type) * d.d;
  const char* src = static_cast<const char*>(x.untyped_data());
  char* dst = static_cast<char*>(rows->untyped_data());
  const int32_t* rp = row_pair.typed_data();
  const int32_t* ps = pos.typed_data();
  const float* sc = scale.typed_data();
  std::vector<float> buf(scale_n ? d.d : 0);
  for (int64_t r = 0; r < d.r; ++r) {
    const int32_t p = rp[r];
    // Row r holds pair p only when pos agrees (a plan always makes them agree; a hand-made routing that
    // does not gets zeros, as on CUDA, where the gather is token-major and reads pos).
    if (p < 0 || p >= d.p || ps[p] != r) {
      std::memset(dst + r * row_bytes, 0, row_bytes);
      continue;
    }
    const int64_t t = p / d.k;
    if (scale_n == 0) {
      std::memcpy(dst + r * row_bytes, src + t * row_bytes, row_bytes);
    } else {
      load_row(type, src, t, d.d, buf.data());
      const float s = sc[p];
      for (int64_t i = 0; i < d.d; ++i) buf[i] *= s;
      store_row(type, dst, r, d.d, buf.data());
    }
  }
  return ffi::Error::Success();
}

// --------------------------------------------------------------------------------------- combine
// y[t] = sum_j w[t,j] * rows[pos[t,j]] over the kept pairs, in j order, float32 accumulation.
ffi::Error CombineCpu(ffi::AnyBuffer rows, ffi::Buffer<ffi::S32> pos, ffi::Buffer<ffi::F32> weights,
                      ffi::Result<ffi::AnyBuffer> y) {
  auto pd = pos.dimensions();
  if (pd.size() != 2) return invalid("combine: pos must be rank 2 [T,k], got " + dims_str(pd));
  if (!same_dims(weights.dimensions(), pd))
    return invalid("combine: weights must be [T,k] = " + dims_str(pd) + ", got " + dims_str(weights.dimensions()));
  RowsDims d;
  if (auto err = rows_dims("combine", y->dimensions(), "output", rows.dimensions(), "rows", pd[1], &d);
      err.failure())
    return err;
  if (d.t != pd[0]) return invalid("combine: output must have T = pos.shape[0] rows");
  if (!is_float_type(rows.element_type()) || y->element_type() != rows.element_type())
    return invalid("combine: rows must be float32/bfloat16/float16 and the output of the same dtype");

  const ffi::DataType type = rows.element_type();
  const int32_t* ps = pos.typed_data();
  const float* w = weights.typed_data();
  std::vector<float> acc(d.d), row(d.d);
  for (int64_t t = 0; t < d.t; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t r = ps[t * d.k + j];
      if (r < 0 || r >= d.r) continue;  // dropped pair
      load_row(type, rows.untyped_data(), r, d.d, row.data());
      const float wj = w[t * d.k + j];
      for (int64_t i = 0; i < d.d; ++i) acc[i] += wj * row[i];
    }
    store_row(type, y->untyped_data(), t, d.d, acc.data());
  }
  return ffi::Error::Success();
}

// drows[r] = round(w[p] * dy[p / k]) for the row of each kept pair p (0 for padding rows);
// dweights[p] = <dy[p / k], rows[r]> in float32 (0 for dropped pairs).
ffi::Error CombineBwdCpu(ffi::AnyBuffer dy, ffi::AnyBuffer rows, ffi::Buffer<ffi::S32> row_pair,
                         ffi::Buffer<ffi::F32> weights, ffi::Result<ffi::AnyBuffer> drows,
                         ffi::Result<ffi::Buffer<ffi::F32>> dweights) {
  RowsDims d;
  if (auto err = combine_bwd_dims(dy.dimensions(), rows.dimensions(), row_pair.dimensions(),
                                  weights.dimensions(), drows->dimensions(), dweights->dimensions(), &d);
      err.failure())
    return err;
  const ffi::DataType type = rows.element_type();
  if (!is_float_type(type) || dy.element_type() != type || drows->element_type() != type)
    return invalid("combine_bwd: dy, rows and drows must share one float dtype");

  const int32_t* rp = row_pair.typed_data();
  const float* w = weights.typed_data();
  float* dw = dweights->typed_data();
  std::fill(dw, dw + d.p, 0.0f);
  std::vector<float> g(d.d), row(d.d), out(d.d);
  for (int64_t r = 0; r < d.r; ++r) {
    const int32_t p = rp[r];
    if (p < 0 || p >= d.p) {
      std::memset(static_cast<char*>(drows->untyped_data()) + r * d.d * width_of(type), 0,
                  d.d * width_of(type));
      continue;
    }
    load_row(type, dy.untyped_data(), p / d.k, d.d, g.data());
    load_row(type, rows.untyped_data(), r, d.d, row.data());
    const float wp = w[p];
    float dot = 0.0f;
    for (int64_t i = 0; i < d.d; ++i) {
      out[i] = wp * g[i];
      dot += g[i] * row[i];
    }
    store_row(type, drows->untyped_data(), r, d.d, out.data());
    dw[p] = dot;
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiDispatchPlanCpu, jax_moe_ffi::DispatchPlanCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // expert_ids [T,k]
                                  .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()  // keep [T,k] or [0]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // pos [T,k]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // row_pair [R]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // counts [E]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // group_sizes [E]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // workspace [W]
                                  .Attr<int64_t>("capacity")                // -1: none
                                  .Attr<int64_t>("align")
                                  .Attr<int64_t>("chunk"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiDispatchCpu, jax_moe_ffi::DispatchCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [T,D]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // pos [T,k]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // row_pair [R]
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   // scale [T,k] or [0]
                                  .Ret<xla::ffi::AnyBuffer>()               // rows [R,D]
                                  .Attr<int64_t>("top_k"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiCombineCpu, jax_moe_ffi::CombineCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // rows [R,D]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // pos [T,k]
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   // weights [T,k]
                                  .Ret<xla::ffi::AnyBuffer>());             // y [T,D]

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiCombineBwdCpu, jax_moe_ffi::CombineBwdCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // dy [T,D]
                                  .Arg<xla::ffi::AnyBuffer>()               // rows [R,D]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // row_pair [R]
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   // weights [T,k]
                                  .Ret<xla::ffi::AnyBuffer>()               // drows [R,D]
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()); // dweights [T,k]
