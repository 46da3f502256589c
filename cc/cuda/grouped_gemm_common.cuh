// Helpers shared by the CUDA grouped-GEMM handlers (grouped_gemm.cu: bf16/f16; grouped_gemm_fp8.cu:
// blockwise FP8): error macros, device properties, CUTLASS kernel preparation and launch, the block
// prefix sum of the setup kernels, zero kernels and the XLA-owned workspace.
//
// Everything is in an anonymous namespace: each translation unit gets its own copy (internal linkage,
// nothing leaks into the shared library's dynamic symbol table).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/ffi_helpers.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/gemm/gemm.h"
#include "cuda/dependent_launch.cuh"
#include "cuda/group_tensormaps.cuh"
#include "xla/ffi/api/ffi.h"

namespace jax_moe_ffi {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Error helpers
// ---------------------------------------------------------------------------------------------

ffi::Error CudaError(const char* what, cudaError_t err) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("jax_moe_ffi: CUDA error in ") + what +
                                                   ": " + cudaGetErrorName(err) + ": " +
                                                   cudaGetErrorString(err));
}

#define JMF_CUDA_CHECK(expr)                                   \
  do {                                                         \
    cudaError_t jmf_err_ = (expr);                             \
    if (jmf_err_ != cudaSuccess) return CudaError(#expr, jmf_err_); \
  } while (0)

// Kernel launches report configuration errors through cudaGetLastError().
#define JMF_CUDA_CHECK_LAUNCH(name)                            \
  do {                                                         \
    cudaError_t jmf_err_ = cudaGetLastError();                 \
    if (jmf_err_ != cudaSuccess) return CudaError(name, jmf_err_); \
  } while (0)

#define JMF_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ffi::Error jmf_status_ = (expr);           \
    if (jmf_status_.failure()) return jmf_status_; \
  } while (0)

std::string DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::F16: return "f16";
    case ffi::DataType::F32: return "f32";
    case ffi::DataType::F64: return "f64";
    case ffi::DataType::S32: return "s32";
    case ffi::DataType::S64: return "s64";
    case ffi::DataType::S8: return "s8";
    case ffi::DataType::U8: return "u8";
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::F8E4M3FN: return "f8e4m3fn";
    case ffi::DataType::F8E5M2: return "f8e5m2";
    default: return "dtype#" + std::to_string(static_cast<int>(t));
  }
}

bool IsHalfType(ffi::DataType t) {
  return t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t RoundUp(size_t a, size_t b) { return (a + b - 1) / b * b; }

// ---------------------------------------------------------------------------------------------
// Device properties (cached per device: cudaDeviceGetAttribute is cheap but not free)
// ---------------------------------------------------------------------------------------------

struct DeviceInfo {
  int device = 0;
  int sm_count = 0;
};

ffi::Error GetDeviceInfo(DeviceInfo* info) {
  // XLA makes the stream's device current on the calling thread.
  int device = 0;
  JMF_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::unordered_map<int, int>* sm_counts = new std::unordered_map<int, int>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = sm_counts->find(device);
  if (it == sm_counts->end()) {
    int major = 0, minor = 0, sms = 0;
    JMF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    JMF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    // The kernels are compiled for sm_90a only (wgmma / TMA multicast / setmaxnreg are
    // arch-specific and do not run on sm_100+), so refuse anything else with a clear message.
    if (major != 9 || minor != 0) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        "jax_moe_ffi: the CUDA grouped GEMM is built for sm_90a (H100/H200); "
                        "device " + std::to_string(device) + " has compute capability " +
                            std::to_string(major) + "." + std::to_string(minor));
    }
    JMF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    it = sm_counts->emplace(device, sms).first;
  }
  info->device = device;
  info->sm_count = it->second;
  return ffi::Error::Success();
}

// The cluster-dimension launch attribute of a CUTLASS SM90 kernel.
template <class Kernel>
cudaLaunchAttribute ClusterAttribute() {
  using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cute::size<0>(Cluster{});
  attr.val.clusterDim.y = cute::size<1>(Cluster{});
  attr.val.clusterDim.z = cute::size<2>(Cluster{});
  return attr;
}

// A CUTLASS 3.x kernel's entry point (cutlass::device_kernel's body) behind a wait for the grids before it
// (dependent_launch.cuh): with PDL its CTAs may be resident before the descriptor kernel has finished.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, Kernel::MinBlocksPerMultiprocessor)
    GroupedGemmKernel(CUTLASS_GRID_CONSTANT typename Kernel::Params const params) {
  WaitForPrecedingGrids();
  extern __shared__ char smem[];
  Kernel op;
  op(params, smem);
}

// Per (kernel, device) one-time setup: opt in to the kernel's large dynamic shared memory and ask
// the driver how many clusters can be co-resident. The persistent grid must not exceed that
// number of clusters: a cluster that cannot start until another one has *finished all of its
// tiles* would double the runtime. (CUTLASS falls back to a GPC-size heuristic when this is 0.)
template <class Kernel>
ffi::Error PrepareKernel(int device, int* max_active_clusters) {
  static std::mutex mu;
  static std::unordered_map<int, int>* cache = new std::unordered_map<int, int>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(device);
  if (it != cache->end()) {
    *max_active_clusters = it->second;
    return ffi::Error::Success();
  }
  const void* fn = reinterpret_cast<const void*>(&GroupedGemmKernel<Kernel>);
  const int smem = static_cast<int>(Kernel::SharedStorageSize);
  JMF_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}), cute::size<2>(Cluster{}));
  cfg.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1] = {ClusterAttribute<Kernel>()};
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // not fatal: clear it and let CUTLASS use its heuristic
    clusters = 0;
  }
  cache->emplace(device, clusters);
  *max_active_clusters = clusters;
  return ffi::Error::Success();
}


// Every packed stride used here has exactly one run-time component (the leading dimension) in
// mode 0 or 1; mode 2 (batch) is the static 0 of the grouped kernels. Set that component.
template <class Stride>
__device__ __forceinline__ Stride StrideWithLd(int64_t ld) {
  using M0 = cute::remove_cvref_t<decltype(cute::get<0>(Stride{}))>;
  using M1 = cute::remove_cvref_t<decltype(cute::get<1>(Stride{}))>;
  static_assert(cute::is_static<M0>::value != cute::is_static<M1>::value,
                "expected exactly one dynamic stride mode among (0, 1)");
  static_assert(cute::is_static<cute::remove_cvref_t<decltype(cute::get<2>(Stride{}))>>::value,
                "expected a static batch stride");
  Stride s{};
  if constexpr (cute::is_static<M0>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

constexpr int kSetupThreads = 256;

// Exclusive prefix sum over the block (all kSetupThreads threads must call it).
__device__ __forceinline__ int64_t BlockExclusiveSum(int64_t v, int64_t* warp_offsets,
                                                     int64_t* block_total) {
  constexpr int kWarps = kSetupThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  int64_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int64_t t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  if (lane == 31) warp_offsets[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < kWarps ? warp_offsets[lane] : 0;
    int64_t wincl = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int64_t t = __shfl_up_sync(0xffffffffu, wincl, o);
      if (lane >= o) wincl += t;
    }
    if (lane < kWarps) warp_offsets[lane] = wincl - w;
    if (lane == kWarps - 1) *block_total = wincl;
  }
  __syncthreads();
  return incl - v + warp_offsets[warp];
}

// A two-way switch from the environment: true iff `name` is set to `other`. Any value but `fallback` or `other` is
// said on stderr (once per variable) and read as `fallback` (no silent fallback).
inline bool EnvSwitch(const char* name, const char* fallback, const char* other) {
  const char* v = std::getenv(name);
  const std::string choice(v != nullptr ? v : fallback);
  if (choice != fallback && choice != other) {
    static std::mutex mu;
    static std::unordered_map<std::string, bool> said;
    std::lock_guard<std::mutex> lock(mu);
    if (!said[name]) {
      said[name] = true;
      std::fprintf(stderr, "jax_moe_ffi: %s must be %s|%s; unknown value ignored, using %s\n", name, fallback, other,
                   fallback);
    }
  }
  return choice == other;
}

// Programmatic dependent launch for the kernels after a call's setup kernel (dependent_launch.cuh): JAX_MOE_FFI_PDL=1|0,
// on by default since session 37 (cc/cuda/NOTES.md). Read on every call (one getenv), so that one process can A/B it:
// a fresh jit records a new XLA command buffer, which runs the handler again.
inline bool DependentLaunchOn() { return !EnvSwitch("JAX_MOE_FFI_PDL", "1", "0"); }

// JAX_MOE_FFI_PAIR_ORDER=blocks|interleave, read on every call (so that one process can alternate them): the 2G
// problems of a bf16 pair launch (gate and up, forward or weight gradients) as product 0 of every group then product 1
// (blocks, the default), or product 0 and 1 of group g side by side (interleave). Why: in block order the second
// product reads each group's rows G problems later, from HBM again; side by side it finds them in L2. The same tiles
// and the same k-order per output element either way, so the same bits (GPU test). Measured (session 42, H100,
// benchmarks/gate_up_pair.py at the Qwen3 layer's shape): no faster than blocks (forward 0.905-0.939 vs 0.916-0.947 ms,
// the train step 53.15 vs 52.85-53.34 ms), so blocks, the order of every H200 result, stays the default.
inline bool PairInterleaved() { return EnvSwitch("JAX_MOE_FFI_PAIR_ORDER", "blocks", "interleave"); }

// The launch attributes of a kernel of the chain: the PDL attribute when on, and `extra` (e.g. a cluster shape).
struct ChainLaunchAttributes {
  cudaLaunchAttribute attrs[2] = {};
  unsigned count = 0;
  explicit ChainLaunchAttributes(const cudaLaunchAttribute* extra = nullptr) {
    if (extra != nullptr) attrs[count++] = *extra;
    if (DependentLaunchOn()) {
      attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[count].val.programmaticStreamSerializationAllowed = 1;
      ++count;
    }
  }
};

// Launches a kernel of the chain after the setup kernel; it must start with WaitForPrecedingGrids().
template <class... Params, class... Args>
ffi::Error LaunchInChain(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const char* name,
                         Args... args) {
  ChainLaunchAttributes attributes;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cfg.attrs = attributes.attrs;
  cfg.numAttrs = attributes.count;
  cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
  if (err != cudaSuccess) return CudaError(name, err);
  JMF_CUDA_CHECK_LAUNCH(name);
  return ffi::Error::Success();
}

// An A/B knob's value: read once in a shipped build; on every call in an experiment build
// (-DJAX_MOE_FFI_FP8_EXPERIMENTS=ON), so that one process can alternate the choices (with XLA's command buffers off).
// Every call site passes its own lambda, so each knob has its own cached value.
template <class Read>
auto ReadOnceOrPerCall(Read read) {
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
  return read();
#else
  static const auto value = read();
  return value;
#endif
}

// Wgrad problem order. A wgrad tile's cost is about its group's rows (the contraction), and CUTLASS's persistent
// grouped scheduler deals tiles to CTAs round-robin in problem order. Listed largest group first, every CTA ends at
// most about one large tile after the others (longest-processing-time order); listed in group order, the last waves
// can hold a large group's tiles on a few SMs while the rest idle. A model (tools/wgrad_order_model.py) predicted
// the slowest CTA 10% above the mean in group order, 3% in size order, on the qwen3-30b down wgrad with Dirichlet(0.5)
// sizes. Measured on the H200 (session 24, benchmarks/results/wgrad_order_h200.md, two rounds a process per order):
// skewed deepseek-v3 gate_up / down +2.0% / +1.4%, qwen3-30b gate_up +1.7% (within noise), qwen3-30b down -0.4%,
// even sizes unchanged (the same order): that wgrad's skew loss (0.85 of even) is not load imbalance.
// Groups beyond kMaxOrderedGroups keep group order (the rank is O(G) a thread).
constexpr int64_t kMaxOrderedGroups = 1024;

// Position of group g when groups are listed by rows descending, ties by index (a permutation of 0..n-1).
__device__ __forceinline__ int64_t SizeDescendingRank(const int32_t* rows, int64_t n, int64_t g) {
  const int32_t own = rows[g];
  int64_t rank = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t r = rows[j];
    rank += (r > own) | (r == own && j < g);
  }
  return rank;
}

// The wgrad's problem order (JAX_MOE_FFI_WGRAD_ORDER, below).
enum class WgradOrder : int { kGroups = 0, kSize = 1, kMixed = 2 };

// Problem slot of group g: its group index, its SizeDescendingRank, or (kMixed) the ranks interleaved from both ends
// -- largest, smallest, second largest, second smallest, ... (a permutation of 0..n-1). Why kMixed: the ncu profile
// of the skewed qwen3-30b down wgrad (session 25) shows its consumer warpgroups waiting longer on each other's turns
// than with even sizes; half its groups have < 260 rows, whose 128 x 128 tiles are one to four k-tiles long, so each
// tile's epilogue (32 KB of output) outlasts the other warpgroup's mainloop. Largest first puts all of those tiles at
// the end, where every SM writes at once; interleaved, they run beside large groups' compute-bound tiles. Measured
// (session 25, wgrad_order_mixed_ab_h200.md, alternating, bitwise): within noise of kSize on skewed sizes.
__device__ __forceinline__ int64_t WgradProblemSlot(WgradOrder order, const int32_t* rows, int64_t n, int64_t g) {
  if (order == WgradOrder::kGroups) return g;
  const int64_t rank = SizeDescendingRank(rows, n, g);
  if (order == WgradOrder::kSize) return rank;
  const int64_t half = (n + 1) / 2;
  return rank < half ? 2 * rank : 2 * (n - 1 - rank) + 1;
}

// JAX_MOE_FFI_WGRAD_ORDER = size (default) | groups | mixed: the wgrad's problem order (above), an A/B knob.
inline WgradOrder WgradProblemOrder() {
  return ReadOnceOrPerCall([] {
    const char* v = std::getenv("JAX_MOE_FFI_WGRAD_ORDER");
    const std::string s(v != nullptr ? v : "size");
    if (s == "size") return WgradOrder::kSize;
    if (s == "groups") return WgradOrder::kGroups;
    if (s == "mixed") return WgradOrder::kMixed;
    static bool said = false;
    if (!said) {
      said = true;
      std::fprintf(stderr, "jax_moe_ffi: JAX_MOE_FFI_WGRAD_ORDER must be size|groups|mixed; unknown value ignored, "
                           "using size\n");
    }
    return WgradOrder::kSize;
  });
}

// JAX_MOE_FFI_WGRAD_SCHEDULE = m1 (default) | m2 | m4 | m8 | n1 | n2 | n4 | n8: the order in which CUTLASS's grouped
// scheduler walks a wgrad group's [K, N] output tiles -- along M (K of the layer; CUTLASS's grouped default) or along
// N, with a swizzle of 1-8 tiles. An A/B knob for the skewed wgrad: 132 concurrent tiles along M span every M tile
// of a group, so a large group's A panel set (deepseek-v3 gate_up skewed: 5217 rows, 75 MB) cannot stay in the
// 50 MB L2. Only the order changes (bitwise the default), but a swizzle rounds each group's tile grid up to a
// multiple of swizzle x cluster in both dimensions, and the padded tiles are computed and discarded (qwen3-30b down:
// K = 768 is 6 M tiles, 8 with m2 / m4). ReadOnceOrPerCall.
struct WgradScheduleChoice {
  bool along_n;
  int swizzle;
};
inline WgradScheduleChoice WgradSchedule() {
  return ReadOnceOrPerCall([] {
    const char* v = std::getenv("JAX_MOE_FFI_WGRAD_SCHEDULE");
    const std::string s(v != nullptr ? v : "m1");
    if (s.size() == 2 && (s[0] == 'm' || s[0] == 'n') && (s[1] == '1' || s[1] == '2' || s[1] == '4' || s[1] == '8')) {
      return WgradScheduleChoice{s[0] == 'n', s[1] - '0'};
    }
    static bool said = false;
    if (!said) {
      said = true;
      std::fprintf(stderr, "jax_moe_ffi: JAX_MOE_FFI_WGRAD_SCHEDULE must be m1|m2|m4|m8|n1|n2|n4|n8; unknown value "
                           "ignored, using m1\n");
    }
    return WgradScheduleChoice{false, 1};
  });
}

// Row splits (forward / dgrad, 128-row tiles): each group's rows shared between two kernels of one call.
//
// The cluster split. CUTLASS's grouped scheduler rounds every group's row tiles up to the cluster shape, so a 2x1
// cluster (the weight tile multicast to the CTAs of two neighbouring row tiles) computes a zero-filled tile for every
// group with an odd number of row tiles. Split instead: the 2x1 kernel takes each group's whole pairs of 128-row
// tiles (kTilePairs), a kernel with a 1x2 / 1x1 cluster the last tile of a group with an odd count (kOddTile).
// No tile is padded; with even counts (even groups) the second kernel gets no rows.
//
// The short-tail split. A group whose last 128-row tile holds r <= 64 rows computes 128 - r zero-filled rows there;
// with routed (skewed) sizes that is most of the padding (qwen3-30b, Dirichlet(0.5) sizes: 128-row tiles are 89%
// full, 94% with such tails on 64-row tiles). kLongTiles: every row but such a tail (128-row kernel); kShortTail:
// the tail (a 64-row kernel). Even groups of a multiple of 128 rows leave the tail kernel without rows.
enum class RowPart { kAll, kTilePairs, kOddTile, kLongTiles, kShortTail };
constexpr int64_t kSplitTileRows = 128;
constexpr int64_t kShortTailRows = 64;

__host__ __device__ __forceinline__ GroupRows SplitRows(GroupRows r, RowPart part) {
  if (part == RowPart::kAll) return r;
  int64_t mid;
  if (part == RowPart::kLongTiles || part == RowPart::kShortTail) {
    const int64_t rest = (r.end - r.begin) % kSplitTileRows;
    mid = rest > 0 && rest <= kShortTailRows ? r.end - rest : r.end;
    return part == RowPart::kLongTiles ? GroupRows{r.begin, mid} : GroupRows{mid, r.end};
  }
  const int64_t tiles = (r.end - r.begin + kSplitTileRows - 1) / kSplitTileRows;
  mid = (tiles & 1) ? r.begin + kSplitTileRows * (tiles - 1) : r.end;
  return part == RowPart::kTilePairs ? GroupRows{r.begin, mid} : GroupRows{mid, r.end};
}

// A grouped GEMM launch prepared but not yet issued (its setup kernels already queued): a split call issues its
// two kernels together, one after the other on the caller's stream or side by side (ForkJoin).
using DeferredLaunch = std::function<ffi::Error(cudaStream_t)>;

// One side stream per device and translation unit (created on first use, never destroyed) and its two events. The
// mutex keeps a fork and its join together: another thread's handler must not record between them.
struct SideStream {
  std::mutex mu;
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;
};

// Issues first(stream) and second(side) so that second starts after everything queued on `stream` before this call
// and everything queued on `stream` after this call waits for it: the caller sees one stream-ordered call, and under
// stream capture (XLA's command buffers) both branches land in the same CUDA graph. The persistent first kernel takes
// the SMs; the second kernel's CTAs can take them as the first one's last wave drains, instead of after all of it
// (the cluster split launched so: +2-4% over auto on even groups and -1 to -2% on skewed ones, against -1 to -6% there
// with serial launches; sessions 21-22).
inline ffi::Error ForkJoin(cudaStream_t stream, const DeferredLaunch& first, const DeferredLaunch& second) {
  constexpr int kMaxDevices = 64;
  static SideStream sides[kMaxDevices];
  int device = 0;
  JMF_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_moe_ffi: device ordinal " + std::to_string(device) +
                                                     " past the side streams' table (64)");
  }
  SideStream& side = sides[device];
  std::lock_guard<std::mutex> lock(side.mu);
  if (side.stream == nullptr) {
    // Creating a stream is not a stream operation, but a capturing thread (thread-local mode) may refuse it.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    JMF_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaError_t err = cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&side.forked, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&side.joined, cudaEventDisableTiming);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (err != cudaSuccess) {
      side.stream = nullptr;
      return CudaError("side stream creation", err);
    }
  }
  JMF_CUDA_CHECK(cudaEventRecord(side.forked, stream));
  ffi::Error first_result = first(stream);
  JMF_CUDA_CHECK(cudaStreamWaitEvent(side.stream, side.forked, 0));
  ffi::Error second_result = first_result.failure() ? ffi::Error::Success() : second(side.stream);
  // Joined even when a launch failed: under capture the side stream is part of the caller's capture now.
  JMF_CUDA_CHECK(cudaEventRecord(side.joined, side.stream));
  JMF_CUDA_CHECK(cudaStreamWaitEvent(stream, side.joined, 0));
  return first_result.failure() ? first_result : second_result;
}

// JAX_MOE_FFI_SECOND_LAUNCH = serial (default) | stream: whether a split call's second kernel runs after the first
// on the caller's stream or beside it (ForkJoin). An A/B knob (ReadOnceOrPerCall).
inline bool SecondLaunchBeside() {
  return ReadOnceOrPerCall([] { return EnvSwitch("JAX_MOE_FFI_SECOND_LAUNCH", "serial", "stream"); });
}

// The two kernels of a split call, on the caller's stream one after the other (serial) or side by side (ForkJoin).
inline ffi::Error IssueSplit(cudaStream_t stream, bool side_by_side, const DeferredLaunch& first,
                             const DeferredLaunch& second) {
  if (side_by_side) return ForkJoin(stream, first, second);
  JMF_RETURN_IF_ERROR(first(stream));
  return second(stream);
}

// ---------------------------------------------------------------------------------------------
// Zero kernels (16-byte stores; every row of out is a multiple of 16 bytes since N % 8 == 0)
// ---------------------------------------------------------------------------------------------

constexpr int kZeroThreads = 256;

// Forward/dgrad: rows [total, M) of out[M,N] belong to no group.
__global__ void __launch_bounds__(kZeroThreads)
    ZeroTailRowsKernel(uint4* __restrict__ out, const int64_t* __restrict__ total_rows,
                       int64_t vecs_per_row, int64_t total_vecs) {
  LetDependentGridsLaunch();
  WaitForPrecedingGrids();  // (total_rows: the setup kernel's)
  const int64_t begin = *total_rows * vecs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total_vecs; i += stride) {
    out[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

// Launches ZeroTailRowsKernel over out[M, N] (row_bytes = N * element size, a multiple of 16).
inline ffi::Error ZeroTailRows(void* out, const int64_t* total_rows, int64_t m, int64_t row_bytes,
                               int sm_count, cudaStream_t stream) {
  const int64_t vecs_per_row = row_bytes / 16;
  const int64_t total_vecs = m * vecs_per_row;
  int64_t blocks = CeilDiv(total_vecs, kZeroThreads);
  const int64_t max_blocks = 4 * static_cast<int64_t>(sm_count);
  blocks = blocks > max_blocks ? max_blocks : blocks;
  if (blocks < 1) return ffi::Error::Success();
  return LaunchInChain(ZeroTailRowsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kZeroThreads), stream,
                       "ZeroTailRowsKernel launch", static_cast<uint4*>(out), total_rows, vecs_per_row, total_vecs);
}

// ---------------------------------------------------------------------------------------------
// One grouped GEMM call
// ---------------------------------------------------------------------------------------------

// Device memory for the per-group arrays and CUTLASS's workspace: a u8 output of the custom call
// (sized by Python, see ops/grouped_gemm.py). XLA owns it, so its address stays valid when the call
// is replayed from a CUDA graph (FFI scratch memory would be freed when the handler returns).
struct Workspace {
  void* ptr;
  size_t bytes;
};

// The two halves of a workspace (256-byte aligned), for two kernels launched back to back in one call (the pick and
// the cluster split), each carving its own arrays.
struct WorkspaceHalves {
  Workspace first, second;
};
inline WorkspaceHalves HalveWorkspace(const Workspace& ws) {
  const size_t half = (ws.bytes / 2) & ~static_cast<size_t>(255);
  return {Workspace{ws.ptr, half}, Workspace{static_cast<char*>(ws.ptr) + half, ws.bytes - half}};
}


// Carves 128-byte aligned pieces (TMA descriptors need 64) out of the workspace, in order.
struct WorkspaceCarver {
  size_t offset = 0;
  size_t take(size_t bytes) {
    size_t at = offset;
    offset = RoundUp(offset + bytes, 128);
    return at;
  }
};

// JAX_MOE_FFI_GEMM_GRID=<f> (read once; default 1; an A/B knob for the streams work, issue 7): scales the
// persistent grid of every grouped GEMM. f < 1 launches fewer CTAs than co-resident slots, leaving SMs to
// kernels on other streams (a shared expert beside the routed GEMMs). f > 1 oversubscribes: each CTA then
// holds f times fewer tiles, so CTAs that start late (their SMs busy with another stream's kernels) delay the
// launch's end by less. The scheduler strides tiles by the grid size, so any grid covers every tile.
double GridScale() {
  static const double scale = [] {
    const char* v = std::getenv("JAX_MOE_FFI_GEMM_GRID");
    double f = v != nullptr ? std::atof(v) : 1.0;
    if (!(f > 0.0 && f <= 4.0)) {
      if (v != nullptr) std::fprintf(stderr, "jax_moe_ffi: JAX_MOE_FFI_GEMM_GRID=%s is not in (0, 4]; using 1\n", v);
      f = 1.0;
    }
    return f;
  }();
  return scale;
}

// The Arguments of a grouped (pointer-array) kernel with everything but the per-call arrays: the
// device, its SM count and the co-resident cluster count (PrepareKernel), scaled by GridScale(), and the number of
// problems (the per-group descriptor workspace of group_tensormaps.cuh depends on it).
template <class Kernel>
ffi::Error GroupedArguments(const DeviceInfo& dev, int64_t problems, typename Kernel::Arguments* args) {
  int max_active_clusters = 0;
  JMF_RETURN_IF_ERROR(PrepareKernel<Kernel>(dev.device, &max_active_clusters));
  int sm_count = dev.sm_count;
  const double scale = GridScale();
  if (scale != 1.0 && max_active_clusters > 0) {
    // CUTLASS launches max_active_clusters clusters when that many fit in sm_count SMs (its grouped scheduler
    // has no host problem shapes here), so both are scaled; the per-SM descriptor workspace follows sm_count.
    using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
    const int cluster_size = cute::size(Cluster{});
    max_active_clusters = std::max(1, static_cast<int>(max_active_clusters * scale));
    sm_count = std::max(sm_count, max_active_clusters * cluster_size);
    if (scale < 1.0) sm_count = max_active_clusters * cluster_size;
  }
  *args = typename Kernel::Arguments{};
  args->mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args->hw_info.device_id = dev.device;
  args->hw_info.sm_count = sm_count;
  args->hw_info.max_active_clusters = max_active_clusters;
  // The problem count (its arrays come later): the workspace of per-group descriptors depends on it.
  args->problem_shape.num_groups = static_cast<int32_t>(problems);
  return ffi::Error::Success();
}

// Checks, initialises CUTLASS's workspace (per-SM TMA descriptors) and launches a CUTLASS 3.x SM90
// kernel (cluster launch) on `stream`. `name` says which configuration in errors.
template <class Kernel>
ffi::Error LaunchCutlassKernel(const typename Kernel::Arguments& args, void* workspace,
                               cudaStream_t stream, const char* name) {
  if (!Kernel::can_implement(args)) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("jax_moe_ffi: CUTLASS cannot implement the grouped GEMM (") + name + ")");
  }
  cutlass::Status st = Kernel::initialize_workspace(args, workspace, stream);
  if (st != cutlass::Status::kSuccess) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("jax_moe_ffi: CUTLASS initialize_workspace failed: ") +
                          cutlassGetStatusString(st));
  }
  // Builds the (placeholder) TMA descriptors on the host. Per group, address, extents and strides come from the
  // device arrays: written into per-group descriptors before the GEMM (collectives with prebuilt descriptors,
  // group_tensormaps.cuh), or patched by the kernel into its per-SM copies when a CTA reaches the group.
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
  if constexpr (kNeedsGroupTensormaps<Kernel>) {
    // Per-group descriptors into the workspace, from the arrays the setup kernel wrote (group_tensormaps.cuh).
    const int groups = args.problem_shape.groups();
    const unsigned blocks = static_cast<unsigned>(CeilDiv(std::max(groups, 1), kBuildMapsWarps));
    JMF_RETURN_IF_ERROR(LaunchInChain(BuildGroupTensormapsKernel<Kernel>, dim3(blocks), dim3(32 * kBuildMapsWarps),
                                      stream, "BuildGroupTensormapsKernel launch", params));
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = Kernel::get_grid_shape(params);
  cfg.blockDim = Kernel::get_block_shape();
  cfg.dynamicSmemBytes = Kernel::SharedStorageSize;
  cfg.stream = stream;
  const cudaLaunchAttribute cluster = ClusterAttribute<Kernel>();
  ChainLaunchAttributes attributes(&cluster);
  cfg.attrs = attributes.attrs;
  cfg.numAttrs = attributes.count;
  void* kernel_args[] = {&params};
  JMF_CUDA_CHECK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(&GroupedGemmKernel<Kernel>), kernel_args));
  JMF_CUDA_CHECK_LAUNCH("grouped GEMM kernel launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi
