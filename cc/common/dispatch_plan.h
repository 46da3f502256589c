// Shape bookkeeping of the token dispatch / combine handlers, shared by CPU and CUDA so the two
// platforms validate the same things and agree on every index rule.
//
// Vocabulary (see jax_moe_ffi/ops/dispatch.py for the user-facing contract):
//   T tokens, k choices per token, P = T*k (token, choice) pairs with flat index p = t*k + j,
//   E experts, R dispatched rows (static upper bound on the padded total), D hidden size.
//   pos[T,k]     row of each pair in `rows`, -1 when the pair is dropped;
//   row_pair[R]  flat pair index of each row, -1 for alignment padding and rows past the total;
//   counts[E]    kept pairs per expert; group_sizes[E] counts rounded up to a multiple of `align`.
// Rows are sorted by expert, stable in p (token-major, choice-minor). A pair whose expert id is out
// of [0, E) or whose keep flag is false is dropped and does not use a capacity slot; with
// capacity C >= 0 a pair whose running count among earlier kept-candidate pairs of its expert is
// >= C is dropped (the GShard/Switch cumsum rule).
#pragma once

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"

namespace jax_moe_ffi {

JMF_HD int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct PlanDims {
  int64_t t, k, p, e, r, chunks;
  bool has_keep;
};

// expert_ids [T,k] S32, keep [T,k] PRED or [0] (no mask); outputs pos [T,k], row_pair [R],
// counts [E], group_sizes [E], workspace [W] (CUDA needs W >= chunks*E + E + 1; CPU ignores it).
template <typename IdsBuf, typename KeepBuf>
ffi::Error plan_dims(const IdsBuf& ids, const KeepBuf& keep, ffi::AnyBuffer::Dimensions pos,
                     ffi::AnyBuffer::Dimensions row_pair, ffi::AnyBuffer::Dimensions counts,
                     ffi::AnyBuffer::Dimensions group_sizes, int64_t align, int64_t chunk,
                     PlanDims* d) {
  auto id = ids.dimensions();
  if (id.size() != 2) return invalid("dispatch_plan: expert_ids must be rank 2 [T,k], got " + dims_str(id));
  d->t = id[0];
  d->k = id[1];
  d->p = d->t * d->k;
  auto kd = keep.dimensions();
  if (kd.size() == 2 && kd[0] == d->t && kd[1] == d->k) {
    d->has_keep = true;
  } else if (keep.element_count() == 0) {
    d->has_keep = false;  // an empty buffer means "no mask"
  } else {
    return invalid("dispatch_plan: keep must be [T,k] = " + dims_str(id) + " or [0], got " + dims_str(kd));
  }
  if (pos.size() != 2 || pos[0] != d->t || pos[1] != d->k)
    return invalid("dispatch_plan: pos output must be [T,k] = " + dims_str(id) + ", got " + dims_str(pos));
  if (row_pair.size() != 1) return invalid("dispatch_plan: row_pair output must be rank 1 [R]");
  d->r = row_pair[0];
  if (counts.size() != 1 || counts[0] < 1)
    return invalid("dispatch_plan: counts output must be [E] with E >= 1, got " + dims_str(counts));
  d->e = counts[0];
  if (group_sizes.size() != 1 || group_sizes[0] != d->e)
    return invalid("dispatch_plan: group_sizes output must be [E], got " + dims_str(group_sizes));
  if (align < 1) return invalid("dispatch_plan: align must be >= 1, got " + std::to_string(align));
  if (chunk < 32 || chunk % 32 != 0)
    return invalid("dispatch_plan: chunk must be a positive multiple of 32, got " + std::to_string(chunk));
  if (d->r > INT32_MAX || d->p > INT32_MAX)
    return invalid("dispatch_plan: rows and pairs must fit in int32");
  d->chunks = (d->p + chunk - 1) / chunk;
  return ffi::Error::Success();
}

struct RowsDims {
  int64_t t, d, r, p, k;
};

// x [T,D] (or dy for combine_bwd), rows [R,D]: same dtype, same D.
inline ffi::Error rows_dims(const char* op, ffi::AnyBuffer::Dimensions xd, const char* x_name,
                            ffi::AnyBuffer::Dimensions rd, const char* r_name, int64_t top_k,
                            RowsDims* d) {
  if (xd.size() != 2) return invalid(std::string(op) + ": " + x_name + " must be rank 2, got " + dims_str(xd));
  if (rd.size() != 2 || rd[1] != xd[1])
    return invalid(std::string(op) + ": " + r_name + " must be [R," + std::to_string(xd[1]) + "], got " +
                   dims_str(rd));
  if (top_k < 1) return invalid(std::string(op) + ": top_k must be >= 1, got " + std::to_string(top_k));
  d->t = xd[0];
  d->d = xd[1];
  d->r = rd[0];
  d->k = top_k;
  d->p = d->t * top_k;
  return ffi::Error::Success();
}

// dispatch's index arguments: pos [T,k], row_pair [R], scale [T,k] or none.
inline ffi::Error dispatch_index_dims(ffi::AnyBuffer::Dimensions pos, ffi::AnyBuffer::Dimensions row_pair,
                                      size_t scale_count, const RowsDims& d) {
  if (pos.size() != 2 || pos[0] != d.t || pos[1] != d.k)
    return invalid("dispatch: pos must be [T,k] = [" + std::to_string(d.t) + "," + std::to_string(d.k) +
                   "], got " + dims_str(pos));
  if (row_pair.size() != 1 || row_pair[0] != d.r)
    return invalid("dispatch: row_pair must be [R] = [" + std::to_string(d.r) + "], got " + dims_str(row_pair));
  if (scale_count != 0 && static_cast<int64_t>(scale_count) != d.p)
    return invalid("dispatch: scale must have T*k = " + std::to_string(d.p) + " elements or none, got " +
                   std::to_string(scale_count));
  return ffi::Error::Success();
}

inline bool same_dims(ffi::AnyBuffer::Dimensions a, ffi::AnyBuffer::Dimensions b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// combine_bwd: dy [T,D], rows [R,D], row_pair [R], weights [T,k] -> drows [R,D], dweights [T,k].
inline ffi::Error combine_bwd_dims(ffi::AnyBuffer::Dimensions dy, ffi::AnyBuffer::Dimensions rows,
                                   ffi::AnyBuffer::Dimensions row_pair, ffi::AnyBuffer::Dimensions weights,
                                   ffi::AnyBuffer::Dimensions drows, ffi::AnyBuffer::Dimensions dweights,
                                   RowsDims* d) {
  if (weights.size() != 2) return invalid("combine_bwd: weights must be rank 2 [T,k], got " + dims_str(weights));
  if (auto err = rows_dims("combine_bwd", dy, "dy", rows, "rows", weights[1], d); err.failure()) return err;
  if (d->t != weights[0]) return invalid("combine_bwd: dy and weights must share T");
  if (row_pair.size() != 1 || row_pair[0] != d->r) return invalid("combine_bwd: row_pair must be [R]");
  if (!same_dims(drows, rows) || !same_dims(dweights, weights))
    return invalid("combine_bwd: outputs must be [R,D] and [T,k]");
  return ffi::Error::Success();
}

}  // namespace jax_moe_ffi
