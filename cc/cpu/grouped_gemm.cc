// CPU grouped GEMM (forward / dgrad form and wgrad) as typed XLA FFI handlers.
//
// The reference implementation of the op family and what CI runs. Each group's weight is unpacked
// once to a float32 panel laid out [K, N] (so the transposed dgrad form costs one panel transpose,
// not a materialised XLA transpose), then rows are processed in blocks of kRowBlock against
// k-blocks of the panel: the inner loop runs along contiguous N and is auto-vectorised.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtypes.h"
#include "common/ffi_helpers.h"

namespace jax_moe_ffi {
namespace {

constexpr int64_t kRowBlock = 4;
constexpr int64_t kKBlock = 256;

// Reads element i of a buffer of float-like dtype as float.
struct FloatReader {
  ffi::DataType type;
  const void* data;
  float operator()(int64_t i) const {
    switch (type) {
      case ffi::DataType::F32: return static_cast<const float*>(data)[i];
      case ffi::DataType::BF16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
      default: return f16_to_float(static_cast<const uint16_t*>(data)[i]);
    }
  }
};

// Writes a contiguous run of float32 values into a buffer of float-like dtype, rounding to nearest even.
void store_row(ffi::DataType type, void* data, int64_t offset, const float* src, int64_t n) {
  switch (type) {
    case ffi::DataType::F32:
      std::memcpy(static_cast<float*>(data) + offset, src, n * sizeof(float));
      break;
    case ffi::DataType::BF16: {
      auto* dst = static_cast<uint16_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
      break;
    }
    default: {
      auto* dst = static_cast<uint16_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
    }
  }
}

void zero_elements(ffi::DataType type, void* data, int64_t offset, int64_t count) {
  size_t width = type == ffi::DataType::F32 ? 4 : 2;
  std::memset(static_cast<char*>(data) + offset * width, 0, count * width);  // +0.0 in every format
}

bool is_float_type(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

ffi::Error check_types(const char* op, ffi::DataType a, const char* a_name, ffi::DataType b,
                       const char* b_name, ffi::DataType out) {
  if (!is_float_type(a) || !is_float_type(b) || !is_float_type(out))
    return invalid(std::string(op) + ": " + a_name + ", " + b_name +
                   " and the output must be float32, bfloat16 or float16");
  if (a != b)
    return invalid(std::string(op) + ": " + a_name + " and " + b_name + " must have the same dtype");
  return ffi::Error::Success();
}

// out[rows, :N] = lhs[rows, :K] . panel[K, N] (+ addend[rows, :N] when given: the accumulate form adds
// it to the float32 product before the one rounding, as the CUDA epilogue does), panel float32 row-major.
void gemm_rows(const FloatReader& lhs, int64_t k, const std::vector<float>& panel, int64_t n,
               int64_t row_begin, int64_t row_end, ffi::DataType out_type, void* out,
               const FloatReader* addend = nullptr) {
  std::vector<float> acc(kRowBlock * n);
  std::vector<float> a(kRowBlock * kKBlock);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowBlock) {
    int64_t rows = std::min(kRowBlock, row_end - r0);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
      int64_t kb = std::min(kKBlock, k - k0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t kk = 0; kk < kb; ++kk) a[r * kKBlock + kk] = lhs((r0 + r) * k + k0 + kk);
      for (int64_t kk = 0; kk < kb; ++kk) {
        const float* b = panel.data() + (k0 + kk) * n;
        for (int64_t r = 0; r < rows; ++r) {
          float av = a[r * kKBlock + kk];
          float* c = acc.data() + r * n;
          for (int64_t j = 0; j < n; ++j) c[j] += av * b[j];
        }
      }
    }
    if (addend != nullptr)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) acc[r * n + j] += (*addend)((r0 + r) * n + j);
    for (int64_t r = 0; r < rows; ++r) store_row(out_type, out, (r0 + r) * n, acc.data() + r * n, n);
  }
}

// Shared body of the plain and the accumulate forms. addend == nullptr: rows outside every group are
// zero; else out = addend + product (rows outside every group are addend's).
ffi::Error GroupedGemmBody(const char* op, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                           ffi::Buffer<ffi::S32> group_sizes, const ffi::AnyBuffer* addend,
                           ffi::Result<ffi::AnyBuffer> out, bool transpose_rhs) {
  GroupedGemmDims d;
  if (auto err = grouped_gemm_dims(lhs, rhs, group_sizes, transpose_rhs, &d); err.failure())
    return err;
  if (auto err = check_types(op, lhs.element_type(), "lhs", rhs.element_type(), "rhs",
                             out->element_type());
      err.failure())
    return err;
  auto od = out->dimensions();
  if (od.size() != 2 || od[0] != d.m || od[1] != d.n)
    return invalid(std::string(op) + ": output must be [M,N] = [" + std::to_string(d.m) + "," +
                   std::to_string(d.n) + "], got " + dims_str(od));
  if (addend != nullptr) {
    if (auto err = check_addend(op, *addend, d.m, d.n, out->element_type()); err.failure()) return err;
  }
  FloatReader add{addend != nullptr ? addend->element_type() : out->element_type(),
                  addend != nullptr ? addend->untyped_data() : nullptr};

  FloatReader a{lhs.element_type(), lhs.untyped_data()};
  FloatReader b{rhs.element_type(), rhs.untyped_data()};
  const int32_t* sizes = group_sizes.typed_data();
  std::vector<float> panel(d.k * d.n);
  int64_t start = 0;
  for (int64_t g = 0; g < d.g; ++g) {
    GroupRows rows = clip_group(start, sizes[g], d.m);
    start = rows.end;
    if (rows.end == rows.begin) continue;
    const int64_t base = g * d.k * d.n;
    if (transpose_rhs) {  // rhs[g] is [N, K]
      for (int64_t j = 0; j < d.n; ++j)
        for (int64_t kk = 0; kk < d.k; ++kk) panel[kk * d.n + j] = b(base + j * d.k + kk);
    } else {
      for (int64_t i = 0; i < d.k * d.n; ++i) panel[i] = b(base + i);
    }
    gemm_rows(a, d.k, panel, d.n, rows.begin, rows.end, out->element_type(), out->untyped_data(),
              addend != nullptr ? &add : nullptr);
  }
  // Rows past the clipped total belong to no group: zero, or the addend's rows. (Earlier rows are all
  // in some group: clipped groups are contiguous from row 0.)
  if (addend == nullptr) {
    zero_elements(out->element_type(), out->untyped_data(), start * d.n, (d.m - start) * d.n);
  } else if (addend->untyped_data() != out->untyped_data()) {
    const size_t width = ffi::ByteWidth(out->element_type());
    std::memcpy(static_cast<char*>(out->untyped_data()) + start * d.n * width,
                static_cast<const char*>(addend->untyped_data()) + start * d.n * width,
                (d.m - start) * d.n * width);
  }
  return ffi::Error::Success();
}

ffi::Error GroupedGemmCpu(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Buffer<ffi::S32> group_sizes,
                          ffi::Result<ffi::AnyBuffer> out, bool transpose_rhs) {
  return GroupedGemmBody("grouped_gemm", lhs, rhs, group_sizes, nullptr, out, transpose_rhs);
}

// out = addend + grouped_gemm(lhs, rhs): the dgrad of two GEMMs that share their lhs, summed in one
// epilogue instead of a separate add. XLA aliases out to addend (input_output_aliases).
ffi::Error GroupedGemmAccCpu(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Buffer<ffi::S32> group_sizes,
                             ffi::AnyBuffer addend, ffi::Result<ffi::AnyBuffer> out, bool transpose_rhs) {
  return GroupedGemmBody("grouped_gemm_acc", lhs, rhs, group_sizes, &addend, out, transpose_rhs);
}

ffi::Error GroupedGemmWgradCpu(ffi::AnyBuffer lhs, ffi::AnyBuffer dout,
                               ffi::Buffer<ffi::S32> group_sizes, ffi::Result<ffi::AnyBuffer> out) {
  auto ld = lhs.dimensions();
  auto dd = dout.dimensions();
  auto sd = group_sizes.dimensions();
  auto od = out->dimensions();
  if (ld.size() != 2 || dd.size() != 2 || ld[0] != dd[0])
    return invalid("grouped_gemm_wgrad: lhs [M,K] and dout [M,N] must share M, got lhs " +
                   dims_str(ld) + " dout " + dims_str(dd));
  if (sd.size() != 1) return invalid("grouped_gemm_wgrad: group_sizes must be rank 1");
  const int64_t m = ld[0], k = ld[1], n = dd[1], g_count = sd[0];
  if (od.size() != 3 || od[0] != g_count || od[1] != k || od[2] != n)
    return invalid("grouped_gemm_wgrad: output must be [G,K,N], got " + dims_str(od));
  if (auto err = check_types("grouped_gemm_wgrad", lhs.element_type(), "lhs", dout.element_type(),
                             "dout", out->element_type());
      err.failure())
    return err;

  FloatReader a{lhs.element_type(), lhs.untyped_data()};
  FloatReader dy{dout.element_type(), dout.untyped_data()};
  const int32_t* sizes = group_sizes.typed_data();
  std::vector<float> acc(k * n);
  std::vector<float> dy_row(n), a_row(k);
  int64_t start = 0;
  for (int64_t g = 0; g < g_count; ++g) {
    GroupRows rows = clip_group(start, sizes[g], m);
    start = rows.end;
    std::fill(acc.begin(), acc.end(), 0.0f);
    // Rank-1 updates, one row at a time: acc[k, :] += lhs[r, k] * dout[r, :] (contiguous in N).
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      for (int64_t j = 0; j < n; ++j) dy_row[j] = dy(r * n + j);
      for (int64_t kk = 0; kk < k; ++kk) a_row[kk] = a(r * k + kk);
      for (int64_t kk = 0; kk < k; ++kk) {
        float av = a_row[kk];
        float* c = acc.data() + kk * n;
        for (int64_t j = 0; j < n; ++j) c[j] += av * dy_row[j];
      }
    }
    store_row(out->element_type(), out->untyped_data(), g * k * n, acc.data(), k * n);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmCpu, jax_moe_ffi::GroupedGemmCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // lhs
                                  .Arg<xla::ffi::AnyBuffer>()               // rhs
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>()               // out
                                  .Attr<bool>("transpose_rhs"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmAccCpu, jax_moe_ffi::GroupedGemmAccCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // lhs
                                  .Arg<xla::ffi::AnyBuffer>()               // rhs
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // group_sizes
                                  .Arg<xla::ffi::AnyBuffer>()               // addend (aliased to out)
                                  .Ret<xla::ffi::AnyBuffer>()               // out
                                  .Attr<bool>("transpose_rhs"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmWgradCpu, jax_moe_ffi::GroupedGemmWgradCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // lhs
                                  .Arg<xla::ffi::AnyBuffer>()               // dout
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>());             // out
