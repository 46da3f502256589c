// Per-group TMA descriptors built once per call, before the grouped GEMM, instead of rewritten by each CTA.
//
// Why: CUTLASS's SM90 pointer-array kernels keep one copy of each TMA descriptor per SM in global memory. When a
// persistent CTA moves to a tile of another group, the producer warp rewrites its A / B copies and each consumer warp
// group its D copy (tensormap.replace in shared memory, then a copy-and-release into global memory, then an acquire
// before the next use). The consumer side first waits until every TMA store it has issued is complete -- its
// descriptor copy is about to be overwritten while those stores may still read it -- so on a group change the
// consumer warp groups (the tensor-core issuers) stall on the previous tile's output reaching memory. With the
// benchmark shapes a CTA changes group on nearly every tile (qwen3-30b: 24 tiles a group, a grid of 132); session 22's
// fit (benchmarks/gemm_anatomy.py) put the fixed cost per 128x256 tile at 1.3 us with one group and 3.0 us with 128.
//
// Here a small kernel writes one descriptor per group and operand (A, B, D) into the GEMM's workspace before the
// GEMM starts; the collectives below only move a pointer to group g's descriptors and acquire them (the descriptors
// are never written while the GEMM runs, so no store has to be waited for). The descriptor contents are the ones
// CUTLASS would have built for that group: the mainloop's come from CUTLASS's own update functions; D's from the same
// cute calls CUTLASS's epilogue makes (its update functions need an epilogue object, i.e. its shared memory).
//
// Measured (H200, session 23, alternating in one process, bitwise equal outputs; tile_ab_premaps_h200.md,
// fp8_premaps_*_h200.md): bf16 wgrad +6-11% on the qwen3-30b shapes (ping-pong tiles with a short mainloop: the
// fixed cost weighs most), forward / dgrad +1-3%, deepseek-v3 gate_up +0.5-1%; FP8 forward 0 to +5%. So every kernel
// of grouped_gemm_kernels.cuh takes them (PrebuiltMapsOf), cooperative and ping-pong alike; an epilogue that reads C
// (the accumulate form) keeps CUTLASS's per-SM descriptors, and so does the two-product mainloop. The kernel layer,
// loads, mainloops and epilogue stores are CUTLASS's (and ours for the FP8 consumer mainloops).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cuda/dependent_launch.cuh"

namespace jax_moe_ffi {
namespace cuda {

// Mainloop: the workspace holds, per group, the kMaps descriptors the base collective keeps (A, B for CUTLASS's; A0,
// B0, A1, B1 for the two-product mainloop), written by BuildGroupTensormapsKernel.
template <class Base>
struct PrebuiltTensormapMainloop : Base {
  using Base::Base;
  using Params = typename Base::Params;
  using Arguments = typename Base::Arguments;
  using TensorMapStorage = typename Base::TensorMapStorage;
  // As many descriptors as the base keeps in shared memory (its TensorMapStorage holds just those, in the order of its
  // tuple of pointers), and a tuple of that many pointers, as the base's tensormaps_init returns. (Not deduced from
  // tensormaps_init: a device function's `auto` return type is not known in nvcc's host pass.)
  static constexpr int kMaps = static_cast<int>(sizeof(TensorMapStorage) / sizeof(cute::TmaDescriptor));
  static_assert(sizeof(TensorMapStorage) == kMaps * sizeof(cute::TmaDescriptor), "prebuilt tensormaps: storage");
  template <size_t... I>
  static auto PointerTuple(std::index_sequence<I...>) -> cute::tuple<std::enable_if_t<(I < kMaps), cute::TmaDescriptor*>...>;
  using TensorMaps = decltype(PointerTuple(std::make_index_sequence<kMaps>{}));
  static constexpr bool kPrebuiltTensormaps = true;
  static_assert(Base::IsGroupedGemmKernel, "prebuilt tensormaps: grouped (per-group stride) kernels only");

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& problem_shape, Arguments const&, int) {
    return kMaps * sizeof(cute::TmaDescriptor) * static_cast<size_t>(std::max(problem_shape.groups(), 1));
  }

  template <size_t... I>
  static CUTLASS_DEVICE TensorMaps MapsAt(Params const& p, int32_t group, std::index_sequence<I...>) {
    cute::TmaDescriptor* first = reinterpret_cast<cute::TmaDescriptor*>(p.tensormaps) + kMaps * int64_t{group};
    return TensorMaps((first + I)...);
  }
  static CUTLASS_DEVICE TensorMaps MapsAt(Params const& p, int32_t group) {
    return MapsAt(p, group, std::make_index_sequence<kMaps>{});
  }

  // Called by the kernel layer: no copy into shared memory, no per-SM slot.
  CUTLASS_DEVICE TensorMaps tensormaps_init(Params const& p, TensorMapStorage&, int32_t, int32_t) {
    return MapsAt(p, 0);
  }
  // The kernel layer passes its own (non-const) copy of the tuple returned above: pointing it at group next_batch's
  // descriptors is the whole update. (The loads already issued keep the descriptor address they were issued with.)
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage&, Params const& p, TensorMaps& maps,
                                                ProblemShape_MNKL, int32_t next_batch) {
    maps = MapsAt(p, next_batch);
  }
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage&, TensorMaps const&) {}
  // tensormaps_fence_acquire: the base's (one acquire per descriptor: written by another kernel through the generic
  // proxy and released there, read here by TMA).

  // BuildGroupTensormapsKernel, one warp per group: the base's own update of the descriptors copied from the params
  // into shared memory, then its copy-and-release, into this group's slots.
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE void BuildGroup(Params const& p, TensorMapStorage& smem, ProblemShape_MNKL shape, int32_t group) {
    Base::tensormaps_init(p, smem, /*sm_count=*/1, /*sm_idx=*/0);  // (its per-SM pointers are not used)
    const TensorMaps slots = MapsAt(p, group);
    Base::tensormaps_perform_update(smem, p, slots, shape, group);
    __syncwarp();
    Base::tensormaps_cp_fence_release(smem, slots);
  }
};

// Epilogue (TMA store of D, no C operand): the workspace holds one D descriptor per group.
template <class Base>
struct PrebuiltTensormapEpilogue : Base {
  using Base::Base;
  using Params = typename Base::Params;
  using Arguments = typename Base::Arguments;
  using TensorMapStorage = typename Base::TensorMapStorage;
  using ElementD = typename Base::ElementD;
  static constexpr bool kPrebuiltTensormaps = true;
  static_assert(std::is_void_v<typename Base::ElementC> && !std::is_void_v<ElementD>,
                "prebuilt tensormaps: epilogues that store D and read no C");

  // (LinearCombination without C keeps no workspace of its own; the base puts one after its per-SM descriptors.)
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& problem_shape, Arguments const&, int) {
    return sizeof(cute::TmaDescriptor) * static_cast<size_t>(std::max(problem_shape.groups(), 1));
  }

  static CUTLASS_DEVICE cute::TmaDescriptor* GroupMap(Params const& p, int32_t group) {
    return p.tensormaps + group;
  }

  CUTLASS_DEVICE auto load_init(Params const& p, TensorMapStorage&, int32_t, int32_t) {
    return cute::make_tuple(GroupMap(p, 0));
  }
  CUTLASS_DEVICE auto store_init(Params const& p, TensorMapStorage&, int32_t, int32_t, int32_t) {
    return cute::make_tuple(GroupMap(p, 0));
  }
  // The kernel layer calls this in the warp that issues the TMA stores (warp 0 of a consumer warp group) with its
  // own copy of the pointer store_init returned.
  template <bool IsLoad, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage&, Params const& p, cute::TmaDescriptor*& map,
                                                ProblemShape_MNKL, int32_t next_batch, int32_t) {
    if constexpr (!IsLoad) map = GroupMap(p, next_batch);
  }
  // CUTLASS waits here for every issued TMA store to complete (its per-SM copy is about to be overwritten); these
  // descriptors are never overwritten while the GEMM runs.
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage&, cute::TmaDescriptor const*, int32_t = 0) {}
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_fence_acquire(cute::TmaDescriptor const* map) {
    if constexpr (!IsLoad) cute::tma_descriptor_fence_acquire(map);
  }

  // BuildGroupTensormapsKernel, one warp per group: D's descriptor from the params (built on the host for a
  // placeholder shape) with this group's address, extents and byte strides.
  template <class ProblemShape_MNKL>
  static CUTLASS_DEVICE void BuildGroup(Params const& p, cute::TmaDescriptor& smem, ProblemShape_MNKL shape,
                                        int32_t group) {
    if (cute::elect_one_sync()) {
      smem = *p.tma_store_d.get_tma_descriptor();
      cute::tma_descriptor_replace_addr_in_shared_mem(smem, p.ptr_D[group]);
      const uint32_t m = cute::get<0>(shape);
      const uint32_t n = cute::get<1>(shape);
      const auto layout_d = cute::make_layout(cute::make_shape(m, n, cute::Int<1>{}), p.dD[group]);
      cute::array<uint32_t, 5> extents = {1, 1, 1, 1, 1};
      cute::array<uint64_t, 5> strides = {0, 0, 0, 0, 0};
      cute::detail::fill_tma_gmem_shape_stride(p.tma_store_d, cute::make_tensor(static_cast<ElementD const*>(nullptr),
                                                                                layout_d),
                                               extents, strides);
      for (uint64_t& s : strides) s = s * cute::sizeof_bits_v<ElementD> / 8;  // elements -> bytes
      cute::tma_descriptor_replace_dims_strides_in_shared_mem(smem, extents, strides);
    }
    __syncwarp();
    cute::tma_descriptor_cp_fence_release(GroupMap(p, group), smem);
  }
};

template <class Collective, class = void>
struct HasPrebuiltTensormaps : std::false_type {};
template <class Collective>
struct HasPrebuiltTensormaps<Collective, std::void_t<decltype(Collective::kPrebuiltTensormaps)>>
    : std::bool_constant<Collective::kPrebuiltTensormaps> {};

// Whether a kernel needs BuildGroupTensormapsKernel before it: either collective may take prebuilt descriptors
// (e.g. the accumulate form's mainloop does, its epilogue, which reads C, does not).
template <class Kernel>
constexpr bool kNeedsGroupTensormaps = HasPrebuiltTensormaps<typename Kernel::CollectiveMainloop>::value ||
                                       HasPrebuiltTensormaps<typename Kernel::CollectiveEpilogue>::value;

// One warp per group. Groups with no rows or columns get no tiles from the scheduler, so no descriptors (a group with
// K = 0 still stores its zeros through D).
constexpr int kBuildMapsWarps = 4;
template <class Kernel>
__global__ void __launch_bounds__(32 * kBuildMapsWarps)
    BuildGroupTensormapsKernel(CUTLASS_GRID_CONSTANT typename Kernel::Params const params) {
  using Mainloop = typename Kernel::CollectiveMainloop;
  using Epilogue = typename Kernel::CollectiveEpilogue;
  struct alignas(128) DMap {
    cute::TmaDescriptor map;
  };
  __shared__ typename Mainloop::TensorMapStorage mainloop_maps[kBuildMapsWarps];
  __shared__ DMap d_maps[kBuildMapsWarps];
  LetDependentGridsLaunch();  // the GEMM's CTAs may take their SMs now; they wait for this grid to finish
  WaitForPrecedingGrids();    // the problem shapes and pointer arrays: the setup kernel's
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int32_t group = static_cast<int32_t>(blockIdx.x) * kBuildMapsWarps + warp;
  if (group >= params.problem_shape.groups()) return;  // (whole warps)
  const auto shape = cute::append<4>(params.problem_shape.get_problem_shape(group), 1);
  if (cute::get<0>(shape) <= 0 || cute::get<1>(shape) <= 0) return;
  if constexpr (HasPrebuiltTensormaps<Mainloop>::value) {
    Mainloop mainloop;
    mainloop.BuildGroup(params.mainloop, mainloop_maps[warp], shape, group);
  }
  if constexpr (HasPrebuiltTensormaps<Epilogue>::value) {
    Epilogue::BuildGroup(params.epilogue, d_maps[warp].map, shape, group);
  }
}

}  // namespace cuda
}  // namespace jax_moe_ffi
