// CUDA token dispatch / combine as typed XLA FFI handlers (SM90; nothing here is Hopper-specific).
// Index rules: common/dispatch_plan.h; semantics: jax_moe_ffi/ops/dispatch.py. Same targets as the CPU file:
//
//   jax_moe_ffi_dispatch_plan : expert_ids[T,k], keep[T,k]|[0] -> pos, row_pair, counts, group_sizes, workspace
//   jax_moe_ffi_dispatch      : x[T,D], pos[T,k], row_pair[R], scale[P]|[0] -> rows[R,D]
//   jax_moe_ffi_combine       : rows[R,D], pos[T,k], weights[T,k]  -> y[T,D]
//   jax_moe_ffi_combine_bwd   : dy[T,D], rows[R,D], row_pair[R], weights[T,k] -> drows[R,D], dweights[T,k]
//
// Everything stays on the device: the plan is three small kernels on the stream, its scratch is an
// XLA output (`workspace`), no host synchronisation, no device->host copies, so every handler is
// CUDA-graph (command buffer) compatible.
//
// Plan (P pairs in chunks of `chunk`, W = chunks*E + E + 1 int32 workspace: histograms, offsets, ticket):
//   1. rank:   one warp per chunk walks its pairs 32 at a time in flat order; __match_any_sync groups
//              lanes of one expert, so each pair gets its stable rank inside the chunk; per-chunk
//              histograms go to workspace[c*E + e] (shared memory while E is small). The same launch
//              fills row_pair with -1 (padding rows read as "no pair") and zeroes the ticket.
//   2. scan:   one warp per expert turns the chunk histograms into exclusive prefixes (stable across
//              chunks) and writes the expert total; the last block to finish (ticket) then computes
//              counts = min(total, C), group_sizes = round_up(counts, align) and the group offsets.
//   3. final:  per pair: rank = chunk prefix + in-chunk rank; drop if rank >= C; pos = offset + rank,
//              row_pair[pos] = p.
// Kernels 1-2 used to be a memset and three launches; fusing them saves launch gaps on a pass that
// is ~1/3 of dispatch time at the benchmark shapes.
// Gather / combine move 16-byte vectors (uint4) when the row size and pointers allow, else 8/4/2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "common/dispatch_plan.h"
#include "common/ffi_helpers.h"

namespace jax_moe_ffi {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarpsPerBlock = 8;  // row / token kernels: one warp per row (token), 8 per block
constexpr int kRankWarps = 4;      // plan rank kernel: warps (chunks) per block
constexpr int kSharedHistBytes = 32 * 1024;

ffi::Error cuda_error(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal,
                    std::string("jax_moe_ffi: ") + what + ": " + cudaGetErrorString(e));
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------ element traits
struct F32Elem {
  using S = float;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float f) { return f; }
};
struct BF16Elem {
  using S = uint16_t;
  static __device__ __forceinline__ float load(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
  static __device__ __forceinline__ uint16_t store(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
struct F16Elem {
  using S = uint16_t;
  static __device__ __forceinline__ float load(uint16_t h) { return __half2float(__ushort_as_half(h)); }
  static __device__ __forceinline__ uint16_t store(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

// A vector of V (uint4 / uint2 / uint32_t / uint16_t) seen as N elements of storage type S.
template <typename S, typename V>
union Pack {
  static constexpr int N = sizeof(V) / sizeof(S);
  V raw;
  S e[sizeof(V) / sizeof(S)];
};

template <typename V>
__device__ __forceinline__ V zero_vec() {
  return V{};
}

// -------------------------------------------------------------------------------------- plan
// One warp per chunk. `local` receives each pair's rank inside its chunk (-1: not a candidate).
template <bool kShared>
__global__ void plan_rank_kernel(const int32_t* __restrict__ ids, const bool* __restrict__ keep,
                                 int64_t num_pairs, int32_t num_experts, int64_t chunk,
                                 int64_t num_chunks, int32_t* __restrict__ hist,
                                 int32_t* __restrict__ local, int32_t* __restrict__ row_pair,
                                 int64_t num_rows, int32_t* __restrict__ ticket) {
  extern __shared__ int32_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Side jobs of this launch (the finalize kernel, two launches later, writes the kept rows).
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < num_rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    row_pair[r] = -1;
  if (blockIdx.x == 0 && threadIdx.x == 0) *ticket = 0;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRankWarps + warp;
  if (c >= num_chunks) return;  // whole warps exit together
  int32_t* cnt = kShared ? smem + static_cast<int64_t>(warp) * num_experts : hist + c * num_experts;
  for (int32_t e = lane; e < num_experts; e += 32) cnt[e] = 0;
  __syncwarp();
  const int64_t begin = c * chunk;
  const int64_t end = begin + chunk < num_pairs ? begin + chunk : num_pairs;
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t p = base + lane;
    int32_t e = -1;
    if (p < end) {
      const int32_t v = ids[p];
      if (v >= 0 && v < num_experts && (keep == nullptr || keep[p])) e = v;
    }
    const unsigned peers = __match_any_sync(kFull, e);
    int32_t before = 0;
    if (e >= 0) before = cnt[e];
    __syncwarp();
    if (e >= 0) {
      const int leader = __ffs(peers) - 1;
      if (lane == leader) cnt[e] = before + __popc(peers);
      local[p] = before + __popc(peers & lt_mask);
    } else if (p < end) {
      local[p] = -1;
    }
    __syncwarp();
  }
  if (kShared) {
    for (int32_t e = lane; e < num_experts; e += 32) hist[c * num_experts + e] = cnt[e];
  }
}

// One block of up to 1024 threads: counts (capacity-clipped), padded group sizes, group offsets.
// `counts` holds each expert's total on entry.
__device__ void expert_scan(int32_t num_experts, int64_t capacity, int64_t align,
                            int32_t* __restrict__ counts, int32_t* __restrict__ group_sizes,
                            int32_t* __restrict__ offsets) {
  __shared__ int32_t warp_sums[32];
  __shared__ int32_t carry_s;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) carry_s = 0;
  __syncthreads();
  for (int32_t e0 = 0; e0 < num_experts; e0 += blockDim.x) {
    const int32_t e = e0 + tid;
    int32_t padded = 0;
    if (e < num_experts) {
      int64_t c = __ldcg(counts + e);  // written by other blocks of this launch: read past L1
      if (capacity >= 0 && c > capacity) c = capacity;
      padded = static_cast<int32_t>(round_up(c, align));
      counts[e] = static_cast<int32_t>(c);
      group_sizes[e] = padded;
    }
    int32_t incl = padded;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t n = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += n;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      const int nwarps = blockDim.x / 32;
      int32_t s = lane < nwarps ? warp_sums[lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t n = __shfl_up_sync(kFull, s, o);
        if (lane >= o) s += n;
      }
      if (lane < nwarps) warp_sums[lane] = s;  // inclusive prefix of warp totals
    }
    __syncthreads();
    const int32_t warp_base = warp == 0 ? 0 : warp_sums[warp - 1];
    const int32_t carry = carry_s;
    if (e < num_experts) offsets[e] = carry + warp_base + incl - padded;
    __syncthreads();
    if (tid == blockDim.x - 1) carry_s = carry + warp_base + incl;
    __syncthreads();
  }
}

// One warp per expert: exclusive prefix over chunks (in place) and the expert's total; the last
// block to finish runs expert_scan (the threadfence + ticket pattern: deterministic, one writer).
__global__ void plan_scan_kernel(int32_t* __restrict__ hist, int64_t num_chunks, int32_t num_experts,
                                 int64_t capacity, int64_t align, int32_t* __restrict__ counts,
                                 int32_t* __restrict__ group_sizes, int32_t* __restrict__ offsets,
                                 int32_t* __restrict__ ticket) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (e < num_experts) {
    int32_t carry = 0;
    for (int64_t c0 = 0; c0 < num_chunks; c0 += 32) {
      const int64_t c = c0 + lane;
      const int32_t v = c < num_chunks ? hist[c * num_experts + e] : 0;
      int32_t incl = v;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t n = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += n;
      }
      if (c < num_chunks) hist[c * num_experts + e] = carry + incl - v;
      carry += __shfl_sync(kFull, incl, 31);
    }
    if (lane == 0) counts[e] = carry;
  }
  __shared__ bool last;
  __threadfence();  // totals visible device-wide before this block takes its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  expert_scan(num_experts, capacity, align, counts, group_sizes, offsets);
}

// One thread per pair: final row of each kept pair; `pos` holds the in-chunk rank on entry.
__global__ void plan_finalize_kernel(const int32_t* __restrict__ ids, int64_t num_pairs,
                                     int32_t num_experts, int64_t chunk, int64_t capacity,
                                     int64_t num_rows, const int32_t* __restrict__ hist,
                                     const int32_t* __restrict__ offsets, int32_t* __restrict__ pos,
                                     int32_t* __restrict__ row_pair) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= num_pairs) return;
  const int32_t local = pos[p];
  if (local < 0) return;  // already -1
  const int32_t e = ids[p];
  const int64_t rank = static_cast<int64_t>(hist[(p / chunk) * num_experts + e]) + local;
  if (capacity >= 0 && rank >= capacity) {
    pos[p] = -1;
    return;
  }
  const int64_t row = offsets[e] + rank;
  if (row >= num_rows) {  // cannot happen with the row bound of dispatch_num_rows; never write out of bounds
    pos[p] = -1;
    return;
  }
  pos[p] = static_cast<int32_t>(row);
  row_pair[row] = static_cast<int32_t>(p);
}

ffi::Error DispatchPlanCuda(cudaStream_t stream, ffi::Buffer<ffi::S32> expert_ids,
                            ffi::Buffer<ffi::PRED> keep, ffi::Result<ffi::Buffer<ffi::S32>> pos,
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
  if (d.e > INT32_MAX) return invalid("dispatch_plan: too many experts");
  const int64_t need = d.chunks * d.e + d.e + 1;
  if (static_cast<int64_t>(workspace->element_count()) < need)
    return invalid("dispatch_plan: workspace must hold chunks*E + E + 1 = " + std::to_string(need) +
                   " int32, got " + dims_str(workspace->dimensions()));
  const int32_t e = static_cast<int32_t>(d.e);
  int32_t* hist = workspace->typed_data();
  int32_t* offsets = hist + d.chunks * d.e;
  int32_t* ticket = offsets + d.e;
  int32_t* pos_p = pos->typed_data();
  int32_t* rp = row_pair->typed_data();
  int32_t* cnt = counts->typed_data();
  const int32_t* ids = expert_ids.typed_data();
  const bool* kp = d.has_keep ? keep.typed_data() : nullptr;

  // Rank launch: at least one block so row_pair and the ticket are initialised even with no pairs.
  const int rank_blocks = static_cast<int>(std::max<int64_t>(1, cdiv(d.chunks, kRankWarps)));
  const size_t shared = static_cast<size_t>(kRankWarps) * d.e * sizeof(int32_t);
  if (shared <= kSharedHistBytes) {
    plan_rank_kernel<true><<<rank_blocks, kRankWarps * 32, shared, stream>>>(
        ids, kp, d.p, e, chunk, d.chunks, hist, pos_p, rp, d.r, ticket);
  } else {
    plan_rank_kernel<false><<<rank_blocks, kRankWarps * 32, 0, stream>>>(
        ids, kp, d.p, e, chunk, d.chunks, hist, pos_p, rp, d.r, ticket);
  }
  if (auto err = cuda_error("dispatch_plan rank kernel"); err.failure()) return err;
  constexpr int kScanThreads = 256;  // 8 experts per block; the last block scans all E with 256 threads
  plan_scan_kernel<<<static_cast<int>(std::max<int64_t>(1, cdiv(d.e * 32, kScanThreads))), kScanThreads, 0,
                     stream>>>(hist, d.chunks, e, capacity, align, cnt, group_sizes->typed_data(), offsets,
                               ticket);
  if (auto err = cuda_error("dispatch_plan scan kernel"); err.failure()) return err;
  if (d.p > 0) {
    plan_finalize_kernel<<<static_cast<int>(cdiv(d.p, 256)), 256, 0, stream>>>(
        ids, d.p, e, chunk, capacity, d.r, hist, offsets, pos_p, rp);
    if (auto err = cuda_error("dispatch_plan finalize kernel"); err.failure()) return err;
  }
  return ffi::Error::Success();
}

// ----------------------------------------------------------------------------- vector width
// Widest of 16/8/4/2 bytes that divides the row and every pointer (min: the element size).
int vec_bytes(int64_t row_bytes, size_t elem, std::initializer_list<const void*> ptrs) {
  for (int vb : {16, 8, 4, 2}) {
    if (static_cast<size_t>(vb) < elem) break;
    bool ok = row_bytes % vb == 0;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % vb == 0;
    if (ok) return vb;
  }
  return static_cast<int>(elem);
}

// Calls f(V{}) with V the unsigned vector type of `vb` bytes.
template <typename F>
ffi::Error with_vec(int vb, F&& f) {
  switch (vb) {
    case 16: return f(uint4{});
    case 8: return f(uint2{});
    case 4: return f(uint32_t{});
    default: return f(uint16_t{});
  }
}

// Calls f(Elem{}) with the element traits of a float dtype.
template <typename F>
ffi::Error with_elem(ffi::DataType t, F&& f) {
  switch (t) {
    case ffi::DataType::F32: return f(F32Elem{});
    case ffi::DataType::BF16: return f(BF16Elem{});
    case ffi::DataType::F16: return f(F16Elem{});
    default: return invalid("expected float32, bfloat16 or float16");
  }
}

size_t width_of(ffi::DataType t) { return t == ffi::DataType::F32 ? 4 : 2; }
bool is_float_type(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

// -------------------------------------------------------------------------------- dispatch
// Row r holds pair p = row_pair[r] when p is a pair and pos[p] == r (a plan always makes them agree;
// the check keeps a hand-made routing from leaving a row unwritten or written twice); else zeros.
__device__ __forceinline__ bool row_is_held(const int32_t* __restrict__ pos, int32_t p, int64_t r,
                                            int64_t num_pairs) {
  return p >= 0 && p < num_pairs && pos[p] == r;
}

template <typename Elem, typename V, bool kScaled>
__device__ __forceinline__ V scaled_vec(V in, float s) {
  if constexpr (!kScaled) {
    return in;
  } else {
    using P = Pack<typename Elem::S, V>;
    P a, b;
    a.raw = in;
#pragma unroll
    for (int i = 0; i < P::N; ++i) b.e[i] = Elem::store(s * Elem::load(a.e[i]));
    return b.raw;
  }
}

// Token-major gather: one warp per token reads the token's row once and stores it to the rows of
// its (up to kPairBatch at a time) kept pairs: HBM traffic is T*D reads + R*D writes, instead of
// R*D reads (through L2) + R*D writes for a row-major gather. Blocks past `token_blocks` zero the
// rows no pair holds (padding), 32 rows per warp, found by a ballot over row_pair.
constexpr int kPairBatch = 8;
template <typename Elem, typename V, bool kScaled>
__global__ void gather_tokens_kernel(const V* __restrict__ x, const int32_t* __restrict__ pos,
                                     const int32_t* __restrict__ row_pair, const float* __restrict__ scale,
                                     int64_t num_tokens, int64_t top_k, int64_t num_rows, int64_t nvec,
                                     int64_t token_blocks, V* __restrict__ rows) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t num_pairs = num_tokens * top_k;
  if (blockIdx.x < token_blocks) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
    if (t >= num_tokens) return;
    const V* src = x + t * nvec;
    for (int64_t j0 = 0; j0 < top_k; j0 += kPairBatch) {
      int32_t mine = -1;
      float my_scale = 1.0f;
      if (lane < kPairBatch && j0 + lane < top_k) {
        const int64_t p = t * top_k + j0 + lane;
        const int32_t r = pos[p];
        if (r >= 0 && r < num_rows && row_pair[r] == p) {
          mine = r;
          if constexpr (kScaled) my_scale = scale[p];
        }
      }
      int64_t dst[kPairBatch];
      float s[kPairBatch];
#pragma unroll
      for (int i = 0; i < kPairBatch; ++i) {
        const int32_t r = __shfl_sync(kFull, mine, i);
        dst[i] = r < 0 ? -1 : static_cast<int64_t>(r) * nvec;
        s[i] = __shfl_sync(kFull, my_scale, i);
      }
      if (__ballot_sync(kFull, mine >= 0) == 0) continue;
#pragma unroll 2
      for (int64_t v = lane; v < nvec; v += 32) {
        const V in = __ldg(src + v);
        // FP8 seam: a quantising store (E4M3 data + block scales as extra outputs) replaces this.
#pragma unroll
        for (int i = 0; i < kPairBatch; ++i)
          if (dst[i] >= 0) rows[dst[i] + v] = scaled_vec<Elem, V, kScaled>(in, s[i]);
      }
    }
    return;
  }
  const int64_t r0 = ((static_cast<int64_t>(blockIdx.x) - token_blocks) * kWarpsPerBlock + warp) * 32;
  if (r0 >= num_rows) return;
  const int64_t r = r0 + lane;
  const bool empty = r < num_rows && !row_is_held(pos, r < num_rows ? row_pair[r] : -1, r, num_pairs);
  for (unsigned m = __ballot_sync(kFull, empty); m != 0; m &= m - 1) {
    V* dst = rows + (r0 + __ffs(m) - 1) * nvec;
    const V z = zero_vec<V>();
    for (int64_t v = lane; v < nvec; v += 32) dst[v] = z;
  }
}

// Row-major gather (one warp per output row; JAX_MOE_FFI_DISPATCH_GATHER=rows selects it, for
// comparison): rows[r] = scale[p] * x[p / k] or zeros, same rule as the token-major kernel.
template <typename Elem, typename V, bool kScaled>
__global__ void gather_rows_kernel(const V* __restrict__ x, const int32_t* __restrict__ pos,
                                   const int32_t* __restrict__ row_pair, const float* __restrict__ scale,
                                   int64_t num_rows, int64_t num_pairs, int64_t top_k, int64_t nvec,
                                   V* __restrict__ rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= num_rows) return;
  const int32_t p = row_pair[r];
  V* dst = rows + r * nvec;
  if (!row_is_held(pos, p, r, num_pairs)) {
    const V z = zero_vec<V>();
    for (int64_t v = lane; v < nvec; v += 32) dst[v] = z;
    return;
  }
  const V* src = x + (p / top_k) * nvec;
  const float s = kScaled ? scale[p] : 1.0f;
#pragma unroll 4
  for (int64_t v = lane; v < nvec; v += 32) dst[v] = scaled_vec<Elem, V, kScaled>(__ldg(src + v), s);
}

bool row_major_gather_requested() {
  static const bool rows = [] {
    const char* v = std::getenv("JAX_MOE_FFI_DISPATCH_GATHER");
    return v != nullptr && std::string(v) == "rows";
  }();
  return rows;
}

ffi::Error DispatchCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> pos,
                        ffi::Buffer<ffi::S32> row_pair, ffi::Buffer<ffi::F32> scale,
                        ffi::Result<ffi::AnyBuffer> rows, int64_t top_k) {
  RowsDims d;
  if (auto err = rows_dims("dispatch", x.dimensions(), "x", rows->dimensions(), "rows", top_k, &d);
      err.failure())
    return err;
  if (auto err = dispatch_index_dims(pos.dimensions(), row_pair.dimensions(), scale.element_count(), d);
      err.failure())
    return err;
  const ffi::DataType type = x.element_type();
  if (!is_float_type(type) || rows->element_type() != type)
    return invalid("dispatch: x must be float32/bfloat16/float16 and rows of the same dtype");
  if (d.r == 0 || d.d == 0) return ffi::Error::Success();

  const size_t elem = width_of(type);
  const int64_t row_bytes = d.d * static_cast<int64_t>(elem);
  const int vb = vec_bytes(row_bytes, elem, {x.untyped_data(), rows->untyped_data()});
  const int64_t nvec = row_bytes / vb;
  const bool scaled = scale.element_count() != 0;
  const int32_t* ps = pos.typed_data();
  const int32_t* rp = row_pair.typed_data();
  const float* sc = scale.typed_data();
  return with_elem(type, [&](auto etag) -> ffi::Error {
    using Elem = decltype(etag);
    return with_vec(vb, [&](auto vtag) -> ffi::Error {
      using V = decltype(vtag);
      if constexpr (sizeof(V) < sizeof(typename Elem::S)) {
        return invalid("dispatch: internal vector width error");
      } else {
        const V* xv = static_cast<const V*>(x.untyped_data());
        V* out = static_cast<V*>(rows->untyped_data());
        auto launch = [&](auto scaled_tag) {
          constexpr bool kScaled = decltype(scaled_tag)::value;
          if (row_major_gather_requested()) {
            gather_rows_kernel<Elem, V, kScaled><<<static_cast<int>(cdiv(d.r, kWarpsPerBlock)),
                                                   kWarpsPerBlock * 32, 0, stream>>>(
                xv, ps, rp, sc, d.r, d.p, d.k, nvec, out);
          } else {
            const int64_t token_blocks = cdiv(d.t, kWarpsPerBlock);
            const int64_t zero_blocks = cdiv(d.r, 32 * kWarpsPerBlock);
            gather_tokens_kernel<Elem, V, kScaled><<<static_cast<int>(token_blocks + zero_blocks),
                                                     kWarpsPerBlock * 32, 0, stream>>>(
                xv, ps, rp, sc, d.t, d.k, d.r, nvec, token_blocks, out);
          }
        };
        if (scaled) launch(std::true_type{});
        else launch(std::false_type{});
        return cuda_error("dispatch gather kernel");
      }
    });
  });
}

// --------------------------------------------------------------------------------- combine
// One warp per (token, slice of kCombineSliceVecs vectors of the row); each lane owns whole
// vectors and sums the token's k rows in float32, in choice order (loads of up to kBatch rows in
// flight). Slicing the row gives many short warps instead of T long ones: a whole-row warp at
// D=7168 walked 28 dependent load rounds and T=4096 warps half-filled the GPU (75% of XLA's own
// gather+reduce); the summation order per element is unchanged. Deterministic: no atomics.
constexpr int64_t kCombineSliceVecs = 64;
template <typename Elem, typename V>
__global__ void combine_kernel(const V* __restrict__ rows, const int32_t* __restrict__ pos,
                               const float* __restrict__ weights, int64_t num_tokens, int64_t top_k,
                               int64_t num_rows, int64_t nvec, V* __restrict__ y) {
  using P = Pack<typename Elem::S, V>;
  constexpr int kBatch = 8;
  const int64_t slices = (nvec + kCombineSliceVecs - 1) / kCombineSliceVecs;
  const int64_t w_id = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t t = w_id / slices;
  if (t >= num_tokens) return;
  const int64_t v_begin = (w_id % slices) * kCombineSliceVecs;
  const int64_t v_end = v_begin + kCombineSliceVecs < nvec ? v_begin + kCombineSliceVecs : nvec;
  const int32_t* tp = pos + t * top_k;
  const float* tw = weights + t * top_k;
  for (int64_t v = v_begin + lane; v < v_end; v += 32) {
    float acc[P::N];
#pragma unroll
    for (int i = 0; i < P::N; ++i) acc[i] = 0.0f;
    for (int64_t j0 = 0; j0 < top_k; j0 += kBatch) {
      P buf[kBatch];
      float w[kBatch];
      bool ok[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {  // issue all loads of the batch first
        const int64_t j = j0 + b;
        ok[b] = false;
        if (j < top_k) {
          const int32_t r = __ldg(tp + j);
          ok[b] = r >= 0 && r < num_rows;  // dropped pairs contribute exactly 0 (even for NaN weights)
          if (ok[b]) {
            w[b] = __ldg(tw + j);
            buf[b].raw = __ldg(rows + static_cast<int64_t>(r) * nvec + v);
          }
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {  // then accumulate in choice order
        if (!ok[b]) continue;
#pragma unroll
        for (int i = 0; i < P::N; ++i) acc[i] = fmaf(w[b], Elem::load(buf[b].e[i]), acc[i]);
      }
    }
    P out;
#pragma unroll
    for (int i = 0; i < P::N; ++i) out.e[i] = Elem::store(acc[i]);
    y[t * nvec + v] = out.raw;
  }
}

ffi::Error CombineCuda(cudaStream_t stream, ffi::AnyBuffer rows, ffi::Buffer<ffi::S32> pos,
                       ffi::Buffer<ffi::F32> weights, ffi::Result<ffi::AnyBuffer> y) {
  auto pd = pos.dimensions();
  if (pd.size() != 2) return invalid("combine: pos must be rank 2 [T,k], got " + dims_str(pd));
  if (!same_dims(weights.dimensions(), pd))
    return invalid("combine: weights must be [T,k] = " + dims_str(pd) + ", got " + dims_str(weights.dimensions()));
  RowsDims d;
  if (auto err = rows_dims("combine", y->dimensions(), "output", rows.dimensions(), "rows", pd[1], &d);
      err.failure())
    return err;
  if (d.t != pd[0]) return invalid("combine: output must have T = pos.shape[0] rows");
  const ffi::DataType type = rows.element_type();
  if (!is_float_type(type) || y->element_type() != type)
    return invalid("combine: rows must be float32/bfloat16/float16 and the output of the same dtype");
  if (d.t == 0 || d.d == 0) return ffi::Error::Success();

  const size_t elem = width_of(type);
  const int64_t row_bytes = d.d * static_cast<int64_t>(elem);
  const int vb = vec_bytes(row_bytes, elem, {rows.untyped_data(), y->untyped_data()});
  const int64_t nvec = row_bytes / vb;
  const int64_t warps = d.t * cdiv(nvec, kCombineSliceVecs);
  if (cdiv(warps, kWarpsPerBlock) > INT32_MAX) return invalid("combine: too many rows for one launch");
  const int blocks = static_cast<int>(cdiv(warps, kWarpsPerBlock));
  return with_vec(vb, [&](auto vtag) -> ffi::Error {
    using V = decltype(vtag);
    return with_elem(type, [&](auto etag) -> ffi::Error {
      using Elem = decltype(etag);
      if constexpr (sizeof(V) >= sizeof(typename Elem::S)) {
        combine_kernel<Elem, V><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
            static_cast<const V*>(rows.untyped_data()), pos.typed_data(), weights.typed_data(), d.t,
            d.k, d.r, nvec, static_cast<V*>(y->untyped_data()));
        return cuda_error("combine kernel");
      } else {
        return invalid("combine: internal vector width error");
      }
    });
  });
}

// One warp per row r holding pair p (token t): drows[r] = round(w[p] * dy[t]) and
// dweights[p] = <dy[t], rows[r]> (float32, fixed-order warp reduction). dweights starts at 0
// (memset) so dropped pairs get 0; each kept pair is written by exactly one row.
template <typename Elem, typename V>
__global__ void combine_bwd_kernel(const V* __restrict__ dy, const V* __restrict__ rows,
                                   const int32_t* __restrict__ row_pair, const float* __restrict__ weights,
                                   int64_t num_rows, int64_t num_pairs, int64_t top_k, int64_t nvec,
                                   V* __restrict__ drows, float* __restrict__ dweights) {
  using P = Pack<typename Elem::S, V>;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= num_rows) return;
  const int32_t p = row_pair[r];
  V* dst = drows + r * nvec;
  if (p < 0 || p >= num_pairs) {
    const V z = zero_vec<V>();
    for (int64_t v = lane; v < nvec; v += 32) dst[v] = z;
    return;
  }
  const V* g = dy + (p / top_k) * nvec;
  const V* src = rows + r * nvec;
  const float w = weights[p];
  float dot = 0.0f;
#pragma unroll 2
  for (int64_t v = lane; v < nvec; v += 32) {
    P a, b, out;
    a.raw = __ldg(g + v);
    b.raw = __ldg(src + v);
#pragma unroll
    for (int i = 0; i < P::N; ++i) {
      const float gv = Elem::load(a.e[i]);
      out.e[i] = Elem::store(w * gv);
      dot = fmaf(gv, Elem::load(b.e[i]), dot);
    }
    dst[v] = out.raw;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(kFull, dot, o);
  if (lane == 0) dweights[p] = dot;
}

ffi::Error CombineBwdCuda(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer rows,
                          ffi::Buffer<ffi::S32> row_pair, ffi::Buffer<ffi::F32> weights,
                          ffi::Result<ffi::AnyBuffer> drows, ffi::Result<ffi::Buffer<ffi::F32>> dweights) {
  RowsDims d;
  if (auto err = combine_bwd_dims(dy.dimensions(), rows.dimensions(), row_pair.dimensions(),
                                  weights.dimensions(), drows->dimensions(), dweights->dimensions(), &d);
      err.failure())
    return err;
  const ffi::DataType type = rows.element_type();
  if (!is_float_type(type) || dy.element_type() != type || drows->element_type() != type)
    return invalid("combine_bwd: dy, rows and drows must share one float dtype");

  if (d.p > 0) {
    if (cudaError_t st = cudaMemsetAsync(dweights->typed_data(), 0, d.p * sizeof(float), stream); st != cudaSuccess)
      return ffi::Error(ffi::ErrorCode::kInternal,
                        std::string("jax_moe_ffi: combine_bwd memset: ") + cudaGetErrorString(st));
  }
  if (d.r == 0 || d.d == 0) return ffi::Error::Success();
  const size_t elem = width_of(type);
  const int64_t row_bytes = d.d * static_cast<int64_t>(elem);
  const int vb = vec_bytes(row_bytes, elem, {dy.untyped_data(), rows.untyped_data(), drows->untyped_data()});
  const int64_t nvec = row_bytes / vb;
  const int blocks = static_cast<int>(cdiv(d.r, kWarpsPerBlock));
  return with_vec(vb, [&](auto vtag) -> ffi::Error {
    using V = decltype(vtag);
    return with_elem(type, [&](auto etag) -> ffi::Error {
      using Elem = decltype(etag);
      if constexpr (sizeof(V) >= sizeof(typename Elem::S)) {
        combine_bwd_kernel<Elem, V><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
            static_cast<const V*>(dy.untyped_data()), static_cast<const V*>(rows.untyped_data()),
            row_pair.typed_data(), weights.typed_data(), d.r, d.p, d.k, nvec,
            static_cast<V*>(drows->untyped_data()), dweights->typed_data());
        return cuda_error("combine_bwd kernel");
      } else {
        return invalid("combine_bwd: internal vector width error");
      }
    });
  });
}

}  // namespace
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiDispatchPlanCuda, jax_moe_ffi::DispatchPlanCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // expert_ids [T,k]
                                  .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()  // keep [T,k] or [0]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // pos [T,k]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // row_pair [R]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // counts [E]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // group_sizes [E]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // workspace [W]
                                  .Attr<int64_t>("capacity")                // -1: none
                                  .Attr<int64_t>("align")
                                  .Attr<int64_t>("chunk"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiDispatchCuda, jax_moe_ffi::DispatchCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [T,D]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // pos [T,k]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // row_pair [R]
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   // scale [T,k] or [0]
                                  .Ret<xla::ffi::AnyBuffer>()               // rows [R,D]
                                  .Attr<int64_t>("top_k"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiCombineCuda, jax_moe_ffi::CombineCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()               // rows [R,D]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // pos [T,k]
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   // weights [T,k]
                                  .Ret<xla::ffi::AnyBuffer>(),              // y [T,D]
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiCombineBwdCuda, jax_moe_ffi::CombineBwdCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()               // dy [T,D]
                                  .Arg<xla::ffi::AnyBuffer>()               // rows [R,D]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // row_pair [R]
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   // weights [T,k]
                                  .Ret<xla::ffi::AnyBuffer>()               // drows [R,D]
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>(),  // dweights [T,k]
                              {xla::ffi::Traits::kCmdBufferCompatible});
