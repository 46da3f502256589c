// The generic half of the CUDA grouped GEMM handlers, shared by grouped_gemm.cu (plain forward / dgrad
// and wgrad) and grouped_gemm_acc.cu (out = addend + product): the setup kernel that turns device group
// sizes into CUTLASS problem arrays, one call's launch sequence, and the tile-config / dtype dispatch.
// Two translation units so that their many CUTLASS instantiations compile in parallel.
//
// Everything is in an anonymous namespace: each translation unit gets its own copy.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <string>

#include "common/ffi_helpers.h"
#include "cuda/grouped_gemm_common.cuh"
#include "cuda/grouped_gemm_kernels.cuh"
#include "xla/ffi/api/ffi.h"

namespace jax_moe_ffi {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Device-side setup: group_sizes -> per-group problem shapes, pointers, strides
// ---------------------------------------------------------------------------------------------

enum class Op { kForward, kDgrad, kWgrad };

// Per-group device arrays handed to the CUTLASS kernel (all carved out of the workspace).
template <class GemmDef>
struct GroupArrays {
  using Kernel = typename GemmDef::Kernel;
  using ElementA = typename Kernel::ElementA;
  using ElementB = typename Kernel::ElementB;
  using ElementD = typename Kernel::ElementD;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename GroupShape::UnderlyingProblemShape;

  Shape* shapes;
  const ElementA** ptr_a;
  const ElementB** ptr_b;
  const ElementA** ptr_a1 = nullptr;  // two products (LaunchOperands::a1): the second product's operands
  const ElementB** ptr_b1 = nullptr;
  ElementD** ptr_d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
};

// Group g gets rows [begin_g, end_g) from clip_group (the shared CPU/CUDA rule).
//
// clip_group is specified with a *running clipped* start (start_{g+1} = end_g). Because clipped
// sizes are >= 0, that start equals min(P_g, M) where P_g is the plain prefix sum of the
// non-negative sizes, and clip_group(P_g, size, M) clips P_g itself; so a parallel scan of
// max(size, 0) followed by clip_group gives exactly the sequential rows.
//
//   forward/dgrad: problem (m_g, N, K); A = lhs + begin*K, B = rhs + g*K*N, D = out + begin*N
//   wgrad        : problem (K, N, m_g) or (0, 0, 0) when m_g == 0 (a zero-size problem gets no
//                  tiles from the scheduler; Zero::kEmptyGroups below writes that group);
//                  A = lhs + begin*K (read as K x m_g, column-major), B = dout + begin*N,
//                  D = out + g*K*N
//
// Pick (forward / dgrad): the device-side choice between two kernels launched back to back, a 2x1
// cluster (the weight tile multicast to two CTAs computing neighbouring row tiles of one group) and the
// host's choice (1x2 or 1x1). CUTLASS's grouped scheduler rounds each group's row tiles up to the
// cluster, so the 2x1 kernel computes one zero-filled tile for every group with an odd number of
// 128-row tiles. Both setup kernels count those padded tiles from the same sizes with the same integer
// rule, so they agree; the kernel not picked gets zero rows in every group and the scheduler gives it
// no tiles (it costs a launch, a few microseconds). No host sync, fixed launch configuration.
enum class Pick { kAlways, kIfPaired, kIfUnpaired };
constexpr int64_t kPairTileRows = 128;   // the row tile of both kernels of the pair
constexpr int64_t kPairMaxPadShare = 64; // paired iff padded tiles <= 1/64 of all row tiles: on even
                                         // groups the weight multicast gained 0.7-3.2% (session 9)

//
// Zeroing (the output the GEMM does not write) is fused into the same launch: one fewer kernel per call,
// which on the H200 was a 4.5-7.6 us kernel plus a 4-6 us gap before it (benchmarks/NOTES.md, session 8).
// Block (0, 0) writes the problem arrays; every block runs the same scan of the sizes (a few hundred
// integers: cheaper than waiting for block 0) and zeroes its share:
//   Zero::kTailRows    (forward / dgrad): rows [total, M) of out, vecs_per_unit = 16-byte vectors per row;
//   Zero::kEmptyGroups (wgrad): out[g] of every group with no rows, vecs_per_unit = vectors per [K, N] block;
//                      grid (x, y): blocks with blockIdx.y == g mod gridDim.y share group g's block;
//   Zero::kNone        (accumulate form, or the second kernel of a pair): nothing.
// The regions zeroed are disjoint from those the GEMM writes, and the GEMM is launched after this kernel.
enum class Zero { kNone, kTailRows, kEmptyGroups };

// The B operands and outputs of one launch: one set, or two that share A and the group sizes (a pair:
// problems g and G + g, or 2g and 2g + 1 with JAX_MOE_FFI_PAIR_ORDER=interleave, e.g. the gate and up projections of
// the same rows), so that both run in one
// persistent launch with one tail and one setup.
//
// Two products (a1 != nullptr, forward / dgrad, copies = 1): out_g = a_g . b[0]_g + a1_g . b[1]_g in one
// accumulator (TwoProductMainloop, two_product_mainloop.cuh); problem K = round_up(K, BLK_K) + K.
template <class GemmDef>
struct LaunchOperands {
  const typename GroupArrays<GemmDef>::ElementB* b[2];
  typename GroupArrays<GemmDef>::ElementD* d[2];
  int copies;  // 1 or 2
  bool interleave = false;  // copies == 2: problem of (group slot, copy c) is 2 slot + c, else c G + slot
  const typename GroupArrays<GemmDef>::ElementA* a1 = nullptr;
};

// Whether a kernel's mainloop is a TwoProductMainloop (its Arguments carry k_each).
template <class Mainloop, class = void>
struct HasTwoProducts : std::false_type {};
template <class Mainloop>
struct HasTwoProducts<Mainloop, std::void_t<decltype(std::declval<typename Mainloop::Arguments&>().k_each)>>
    : std::true_type {};

template <class GemmDef>
__global__ void __launch_bounds__(kSetupThreads)
    SetupGroupsKernel(GroupArrays<GemmDef> arr, Op op, Pick pick, RowPart part, const int32_t* __restrict__ sizes,
                      int64_t num_groups, int64_t m, int64_t k, int64_t n,
                      const typename GroupArrays<GemmDef>::ElementA* a, LaunchOperands<GemmDef> ops,
                      Zero zero, int64_t vecs_per_unit, bool write_arrays, WgradOrder order) {
  using Arr = GroupArrays<GemmDef>;
  __shared__ int64_t warp_offsets[kSetupThreads / 32];
  __shared__ int64_t chunk_total;
  __shared__ bool chunk_empty[kSetupThreads];  // Zero::kEmptyGroups: group base + i has no rows
  __shared__ int32_t group_rows[kMaxOrderedGroups];  // ordered: every group's rows, for WgradProblemSlot
  LetDependentGridsLaunch();  // (they wait for this grid: dependent_launch.cuh)
  const bool writer = write_arrays && blockIdx.x == 0 && blockIdx.y == 0;  // uniform per block
  // ordered (wgrad): problem slots by rows (WgradProblemOrder); needs all rows first, one more scan.
  const bool ordered = writer && order != WgradOrder::kGroups && num_groups <= kMaxOrderedGroups;  // uniform per block
  if (ordered) {
    int64_t prefix = 0;
    for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
      const int64_t g = base + threadIdx.x;
      const int32_t size = g < num_groups ? sizes[g] : 0;
      const int64_t excl = BlockExclusiveSum(size > 0 ? size : 0, warp_offsets, &chunk_total);
      if (g < num_groups) {
        const GroupRows r = SplitRows(clip_group(prefix + excl, size, m), part);
        group_rows[g] = static_cast<int32_t>(r.end - r.begin);
      }
      prefix += chunk_total;
      __syncthreads();
    }
  }
  int64_t row_tiles = 0;   // sum over groups of ceil(rows / 128)    (Pick only)
  int64_t padded_tiles = 0;  // groups with an odd number of them    (Pick only)

  const int64_t ld_a = k;                              // lhs rows
  const int64_t ld_b = op == Op::kDgrad ? k : n;       // rhs[g] rows ([N,K] for dgrad) / dout rows
  const int64_t ld_d = n;                              // out rows

  int64_t carry = 0;  // prefix sum of max(size, 0) over previous chunks (same in all threads)
  for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int32_t size = g < num_groups ? sizes[g] : 0;
    const int64_t excl = BlockExclusiveSum(size > 0 ? size : 0, warp_offsets, &chunk_total);
    // part: this kernel's share of each group's rows (forward / dgrad; kAll for the wgrad).
    const GroupRows r = g < num_groups ? SplitRows(clip_group(carry + excl, size, m), part) : GroupRows{0, 0};
    const int64_t rows = r.end - r.begin;
    if (zero == Zero::kEmptyGroups) {  // uniform branch (a kernel argument)
      chunk_empty[threadIdx.x] = g < num_groups && rows == 0;
      __syncthreads();
      const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
      // This block's groups in the chunk: base + j == blockIdx.y (mod gridDim.y); one modulo per chunk.
      const int64_t gy = gridDim.y;
      for (int64_t j = ((static_cast<int64_t>(blockIdx.y) - base) % gy + gy) % gy;
           j < kSetupThreads && base + j < num_groups; j += gy) {
        if (!chunk_empty[j]) continue;
        for (int c = 0; c < ops.copies; ++c) {
          uint4* o = reinterpret_cast<uint4*>(ops.d[c]) + (base + j) * vecs_per_unit;
          for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs_per_unit;
               i += stride) {
            o[i] = make_uint4(0u, 0u, 0u, 0u);
          }
        }
      }
    }
    if (writer && g < num_groups) {
      const int64_t slot = ordered ? WgradProblemSlot(order, group_rows, num_groups, g) : g;
      for (int c = 0; c < ops.copies; ++c) {
        const int64_t p = ops.interleave ? 2 * slot + c : c * num_groups + slot;  // problem index
        arr.stride_a[p] = StrideWithLd<typename Arr::StrideA>(ld_a);
        arr.stride_b[p] = StrideWithLd<typename Arr::StrideB>(ld_b);
        arr.stride_d[p] = StrideWithLd<typename Arr::StrideD>(ld_d);
        arr.ptr_a[p] = a + r.begin * k;
        if (op == Op::kWgrad) {
          arr.shapes[p] = rows > 0 ? typename Arr::Shape(static_cast<int>(k), static_cast<int>(n),
                                                         static_cast<int>(rows))
                                   : typename Arr::Shape(0, 0, 0);
          arr.ptr_b[p] = ops.b[c] + r.begin * n;
          arr.ptr_d[p] = ops.d[c] + g * k * n;
        } else {
          // rows == 0 gives zero tiles along M: the scheduler skips the group.
          int64_t problem_k = k;
          if (ops.a1 != nullptr) {  // two products, each padded to whole k-tiles
            constexpr int64_t kTileK = cute::size<2>(typename GemmDef::ConfigT::TileShape{});
            problem_k = (k + kTileK - 1) / kTileK * kTileK + k;
            arr.ptr_a1[g] = ops.a1 + r.begin * k;
            arr.ptr_b1[g] = ops.b[1] + g * k * n;
          }
          arr.shapes[p] = typename Arr::Shape(static_cast<int>(rows), static_cast<int>(n),
                                              static_cast<int>(problem_k));
          arr.ptr_b[p] = ops.b[c] + g * k * n;
          arr.ptr_d[p] = ops.d[c] + r.begin * n;
        }
      }
    }
    carry += chunk_total;
    __syncthreads();  // everyone has read chunk_total / warp_offsets / chunk_empty before they are rewritten
    if (writer && pick != Pick::kAlways) {  // uniform branch (a kernel argument, the block index)
      const int64_t tiles = (rows + kPairTileRows - 1) / kPairTileRows;  // 0 past the last group
      BlockExclusiveSum(tiles, warp_offsets, &chunk_total);
      row_tiles += chunk_total;
      __syncthreads();
      BlockExclusiveSum(tiles & 1, warp_offsets, &chunk_total);
      padded_tiles += chunk_total;
      __syncthreads();
    }
  }
  const int64_t total = carry < m ? carry : m;
  if (zero == Zero::kTailRows) {
    const int64_t nblocks = static_cast<int64_t>(gridDim.x) * gridDim.y;
    const int64_t stride = nblocks * blockDim.x;
    const int64_t block = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
    for (int c = 0; c < ops.copies; ++c) {
      uint4* o = reinterpret_cast<uint4*>(ops.d[c]);
      for (int64_t i = total * vecs_per_unit + block * blockDim.x + threadIdx.x; i < m * vecs_per_unit;
           i += stride) {
        o[i] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  if (!writer) return;
  if (pick != Pick::kAlways) {
    const bool paired = padded_tiles * kPairMaxPadShare <= row_tiles;
    if (paired != (pick == Pick::kIfPaired)) {
      // Not this kernel: every group gets zero rows (the same thread wrote shapes[p] above).
      for (int64_t p = threadIdx.x; p < ops.copies * num_groups; p += kSetupThreads) {
        arr.shapes[p] = typename Arr::Shape(0, static_cast<int>(n), static_cast<int>(k));
      }
    }
  }
}

// JAX_MOE_FFI_SETUP_ZERO = fused (default) | separate, read once: separate launches the zeroing as a second
// kernel after the setup (the layout before session 10), for A/B runs.
bool SeparateZeroLaunch() {
  static const bool separate = [] {
    const char* v = std::getenv("JAX_MOE_FFI_SETUP_ZERO");
    return v != nullptr && std::string(v) == "separate";
  }();
  return separate;
}

struct GemmCall {
  Op op;
  const void* a;  // lhs [M,K]
  const void* b;  // rhs [G,K,N] / [G,N,K] (forward / dgrad) or dout [M,N] (wgrad)
  void* d;        // out [M,N] (forward / dgrad) or [G,K,N] (wgrad)
  const void* b2 = nullptr;  // a pair (LaunchOperands): the second B and out, same shapes and dtypes
  void* d2 = nullptr;
  const void* a2 = nullptr;  // two products summed (with b2; d2 unused): out = a . b + a2 . b2
  size_t out_elem_bytes;
  bool accumulate = false;  // out already holds the addend: D = acc + out (forward / dgrad only)
  const int32_t* sizes;
  int64_t m, k, n, g;
};

// pick: see SetupGroupsKernel; part: the rows of each group this kernel computes (SplitRows).
// write_zeros = false: the other kernel of a pair writes the rows no group covers.
// defer != nullptr: the setup kernel is queued on `stream`, the GEMM itself is left in *defer (IssueSplit).
template <class GemmDef>
ffi::Error RunGroupedGemm(cudaStream_t stream, const Workspace& ws, const GemmCall& c,
                          const DeviceInfo& dev, Pick pick = Pick::kAlways, bool write_zeros = true,
                          RowPart part = RowPart::kAll, DeferredLaunch* defer = nullptr) {
  using Kernel = typename GemmDef::Kernel;
  using Arr = GroupArrays<GemmDef>;

  constexpr bool kTwoProducts = HasTwoProducts<typename Kernel::CollectiveMainloop>::value;
  if (kTwoProducts != (c.a2 != nullptr) || (c.a2 != nullptr && (c.b2 == nullptr || c.op == Op::kWgrad))) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_moe_ffi: two-product GEMM / kernel mismatch");
  }
  const int copies = c.b2 != nullptr && c.a2 == nullptr ? 2 : 1;
  const size_t ng = static_cast<size_t>(c.g) * copies;  // problems

  typename Kernel::Arguments args;
  JMF_RETURN_IF_ERROR(GroupedArguments<Kernel>(dev, static_cast<int64_t>(ng), &args));
  // CUTLASS's workspace holds per-SM copies of the TMA descriptors that the kernel rewrites when
  // it moves to another group (its size depends only on hw_info.sm_count), or with prebuilt
  // descriptors (group_tensormaps.cuh) one set per problem.
  const size_t workspace_bytes = Kernel::get_workspace_size(args);
  WorkspaceCarver carve;
  const size_t o_shapes = carve.take(ng * sizeof(typename Arr::Shape));
  const size_t o_ptr_a = carve.take(ng * sizeof(void*));
  const size_t o_ptr_b = carve.take(ng * sizeof(void*));
  const size_t o_ptr_d = carve.take(ng * sizeof(void*));
  const size_t o_stride_a = carve.take(ng * sizeof(typename Arr::StrideA));
  const size_t o_stride_b = carve.take(ng * sizeof(typename Arr::StrideB));
  const size_t o_stride_d = carve.take(ng * sizeof(typename Arr::StrideD));
  const size_t o_ptr_a1 = kTwoProducts ? carve.take(ng * sizeof(void*)) : 0;
  const size_t o_ptr_b1 = kTwoProducts ? carve.take(ng * sizeof(void*)) : 0;
  const size_t o_workspace = carve.take(workspace_bytes);
  const size_t offset = carve.offset;

  if (offset > ws.bytes || (reinterpret_cast<uintptr_t>(ws.ptr) & 255) != 0) {
    return invalid("grouped_gemm: the workspace output has " + std::to_string(ws.bytes) +
                   " bytes (256-byte aligned needed), this call needs " + std::to_string(offset) +
                   " (G=" + std::to_string(c.g) + ", " + std::to_string(dev.sm_count) + " SMs)");
  }
  char* base = static_cast<char*>(ws.ptr);
  Arr arr;
  arr.shapes = reinterpret_cast<typename Arr::Shape*>(base + o_shapes);
  arr.ptr_a = reinterpret_cast<const typename Arr::ElementA**>(base + o_ptr_a);
  arr.ptr_b = reinterpret_cast<const typename Arr::ElementB**>(base + o_ptr_b);
  arr.ptr_d = reinterpret_cast<typename Arr::ElementD**>(base + o_ptr_d);
  arr.stride_a = reinterpret_cast<typename Arr::StrideA*>(base + o_stride_a);
  arr.stride_b = reinterpret_cast<typename Arr::StrideB*>(base + o_stride_b);
  arr.stride_d = reinterpret_cast<typename Arr::StrideD*>(base + o_stride_d);
  if (kTwoProducts) {
    arr.ptr_a1 = reinterpret_cast<const typename Arr::ElementA**>(base + o_ptr_a1);
    arr.ptr_b1 = reinterpret_cast<const typename Arr::ElementB**>(base + o_ptr_b1);
  }
  void* workspace = base + o_workspace;

  // 1. Per-group metadata, and zeros where the GEMM does not write (SetupGroupsKernel, Zero). Grid sizes
  // depend only on static shapes.
  Zero zero = Zero::kNone;
  int64_t vecs_per_unit = 0;
  dim3 grid(1, 1);
  // One block per SM: the zeroing is a grid-stride loop of 16-byte stores, and every block also scans the
  // group sizes, so more blocks mostly add launch and scan time (the tail is empty in dropless calls).
  const int64_t max_blocks = static_cast<int64_t>(dev.sm_count);
  if (c.op == Op::kWgrad) {
    zero = Zero::kEmptyGroups;
    vecs_per_unit = c.k * c.n * static_cast<int64_t>(c.out_elem_bytes) / 16;
    const int64_t gy = c.g < 65535 ? c.g : 65535;
    int64_t gx = CeilDiv(max_blocks, gy);
    const int64_t gx_max = CeilDiv(vecs_per_unit, int64_t{kSetupThreads});
    gx = gx > gx_max ? gx_max : gx;
    gx = gx < 1 ? 1 : (gx > 65535 ? 65535 : gx);
    grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  } else if (!c.accumulate && write_zeros) {
    // (accumulate: rows no group covers keep the addend already in out)
    zero = Zero::kTailRows;
    vecs_per_unit = c.n * static_cast<int64_t>(c.out_elem_bytes) / 16;
    int64_t blocks = CeilDiv(c.m * vecs_per_unit, int64_t{kSetupThreads});
    blocks = blocks > max_blocks ? max_blocks : (blocks < 1 ? 1 : blocks);
    grid = dim3(static_cast<unsigned>(blocks), 1);
  }
  const WgradOrder order = c.op == Op::kWgrad ? WgradProblemOrder() : WgradOrder::kGroups;
  const auto* a = static_cast<const typename Arr::ElementA*>(c.a);
  LaunchOperands<GemmDef> ops;
  ops.copies = copies;
  ops.interleave = copies == 2 && PairInterleaved();
  ops.b[0] = static_cast<const typename Arr::ElementB*>(c.b);
  ops.d[0] = static_cast<typename Arr::ElementD*>(c.d);
  ops.b[1] = c.b2 != nullptr ? static_cast<const typename Arr::ElementB*>(c.b2) : nullptr;
  ops.d[1] = copies == 2 ? static_cast<typename Arr::ElementD*>(c.d2) : nullptr;
  ops.a1 = static_cast<const typename Arr::ElementA*>(c.a2);
  if (SeparateZeroLaunch() && zero != Zero::kNone) {
    // A/B only (JAX_MOE_FFI_SETUP_ZERO=separate): the arrays, then the zeros, in two launches as before.
    SetupGroupsKernel<GemmDef><<<1, kSetupThreads, 0, stream>>>(arr, c.op, pick, part, c.sizes, c.g, c.m, c.k, c.n,
                                                              a, ops, Zero::kNone, 0, true, order);
    JMF_CUDA_CHECK_LAUNCH("SetupGroupsKernel launch");
    SetupGroupsKernel<GemmDef><<<grid, kSetupThreads, 0, stream>>>(arr, c.op, pick, part, c.sizes, c.g, c.m, c.k,
                                                                 c.n, a, ops, zero, vecs_per_unit, false,
                                                                 WgradOrder::kGroups);
  } else {
    SetupGroupsKernel<GemmDef><<<grid, kSetupThreads, 0, stream>>>(arr, c.op, pick, part, c.sizes, c.g, c.m, c.k,
                                                                 c.n, a, ops, zero, vecs_per_unit, true, order);
  }
  JMF_CUDA_CHECK_LAUNCH("SetupGroupsKernel launch");

  // 2. The grouped GEMM. Device-only problem shapes (host pointer = nullptr): nothing on the host
  // depends on the group sizes, and the scheduler launches the persistent grid.
  args.problem_shape = GroupShape{static_cast<int32_t>(ng), arr.shapes, nullptr};
  args.mainloop.ptr_A = arr.ptr_a;
  args.mainloop.dA = arr.stride_a;
  args.mainloop.ptr_B = arr.ptr_b;
  args.mainloop.dB = arr.stride_b;
  if constexpr (kTwoProducts) {
    args.mainloop.ptr_A1 = arr.ptr_a1;
    args.mainloop.ptr_B1 = arr.ptr_b1;
    args.mainloop.k_each = static_cast<int>(c.k);
  }
  args.epilogue.thread.alpha = 1.0f;
  if constexpr (GemmDef::kWithAddend) {
    // D = acc + C, C read from D's own rows before they are written (same tile, same CTA).
    using Epi = typename Kernel::CollectiveEpilogue;
    static_assert(std::is_same_v<typename Epi::InternalStrideC, typename Epi::InternalStrideD>);
    args.epilogue.thread.beta = 1.0f;
    args.epilogue.ptr_C = const_cast<const typename Arr::ElementD**>(arr.ptr_d);
    args.epilogue.dC = arr.stride_d;
  } else {
    args.epilogue.thread.beta = 0.0f;  // there is no C operand
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
  }
  args.epilogue.ptr_D = arr.ptr_d;
  args.epilogue.dD = arr.stride_d;
  if (c.op == Op::kWgrad) {  // the tile order (WgradSchedule): CUTLASS's along-M, unswizzled, unless asked
    const WgradScheduleChoice schedule = WgradSchedule();
    using Raster = decltype(args.scheduler.raster_order);
    args.scheduler.raster_order = schedule.along_n ? Raster::AlongN : Raster::AlongM;
    args.scheduler.max_swizzle_size = schedule.swizzle;
  }

  if (defer != nullptr) {
    *defer = [args, workspace](cudaStream_t s) {
      return LaunchCutlassKernel<Kernel>(args, workspace, s, GemmDef::ConfigT::kName);
    };
    return ffi::Error::Success();
  }
  return LaunchCutlassKernel<Kernel>(args, workspace, stream, GemmDef::ConfigT::kName);
}

// ---------------------------------------------------------------------------------------------
// Config / dtype dispatch
// ---------------------------------------------------------------------------------------------

using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;

// Environment overrides, read once (for benchmarking / tuning on the target machine; in an experiment build,
// -DJAX_MOE_FFI_FP8_EXPERIMENTS=ON, JAX_MOE_FFI_GEMM_TILES is read on every call so that one process can
// alternate the choices: run such A/B timings with XLA's command buffers off):
//   JAX_MOE_FFI_GEMM_TILES  = auto (default; also `static`) | split | pick | large | small | c1x1 | c1x2 | c2x1 |
//                             pp128 | n192 | n192all, forward and dgrad, plain and accumulate forms. auto: DefaultTiles
//                             (n192, the 128x192 tiles where 256-wide ones would run 1x1, is auto since session 43;
//                             c1x1 the old choice there); n192all: 128x192 tiles wherever N % 384 == 0 (A/B).
//                             split: the cluster split
//                             (RunSplit), opt-in: +1-3% on even groups, -1 to -6% on skewed ones (session 21,
//                             tile_ab_split_h200.md); pick: the device-side 2x1 pick, opt-in: on routed group sizes
//                             it only adds an empty launch, 0.2-0.7% of the Qwen3 layer / train step
//                             tail64: the short-tail split (RunShortTail), 128-row tiles on every row but a group's
//                             last r <= 64 rows, a 64-row ping-pong kernel on those (session 22: -1 to -4%, not auto)
//                             experiment builds also: e32 | e128 | e64s3 | e32s4 (epilogue subtiles / store stages) and
//                             persm (auto's plain 1x2 kernel with CUTLASS's per-SM TMA descriptors instead of the
//                             per-group ones built before the GEMM, group_tensormaps.cuh)
//   JAX_MOE_FFI_SECOND_LAUNCH = serial (default) | stream: a split's second kernel after the first on the caller's
//                             stream, or beside it on a side stream (ForkJoin); read per call like GEMM_TILES
//   JAX_MOE_FFI_WGRAD_TILES = coop (default since session 45) | pingpong | c2x2  wgrad (c2x2: bf16 -> bf16 only;
//                             ChooseWgradTiles); experiment builds also persm (ping-pong with CUTLASS's per-SM TMA
//                             descriptors), s4 | e64x64 | e64x128
//                             (PingpongEpiStagesConfig: other epilogue subtiles / store stages), k32 (32-deep
//                             k-tiles: Pingpong128K32Config), trim (the last k-tile's zero steps skipped:
//                             Pingpong128TrimConfig), per call
//   JAX_MOE_FFI_WGRAD_SCHEDULE = m1 (default) | m2 | m4 | m8 | n1 | n2 | n4 | n8: the wgrad's tile order
//                             (WgradSchedule)
const char* EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

enum class Tiles { kSmall, kCoopC1x1, kCoopC1x2, kCoopC2x1, kPingpong128, kCoop192, kPaired, kSplit, kShortTail,
                   kEpi32, kEpi128, kEpi64S3, kEpi32S4, kPerSmMaps };

// Host-side choice from static shapes only (the group sizes stay on the device).
Tiles AutoTiles(const GemmCall& c) {
  // Average rows per group (an upper bound, as the sizes may sum to less than M): short groups
  // waste most of a 128-row tile.
  if (c.m <= 128 * c.g) return Tiles::kSmall;
  // A 1x2 cluster needs an even number of 256-wide N tiles, else the scheduler pads a tile column.
  return CeilDiv(c.n, int64_t{256}) % 2 == 0 ? Tiles::kCoopC1x2 : Tiles::kCoopC1x1;
}

// Whether N, an odd number of 256-wide tiles, splits into an even number of whole 192-wide ones (768, 2304, ...).
bool Splits192(const GemmCall& c) { return c.n % 384 == 0 && CeilDiv(c.n, int64_t{256}) % 2 == 1; }

// The default (auto): AutoTiles, but 128x192 tiles on a 1x2 cluster where AutoTiles would run the 1x1 cluster and N
// splits into 192-wide pairs. Why: the 1x1 kernel gets no A multicast, and at the Qwen3 layer's N = 768 (the gate/up
// pair forward and the down dgrad) it ran 18% slower than the 192-wide tiles on an H100 (session 43: the layer's
// forward 1895 -> 1550 us of kernels, forward+backward 4783 -> 4400 us; the train step 0.4-1.1 ms faster in three
// alternating pairs); on the H200 the pair forward 716-731 -> 645 us and the down dgrad 369-374 -> 334 us (session 43
// against sessions 11-14's profiles; the layer ~1.5% faster in session 6's same-call A/B). Same k-order
// per output element, so the same bits as the 256-wide tiles (gate_up_pair.py's bitwise_first). bf16 -> bf16 only
// (RunForwardLike); JAX_MOE_FFI_GEMM_TILES=c1x1 gives the previous choice.
Tiles DefaultTiles(const GemmCall& c) {
  const Tiles t = AutoTiles(c);
  return t == Tiles::kCoopC1x1 && Splits192(c) ? Tiles::kCoop192 : t;
}

// Once per process, on stderr: an override that is not taken as given (no silent fallback).
void SayOnce(bool* said, const char* msg) {
  if (!*said) {
    *said = true;
    std::fprintf(stderr, "jax_moe_ffi: %s\n", msg);
  }
}

Tiles ChooseTiles(const GemmCall& c) {
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
  const std::string choice = EnvOr("JAX_MOE_FFI_GEMM_TILES", "auto");
#else
  static const std::string choice = EnvOr("JAX_MOE_FFI_GEMM_TILES", "auto");
#endif
  static bool said_unknown = false;
  if (choice == "split") {
    // 128-row tiles: 2x1 on each group's pairs of row tiles, the host's cluster on odd last tiles (RunSplit).
    return AutoTiles(c) == Tiles::kSmall ? Tiles::kSmall : Tiles::kSplit;
  }
  if (choice == "tail64") {
    // 128-row tiles on each group's rows but a last partial tile of <= 64 rows, 64-row tiles on that (RunShortTail).
    return AutoTiles(c) == Tiles::kSmall ? Tiles::kSmall : Tiles::kShortTail;
  }
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
  if (choice == "persm") {
    // auto's plain 1x2 kernel with CUTLASS's per-SM TMA descriptors (auto's are prebuilt per group)
    const Tiles t = AutoTiles(c);
    return t == Tiles::kCoopC1x2 ? Tiles::kPerSmMaps : t;
  }
  if (choice == "e32" || choice == "e128" || choice == "e64s3" || choice == "e32s4") {
    // auto's plain 1x2 tile with CUTLASS's 128 x 32 / 128 x 128 subtiles, or with 3 / 4 store stages (EpilogueFor)
    const Tiles t = AutoTiles(c);
    if (t != Tiles::kCoopC1x2) return t;
    return choice == "e32" ? Tiles::kEpi32 : choice == "e128" ? Tiles::kEpi128
         : choice == "e64s3" ? Tiles::kEpi64S3 : Tiles::kEpi32S4;
  }
#endif
  if (choice == "pick") {
    // 128-row tiles: the device picks 2x1 or the host's cluster (RunPaired); bf16 -> bf16 only.
    return AutoTiles(c) == Tiles::kSmall ? Tiles::kSmall : Tiles::kPaired;
  }
  if (choice == "small") return Tiles::kSmall;
  if (choice == "c1x1") return Tiles::kCoopC1x1;
  if (choice == "c1x2") return Tiles::kCoopC1x2;
  if (choice == "c2x1") return Tiles::kCoopC2x1;
  if (choice == "pp128") return Tiles::kPingpong128;
  if (choice == "n192all") {
    // 128x192 tiles on a 1x2 cluster wherever N is an even number of 192-wide tiles (1536, 3072, ...), not only where
    // the default takes them; A/B only (session 43: on the H200 the N = 768 pair forward with these tiles ran at
    // ~640 TFLOP/s in the layer profile, the N = 1536 table case at ~578 with 128x256 tiles). Session 44, H100: no faster
    // (qwen3 gate_up forward 594 / 575 against 613 / 599 TFLOP/s, grouped_gemm_tiles_s44_*_h100.md); H200 not yet timed.
    const Tiles t = DefaultTiles(c);
    return (t == Tiles::kCoopC1x2 || t == Tiles::kCoopC1x1) && c.n % 384 == 0 ? Tiles::kCoop192 : t;
  }
  if (choice == "large") {
    const Tiles t = DefaultTiles(c);
    return t == Tiles::kSmall ? Tiles::kCoopC1x2 : t;
  }
  // "static": another name for auto, the host's choice (what session-9 results call it); "n192" (the 128x192 tiles
  // where they fit, opt-in in sessions 6-42) is auto since session 43.
  if (choice != "auto" && choice != "static" && choice != "n192") {
    SayOnce(&said_unknown, "JAX_MOE_FFI_GEMM_TILES must be auto|static|split|tail64|pick|large|small|c1x1|c1x2|c2x1|"
                           "pp128|n192|n192all; unknown value ignored, using auto");
  }
  return DefaultTiles(c);
}

bool said_ab_dtype = false;  // one message for every dtype / layout instantiation below
bool said_192_dtype = false;  // likewise for the default's 192-wide tiles

enum class WgradTiles {
  kPingpong, kCoop, kPingpongC2x2, kPingpongPerSmMaps, kEpi64S4, kEpi64x64, kEpi64x128, kK32, kTrim
};

// The wgrad's tiles. Default (session 45): cooperative 128x256x64 on a 2x1 cluster, what torch._grouped_mm runs.
// On an H100 (wgrad pass alone, ping-pong then coop, two alternating rounds, grouped_gemm_wgrad_all_s45_*_h100.md):
// +3 to +21% on the large-K shapes (deepseek-v3 gate_up 565 -> 616 / 629 TFLOP/s, qwen3-235b 551-576 -> 634-689,
// deepseek-v3 down +3-5%), +3 to +28% on every skewed row, within -3 / +2% on the even qwen3-30b rows; the Qwen3
// train step -1.4 / -2.4% (dropless) and -1.1 / -1.6% (exact) in two alternating pairs (train_step_s45_wgrad_*_h100.md).
// The ping-pong kernel (the default before) hides one warp group's epilogue behind the other's mainloop; the
// cooperative tile's 256-wide N side reads half the lhs per output element, which (likely; not profiled) wins once a
// group's rows (the contraction) are more than a few hundred, and on skewed sizes, where most rows sit in long groups.
// Not yet timed on an H200 (session 10's Qwen3 layer A/B there: within noise, 4.764 vs 4.733 ms).
WgradTiles ChooseWgradTiles() {
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
  const std::string choice = EnvOr("JAX_MOE_FFI_WGRAD_TILES", "coop");  // per call (A/B in one process)
  if (choice == "persm") return WgradTiles::kPingpongPerSmMaps;
  if (choice == "s4") return WgradTiles::kEpi64S4;
  if (choice == "e64x64") return WgradTiles::kEpi64x64;
  if (choice == "e64x128") return WgradTiles::kEpi64x128;
  if (choice == "k32") return WgradTiles::kK32;
  if (choice == "trim") return WgradTiles::kTrim;
#else
  static const std::string choice = EnvOr("JAX_MOE_FFI_WGRAD_TILES", "coop");
#endif
  static bool said = false;
  if (choice == "pingpong") return WgradTiles::kPingpong;
  if (choice == "c2x2") return WgradTiles::kPingpongC2x2;
  if (choice != "coop") {
    SayOnce(&said, "JAX_MOE_FFI_WGRAD_TILES must be coop|pingpong|c2x2; unknown value ignored, using coop");
  }
  return WgradTiles::kCoop;
}

// The pair: the host's 128-row choice (1x2 or 1x1 cluster) and the 2x1 cluster, launched back to back;
// each one's setup kernel decides from the device sizes whether it runs (SetupGroupsKernel, Pick). Each
// gets half of the workspace.
template <bool Acc, class TIn, class TOut, class LayoutB>
ffi::Error RunPaired(cudaStream_t stream, const Workspace& ws, const GemmCall& c, const DeviceInfo& dev) {
  const auto [first, second] = HalveWorkspace(ws);
  ffi::Error err = AutoTiles(c) == Tiles::kCoopC1x1
      ? RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<1, 1>, Acc>>(
            stream, first, c, dev, Pick::kIfUnpaired, /*write_zeros=*/true)
      : RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<1, 2>, Acc>>(
            stream, first, c, dev, Pick::kIfUnpaired, /*write_zeros=*/true);
  if (err.failure()) return err;
  return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<2, 1>, Acc>>(
      stream, second, c, dev, Pick::kIfPaired, /*write_zeros=*/false);
}

// Auto's 1x2 kernel: 128 x 64 epilogue subtiles for the plain forward / dgrad (CoopEpiConfig), CUTLASS's 128 x 32 for
// the accumulate form (its C operand's staging was not measured with wider subtiles).
template <bool Acc>
using AutoC1x2 = std::conditional_t<Acc, CoopConfig<1, 2>, CoopEpiConfig<64>>;

// Two kernels on parts of each group's rows (SplitRows), each with half of the workspace: both setup kernels are
// queued first, then the two GEMMs (IssueSplit). The first kernel zeroes the rows past the total.
template <class FirstDef, class SecondDef>
ffi::Error RunRowSplit(cudaStream_t stream, const Workspace& ws, const GemmCall& c, const DeviceInfo& dev,
                       RowPart first_part, RowPart second_part) {
  const auto [first_ws, second_ws] = HalveWorkspace(ws);
  DeferredLaunch first, second;
  JMF_RETURN_IF_ERROR(RunGroupedGemm<FirstDef>(stream, first_ws, c, dev, Pick::kAlways, /*write_zeros=*/true,
                                               first_part, &first));
  JMF_RETURN_IF_ERROR(RunGroupedGemm<SecondDef>(stream, second_ws, c, dev, Pick::kAlways, /*write_zeros=*/false,
                                                second_part, &second));
  return IssueSplit(stream, SecondLaunchBeside(), first, second);
}

// The cluster split (SplitRows; JAX_MOE_FFI_GEMM_TILES=split, opt-in): the 2x1 kernel on each group's whole pairs
// of 128-row tiles, the host's 128-row choice (1x2 or 1x1 cluster) on the last tile of each group with an odd
// count. With even tile counts the second launch gets no rows (a few us). Bitwise the host's kernel alone; measured
// (serial) +1-3% on even groups and -1 to -6% on skewed ones, where the second launch's own tail costs more than the
// multicast saves (session 21).
template <bool Acc, class TIn, class TOut, class LayoutB>
ffi::Error RunSplit(cudaStream_t stream, const Workspace& ws, const GemmCall& c, const DeviceInfo& dev) {
  using Pairs = GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<2, 1>, Acc>;
  return AutoTiles(c) == Tiles::kCoopC1x1
      ? RunRowSplit<Pairs, GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<1, 1>, Acc>>(
            stream, ws, c, dev, RowPart::kTilePairs, RowPart::kOddTile)
      : RunRowSplit<Pairs, GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<1, 2>, Acc>>(
            stream, ws, c, dev, RowPart::kTilePairs, RowPart::kOddTile);
}

// The short-tail split (SplitRows; JAX_MOE_FFI_GEMM_TILES=tail64): the host's 128-row choice on every row but a
// group's last r <= 64 rows, the 64-row ping-pong kernel (auto's kernel for short groups) on those. Both kernels
// accumulate each output element over K in the same order of 16-deep wgmma steps.
template <bool Acc, class TIn, class TOut, class LayoutB>
ffi::Error RunShortTail(cudaStream_t stream, const Workspace& ws, const GemmCall& c, const DeviceInfo& dev) {
  using Tail = GroupedGemm<TIn, TOut, RowMajor, LayoutB, PingpongConfig, Acc>;
  return AutoTiles(c) == Tiles::kCoopC1x1
      ? RunRowSplit<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<1, 1>, Acc>, Tail>(
            stream, ws, c, dev, RowPart::kLongTiles, RowPart::kShortTail)
      : RunRowSplit<GroupedGemm<TIn, TOut, RowMajor, LayoutB, AutoC1x2<Acc>, Acc>, Tail>(
            stream, ws, c, dev, RowPart::kLongTiles, RowPart::kShortTail);
}

// Forward (B row-major) or dgrad (B column-major) with the chosen tiles. The 2x1 kernels (c2x1, pick, split), the
// A/B-only pp128 and the default's 192-wide tiles are compiled for bf16 -> bf16 only, to bound the build time; other
// dtypes say so once and use AutoTiles' choice. The compile check (BF16_ONLY) has none of them.
template <bool Acc, class TIn, class TOut, class LayoutB>
ffi::Error RunForwardLike(cudaStream_t stream, const Workspace& ws, const GemmCall& c,
                          const DeviceInfo& dev) {
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  constexpr bool kAbConfigs = false;
#else
  constexpr bool kAbConfigs =
      std::is_same_v<TIn, cutlass::bfloat16_t> && std::is_same_v<TOut, cutlass::bfloat16_t>;
#endif
  Tiles tiles = ChooseTiles(c);
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  // The compile check (CI) builds AutoTiles' kernels only (the same templates as the 2x1 / A/B / 192-wide ones); it is
  // never run, so the 192-wide tiles (the default's, n192all's) become AutoTiles' choice there.
  if (tiles == Tiles::kCoop192) tiles = AutoTiles(c);
  if (tiles != Tiles::kSmall && tiles != Tiles::kCoopC1x1 && tiles != Tiles::kCoopC1x2 && tiles != Tiles::kShortTail) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_moe_ffi: this CUDA library was built with JAX_MOE_FFI_CUDA_BF16_ONLY (a compile check): "
                      "JAX_MOE_FFI_GEMM_TILES=c2x1/pp128/pick/split are not in it; rebuild without it");
  }
#endif
  if constexpr (kAbConfigs) {
    if (tiles == Tiles::kPaired) return RunPaired<Acc, TIn, TOut, LayoutB>(stream, ws, c, dev);
    if (tiles == Tiles::kSplit) return RunSplit<Acc, TIn, TOut, LayoutB>(stream, ws, c, dev);
    if (tiles == Tiles::kCoopC2x1)
      return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<2, 1>, Acc>>(
          stream, ws, c, dev);
    if (tiles == Tiles::kPingpong128)
      return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, Pingpong128Config<1, 2>, Acc>>(
          stream, ws, c, dev);
    if (tiles == Tiles::kCoop192)
      return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, Coop192Config, Acc>>(
          stream, ws, c, dev);
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
    if constexpr (!Acc) {
      if (tiles == Tiles::kEpi32)
        return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<1, 2>>>(stream, ws, c, dev);
      if (tiles == Tiles::kEpi128)
        return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopEpiConfig<128>>>(stream, ws, c, dev);
      if (tiles == Tiles::kEpi64S3)
        return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopEpiStagesConfig<64, 3>>>(stream, ws, c, dev);
      if (tiles == Tiles::kEpi32S4)
        return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopEpiStagesConfig<32, 4>>>(stream, ws, c, dev);
      if (tiles == Tiles::kPerSmMaps)
        return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, PerSmMaps<CoopEpiConfig<64>>>>(stream, ws, c, dev);
    }
#endif
  } else {
    // The 2x1 kernels (also those of the pick) and the 192-wide ones are compiled for bf16 -> bf16 only (build time).
    if (tiles == Tiles::kCoop192) {
      SayOnce(&said_192_dtype, "the 128x192 tiles (the default where N is an odd number of 256-wide tiles, e.g. 768) are "
                         "compiled for bf16 -> bf16 only; other dtypes run the 128x256 tiles there");
      tiles = AutoTiles(c);
    }
    if (tiles == Tiles::kCoopC2x1 || tiles == Tiles::kPingpong128 || tiles == Tiles::kPaired ||
        tiles == Tiles::kSplit) {
      SayOnce(&said_ab_dtype, "JAX_MOE_FFI_GEMM_TILES=c2x1/pp128/pick/split is compiled for bf16 -> bf16 only; "
                              "other dtypes use the automatic tile choice");
      tiles = AutoTiles(c);
    }
  }
  switch (tiles) {
    case Tiles::kEpi32:
    case Tiles::kEpi128:
    case Tiles::kEpi64S3:
    case Tiles::kEpi32S4:
    case Tiles::kPerSmMaps:  // (the experiment kernels above are plain bf16 -> bf16 only)
      SayOnce(&said_ab_dtype, "JAX_MOE_FFI_GEMM_TILES=e32/e128/e64s3/e32s4/persm (experiment) is compiled for the plain bf16 -> bf16 "
                              "forward / dgrad only; this call uses the automatic tile choice");
      return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, AutoC1x2<Acc>, Acc>>(stream, ws, c, dev);
    case Tiles::kShortTail:  // the automatic choice's kernels, so every dtype and build has it
      return RunShortTail<Acc, TIn, TOut, LayoutB>(stream, ws, c, dev);
    case Tiles::kSmall:
      return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, PingpongConfig, Acc>>(
          stream, ws, c, dev);
    case Tiles::kCoopC1x1:
      return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, CoopConfig<1, 1>, Acc>>(
          stream, ws, c, dev);
    default:
      return RunGroupedGemm<GroupedGemm<TIn, TOut, RowMajor, LayoutB, AutoC1x2<Acc>, Acc>>(stream, ws, c, dev);
  }
}

// Acc: the accumulate form (D = acc + C); each translation unit instantiates one value, so the plain
// kernels compile in grouped_gemm.cu and the accumulate ones in grouped_gemm_acc.cu.
template <bool Acc, class TIn, class TOut>
ffi::Error DispatchOp(cudaStream_t stream, const Workspace& ws, const GemmCall& c,
                      const DeviceInfo& dev) {
  if (c.accumulate != Acc) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_moe_ffi: grouped GEMM accumulate flag mismatch");
  }
  switch (c.op) {
    case Op::kForward:
      return RunForwardLike<Acc, TIn, TOut, RowMajor>(stream, ws, c, dev);
    case Op::kDgrad:
      return RunForwardLike<Acc, TIn, TOut, ColMajor>(stream, ws, c, dev);
    case Op::kWgrad:
      if constexpr (!Acc) {
        const WgradTiles wt = ChooseWgradTiles();
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
        // The compile check (CI): the default wgrad tiles only.
        if (wt != WgradTiles::kCoop) {
          return ffi::Error(ffi::ErrorCode::kUnimplemented,
                            "jax_moe_ffi: this CUDA library was built with JAX_MOE_FFI_CUDA_BF16_ONLY (a compile "
                            "check): JAX_MOE_FFI_WGRAD_TILES=pingpong/c2x2 are not in it; rebuild without it");
        }
#else
        if (wt == WgradTiles::kPingpong)
          return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, Pingpong128Config<2, 1>>>(
              stream, ws, c, dev);
        if constexpr (std::is_same_v<TIn, cutlass::bfloat16_t> && std::is_same_v<TOut, cutlass::bfloat16_t>) {
          if (wt == WgradTiles::kPingpongC2x2)
            return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, Pingpong128Config<2, 2>>>(
                stream, ws, c, dev);
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
          if (wt == WgradTiles::kPingpongPerSmMaps)
            return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, PerSmMaps<Pingpong128Config<2, 1>>>>(
                stream, ws, c, dev);
          if (wt == WgradTiles::kEpi64S4)
            return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, PingpongEpiStagesConfig<64, 32, 4>>>(
                stream, ws, c, dev);
          if (wt == WgradTiles::kEpi64x64)
            return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, PingpongEpiStagesConfig<64, 64, 2>>>(
                stream, ws, c, dev);
          if (wt == WgradTiles::kEpi64x128)
            return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, PingpongEpiStagesConfig<64, 128, 2>>>(
                stream, ws, c, dev);
          if (wt == WgradTiles::kK32)
            return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, Pingpong128K32Config>>(stream, ws, c, dev);
          if (wt == WgradTiles::kTrim)
            return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, Pingpong128TrimConfig>>(stream, ws, c,
                                                                                                      dev);
#endif
        } else if (wt == WgradTiles::kPingpongC2x2) {
          SayOnce(&said_ab_dtype, "JAX_MOE_FFI_WGRAD_TILES=c2x2 is compiled for bf16 -> bf16 only; "
                                  "other dtypes use the default wgrad tiles");
        }
#endif
        return RunGroupedGemm<GroupedGemm<TIn, TOut, ColMajor, RowMajor, CoopConfig<2, 1>>>(stream, ws, c, dev);
      }
      break;  // no accumulate form of the wgrad
  }
  return ffi::Error(ffi::ErrorCode::kInternal, "jax_moe_ffi: unknown grouped GEMM op");
}

template <bool Acc>
ffi::Error DispatchTypes(ffi::DataType in_t, ffi::DataType out_t, cudaStream_t stream,
                         const Workspace& ws, const GemmCall& c,
                         const DeviceInfo& dev) {
  using BF16 = cutlass::bfloat16_t;
  using F16 = cutlass::half_t;
  const bool f32_out = out_t == ffi::DataType::F32;
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  // A compile-check build (CI): every kernel template, instantiated for bf16 -> bf16 only.
  (void)sizeof(F16);
  if (in_t != ffi::DataType::BF16 || f32_out) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_moe_ffi: this CUDA library was built with JAX_MOE_FFI_CUDA_BF16_ONLY (a compile check): "
                      "bf16 -> bf16 grouped GEMMs only; rebuild without it");
  }
  return DispatchOp<Acc, BF16, BF16>(stream, ws, c, dev);
#else
  if (in_t == ffi::DataType::BF16) {
    return f32_out ? DispatchOp<Acc, BF16, float>(stream, ws, c, dev)
                   : DispatchOp<Acc, BF16, BF16>(stream, ws, c, dev);
  }
  return f32_out ? DispatchOp<Acc, F16, float>(stream, ws, c, dev)
                 : DispatchOp<Acc, F16, F16>(stream, ws, c, dev);
#endif
}

// Shared dtype rules: operands both bf16 or both f16; out = input dtype or f32.
ffi::Error CheckDtypes(const char* op, const char* a_name, ffi::DataType a_t, const char* b_name,
                       ffi::DataType b_t, ffi::DataType out_t) {
  if (!IsHalfType(a_t) || b_t != a_t) {
    return invalid(std::string(op) + ": " + a_name + " and " + b_name +
                   " must both be bf16 or both f16, got " + a_name + " " + DtypeName(a_t) +
                   " and " + b_name + " " + DtypeName(b_t));
  }
  if (out_t != a_t && out_t != ffi::DataType::F32) {
    return invalid(std::string(op) + ": out dtype must be " + DtypeName(a_t) +
                   " (the input dtype) or f32, got " + DtypeName(out_t));
  }
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------------------
// Handler bodies
// ---------------------------------------------------------------------------------------------

// The forward / dgrad handler body. Acc = true: out = addend + product (addend != nullptr; XLA aliases
// it to out, else it is copied there first), rows no group covers keep the addend.
// rhs2 / out2 (plain form only): a pair, the second product lhs . rhs2 in the same launch (LaunchOperands).
template <bool Acc>
ffi::Error RunForwardOrDgrad(const char* op, cudaStream_t stream, ffi::AnyBuffer lhs,
                             ffi::AnyBuffer rhs, ffi::Buffer<ffi::DataType::S32> group_sizes,
                             const ffi::AnyBuffer* addend, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> workspace, bool transpose_rhs,
                             const ffi::AnyBuffer* rhs2 = nullptr, ffi::AnyBuffer* out2 = nullptr) {
  const std::string name(op);
  const Workspace ws{workspace->untyped_data(), workspace->size_bytes()};
  GroupedGemmDims d;
  JMF_RETURN_IF_ERROR(grouped_gemm_dims(lhs, rhs, group_sizes, transpose_rhs, &d));
  JMF_RETURN_IF_ERROR(CheckDtypes(op, "lhs", lhs.element_type(), "rhs",
                                  rhs.element_type(), out->element_type()));
  auto od = out->dimensions();
  if (od.size() != 2 || od[0] != d.m || od[1] != d.n) {
    return invalid(name + ": out must be [M,N] = [" + std::to_string(d.m) + "," +
                   std::to_string(d.n) + "], got " + dims_str(od));
  }
  // TMA needs 16-byte aligned rows: every contiguous GEMM dimension must be a multiple of 8.
  if (d.k % 8 != 0 || d.n % 8 != 0) {
    return invalid(name + ": K and N must be a multiple of 8 (16-byte aligned rows for TMA)"
                   " on CUDA, got K=" + std::to_string(d.k) + " N=" + std::to_string(d.n));
  }
  if (d.m > kInt32Max || d.k > kInt32Max || d.n > kInt32Max || d.g > kInt32Max) {
    return invalid(name + ": M, K, N and G must each be < 2^31 on CUDA, got M=" +
                   std::to_string(d.m) + " K=" + std::to_string(d.k) + " N=" +
                   std::to_string(d.n) + " G=" + std::to_string(d.g));
  }
  if constexpr (Acc) {
    JMF_RETURN_IF_ERROR(check_addend(op, *addend, d.m, d.n, out->element_type()));
  }
  const bool pair = rhs2 != nullptr;
  if (pair) {
    if (Acc || out2 == nullptr) return ffi::Error(ffi::ErrorCode::kInternal, name + ": pair misuse");
    if (rhs2->element_type() != rhs.element_type() || dims_str(rhs2->dimensions()) != dims_str(rhs.dimensions())) {
      return invalid(name + ": rhs1 must have rhs0's shape and dtype, got " + dims_str(rhs.dimensions()) + " " +
                     DtypeName(rhs.element_type()) + " and " + dims_str(rhs2->dimensions()) + " " +
                     DtypeName(rhs2->element_type()));
    }
    if (out2->element_type() != out->element_type() || dims_str(out2->dimensions()) != dims_str(od)) {
      return invalid(name + ": out1 must have out0's shape and dtype");
    }
    if (2 * d.g > kInt32Max) return invalid(name + ": 2G problems must be < 2^31, got G=" + std::to_string(d.g));
  }
  if (d.m == 0 || d.n == 0) return ffi::Error::Success();  // empty output
  if constexpr (Acc) {
    if (addend->untyped_data() != out->untyped_data()) {
      JMF_CUDA_CHECK(cudaMemcpyAsync(out->untyped_data(), addend->untyped_data(), out->size_bytes(),
                                     cudaMemcpyDeviceToDevice, stream));
    }
  }
  if (d.g == 0 || d.k == 0) {
    // No group has a non-empty product: the whole output is zero (or the addend).
    if (!Acc) JMF_CUDA_CHECK(cudaMemsetAsync(out->untyped_data(), 0, out->size_bytes(), stream));
    if (pair) JMF_CUDA_CHECK(cudaMemsetAsync(out2->untyped_data(), 0, out2->size_bytes(), stream));
    return ffi::Error::Success();
  }
  if (!Aligned16(lhs.untyped_data()) || !Aligned16(rhs.untyped_data()) ||
      !Aligned16(out->untyped_data()) ||
      (pair && (!Aligned16(rhs2->untyped_data()) || !Aligned16(out2->untyped_data())))) {
    return invalid(name + ": lhs, rhs and out must be 16-byte aligned on CUDA");
  }
  DeviceInfo dev;
  JMF_RETURN_IF_ERROR(GetDeviceInfo(&dev));
  GemmCall c;
  c.op = transpose_rhs ? Op::kDgrad : Op::kForward;
  c.a = lhs.untyped_data();
  c.b = rhs.untyped_data();
  c.d = out->untyped_data();
  if (pair) {
    c.b2 = rhs2->untyped_data();
    c.d2 = out2->untyped_data();
  }
  c.out_elem_bytes = ffi::ByteWidth(out->element_type());
  c.accumulate = Acc;
  c.sizes = group_sizes.typed_data();
  c.m = d.m;
  c.k = d.k;
  c.n = d.n;
  c.g = d.g;
  return DispatchTypes<Acc>(lhs.element_type(), out->element_type(), stream, ws, c, dev);
}

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi
