// Shared helpers for the jax_moe_ffi XLA FFI handlers (CPU and CUDA).
// Header-only, no Python: included by the nanobind CPU extension and by the plain CUDA library.
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

#if defined(__CUDACC__)
#define JMF_HD __host__ __device__ __forceinline__
#else
#define JMF_HD inline
#endif

namespace jax_moe_ffi {

namespace ffi = xla::ffi;

// Group-size semantics shared by every op (documented in README "Group sizes"):
// negative sizes count as 0, and groups are laid out back to back from row 0, each clipped to
// [0, M). So a group that would run past M is truncated and later groups are empty; rows at or
// past the (clipped) total are not read as inputs and are written as zeros where they are outputs.
// This one function decides the rows of a group, so CPU and CUDA cannot disagree.
struct GroupRows {
  int64_t begin;
  int64_t end;
};

// Computes the clipped [begin, end) of group `g` given a running (clipped) start.
JMF_HD GroupRows clip_group(int64_t start, int32_t size, int64_t m) {
  int64_t s = size < 0 ? 0 : static_cast<int64_t>(size);
  int64_t b = start < m ? start : m;
  int64_t e = b + s;
  if (e > m) e = m;
  return GroupRows{b, e};
}

inline ffi::Error invalid(const std::string& msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_moe_ffi: " + msg);
}

inline std::string dims_str(ffi::AnyBuffer::Dimensions d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(d[i]);
  }
  return s + "]";
}

// Shape bookkeeping of a grouped matmul call, validated once and shared by CPU and CUDA handlers.
//   transpose_rhs = false: out[M,N] = lhs[M,K] . rhs[g][K,N]   (rhs buffer [G,K,N])
//   transpose_rhs = true : out[M,N] = lhs[M,K] . rhs[g][N,K]^T (rhs buffer [G,N,K]; the dgrad form)
struct GroupedGemmDims {
  int64_t m, k, n, g;
};

// SizesBuffer: ffi::Buffer<ffi::S32> (or AnyBuffer); only its dimensions are read.
template <typename SizesBuffer>
ffi::Error grouped_gemm_dims(const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs,
                             const SizesBuffer& sizes, bool transpose_rhs, GroupedGemmDims* d) {
  auto ld = lhs.dimensions();
  auto rd = rhs.dimensions();
  auto sd = sizes.dimensions();
  if (ld.size() != 2) return invalid("grouped_gemm: lhs must be rank 2, got " + dims_str(ld));
  if (rd.size() != 3) return invalid("grouped_gemm: rhs must be rank 3, got " + dims_str(rd));
  if (sd.size() != 1 || sd[0] != rd[0])
    return invalid("grouped_gemm: group_sizes must be [G] with G = rhs.shape[0], got " +
                   dims_str(sd) + " and rhs " + dims_str(rd));
  d->m = ld[0];
  d->k = ld[1];
  d->g = rd[0];
  int64_t rk = transpose_rhs ? rd[2] : rd[1];
  d->n = transpose_rhs ? rd[1] : rd[2];
  if (rk != d->k)
    return invalid("grouped_gemm: contraction mismatch lhs " + dims_str(ld) + " rhs " +
                   dims_str(rd) + (transpose_rhs ? " (transpose_rhs)" : ""));
  return ffi::Error::Success();
}

// The accumulate form's addend: out = addend + product, so it has out's shape and dtype.
inline ffi::Error check_addend(const char* op, const ffi::AnyBuffer& addend, int64_t m, int64_t n,
                               ffi::DataType out_type) {
  auto ad = addend.dimensions();
  if (ad.size() != 2 || ad[0] != m || ad[1] != n)
    return invalid(std::string(op) + ": addend must be [M,N] = [" + std::to_string(m) + "," +
                   std::to_string(n) + "] (the output's shape), got " + dims_str(ad));
  if (addend.element_type() != out_type)
    return invalid(std::string(op) + ": addend must have the output's dtype");
  return ffi::Error::Success();
}

}  // namespace jax_moe_ffi
