// CUDA (SM90a / Hopper) blockwise-scaled FP8 grouped GEMM (the DeepSeek-V3 recipe) for jax_moe_ffi.
//
//   JaxMoeFfiGroupedGemmFp8Cuda -> target "jax_moe_ffi_grouped_gemm_fp8"
//     out[r, :] = sum_kb (lhs[r, kb] . rhs[g]^T[kb]) * lhs_scale[r, kb] * rhs_scale[g, kb, n / 128]
//     lhs [M,K] f8e4m3fn|f8e5m2, lhs_scale [M, ceil(K/128)] f32 (1 x 128 blocks along K),
//     rhs [G,N,K] f8e4m3fn (K contiguous), rhs_scale [G, ceil(K/128), ceil(N/128)] f32 (128 x 128),
//     group_sizes [G] s32; out [M,N] bf16, rows at/after the clipped total are zero.
//   The forward passes the weight [G,K,N] quantised in 128 x 128 tiles as its FP8 transpose [G,N,K]
//   with the scales as they are; the dgrad passes the weight data as it is ([G,K,N] is [N', K'] for
//   the GEMM out[M,K] = dout[M,N] . W^T) with the scales' last two axes swapped.
//
//   JaxMoeFfiGroupedGemmFp8AccCuda -> target "jax_moe_ffi_grouped_gemm_fp8_acc"
//     the same product plus addend [M,N] bf16, summed in float32 in the epilogue and rounded once; rows no group
//     covers keep the addend (XLA aliases out to addend). The lhs gradient of a gate / up pair: the second dgrad
//     adds the first in its epilogue instead of an elementwise add over [M, N] afterwards (session 25's FP8 step
//     profile: 0.75 ms of such adds a step).
// One call, all on XLA's stream, no host synchronisation (group sizes stay on the GPU):
//   1. a one-block setup kernel: per-group problem shapes, pointers, strides, scale pointers, and
//      the row range of each group;
//   2. a repack kernel copies lhs_scale into CUTLASS's per-group layout: group g's scales as a
//      [K/128, m_g] block (rows contiguous) at offset begin_g * K/128 of a workspace buffer (the
//      SM90 blockwise mainloop derives the scale layout from the group's own M);
//   3. a zero kernel for rows no group covers;
//   4. one CUTLASS pointer-array FP8 blockwise-scaled kernel.
// Command-buffer compatible: the workspace is an XLA-owned output.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/ffi_helpers.h"
#include "cuda/grouped_gemm_common.cuh"
#include "cuda/grouped_gemm_kernels.cuh"
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
#include "cuda/experiments/fp8_ceiling.cuh"
#endif
#include "xla/ffi/api/ffi.h"

#define JMF_EXPORT extern "C" __attribute__((visibility("default")))
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmFp8Cuda(XLA_FFI_CallFrame* call_frame);
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmFp8WgradCuda(XLA_FFI_CallFrame* call_frame);
JMF_EXPORT XLA_FFI_Error* JaxMoeFfiGroupedGemmFp8AccCuda(XLA_FFI_CallFrame* call_frame);

namespace jax_moe_ffi {
namespace cuda {
namespace {

constexpr int64_t kScaleBlock = 128;

template <class GemmDef>
struct Fp8GroupArrays {
  using Kernel = typename GemmDef::Kernel;
  using ElementA = typename Kernel::ElementA;
  using ElementB = typename Kernel::ElementB;
  using ElementD = typename Kernel::ElementD;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using LayoutSFA = typename GemmDef::LayoutSFA;
  using LayoutSFB = typename GemmDef::LayoutSFB;
  using Shape = typename GroupShape::UnderlyingProblemShape;

  Shape* shapes;
  const ElementA** ptr_a;
  const ElementB** ptr_b;
  ElementD** ptr_d;
  const float** ptr_sfa;
  const float** ptr_sfb;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  LayoutSFA* layout_sfa;
  LayoutSFB* layout_sfb;
  int64_t* ends;   // clipped end row of each group (non-decreasing; empty groups: end == begin)
  int64_t* total;  // clipped total rows
  float* sfa;      // repacked lhs scales, M * K/128 floats
};

// One block (see grouped_gemm.cu's SetupGroupsKernel for why a parallel scan of max(size, 0)
// followed by clip_group reproduces the sequential clipping rule).
template <class GemmDef>
__global__ void __launch_bounds__(kSetupThreads)
    Fp8SetupGroupsKernel(Fp8GroupArrays<GemmDef> arr, const int32_t* __restrict__ sizes,
                         int64_t num_groups, int64_t m, int64_t k, int64_t n,
                         const typename Fp8GroupArrays<GemmDef>::ElementA* a,
                         const typename Fp8GroupArrays<GemmDef>::ElementB* b,
                         const float* rhs_scale,
                         typename Fp8GroupArrays<GemmDef>::ElementD* d, RowPart part) {
  using Arr = Fp8GroupArrays<GemmDef>;
  __shared__ int64_t warp_offsets[kSetupThreads / 32];
  __shared__ int64_t chunk_total;
  LetDependentGridsLaunch();  // (they wait for this grid: dependent_launch.cuh)
  const int64_t kb = (k + kScaleBlock - 1) / kScaleBlock;
  const int64_t nb = (n + kScaleBlock - 1) / kScaleBlock;
  int64_t carry = 0;
  for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int32_t size = g < num_groups ? sizes[g] : 0;
    const int64_t excl = BlockExclusiveSum(size > 0 ? size : 0, warp_offsets, &chunk_total);
    if (g < num_groups) {
      const GroupRows whole = clip_group(carry + excl, size, m);
      arr.ends[g] = whole.end;  // the whole group's (RepackScalesKernel finds groups by them)
      const GroupRows r = SplitRows(whole, part);  // this kernel's rows of the group
      const int64_t rows = r.end - r.begin;
      arr.shapes[g] = typename Arr::Shape(static_cast<int>(rows), static_cast<int>(n),
                                          static_cast<int>(k));
      arr.ptr_a[g] = a + r.begin * k;
      arr.ptr_b[g] = b + g * n * k;
      arr.ptr_d[g] = d + r.begin * n;
      arr.ptr_sfa[g] = arr.sfa + r.begin * kb;
      arr.ptr_sfb[g] = rhs_scale + g * kb * nb;
      arr.stride_a[g] = StrideWithLd<typename Arr::StrideA>(k);
      arr.stride_b[g] = StrideWithLd<typename Arr::StrideB>(k);
      arr.stride_d[g] = StrideWithLd<typename Arr::StrideD>(n);
      const auto mnk = cute::make_shape(static_cast<int>(rows > 0 ? rows : 1), static_cast<int>(n),
                                        static_cast<int>(k), 1);
      arr.layout_sfa[g] = GemmDef::ScaleConfig::tile_atom_to_shape_SFA(mnk);
      arr.layout_sfb[g] = GemmDef::ScaleConfig::tile_atom_to_shape_SFB(mnk);
    }
    carry += chunk_total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *arr.total = carry < m ? carry : m;
}

// The rows of the group holding row r (< the clipped total): the first g with ends[g] > r (ends is non-decreasing).
__device__ __forceinline__ GroupRows GroupOfRow(const int64_t* __restrict__ ends, int64_t num_groups, int64_t r) {
  int64_t lo = 0, hi = num_groups - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (ends[mid] > r) hi = mid; else lo = mid + 1;
  }
  return GroupRows{lo > 0 ? ends[lo - 1] : 0, ends[lo]};
}

// lhs_scale [M, KB] (row-major) -> per group g a [KB, m_g] block at sfa + begin_g * KB; with a split (part), per
// group the block of this kernel's rows [b, e) at sfa + b * KB, and rows of the other part skipped.
// Thread i handles (kb, r) = (i / M, i % M): consecutive threads write consecutive rows of a block.
constexpr int kRepackThreads = 256;

__global__ void __launch_bounds__(kRepackThreads)
    RepackScalesKernel(const float* __restrict__ lhs_scale, float* __restrict__ sfa,
                       const int64_t* __restrict__ ends, const int64_t* __restrict__ total_rows,
                       int64_t num_groups, int64_t m, int64_t kb, RowPart part) {
  LetDependentGridsLaunch();
  WaitForPrecedingGrids();  // (ends, total_rows: the setup kernel's)
  const int64_t total = *total_rows;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * kb;
       i += stride) {
    const int64_t blk = i / m;
    const int64_t r = i - blk * m;
    if (r >= total) continue;
    const GroupRows p = SplitRows(GroupOfRow(ends, num_groups, r), part);
    if (r < p.begin || r >= p.end) continue;  // the other kernel's row
    sfa[p.begin * kb + blk * (p.end - p.begin) + (r - p.begin)] = lhs_scale[r * kb + blk];
  }
}

// The same mapping with one thread per row (JAX_MOE_FFI_FP8_REPACK=rows; opt-in until timed on the H200): the row's
// group is searched once instead of once per scale, its KB scales are one contiguous read, and for each block
// consecutive threads (rows of one group) still write consecutive floats. RepackScalesKernel above took ~16 us a
// call in the session-25 train-step profile (0.27 ms a step), where 4-8 MB of scales move.
__global__ void __launch_bounds__(kRepackThreads)
    RepackScaleRowsKernel(const float* __restrict__ lhs_scale, float* __restrict__ sfa,
                          const int64_t* __restrict__ ends, const int64_t* __restrict__ total_rows,
                          int64_t num_groups, int64_t kb, RowPart part) {
  LetDependentGridsLaunch();
  WaitForPrecedingGrids();  // (ends, total_rows: the setup kernel's)
  const int64_t total = *total_rows;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < total; r += stride) {
    const GroupRows p = SplitRows(GroupOfRow(ends, num_groups, r), part);
    if (r < p.begin || r >= p.end) continue;  // the other kernel's row
    const float* src = lhs_scale + r * kb;
    float* dst = sfa + p.begin * kb + (r - p.begin);
    const int64_t rows = p.end - p.begin;
    for (int64_t blk = 0; blk < kb; ++blk) dst[blk * rows] = src[blk];
  }
}

// JAX_MOE_FFI_FP8_REPACK = elements (default) | rows: which of the two kernels above repacks the lhs scales.
bool RepackScalesByRows() {
  return ReadOnceOrPerCall([] { return EnvSwitch("JAX_MOE_FFI_FP8_REPACK", "elements", "rows"); });
}

struct Fp8Call {
  const void* a;
  const float* a_scale;
  const void* b;
  const float* b_scale;
  void* d;
  const int32_t* sizes;
  int64_t m, k, n, g;
};

// The per-group arrays in the workspace output (256-byte aligned pieces), then `extra_floats` floats of scratch
// (Fp8GroupArrays::sfa; 0 for the wgrad) and CUTLASS's workspace (per-SM copies of the TMA descriptors that the
// kernel rewrites when it moves to another group; its size depends only on hw_info.sm_count).
template <class GemmDef>
ffi::Error CarveFp8Arrays(const Workspace& ws, const char* op, int64_t g, size_t extra_floats,
                          size_t cutlass_bytes, int sm_count, Fp8GroupArrays<GemmDef>* arr, void** cutlass_ws) {
  using Arr = Fp8GroupArrays<GemmDef>;
  const size_t ng = static_cast<size_t>(g);
  WorkspaceCarver carve;
  const size_t o_shapes = carve.take(ng * sizeof(typename Arr::Shape));
  const size_t o_ptr_a = carve.take(ng * sizeof(void*));
  const size_t o_ptr_b = carve.take(ng * sizeof(void*));
  const size_t o_ptr_d = carve.take(ng * sizeof(void*));
  const size_t o_ptr_sfa = carve.take(ng * sizeof(void*));
  const size_t o_ptr_sfb = carve.take(ng * sizeof(void*));
  const size_t o_stride_a = carve.take(ng * sizeof(typename Arr::StrideA));
  const size_t o_stride_b = carve.take(ng * sizeof(typename Arr::StrideB));
  const size_t o_stride_d = carve.take(ng * sizeof(typename Arr::StrideD));
  const size_t o_layout_sfa = carve.take(ng * sizeof(typename Arr::LayoutSFA));
  const size_t o_layout_sfb = carve.take(ng * sizeof(typename Arr::LayoutSFB));
  const size_t o_ends = carve.take(ng * sizeof(int64_t));
  const size_t o_total = carve.take(sizeof(int64_t));
  const size_t o_sfa = carve.take(extra_floats * sizeof(float));
  const size_t o_workspace = carve.take(cutlass_bytes);
  if (carve.offset > ws.bytes || (reinterpret_cast<uintptr_t>(ws.ptr) & 255) != 0) {
    return invalid(std::string(op) + ": the workspace output has " + std::to_string(ws.bytes) +
                   " bytes (256-byte aligned needed), this call needs " + std::to_string(carve.offset) +
                   " (G=" + std::to_string(g) + ", " + std::to_string(sm_count) + " SMs)");
  }
  char* base = static_cast<char*>(ws.ptr);
  arr->shapes = reinterpret_cast<typename Arr::Shape*>(base + o_shapes);
  arr->ptr_a = reinterpret_cast<const typename Arr::ElementA**>(base + o_ptr_a);
  arr->ptr_b = reinterpret_cast<const typename Arr::ElementB**>(base + o_ptr_b);
  arr->ptr_d = reinterpret_cast<typename Arr::ElementD**>(base + o_ptr_d);
  arr->ptr_sfa = reinterpret_cast<const float**>(base + o_ptr_sfa);
  arr->ptr_sfb = reinterpret_cast<const float**>(base + o_ptr_sfb);
  arr->stride_a = reinterpret_cast<typename Arr::StrideA*>(base + o_stride_a);
  arr->stride_b = reinterpret_cast<typename Arr::StrideB*>(base + o_stride_b);
  arr->stride_d = reinterpret_cast<typename Arr::StrideD*>(base + o_stride_d);
  arr->layout_sfa = reinterpret_cast<typename Arr::LayoutSFA*>(base + o_layout_sfa);
  arr->layout_sfb = reinterpret_cast<typename Arr::LayoutSFB*>(base + o_layout_sfb);
  arr->ends = reinterpret_cast<int64_t*>(base + o_ends);
  arr->total = reinterpret_cast<int64_t*>(base + o_total);
  arr->sfa = reinterpret_cast<float*>(base + o_sfa);
  *cutlass_ws = base + o_workspace;
  return ffi::Error::Success();
}

// The CUTLASS pointer-array kernel over the arrays a setup kernel wrote (device-only problem shapes; D = acc).
template <class GemmDef>
ffi::Error LaunchFp8Grouped(typename GemmDef::Kernel::Arguments& args, const Fp8GroupArrays<GemmDef>& arr,
                            int64_t g, void* cutlass_ws, cudaStream_t stream) {
  args.problem_shape = GroupShape{static_cast<int32_t>(g), arr.shapes, nullptr};
  args.mainloop.ptr_A = arr.ptr_a;
  args.mainloop.dA = arr.stride_a;
  args.mainloop.ptr_B = arr.ptr_b;
  args.mainloop.dB = arr.stride_b;
  args.mainloop.ptr_SFA = arr.ptr_sfa;
  args.mainloop.layout_SFA = arr.layout_sfa;
  args.mainloop.ptr_SFB = arr.ptr_sfb;
  args.mainloop.layout_SFB = arr.layout_sfb;
  args.epilogue.thread.alpha = 1.0f;
  if constexpr (GemmDef::kWithAddend) {
    // D = acc + C, C read from D's own rows before they are written (same tile, same CTA): the accumulate form.
    using Epi = typename GemmDef::Kernel::CollectiveEpilogue;
    static_assert(std::is_same_v<typename Epi::InternalStrideC, typename Epi::InternalStrideD>);
    args.epilogue.thread.beta = 1.0f;
    args.epilogue.ptr_C = const_cast<const typename Fp8GroupArrays<GemmDef>::ElementD**>(arr.ptr_d);
    args.epilogue.dC = arr.stride_d;
  } else {
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
  }
  args.epilogue.ptr_D = arr.ptr_d;
  args.epilogue.dD = arr.stride_d;
  return LaunchCutlassKernel<typename GemmDef::Kernel>(args, cutlass_ws, stream, GemmDef::ConfigT::kName);
}

// part: the rows of each group this kernel computes (SplitRows); write_zeros = false: the other kernel of a split
// zeroes the rows past the total.
// defer != nullptr: the setup, repack and zero kernels are queued on `stream`, the GEMM is left in *defer.
template <class GemmDef>
ffi::Error RunFp8GroupedGemm(cudaStream_t stream, const Workspace& ws, const Fp8Call& c,
                             const DeviceInfo& dev, RowPart part = RowPart::kAll, bool write_zeros = true,
                             DeferredLaunch* defer = nullptr) {
  using Kernel = typename GemmDef::Kernel;
  using Arr = Fp8GroupArrays<GemmDef>;
  typename Kernel::Arguments args;
  JMF_RETURN_IF_ERROR(GroupedArguments<Kernel>(dev, c.g, &args));
  const int64_t kb = CeilDiv(c.k, kScaleBlock);
  Arr arr;
  void* workspace = nullptr;
  JMF_RETURN_IF_ERROR(CarveFp8Arrays<GemmDef>(ws, "grouped_gemm_fp8", c.g, static_cast<size_t>(c.m * kb),
                                              Kernel::get_workspace_size(args), dev.sm_count, &arr, &workspace));

  // 1. Per-group metadata.
  Fp8SetupGroupsKernel<GemmDef><<<1, kSetupThreads, 0, stream>>>(
      arr, c.sizes, c.g, c.m, c.k, c.n, static_cast<const typename Arr::ElementA*>(c.a),
      static_cast<const typename Arr::ElementB*>(c.b), c.b_scale,
      static_cast<typename Arr::ElementD*>(c.d), part);
  JMF_CUDA_CHECK_LAUNCH("Fp8SetupGroupsKernel launch");

  // 2. Scales into CUTLASS's per-group layout.
  {
    const bool by_rows = RepackScalesByRows();
    int64_t blocks = CeilDiv(by_rows ? c.m : c.m * kb, kRepackThreads);
    const int64_t max_blocks = 4 * static_cast<int64_t>(dev.sm_count);
    blocks = blocks > max_blocks ? max_blocks : blocks;
    const dim3 grid(static_cast<unsigned>(blocks)), block(kRepackThreads);
    if (by_rows) {
      JMF_RETURN_IF_ERROR(LaunchInChain(RepackScaleRowsKernel, grid, block, stream, "RepackScaleRowsKernel launch",
                                        c.a_scale, arr.sfa, arr.ends, arr.total, c.g, kb, part));
    } else {
      JMF_RETURN_IF_ERROR(LaunchInChain(RepackScalesKernel, grid, block, stream, "RepackScalesKernel launch",
                                        c.a_scale, arr.sfa, arr.ends, arr.total, c.g, c.m, kb, part));
    }
  }

  // 3. Rows past the total are zero (bf16 rows: N % 8 == 0 makes them whole 16-byte vectors).
  if (write_zeros) JMF_RETURN_IF_ERROR(ZeroTailRows(c.d, arr.total, c.m, c.n * 2, dev.sm_count, stream));

  // 4. The grouped GEMM with device-only problem shapes.
  if (defer != nullptr) {
    *defer = [args, arr, g = c.g, workspace](cudaStream_t s) mutable {
      return LaunchFp8Grouped<GemmDef>(args, arr, g, workspace, s);
    };
    return ffi::Error::Success();
  }
  return LaunchFp8Grouped<GemmDef>(args, arr, c.g, workspace, stream);
}

// JAX_MOE_FFI_FP8_TILES = auto (default) | large | small | wide | wide_c21 | wide_rs | wide_rs_c21 | wide_one_slice |
// wide_one_slice_c21 | split | tail64, read once (tuning on the target machine). auto: small (ping-pong 64x128) for short
// groups, else wide for E4M3 activations when N has an even number of 256-wide tiles (one slice per warp group and
// 128 x 64 epilogue subtiles for K <= 2048), else large (cooperative 128x128). wide*: 128x256 tiles with sliced
// promotion (fp8_wide_tile_mainloop.cuh), cluster 1x2 / 2x1, *_rs with A in registers, wide_one_slice* with one
// 128-column slice per warp group (and CUTLASS's 128 x 32 epilogue subtiles); split: the cluster split (SplitRows) of auto's wide tiles, 2x1 on each group's pairs of
// row tiles and 1x2 on odd last tiles; tail64: the short-tail split (RunFp8ShortTailForK). For E4M3 activations
// where auto would take 128-row tiles (other calls keep auto's choice).
const std::string& Fp8TileChoice() {
  static const std::string choice = [] {
    const char* v = std::getenv("JAX_MOE_FFI_FP8_TILES");
    const std::string value(v != nullptr ? v : "auto");
    if (value != "auto" && value != "large" && value != "small" && value != "wide" && value != "wide_c21" &&
        value != "wide_rs" && value != "wide_rs_c21" && value != "wide_one_slice" && value != "wide_one_slice_c21" &&
        value != "split" && value != "tail64") {
      std::fprintf(stderr, "jax_moe_ffi: JAX_MOE_FFI_FP8_TILES must be auto|large|small|wide|wide_c21|wide_rs|"
                           "wide_rs_c21|wide_one_slice|wide_one_slice_c21|split|tail64; unknown value ignored, "
                           "using auto\n");
      return std::string("auto");
    }
    return value;
  }();
  return choice;
}

// The cluster split of the 128x256 tiles (SplitRows; JAX_MOE_FFI_FP8_TILES=split, opt-in): the 2x1 kernel on each
// group's whole pairs of 128-row tiles (it also zeroes the rows past the total), then the 1x2 kernel on the last
// tile of groups with an odd count; each gets half of the workspace (the Python side sizes it for two). Even tile
// counts leave the second launch without rows. Both kernels do per output element the same float32 operations, so
// the result is bitwise theirs. Measured (session 21, fp8_split_h200.md): -3 to +1% against auto on even groups,
// -1 to -9% on skewed ones (the second launch's tail), so not auto's choice.
//
// Two kernels on parts of each group's rows (SplitRows), each with half of the workspace: both kernels' setup
// queued first, then the two GEMMs (IssueSplit: serial, or beside each other with JAX_MOE_FFI_SECOND_LAUNCH=stream).
template <class ElementA, class FirstConfig, class SecondConfig>
ffi::Error RunFp8RowSplit(cudaStream_t stream, const Workspace& ws, const Fp8Call& c, const DeviceInfo& dev,
                          RowPart first_part, RowPart second_part) {
  using E4M3 = cutlass::float_e4m3_t;
  using BF16 = cutlass::bfloat16_t;
  const auto [first_ws, second_ws] = HalveWorkspace(ws);
  DeferredLaunch first, second;
  JMF_RETURN_IF_ERROR((RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, FirstConfig>>(
      stream, first_ws, c, dev, first_part, /*write_zeros=*/true, &first)));
  JMF_RETURN_IF_ERROR((RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, SecondConfig>>(
      stream, second_ws, c, dev, second_part, /*write_zeros=*/false, &second)));
  return IssueSplit(stream, SecondLaunchBeside(), first, second);
}

// The split for a call: one 128-column slice per warp group for K <= 2048 (auto's rule), else 64-column slices.
template <class ElementA>
ffi::Error RunFp8SplitForK(cudaStream_t stream, const Workspace& ws, const Fp8Call& c, const DeviceInfo& dev) {
  if (c.k <= 2048) {
    return RunFp8RowSplit<ElementA, Fp8CoopWideConfig<2, 1, false, true>, Fp8CoopWideConfig<1, 2, false, true>>(
        stream, ws, c, dev, RowPart::kTilePairs, RowPart::kOddTile);
  }
  return RunFp8RowSplit<ElementA, Fp8CoopWideConfig<2, 1>, Fp8CoopWideConfig<1, 2>>(stream, ws, c, dev,
                                                                                   RowPart::kTilePairs,
                                                                                   RowPart::kOddTile);
}

// The short-tail split (SplitRows; JAX_MOE_FFI_FP8_TILES=tail64): auto's wide 128-row kernel on every row but a
// group's last r <= 64 rows, the 64x128 ping-pong kernel with the overlapped promotion (auto's kernel for short
// groups) on those. Bitwise auto (the ping-pong kernel's outputs were bitwise the 128x128 default's in session 17, as
// are the wide tiles'); measured -2 to -6% against auto (session 22, fp8_tail64_h200.md), so an A/B option only.
template <class ElementA>
ffi::Error RunFp8ShortTailForK(cudaStream_t stream, const Workspace& ws, const Fp8Call& c, const DeviceInfo& dev) {
  if (c.k <= 2048) {
    return RunFp8RowSplit<ElementA, Fp8CoopWideEpi64Config<true>, Fp8PingpongOverlapConfig>(
        stream, ws, c, dev, RowPart::kLongTiles, RowPart::kShortTail);
  }
  return RunFp8RowSplit<ElementA, Fp8CoopWideConfig<1, 2>, Fp8PingpongOverlapConfig>(
      stream, ws, c, dev, RowPart::kLongTiles, RowPart::kShortTail);
}

bool UseSmallFp8Tiles(const Fp8Call& c) {
  const std::string& choice = Fp8TileChoice();
  if (choice == "large") return false;
  if (choice == "small") return true;
  return c.m <= 128 * c.g;  // short groups waste most of a 128-row tile
}

// JAX_MOE_FFI_FP8_MAINLOOP = overlap (default) | cutlass, read once: the consumer mainloop (both tile
// configs), ours with the promotion overlapping the next slice's wgmmas (fp8_overlap_mainloop.cuh) or CUTLASS's.
bool UseOverlapMainloop() {
  static const bool overlap = !EnvSwitch("JAX_MOE_FFI_FP8_MAINLOOP", "overlap", "cutlass");
  return overlap;
}

#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
// The per-tensor fast-accumulation kernel (experiments/fp8_ceiling.cuh) on the arrays the blockwise setup kernel
// of SetupDef (same tile, same operand layouts and strides) writes; the scale arrays are written and ignored.
template <class PerTensor, class SetupDef>
ffi::Error RunFp8PerTensorExperiment(cudaStream_t stream, const Workspace& ws, const Fp8Call& c,
                                     const DeviceInfo& dev) {
  using Kernel = typename PerTensor::Kernel;
  using Arr = Fp8GroupArrays<SetupDef>;
  static_assert(std::is_same_v<typename Kernel::InternalStrideA, typename Arr::StrideA> &&
                std::is_same_v<typename Kernel::InternalStrideB, typename Arr::StrideB> &&
                std::is_same_v<typename Kernel::InternalStrideD, typename Arr::StrideD>,
                "per-tensor experiment: the blockwise setup's strides must be the kernel's");
  typename Kernel::Arguments args;
  JMF_RETURN_IF_ERROR(GroupedArguments<Kernel>(dev, c.g, &args));
  Arr arr;
  void* workspace = nullptr;
  JMF_RETURN_IF_ERROR(CarveFp8Arrays<SetupDef>(ws, "grouped_gemm_fp8", c.g, 0, Kernel::get_workspace_size(args),
                                               dev.sm_count, &arr, &workspace));
  Fp8SetupGroupsKernel<SetupDef><<<1, kSetupThreads, 0, stream>>>(
      arr, c.sizes, c.g, c.m, c.k, c.n, static_cast<const typename Arr::ElementA*>(c.a),
      static_cast<const typename Arr::ElementB*>(c.b), c.b_scale, static_cast<typename Arr::ElementD*>(c.d),
      RowPart::kAll);
  JMF_CUDA_CHECK_LAUNCH("Fp8SetupGroupsKernel launch");
  JMF_RETURN_IF_ERROR(ZeroTailRows(c.d, arr.total, c.m, c.n * 2, dev.sm_count, stream));
  args.problem_shape = GroupShape{static_cast<int32_t>(c.g), arr.shapes, nullptr};
  args.mainloop.ptr_A = arr.ptr_a;
  args.mainloop.dA = arr.stride_a;
  args.mainloop.ptr_B = arr.ptr_b;
  args.mainloop.dB = arr.stride_b;
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = arr.ptr_d;
  args.epilogue.dD = arr.stride_d;
  return LaunchCutlassKernel<Kernel>(args, workspace, stream, PerTensor::kName);
}

// JAX_MOE_FFI_FP8_EXPERIMENT (read on every call; only in a library built with the CMake option):
//   direct128 | direct128c22 | direct256 | direct256c21: the scale-ignoring ceiling kernels of
//     experiments/fp8_ceiling.cuh (wrong answers by design);
//   coop128: the cooperative 128x128 kernel with our overlapped mainloop (JAX_MOE_FFI_FP8_TILES=large; the
//     default before 128x256 tiles became auto's choice);
//   overlap128c22: coop128 on a 2x2 cluster (both operands multicast);
//   pingpong: the small-tile (ping-pong 64x128) kernel whatever the shape;
//   pertensor128 | pertensor256c21: CUTLASS's per-tensor fast-accumulation FP8 kernel (no scales at all);
//   wide64c12 | wide64c21 | wide64rsc12 | wide64rsc21 | wide128c12 | wide128c21 | tail64 | split: the
//     JAX_MOE_FFI_FP8_TILES=wide / wide_c21 / wide_rs / wide_rs_c21 / wide_one_slice / wide_one_slice_c21 / tail64 /
//     split kernels, per call;
//   wide128e64 (auto's kernel for K <= 2048) | wide64e64 | wide128e64s3 | wide128e32s4: the wide kernels with other
//     epilogue subtiles / store stages (Fp8CoopWideEpi64Config, Fp8CoopWideEpiStagesConfig);
//   wide128e64persm | wide64persm: auto's wide kernels (K <= 2048 / K > 2048) with CUTLASS's per-SM TMA descriptors
//     instead of the per-group ones built before the GEMM (group_tensormaps.cuh).
template <class ElementA>
bool RunFp8Experiment(cudaStream_t stream, const Workspace& ws, const Fp8Call& c, const DeviceInfo& dev,
                      ffi::Error* result) {
  using E4M3 = cutlass::float_e4m3_t;
  using BF16 = cutlass::bfloat16_t;
  const char* v = std::getenv("JAX_MOE_FFI_FP8_EXPERIMENT");
  const std::string which(v != nullptr ? v : "");
  if (which == "coop128") {
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopOverlapConfig>>(stream, ws, c,
                                                                                                  dev);
  } else if (which == "direct128") {
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CeilingConfig<128, 1, 2>>>(
        stream, ws, c, dev);
  } else if (which == "direct256") {
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CeilingConfig<256, 1, 2>>>(
        stream, ws, c, dev);
  } else if (which == "direct128c22") {
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CeilingConfig<128, 2, 2>>>(
        stream, ws, c, dev);
  } else if (which == "overlap128c22") {  // correct numerics: the default kernel on a 2x2 cluster
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopOverlapC22Config>>(
        stream, ws, c, dev);
  } else if (which == "pingpong") {  // correct numerics: the shipped ping-pong 64x128 overlap kernel
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8PingpongOverlapConfig>>(
        stream, ws, c, dev);
  } else if (which == "pertensor128") {
    using Setup = GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CeilingConfig<128, 1, 2>>;
    *result = RunFp8PerTensorExperiment<Fp8PerTensorGemm<128, 1, 2>, Setup>(stream, ws, c, dev);
  } else if (which == "pertensor256c21") {
    using Setup = GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CeilingConfig<256, 2, 1>>;
    *result = RunFp8PerTensorExperiment<Fp8PerTensorGemm<256, 2, 1>, Setup>(stream, ws, c, dev);
  } else if (which == "wide64c12") {  // correct numerics: 128x256 tiles, sliced promotion (JAX_MOE_FFI_FP8_TILES=wide)
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<1, 2>>>(
        stream, ws, c, dev);
  } else if (which == "wide64c21") {  // the same on a 2x1 cluster (JAX_MOE_FFI_FP8_TILES=wide_c21)
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<2, 1>>>(
        stream, ws, c, dev);
  } else if (which == "wide64rsc12") {  // JAX_MOE_FFI_FP8_TILES=wide_rs, per call
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<1, 2, true>>>(
        stream, ws, c, dev);
  } else if (which == "wide64rsc21") {  // JAX_MOE_FFI_FP8_TILES=wide_rs_c21, per call
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<2, 1, true>>>(
        stream, ws, c, dev);
  } else if (which == "wide128c12") {  // one 128-column slice per warp group (JAX_MOE_FFI_FP8_TILES=wide_one_slice)
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<1, 2, false, true>>>(
        stream, ws, c, dev);
  } else if (which == "wide128c21") {  // one slice per warp group on a 2x1 cluster (wide_one_slice_c21)
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<2, 1, false, true>>>(
        stream, ws, c, dev);
  } else if (which == "split") {  // the cluster split of auto's wide tiles (JAX_MOE_FFI_FP8_TILES=split)
    *result = RunFp8SplitForK<ElementA>(stream, ws, c, dev);
  } else if (which == "wide128e64") {  // auto's one-slice wide kernel (K <= 2048) with 128 x 64 epilogue subtiles
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideEpi64Config<true>>>(
        stream, ws, c, dev);
  } else if (which == "wide128e64s3") {  // the same with 3 store stages (EpilogueFor)
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideEpiStagesConfig<64, 3>>>(
        stream, ws, c, dev);
  } else if (which == "wide128e32s4") {  // 128 x 32 subtiles, 4 store stages
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideEpiStagesConfig<32, 4>>>(
        stream, ws, c, dev);
  } else if (which == "wide128e64persm") {  // auto's K <= 2048 kernel with CUTLASS's per-SM descriptors
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, PerSmMaps<Fp8CoopWideEpi64Config<true>>>>(
        stream, ws, c, dev);
  } else if (which == "wide64persm") {  // auto's K > 2048 kernel with CUTLASS's per-SM descriptors
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, PerSmMaps<Fp8CoopWideConfig<1, 2>>>>(
        stream, ws, c, dev);
  } else if (which == "wide64e64") {  // auto's 64-column-slice wide kernel (K > 2048) with 128 x 64 subtiles
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideEpi64Config<false>>>(
        stream, ws, c, dev);
  } else if (which == "tail64") {  // the short-tail split of auto's wide tiles (JAX_MOE_FFI_FP8_TILES=tail64)
    *result = RunFp8ShortTailForK<ElementA>(stream, ws, c, dev);
  } else if (which == "direct256c21") {
    *result = RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CeilingConfig<256, 2, 1>>>(
        stream, ws, c, dev);
  } else {
    return false;
  }
  return true;
}
#endif

template <class ElementA>
ffi::Error DispatchFp8Tiles(cudaStream_t stream, const Workspace& ws, const Fp8Call& c,
                            const DeviceInfo& dev) {
  using E4M3 = cutlass::float_e4m3_t;
  using BF16 = cutlass::bfloat16_t;
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
  if constexpr (std::is_same_v<ElementA, E4M3>) {
    ffi::Error experiment_result;
    if (RunFp8Experiment<ElementA>(stream, ws, c, dev, &experiment_result)) return experiment_result;
  }
#endif
  const bool small = UseSmallFp8Tiles(c);
  if constexpr (std::is_same_v<ElementA, E4M3>) {
    const std::string& tiles = Fp8TileChoice();
    // auto: 128x256 tiles where the 1x2 cluster covers N without a padded tile (an even number of 256-wide column
    // tiles) and our mainloop is on: +2-8% over 128x128 on 4 of the 5 benchmark shapes, qwen3 down within the noise
    // (cc/cuda/NOTES.md).
    // Of those, K <= 2048 (at most 16 k-tiles per tile) takes one 128-column slice per warp group: +4-7% on the
    // qwen3-30b shapes, -2-3% at K = 4096 / 7168 (session 20, fp8_wide_tile_mainloop.cuh).
    const bool auto_wide = tiles == "auto" && UseOverlapMainloop() && CeilDiv(c.n, 256) % 2 == 0;
    // With 128 x 64 epilogue subtiles (Fp8CoopWideEpi64Config): +1-13% on the qwen3-30b shapes (session 22).
    if (!small && auto_wide && c.k <= 2048) {
      return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideEpi64Config<true>>>(
          stream, ws, c, dev);
    }
    if (!small && (tiles == "wide" || auto_wide)) {
      return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<1, 2>>>(stream, ws, c,
                                                                                                       dev);
    }
    if (!small && (tiles == "wide_c21" || tiles == "wide_rs" || tiles == "wide_rs_c21" || tiles == "wide_one_slice" ||
                   tiles == "wide_one_slice_c21" || tiles == "split" || tiles == "tail64")) {
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
      // The compile check (CI) builds auto's kernels only: the other wide variants are A/B alternatives.
      return ffi::Error(ffi::ErrorCode::kUnimplemented,
                        "jax_moe_ffi: this CUDA library was built with JAX_MOE_FFI_CUDA_BF16_ONLY (a compile check): "
                        "JAX_MOE_FFI_FP8_TILES=" + tiles + " is not in it; rebuild without it");
#else
      if (tiles == "split") return RunFp8SplitForK<ElementA>(stream, ws, c, dev);
      if (tiles == "tail64") return RunFp8ShortTailForK<ElementA>(stream, ws, c, dev);
      if (tiles == "wide_one_slice") {  // auto's kernel for K <= 2048 with CUTLASS's 128 x 32 epilogue subtiles
        return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<1, 2, false, true>>>(
            stream, ws, c, dev);
      }
      if (tiles == "wide_c21") {
        return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<2, 1>>>(
            stream, ws, c, dev);
      }
      if (tiles == "wide_one_slice_c21") {
        return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<2, 1, false, true>>>(
            stream, ws, c, dev);
      }
      if (tiles == "wide_rs") {
        return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<1, 2, true>>>(
            stream, ws, c, dev);
      }
      return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopWideConfig<2, 1, true>>>(
          stream, ws, c, dev);
#endif
    }
  }
  if (UseOverlapMainloop()) {
    return small ? RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8PingpongOverlapConfig>>(
                       stream, ws, c, dev)
                 : RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopOverlapConfig>>(
                       stream, ws, c, dev);
  }
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  // The compile check (CI) builds the default mainloop only; CUTLASS's own is the A/B alternative.
  (void)small;
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "jax_moe_ffi: this CUDA library was built with JAX_MOE_FFI_CUDA_BF16_ONLY (a compile check): "
                    "JAX_MOE_FFI_FP8_MAINLOOP=cutlass is not in it; rebuild without it");
#else
  return small ? RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8PingpongConfig>>(
                     stream, ws, c, dev)
               : RunFp8GroupedGemm<GroupedGemmFp8Blockwise<ElementA, E4M3, BF16, Fp8CoopConfig>>(
                     stream, ws, c, dev);
#endif
}

std::string ExpectDims(const char* op, const char* name, ffi::AnyBuffer::Dimensions got,
                       std::initializer_list<int64_t> want) {
  bool ok = got.size() == want.size();
  size_t i = 0;
  for (int64_t w : want) {
    if (!ok) break;
    ok = got[i++] == w;
  }
  if (ok) return "";
  std::string s = "[";
  i = 0;
  for (int64_t w : want) s += (i++ ? "," : "") + std::to_string(w);
  return std::string(op) + ": " + name + " must be " + s + "], got " + dims_str(got);
}

// The argument checks of both handlers and the call they describe; *skip = true: nothing to compute (M or N is 0),
// *zero_products = true: no group has a product (G or K is 0).
ffi::Error MakeFp8Call(const char* op, ffi::AnyBuffer lhs, ffi::AnyBuffer lhs_scale, ffi::AnyBuffer rhs,
                       ffi::AnyBuffer rhs_scale, ffi::Buffer<ffi::DataType::S32> group_sizes,
                       ffi::Result<ffi::AnyBuffer> out, Fp8Call* c, bool* skip, bool* zero_products) {
  const std::string o(op);
  auto ld = lhs.dimensions();
  auto rd = rhs.dimensions();
  if (ld.size() != 2) return invalid(o + ": lhs must be [M,K], got " + dims_str(ld));
  if (rd.size() != 3) return invalid(o + ": rhs must be [G,N,K], got " + dims_str(rd));
  const int64_t m = ld[0], k = ld[1], g = rd[0], n = rd[1];
  if (rd[2] != k) {
    return invalid(o + ": rhs [G,N,K] must have K = lhs.shape[1] = " + std::to_string(k) + ", got " + dims_str(rd));
  }
  const int64_t kb = CeilDiv(k, kScaleBlock), nb = CeilDiv(n, kScaleBlock);
  for (const std::string& e :
       {ExpectDims(op, "lhs_scale", lhs_scale.dimensions(), {m, kb}),
        ExpectDims(op, "rhs_scale", rhs_scale.dimensions(), {g, kb, nb}),
        ExpectDims(op, "group_sizes", group_sizes.dimensions(), {g}),
        ExpectDims(op, "out", out->dimensions(), {m, n})}) {
    if (!e.empty()) return invalid(e);
  }
  const ffi::DataType a_t = lhs.element_type();
  if (a_t != ffi::DataType::F8E4M3FN && a_t != ffi::DataType::F8E5M2) {
    return invalid(o + ": lhs must be float8_e4m3fn or float8_e5m2, got " + DtypeName(a_t));
  }
  if (rhs.element_type() != ffi::DataType::F8E4M3FN) {
    return invalid(o + ": rhs must be float8_e4m3fn, got " + DtypeName(rhs.element_type()));
  }
  if (lhs_scale.element_type() != ffi::DataType::F32 || rhs_scale.element_type() != ffi::DataType::F32) {
    return invalid(o + ": lhs_scale and rhs_scale must be float32");
  }
  if (out->element_type() != ffi::DataType::BF16) {
    return invalid(o + ": out must be bfloat16, got " + DtypeName(out->element_type()));
  }
  if (k % 16 != 0 || n % 8 != 0) {
    return invalid(o + ": K must be a multiple of 16 and N of 8 (16-byte rows for TMA) on CUDA, got K=" +
                   std::to_string(k) + " N=" + std::to_string(n));
  }
  if (m > kInt32Max || k > kInt32Max || n > kInt32Max || g > kInt32Max) {
    return invalid(o + ": M, K, N and G must each be < 2^31 on CUDA");
  }
  *skip = m == 0 || n == 0;
  *zero_products = g == 0 || k == 0;
  if (*skip || *zero_products) return ffi::Error::Success();
  if (!Aligned16(lhs.untyped_data()) || !Aligned16(rhs.untyped_data()) || !Aligned16(out->untyped_data())) {
    return invalid(o + ": lhs, rhs and out must be 16-byte aligned on CUDA");
  }
  c->a = lhs.untyped_data();
  c->a_scale = static_cast<const float*>(lhs_scale.untyped_data());
  c->b = rhs.untyped_data();
  c->b_scale = static_cast<const float*>(rhs_scale.untyped_data());
  c->d = out->untyped_data();
  c->sizes = group_sizes.typed_data();
  c->m = m;
  c->k = k;
  c->n = n;
  c->g = g;
  return ffi::Error::Success();
}

ffi::Error GroupedGemmFp8Impl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer lhs_scale,
                              ffi::AnyBuffer rhs, ffi::AnyBuffer rhs_scale,
                              ffi::Buffer<ffi::DataType::S32> group_sizes,
                              ffi::Result<ffi::AnyBuffer> out,
                              ffi::Result<ffi::AnyBuffer> workspace) {
  Fp8Call c;
  bool skip = false, zero_products = false;
  JMF_RETURN_IF_ERROR(MakeFp8Call("grouped_gemm_fp8", lhs, lhs_scale, rhs, rhs_scale, group_sizes, out, &c, &skip,
                                  &zero_products));
  if (skip) return ffi::Error::Success();
  if (zero_products) {
    JMF_CUDA_CHECK(cudaMemsetAsync(out->untyped_data(), 0, out->size_bytes(), stream));
    return ffi::Error::Success();
  }
  DeviceInfo dev;
  JMF_RETURN_IF_ERROR(GetDeviceInfo(&dev));
  const Workspace ws{workspace->untyped_data(), workspace->size_bytes()};
  if (lhs.element_type() == ffi::DataType::F8E5M2) {
    return DispatchFp8Tiles<cutlass::float_e5m2_t>(stream, ws, c, dev);
  }
  return DispatchFp8Tiles<cutlass::float_e4m3_t>(stream, ws, c, dev);
}

// The accumulate form runs auto's kernels for E4M3 lhs with our overlapped mainloop (JAX_MOE_FFI_FP8_TILES /
// JAX_MOE_FFI_FP8_MAINLOOP are A/B options of the plain call; said once when set). Rows past the clipped total
// keep the addend (no zero kernel).
ffi::Error DispatchFp8AccTiles(cudaStream_t stream, const Workspace& ws, const Fp8Call& c, const DeviceInfo& dev) {
  using E4M3 = cutlass::float_e4m3_t;
  using BF16 = cutlass::bfloat16_t;
  static const bool noted = [] {
    if (Fp8TileChoice() != "auto" || !UseOverlapMainloop()) {
      std::fprintf(stderr, "jax_moe_ffi: JAX_MOE_FFI_FP8_TILES / JAX_MOE_FFI_FP8_MAINLOOP apply to grouped_gemm_fp8; "
                           "grouped_gemm_fp8_acc runs auto's kernels\n");
    }
    return true;
  }();
  (void)noted;
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  // The CI compile check (never run): one kernel compiles the accumulate form's template.
  return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopWideEpi64Config<true>, 128, true>>(
      stream, ws, c, dev, RowPart::kAll, /*write_zeros=*/false);
#else
  const bool small = c.m <= 128 * c.g;  // UseSmallFp8Tiles' auto rule
  const bool wide = CeilDiv(c.n, 256) % 2 == 0;
  if (!small && wide && c.k <= 2048) {
    return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopWideEpi64Config<true>, 128, true>>(
        stream, ws, c, dev, RowPart::kAll, /*write_zeros=*/false);
  }
  if (!small && wide) {
    return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopWideConfig<1, 2>, 128, true>>(
        stream, ws, c, dev, RowPart::kAll, /*write_zeros=*/false);
  }
  if (small) {
    return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8PingpongOverlapConfig, 128, true>>(
        stream, ws, c, dev, RowPart::kAll, /*write_zeros=*/false);
  }
  return RunFp8GroupedGemm<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopOverlapConfig, 128, true>>(
      stream, ws, c, dev, RowPart::kAll, /*write_zeros=*/false);
#endif
}

ffi::Error GroupedGemmFp8AccImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer lhs_scale,
                                 ffi::AnyBuffer rhs, ffi::AnyBuffer rhs_scale,
                                 ffi::Buffer<ffi::DataType::S32> group_sizes, ffi::AnyBuffer addend,
                                 ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace) {
  constexpr const char* op = "grouped_gemm_fp8_acc";
  Fp8Call c;
  bool skip = false, zero_products = false;
  JMF_RETURN_IF_ERROR(MakeFp8Call(op, lhs, lhs_scale, rhs, rhs_scale, group_sizes, out, &c, &skip, &zero_products));
  if (addend.element_type() != ffi::DataType::BF16) {
    return invalid(std::string(op) + ": addend must be bfloat16, got " + DtypeName(addend.element_type()));
  }
  const std::string bad = ExpectDims(op, "addend", addend.dimensions(), {lhs.dimensions()[0], rhs.dimensions()[1]});
  if (!bad.empty()) return invalid(bad);
  if (lhs.element_type() != ffi::DataType::F8E4M3FN) {
    return invalid(std::string(op) + ": lhs must be float8_e4m3fn (the accumulate form's kernels), got " +
                   DtypeName(lhs.element_type()));
  }
  if (skip) return ffi::Error::Success();
  // out starts as the addend: XLA aliases them (input_output_aliases), else one copy.
  if (addend.untyped_data() != out->untyped_data()) {
    JMF_CUDA_CHECK(cudaMemcpyAsync(out->untyped_data(), addend.untyped_data(), out->size_bytes(),
                                   cudaMemcpyDeviceToDevice, stream));
  }
  if (zero_products) return ffi::Error::Success();
  DeviceInfo dev;
  JMF_RETURN_IF_ERROR(GetDeviceInfo(&dev));
  const Workspace ws{workspace->untyped_data(), workspace->size_bytes()};
  return DispatchFp8AccTiles(stream, ws, c, dev);
}

// ------------------------------------------------------------------------------- weight gradient
// JaxMoeFfiGroupedGemmFp8WgradCuda -> "jax_moe_ffi_grouped_gemm_fp8_wgrad"
//   out[g] [K, N] bf16 = sum over group g's 128-token blocks b of (lhs_t[:, b] . dout_t[:, b]^T) scaled by
//   lhs_t_scale[b, k] * dout_t_scale[b, n]
//   lhs_t [K, P] f8e4m3fn, lhs_t_scale [P/128, K] f32; dout_t [N, P] f8e4m3fn|f8e5m2, dout_t_scale [P/128, N]
//   f32; plan [2, G+1] s32 -- all three from quantize_groups_t (common/quantize_shapes.h): the tokens of each
//   group padded to whole 128-token blocks (zero codes), so no scale block straddles two groups, and both
//   operands are K-major (tokens contiguous) as FP8 wgmma needs. Group g is the problem (K, N, 128 * blocks_g)
//   at column 128 * plan[1][g] of both; its scales are MN-major [blocks_g, K] / [blocks_g, N] blocks at row
//   plan[1][g] of the scale arrays, which is CUTLASS's layout with a row stride of K / N as stored.
//   Groups with no tokens get zeros (a separate launch; their problem is (0, 0, 0): no tiles).
template <class GemmDef>
__global__ void __launch_bounds__(kSetupThreads)
    Fp8WgradSetupKernel(Fp8GroupArrays<GemmDef> arr, const int32_t* __restrict__ plan, int64_t num_groups,
                        int64_t k, int64_t n, int64_t p, const typename Fp8GroupArrays<GemmDef>::ElementA* a,
                        const typename Fp8GroupArrays<GemmDef>::ElementB* b, const float* a_scale,
                        const float* b_scale, typename Fp8GroupArrays<GemmDef>::ElementD* d, WgradOrder order) {
  using Arr = Fp8GroupArrays<GemmDef>;
  __shared__ int32_t group_blocks[kMaxOrderedGroups];  // ordered: every group's blocks, for WgradProblemSlot
  LetDependentGridsLaunch();  // (they wait for this grid: dependent_launch.cuh)
  const int32_t* block_off = plan + num_groups + 1;
  const int64_t p_blocks = p / kScaleBlock;
  // Offsets clamped to [0, P/128] and made non-decreasing: a plan that did not come from quantize_groups_t
  // cannot make the kernel read outside the operands (quantize_groups_t's plans are unchanged by this).
  auto clamp_block = [p_blocks](int64_t v, int64_t lo) { return v < lo ? lo : (v > p_blocks ? p_blocks : v); };
  // Problem slots by size (WgradProblemOrder, grouped_gemm_common.cuh).
  const bool ordered = order != WgradOrder::kGroups && num_groups <= kMaxOrderedGroups;
  if (ordered) {
    for (int64_t g = threadIdx.x; g < num_groups; g += blockDim.x) {
      const int64_t b0 = clamp_block(block_off[g], 0);
      group_blocks[g] = static_cast<int32_t>(clamp_block(block_off[g + 1], b0) - b0);
    }
    __syncthreads();
  }
  for (int64_t g = threadIdx.x; g < num_groups; g += blockDim.x) {
    const int64_t b0 = clamp_block(block_off[g], 0), blocks = clamp_block(block_off[g + 1], b0) - b0;
    const int64_t tokens = blocks * kScaleBlock;
    const int64_t s = ordered ? WgradProblemSlot(order, group_blocks, num_groups, g) : g;  // problem slot
    arr.shapes[s] = blocks > 0 ? typename Arr::Shape(static_cast<int>(k), static_cast<int>(n), static_cast<int>(tokens))
                               : typename Arr::Shape(0, 0, 0);
    arr.ptr_a[s] = a + b0 * kScaleBlock;
    arr.ptr_b[s] = b + b0 * kScaleBlock;
    arr.ptr_d[s] = d + g * k * n;
    arr.ptr_sfa[s] = a_scale + b0 * k;
    arr.ptr_sfb[s] = b_scale + b0 * n;
    arr.stride_a[s] = StrideWithLd<typename Arr::StrideA>(p);
    arr.stride_b[s] = StrideWithLd<typename Arr::StrideB>(p);
    arr.stride_d[s] = StrideWithLd<typename Arr::StrideD>(n);
    const auto mnk = cute::make_shape(static_cast<int>(k), static_cast<int>(n),
                                      static_cast<int>(blocks > 0 ? tokens : kScaleBlock), 1);
    arr.layout_sfa[s] = GemmDef::ScaleConfig::tile_atom_to_shape_SFA(mnk);
    arr.layout_sfb[s] = GemmDef::ScaleConfig::tile_atom_to_shape_SFB(mnk);
  }
}

// out[g] = 0 for every group without tokens: blockIdx.y is the group, 16-byte stores over its [K, N] block.
__global__ void __launch_bounds__(kZeroThreads)
    ZeroEmptyWgradGroupsKernel(uint4* __restrict__ out, const int32_t* __restrict__ plan, int64_t num_groups,
                               int64_t p_blocks, int64_t vecs_per_group) {
  LetDependentGridsLaunch();
  WaitForPrecedingGrids();  // (a kernel of the chain: dependent_launch.cuh)
  const int64_t g = blockIdx.y;
  const int32_t* block_off = plan + num_groups + 1;
  // The setup kernel's clamped offsets: group g has blocks iff its end passes its (clamped) start.
  int64_t b0 = block_off[g];
  b0 = b0 < 0 ? 0 : (b0 > p_blocks ? p_blocks : b0);
  const int64_t b1 = block_off[g + 1] > p_blocks ? p_blocks : block_off[g + 1];
  if (b1 > b0) return;
  uint4* o = out + g * vecs_per_group;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs_per_group;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    o[i] = make_uint4(0, 0, 0, 0);
}

struct Fp8WgradCall {
  const void* a;
  const float* a_scale;
  const void* b;
  const float* b_scale;
  const int32_t* plan;
  void* d;
  int64_t k, n, p, g;
};

template <class GemmDef>
ffi::Error RunFp8Wgrad(cudaStream_t stream, const Workspace& ws, const Fp8WgradCall& c, const DeviceInfo& dev) {
  using Kernel = typename GemmDef::Kernel;
  using Arr = Fp8GroupArrays<GemmDef>;
  typename Kernel::Arguments args;
  JMF_RETURN_IF_ERROR(GroupedArguments<Kernel>(dev, c.g, &args));
  Arr arr;
  void* workspace = nullptr;
  JMF_RETURN_IF_ERROR(CarveFp8Arrays<GemmDef>(ws, "grouped_gemm_fp8_wgrad", c.g, 0, Kernel::get_workspace_size(args),
                                              dev.sm_count, &arr, &workspace));
  Fp8WgradSetupKernel<GemmDef><<<1, kSetupThreads, 0, stream>>>(
      arr, c.plan, c.g, c.k, c.n, c.p, static_cast<const typename Arr::ElementA*>(c.a),
      static_cast<const typename Arr::ElementB*>(c.b), c.a_scale, c.b_scale, static_cast<typename Arr::ElementD*>(c.d),
      WgradProblemOrder());
  JMF_CUDA_CHECK_LAUNCH("Fp8WgradSetupKernel launch");
  {
    const int64_t vecs = c.k * c.n * 2 / 16;  // bf16, N % 8 == 0
    int64_t bx = CeilDiv(vecs, kZeroThreads);
    bx = bx > 8 ? 8 : bx;
    JMF_RETURN_IF_ERROR(LaunchInChain(ZeroEmptyWgradGroupsKernel,
                                      dim3(static_cast<unsigned>(bx), static_cast<unsigned>(c.g)), dim3(kZeroThreads),
                                      stream, "ZeroEmptyWgradGroupsKernel launch", static_cast<uint4*>(c.d), c.plan,
                                      c.g, c.p / kScaleBlock, vecs));
  }
  {  // the tile order (WgradSchedule, grouped_gemm_common.cuh): CUTLASS's along-M, unswizzled, unless asked
    const WgradScheduleChoice schedule = WgradSchedule();
    using Raster = decltype(args.scheduler.raster_order);
    args.scheduler.raster_order = schedule.along_n ? Raster::AlongN : Raster::AlongM;
    args.scheduler.max_swizzle_size = schedule.swizzle;
  }
  return LaunchFp8Grouped<GemmDef>(args, arr, c.g, workspace, stream);
}

// JAX_MOE_FFI_FP8_WGRAD_TILES = coop (default) | pingpong, read once. The cooperative 128x128 tile was the faster one
// here: on the H200 (session 16) 1.05-1.20x the bf16 wgrad kernel of then (ping-pong 128x128; the bf16 default is the
// cooperative 128x256 tile since session 45, not yet compared with this one) against 0.95-1.06x for ping-pong 64x128
// (benchmarks/results/fp8_wgrad_coop_h200.md vs grouped_gemm_fp8_h200.md, --passes wgrad).
bool UsePingpongFp8WgradTiles() {
  static const bool pingpong = EnvSwitch("JAX_MOE_FFI_FP8_WGRAD_TILES", "coop", "pingpong");
  return pingpong;
}

// JAX_MOE_FFI_FP8_WGRAD_MAINLOOP = overlap (default) | cutlass, read once: the wgrad's consumer mainloop.
// `overlap` is fp8_overlap_mainloop.cuh's two-sided path (per-column B scales): bitwise CUTLASS's mainloop (GPU
// test) and 2-5% faster on the benchmark shapes (session 17, H200, alternating A/B:
// benchmarks/results/fp8_wgrad_mainloop_{overlap,cutlass}_r{1,2}_h200.md).
bool UseOverlapWgradMainloop() {
  static const bool overlap = !EnvSwitch("JAX_MOE_FFI_FP8_WGRAD_MAINLOOP", "overlap", "cutlass");
  return overlap;
}

ffi::Error DispatchFp8Wgrad(cudaStream_t stream, const Workspace& ws, const Fp8WgradCall& c, const DeviceInfo& dev,
                            bool dout_e5m2) {
  using E4M3 = cutlass::float_e4m3_t;
  using E5M2 = cutlass::float_e5m2_t;
  using BF16 = cutlass::bfloat16_t;
  const bool overlap = UseOverlapWgradMainloop();
  const bool pingpong = UsePingpongFp8WgradTiles();
#ifdef JAX_MOE_FFI_CUDA_BF16_ONLY
  // The compile check builds the cooperative E4M3 kernel with both mainloops.
  if (dout_e5m2 || pingpong) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_moe_ffi: this CUDA library was built with JAX_MOE_FFI_CUDA_BF16_ONLY (a compile check): "
                      "its FP8 wgrad has E4M3 gradients and cooperative tiles only; rebuild without it");
  }
  return overlap ? RunFp8Wgrad<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopOverlapConfig, 1>>(stream, ws, c, dev)
                 : RunFp8Wgrad<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopConfig, 1>>(stream, ws, c, dev);
#else
  if (pingpong) return RunFp8Wgrad<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8PingpongConfig, 1>>(stream, ws, c, dev);
  if (!overlap) {
    return dout_e5m2 ? RunFp8Wgrad<GroupedGemmFp8Blockwise<E4M3, E5M2, BF16, Fp8CoopConfig, 1>>(stream, ws, c, dev)
                     : RunFp8Wgrad<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopConfig, 1>>(stream, ws, c, dev);
  }
  return dout_e5m2 ? RunFp8Wgrad<GroupedGemmFp8Blockwise<E4M3, E5M2, BF16, Fp8CoopOverlapConfig, 1>>(stream, ws, c, dev)
                   : RunFp8Wgrad<GroupedGemmFp8Blockwise<E4M3, E4M3, BF16, Fp8CoopOverlapConfig, 1>>(stream, ws, c, dev);
#endif
}

ffi::Error GroupedGemmFp8WgradImpl(cudaStream_t stream, ffi::AnyBuffer lhs_t, ffi::AnyBuffer lhs_t_scale,
                                   ffi::AnyBuffer dout_t, ffi::AnyBuffer dout_t_scale,
                                   ffi::Buffer<ffi::DataType::S32> plan, ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::AnyBuffer> workspace) {
  auto ad = lhs_t.dimensions();
  auto bd = dout_t.dimensions();
  auto od = out->dimensions();
  if (ad.size() != 2) return invalid("grouped_gemm_fp8_wgrad: lhs_t must be [K,P], got " + dims_str(ad));
  if (bd.size() != 2) return invalid("grouped_gemm_fp8_wgrad: dout_t must be [N,P], got " + dims_str(bd));
  if (od.size() != 3) return invalid("grouped_gemm_fp8_wgrad: out must be [G,K,N], got " + dims_str(od));
  const int64_t k = ad[0], p = ad[1], n = bd[0], g = od[0];
  if (bd[1] != p || p % kScaleBlock != 0) {
    return invalid("grouped_gemm_fp8_wgrad: lhs_t [K,P] and dout_t [N,P] need the same P, a multiple of 128, got " +
                   dims_str(ad) + " and " + dims_str(bd));
  }
  for (const std::string& e : {ExpectDims("grouped_gemm_fp8_wgrad", "lhs_t_scale", lhs_t_scale.dimensions(), {p / kScaleBlock, k}),
                               ExpectDims("grouped_gemm_fp8_wgrad", "dout_t_scale", dout_t_scale.dimensions(), {p / kScaleBlock, n}),
                               ExpectDims("grouped_gemm_fp8_wgrad", "plan", plan.dimensions(), {2, g + 1}),
                               ExpectDims("grouped_gemm_fp8_wgrad", "out", od, {g, k, n})}) {
    if (!e.empty()) return invalid(e);
  }
  if (lhs_t.element_type() != ffi::DataType::F8E4M3FN) {
    return invalid("grouped_gemm_fp8_wgrad: lhs_t must be float8_e4m3fn, got " + DtypeName(lhs_t.element_type()));
  }
  const ffi::DataType b_t = dout_t.element_type();
  if (b_t != ffi::DataType::F8E4M3FN && b_t != ffi::DataType::F8E5M2) {
    return invalid("grouped_gemm_fp8_wgrad: dout_t must be float8_e4m3fn or float8_e5m2, got " + DtypeName(b_t));
  }
  if (lhs_t_scale.element_type() != ffi::DataType::F32 || dout_t_scale.element_type() != ffi::DataType::F32) {
    return invalid("grouped_gemm_fp8_wgrad: lhs_t_scale and dout_t_scale must be float32");
  }
  if (out->element_type() != ffi::DataType::BF16) {
    return invalid("grouped_gemm_fp8_wgrad: out must be bfloat16, got " + DtypeName(out->element_type()));
  }
  if (k % 8 != 0 || n % 8 != 0) {
    return invalid("grouped_gemm_fp8_wgrad: K and N must be multiples of 8 on CUDA (16-byte output rows), got K=" +
                   std::to_string(k) + " N=" + std::to_string(n));
  }
  if (k > kInt32Max || n > kInt32Max || p > kInt32Max || g > 65535) {
    return invalid("grouped_gemm_fp8_wgrad: K, N and P must each be < 2^31 and G <= 65535 on CUDA, got G=" +
                   std::to_string(g));
  }
  if (g == 0 || k == 0 || n == 0) return ffi::Error::Success();
  if (!Aligned16(lhs_t.untyped_data()) || !Aligned16(dout_t.untyped_data()) || !Aligned16(out->untyped_data())) {
    return invalid("grouped_gemm_fp8_wgrad: lhs_t, dout_t and out must be 16-byte aligned on CUDA");
  }
  DeviceInfo dev;
  JMF_RETURN_IF_ERROR(GetDeviceInfo(&dev));
  Fp8WgradCall c;
  c.a = lhs_t.untyped_data();
  c.a_scale = static_cast<const float*>(lhs_t_scale.untyped_data());
  c.b = dout_t.untyped_data();
  c.b_scale = static_cast<const float*>(dout_t_scale.untyped_data());
  c.plan = plan.typed_data();
  c.d = out->untyped_data();
  c.k = k;
  c.n = n;
  c.p = p;
  c.g = g;
  const Workspace ws{workspace->untyped_data(), workspace->size_bytes()};
  return DispatchFp8Wgrad(stream, ws, c, dev, b_t == ffi::DataType::F8E5M2);
}

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmFp8Cuda, jax_moe_ffi::cuda::GroupedGemmFp8Impl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                        // lhs
                                  .Arg<xla::ffi::AnyBuffer>()                        // lhs_scale
                                  .Arg<xla::ffi::AnyBuffer>()                        // rhs [G,N,K]
                                  .Arg<xla::ffi::AnyBuffer>()                        // rhs_scale
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Ret<xla::ffi::AnyBuffer>()                        // out
                                  .Ret<xla::ffi::AnyBuffer>(),                       // workspace
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmFp8WgradCuda, jax_moe_ffi::cuda::GroupedGemmFp8WgradImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                        // lhs_t [K,P]
                                  .Arg<xla::ffi::AnyBuffer>()                        // lhs_t_scale [P/128,K]
                                  .Arg<xla::ffi::AnyBuffer>()                        // dout_t [N,P]
                                  .Arg<xla::ffi::AnyBuffer>()                        // dout_t_scale [P/128,N]
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // plan [2,G+1]
                                  .Ret<xla::ffi::AnyBuffer>()                        // out [G,K,N]
                                  .Ret<xla::ffi::AnyBuffer>(),                       // workspace
                              {xla::ffi::Traits::kCmdBufferCompatible});

// Command-buffer compatible: stream-ordered work only (a device-to-device copy when XLA did not alias out to
// addend), no host sync, all memory XLA-owned.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiGroupedGemmFp8AccCuda, jax_moe_ffi::cuda::GroupedGemmFp8AccImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                        // lhs
                                  .Arg<xla::ffi::AnyBuffer>()                        // lhs_scale
                                  .Arg<xla::ffi::AnyBuffer>()                        // rhs [G,N,K]
                                  .Arg<xla::ffi::AnyBuffer>()                        // rhs_scale
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes
                                  .Arg<xla::ffi::AnyBuffer>()                        // addend [M,N] bf16
                                  .Ret<xla::ffi::AnyBuffer>()                        // out (aliased to addend)
                                  .Ret<xla::ffi::AnyBuffer>(),                       // workspace
                              {xla::ffi::Traits::kCmdBufferCompatible});
