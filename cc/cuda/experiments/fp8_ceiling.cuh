// EXPERIMENT ONLY (CMake option JAX_MOE_FFI_FP8_EXPERIMENTS, default OFF; never in a shipped library):
// ceilings for the blockwise FP8 forward's tile shape. These kernels are the blockwise kernel with its
// consumer mainloop replaced by one that accumulates every k-tile straight into the result, ignoring the
// scales (the per-tensor "fast accumulation" loop): the answer is WRONG by design. Same loads (operands and
// scales), pipeline, tile scheduler and epilogue, so their time is what the tile shape allows once
// promotion costs nothing. Question they answer (session 17): is the forward at ~1100 TFLOP/s limited by
// the promotion or by the 128x128 tile (operand bandwidth into the SM)?
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace jax_moe_ffi {
namespace cuda {

template <class Base>
struct DirectAccumulationMainloop : Base {
  using Base::Base;
  using TiledMma = typename Base::TiledMma;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TensorStorage = typename Base::TensorStorage;
  using Params = typename Base::Params;
  using SmemLayoutA = typename Base::SmemLayoutA;
  using SmemLayoutB = typename Base::SmemLayoutB;

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));

    PipelineState smem_pipe_release = smem_pipe_read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k = 0; k < k_tile_count; ++k) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // k-tile k-1 is done: its stage goes back (the last one in mma_tail)
      if (k > 0) {
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
      ++smem_pipe_read;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(accum);
    if (k_tile_count <= 0) clear(accum);
  }
};

// Cooperative 128 x N x 128 tiles, cluster CM x CN, with the direct (scale-ignoring) mainloop.
template <int kTileN, int kClusterM, int kClusterN>
struct Fp8CeilingConfig {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::_128>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  static constexpr bool kOverlap = false;
  template <class Builder>
  using Mainloop = DirectAccumulationMainloop<Builder>;
  static constexpr const char* kName = "fp8_EXPERIMENT_direct_accumulation";
};

// A candidate with correct numerics: the default forward kernel (overlapped promotion, 128x128x128) on a 2x2
// cluster, so that both the activation and the weight tiles are multicast (half the L2 reads of each per CTA).
struct Fp8CoopOverlapC22Config {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_2, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  static constexpr bool kOverlap = true;
  static constexpr const char* kName = "fp8_blockwise_coop_128x128x128_c2x2_overlap";
};

// CUTLASS's per-tensor-scaled FP8 pointer-array kernel ("fast accumulation": no promotion, no scale loads at all)
// at the same tile and cluster shapes: the kernel family behind the 1523 TFLOP/s of CUTLASS's own grouped FP8
// example on deepseek-v3 gate_up. Against the direct* kernels above (same tile, the blockwise collective's
// scale loads kept) it says what the blockwise collective's structure itself costs. Wrong answers by design
// here too (scales ignored; D = acc).
template <int kTileN, int kClusterM, int kClusterN>
struct Fp8PerTensorGemm {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::_128>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementOut = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, 8, ElementOut, LayoutD*, 8,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, float, void, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, 16, ElementB, LayoutB*, 16, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<GroupShape, CollectiveMainloop, CollectiveEpilogue>;
  static constexpr const char* kName = "fp8_EXPERIMENT_per_tensor_fast_accum";
};

}  // namespace cuda
}  // namespace jax_moe_ffi
