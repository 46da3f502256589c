// A producer mainloop for the SM90 pointer-array (grouped) GEMM that sums two products in one
// accumulator: out_g = A0_g . B0_g + A1_g . B1_g, both products of the same (m_g, N) and contraction
// length K.
//
// Why: the lhs gradient of the gate and up projections (two GEMMs of the same rows) is
// dG . Wg^T + dU . Wu^T. As two launches, the second reads the first's [M, N] output back as its C
// operand (440 vs 386 us for a plain dgrad at the Qwen3 layer, session 10 profile) and both pay a
// K = 768 mainloop's prologue and epilogue per tile. Here each tile runs one K loop of 2K: the first
// ceil(K / BLK_K) k-tiles load A0 / B0, the rest
// A1 / B1 (each product's last k-tile zero-filled by TMA past K), into the same float32 accumulator, and
// the epilogue stores once (one bf16 rounding instead of two).
//
// How: the kernel layer keeps the collective's TMA descriptors in per-SM global memory and asks the
// collective to rewrite them when a tile of another group starts (tensormaps_perform_update). This
// collective keeps four (A0, B0, A1, B1) instead of two; the consumer (mma), the shared-memory stages,
// the pipeline and the epilogue are CUTLASS's (the class derives from the collective CUTLASS's builder
// makes). Problem K is set by the setup kernel to round_up(K, BLK_K) + K, which gives the kernel (and
// its consumer warp groups) the k-tile count of both products.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace jax_moe_ffi {
namespace cuda {

template <class Base>
struct TwoProductMainloop : Base {
  using Base::Base;
  using InternalElementA = typename Base::InternalElementA;
  using InternalElementB = typename Base::InternalElementB;
  using ElementA = typename Base::ElementA;
  using ElementB = typename Base::ElementB;
  using TileShape = typename Base::TileShape;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TensorStorage = typename Base::TensorStorage;
  using DispatchPolicy = typename Base::DispatchPolicy;
  using SmemLayoutA = typename Base::SmemLayoutA;
  using SmemLayoutB = typename Base::SmemLayoutB;
  using GmemTiledCopyA = typename Base::GmemTiledCopyA;
  using GmemTiledCopyB = typename Base::GmemTiledCopyB;
  static_assert(Base::IsGroupedGemmKernel, "two products: grouped (per-group stride) kernels only");
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr bool kPrebuiltTensormaps = false;  // its own per-SM descriptors (four), rewritten per group

  // The base's arguments (A0 / B0 and the shared strides) plus the second product's pointers.
  struct Arguments : Base::Arguments {
    ElementA const** ptr_A1 = nullptr;
    ElementB const** ptr_B1 = nullptr;
    int k_each = 0;  // K of each product (problem K = round_up(k_each, kTileK) + k_each)
  };
  struct Params : Base::Params {
    InternalElementA const** ptr_A1 = nullptr;
    InternalElementB const** ptr_B1 = nullptr;
    int k_each = 0;
  };
  struct TensorMapStorage : cute::aligned_struct<128, cute::_0> {
    cute::TmaDescriptor smem_tensormap_A;
    cute::TmaDescriptor smem_tensormap_B;
    cute::TmaDescriptor smem_tensormap_A1;
    cute::TmaDescriptor smem_tensormap_B1;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape problem_shapes, Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem_shapes, args, workspace);
    p.ptr_A1 = reinterpret_cast<InternalElementA const**>(args.ptr_A1);
    p.ptr_B1 = reinterpret_cast<InternalElementB const**>(args.ptr_B1);
    p.k_each = args.k_each;
    return p;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int sm_count) {
    return 4 * sizeof(cute::TmaDescriptor) * static_cast<size_t>(sm_count);  // A0, B0, A1, B1 per SM
  }

  CUTLASS_DEVICE auto tensormaps_init(Params const& p, TensorMapStorage& s, int32_t sm_count, int32_t sm_idx) {
    using namespace cute;
    TmaDescriptor* g = reinterpret_cast<TmaDescriptor*>(p.tensormaps);
    if (elect_one_sync()) {
      // The parameter descriptors are templates (shapes 1); the updates below set each group's.
      Tensor pa = make_tensor(p.tma_load_a.get_tma_descriptor(), Int<1>{}, Int<1>{});
      Tensor pb = make_tensor(p.tma_load_b.get_tma_descriptor(), Int<1>{}, Int<1>{});
      copy(recast<uint128_t>(pa), recast<uint128_t>(make_tensor(make_smem_ptr(&s.smem_tensormap_A), Int<1>{}, Int<1>{})));
      copy(recast<uint128_t>(pb), recast<uint128_t>(make_tensor(make_smem_ptr(&s.smem_tensormap_B), Int<1>{}, Int<1>{})));
      copy(recast<uint128_t>(pa), recast<uint128_t>(make_tensor(make_smem_ptr(&s.smem_tensormap_A1), Int<1>{}, Int<1>{})));
      copy(recast<uint128_t>(pb), recast<uint128_t>(make_tensor(make_smem_ptr(&s.smem_tensormap_B1), Int<1>{}, Int<1>{})));
    }
    __syncwarp();
    return make_tuple(&g[sm_idx], &g[sm_idx + sm_count], &g[sm_idx + 2 * sm_count], &g[sm_idx + 3 * sm_count]);
  }

  template <class TensorMaps, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& s, Params const& p, TensorMaps const&,
                                                ProblemShape_MNKL problem_shape_mnkl, int32_t next_group) {
    using namespace cute;
    if (elect_one_sync()) {
      tma_descriptor_replace_addr_in_shared_mem(s.smem_tensormap_A, p.ptr_A[next_group]);
      tma_descriptor_replace_addr_in_shared_mem(s.smem_tensormap_B, p.ptr_B[next_group]);
      tma_descriptor_replace_addr_in_shared_mem(s.smem_tensormap_A1, p.ptr_A1[next_group]);
      tma_descriptor_replace_addr_in_shared_mem(s.smem_tensormap_B1, p.ptr_B1[next_group]);
      // Each product's own extent (M, k_each) / (N, k_each), so that TMA zero-fills its last k-tile past K;
      // the two products share strides (the setup kernel writes one stride per group).
      const uint32_t m = get<0>(problem_shape_mnkl);
      const uint32_t n = get<1>(problem_shape_mnkl);
      const uint32_t k = static_cast<uint32_t>(p.k_each);
      cute::array<uint32_t, 5> shape_a = {1, 1, 1, 1, 1}, shape_b = {1, 1, 1, 1, 1};
      cute::array<uint64_t, 5> stride_a = {0, 0, 0, 0, 0}, stride_b = {0, 0, 0, 0, 0};
      Tensor ta = make_tensor(static_cast<InternalElementA const*>(nullptr), make_shape(m, k, Int<1>{}),
                              p.dA[next_group]);
      Tensor tb = make_tensor(static_cast<InternalElementB const*>(nullptr), make_shape(n, k, Int<1>{}),
                              p.dB[next_group]);
      cute::detail::fill_tma_gmem_shape_stride(p.tma_load_a, ta, shape_a, stride_a);
      cute::detail::fill_tma_gmem_shape_stride(p.tma_load_b, tb, shape_b, stride_b);
      for (uint64_t& v : stride_a) v = (v * cutlass::sizeof_bits<InternalElementA>::value) / 8;  // bytes
      for (uint64_t& v : stride_b) v = (v * cutlass::sizeof_bits<InternalElementB>::value) / 8;
      tma_descriptor_replace_dims_strides_in_shared_mem(s.smem_tensormap_A, shape_a, stride_a);
      tma_descriptor_replace_dims_strides_in_shared_mem(s.smem_tensormap_A1, shape_a, stride_a);
      tma_descriptor_replace_dims_strides_in_shared_mem(s.smem_tensormap_B, shape_b, stride_b);
      tma_descriptor_replace_dims_strides_in_shared_mem(s.smem_tensormap_B1, shape_b, stride_b);
    }
  }

  template <class TensorMaps>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& s, TensorMaps const& tm) {
    if (cute::elect_one_sync()) {
      cute::tma_desc_commit_group();
      cute::tma_desc_wait_group();
    }
    // whole warp (aligned instructions)
    cute::tma_descriptor_cp_fence_release(cute::get<0>(tm), s.smem_tensormap_A);
    cute::tma_descriptor_cp_fence_release(cute::get<1>(tm), s.smem_tensormap_B);
    cute::tma_descriptor_cp_fence_release(cute::get<2>(tm), s.smem_tensormap_A1);
    cute::tma_descriptor_cp_fence_release(cute::get<3>(tm), s.smem_tensormap_B1);
  }

  template <class TensorMaps>
  CUTLASS_DEVICE void tensormaps_fence_acquire(TensorMaps const& tm) {
    cute::tma_descriptor_fence_acquire(cute::get<0>(tm));
    cute::tma_descriptor_fence_acquire(cute::get<1>(tm));
    cute::tma_descriptor_fence_acquire(cute::get<2>(tm));
    cute::tma_descriptor_fence_acquire(cute::get<3>(tm));
  }

  // Producer: CUTLASS's load() with the descriptor pair and k coordinate chosen per k-tile.
  template <class TensorA, class TensorB, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs, TensorMaps const& tm,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int /*thread_idx*/, uint32_t block_rank_in_cluster, TensorStorage& shared_tensors) {
    using namespace cute;
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    constexpr uint32_t cluster_x = get<0>(typename DispatchPolicy::ClusterShape());
    const uint2 cluster_id = {block_rank_in_cluster % cluster_x, block_rank_in_cluster / cluster_x};
    auto block_tma_a = p.tma_load_a.get_slice(cluster_id.y);
    auto block_tma_b = p.tma_load_b.get_slice(cluster_id.x);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = block_tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));  // (TMA,TMA_M,TMA_K,k)
    Tensor tAsA = block_tma_a.partition_D(sA);
    Tensor tBgB = block_tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));  // (TMA,TMA_N,TMA_K,k)
    Tensor tBsB = block_tma_b.partition_D(sB);

    uint16_t mcast_mask_a = 0;
    uint16_t mcast_mask_b = 0;
    if constexpr (is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      auto block_layout = Layout<typename DispatchPolicy::ClusterShape>{};  // (m,n) -> block_id
      for (int n = 0; n < size<1>(block_layout); ++n) {
        mcast_mask_a |= (uint16_t(1) << block_layout(cluster_id.x, n, Int<0>{}));
      }
    }
    if constexpr (is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      auto block_layout = Layout<typename DispatchPolicy::ClusterShape>{};
      for (int m = 0; m < size<0>(block_layout); ++m) {
        mcast_mask_b |= (uint16_t(1) << block_layout(m, cluster_id.y, Int<0>{}));
      }
    }

    const int k_tiles_first = (p.k_each + kTileK - 1) / kTileK;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* tma_barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      const int kt = *k_tile_iter;
      const bool second = kt >= k_tiles_first;
      const int kc = second ? kt - k_tiles_first : kt;  // k-tile within its own product
      copy(p.tma_load_a.with(second ? get<2>(tm) : get<0>(tm), *tma_barrier, mcast_mask_a), tAgA(_, _, _, kc),
           tAsA(_, _, _, stage));
      copy(p.tma_load_b.with(second ? get<3>(tm) : get<1>(tm), *tma_barrier, mcast_mask_b), tBgB(_, _, _, kc),
           tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }
};

}  // namespace cuda
}  // namespace jax_moe_ffi
