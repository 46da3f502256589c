// A consumer mainloop for the SM90 blockwise-scaled FP8 grouped GEMM that overlaps the float32
// "promotion" of one 128-deep slice with the tensor-core work of the next.
//
// Why: with blockwise scales every 128-deep slice of the K loop is accumulated by the tensor cores
// into a slice accumulator, which is then multiplied by scale_a(row) * scale_b(tile) and added to the
// float32 result (a promotion: 64 FFMAs per thread for a 64x128 warp-group tile). CUTLASS's SM90
// blockwise mainloop waits for a slice's wgmma batch to finish (warpgroup_wait<0>) before it promotes,
// and both consumer warp groups of a cooperative tile do so at the same time, so the tensor cores
// idle during every promotion (benchmarks/NOTES.md, session 8: ping-pong tiles do no better).
//
// Here each thread keeps two slice accumulators. Slice t's wgmmas are issued into one while the other
// still holds slice t-1; warpgroup_wait<1> then waits for slice t-1 only, and its promotion runs while
// slice t's wgmmas execute. Cost: one more accumulator (64 registers per thread at 128x128 tiles).
//
// Only mma() is new. The producer side (TMA and cp.async loads of operands and scales), the shared
// memory layout, the pipeline, the TMA descriptor updates and the arguments are CUTLASS's collective
// (the class derives from the one CUTLASS's builder makes). The pipeline contract is the same as
// CUTLASS's: slices 0..K-2 are released here, the last one by the kernel's mma_tail().
//
// Supported: one scale block per k-tile (TileK == ScaleGranularityK) and per-row A scales
// (ScaleGranularityM < TileM), with either one B scale per N tile (ScaleGranularityN == TileN: the 1x128 /
// 128x128 recipe of the forward and dgrad) or per-column B scales (ScaleGranularityN == 1: the FP8 weight
// gradient, 1 x 128 token blocks on both operands). Anything else fails to compile.
//
// Per-column B scales ("two-sided"): a thread's slice holds 2 rows x 32 columns per 64-row warp-group tile,
// so keeping two slices' column scales in registers (as the one-sided path keeps its row scales) would
// exceed the consumer's register budget. Instead slice t-1 is promoted before its shared-memory stage goes
// back to the producer, reading both scales from that stage; the promotion is CUTLASS's expression,
// accum += (slice * scale_a(row)) * scale_b(column), written to be bitwise CUTLASS's mainloop's
// (test_gpu_fp8_wgrad_overlap_mainloop_matches_cutlass_bitwise, passed on the H200 in session 17, when it became
// the FP8 wgrad's default: 2-5% faster than CUTLASS's mainloop on the benchmark shapes).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace jax_moe_ffi {
namespace cuda {

// The blockwise scales of a pipeline stage partitioned like the result: the scales in shared memory seen as
// (BLK_M, BLK_N, (BLK_K, PIPE)) tensors that broadcast along the dimension they do not depend on, so that
// partition_C gives each thread the scales of its accumulator elements. Returns (tCsSFA, tCsSFB), each
// (MMA,MMA_M,MMA_N,(MMA_K,PIPE)). Shared by the mainloops here and in fp8_wide_tile_mainloop.cuh.
template <class Mainloop>
CUTLASS_DEVICE auto PartitionScalesLikeResult(typename Mainloop::TensorStorage& shared_tensors, int thread_idx) {
  using namespace cute;
  using TileShape = typename Mainloop::TileShape;
  using SmemLayoutSFA = typename Mainloop::SmemLayoutSFA;
  using SmemLayoutSFB = typename Mainloop::SmemLayoutSFB;
  Tensor sSFA = make_tensor(
      make_smem_ptr(shared_tensors.smem_SFA.data()),
      make_layout(make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                             make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
                  make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                              make_stride(stride<1>(SmemLayoutSFA{}), stride<2>(SmemLayoutSFA{})))));
  Tensor sSFB = make_tensor(
      make_smem_ptr(shared_tensors.smem_SFB.data()),
      make_layout(make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                             make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
                  make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                              make_stride(stride<1>(SmemLayoutSFB{}), stride<2>(SmemLayoutSFB{})))));
  auto thread_mma = typename Mainloop::TiledMma{}.get_slice(thread_idx);
  return make_tuple(thread_mma.partition_C(sSFA), thread_mma.partition_C(sSFB));
}

template <class Base>
struct OverlappedPromotionMainloop : Base {
  using Base::Base;
  using TiledMma = typename Base::TiledMma;
  using TileShape = typename Base::TileShape;
  using ElementBlockScale = typename Base::ElementBlockScale;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TensorStorage = typename Base::TensorStorage;
  using Params = typename Base::Params;
  using SmemLayoutA = typename Base::SmemLayoutA;
  using SmemLayoutB = typename Base::SmemLayoutB;

  static_assert(cute::size<2>(TileShape{}) == Base::ScaleGranularityK,
                "overlapped promotion: one scale block per k-tile");
  static constexpr bool kTwoSided = Base::ScaleNsPerTile > 1;
  static_assert(Base::ScaleMsPerTile == cute::size<0>(TileShape{}) || !kTwoSided,
                "overlapped promotion, two-sided: per-row A scales");
  static_assert(Base::ScaleMsPerTile > 1 && (Base::ScaleNsPerTile == 1 ||
                                            Base::ScaleNsPerTile == cute::size<1>(TileShape{})),
                "overlapped promotion: per-row A scales and one B scale per N tile or per column");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors,
                          Params const& /*mainloop_params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator must live in registers");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (M,K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (N,K,PIPE)
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    auto scales_like_result = PartitionScalesLikeResult<Base>(shared_tensors, thread_idx);
    Tensor tCsSFA = get<0>(scales_like_result);  // (MMA,MMA_M,MMA_N,(MMA_K,PIPE))
    Tensor tCsSFB = get<1>(scales_like_result);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));        // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));        // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    // Two slice accumulators and (one-sided) the combined scale of the slice each one holds.
    Tensor slice0 = make_fragment_like(accum);
    Tensor slice1 = make_fragment_like(accum);
    if constexpr (kTwoSided) {
      mma_two_sided(pipeline, smem_pipe_read, accum, k_tile_count, tiled_mma, tCrA, tCrB, tCsSFA, tCsSFB, slice0,
                    slice1);
      return;
    }
    Tensor scale0 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));  // per row, broadcast over N
    Tensor scale1 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor scale_b = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));  // one value per tile

    PipelineState smem_pipe_release = smem_pipe_read;

    // Waits for the next k-tile, reads its scales and issues its wgmmas into `slice` (not waited for).
    auto issue = [&](auto& slice, auto& scale) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), scale);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), scale_b);
      warpgroup_fence_operand(slice);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), slice);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(slice);
      // scale_a(row) * scale_b(tile), while the wgmmas run.
      const ElementBlockScale b = scale_b(_0{});
      Tensor rows = filter_zeros(scale);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(rows); ++i) rows(i) = rows(i) * b;
      ++smem_pipe_read;
    };
    // accum += slice * scale; the slice's wgmmas must have completed.
    auto promote = [&](auto& slice, auto const& scale) {
      warpgroup_fence_operand(slice);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += slice(i) * scale(i);
    };
    // Slice t-1 is complete (only slice t may still run): its shared-memory stage goes back to the
    // producer.
    auto release_previous = [&]() {
      warpgroup_wait<1>();
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    clear(accum);
    warpgroup_fence_operand(accum);
    if (k_tile_count <= 0) return;
    issue(slice0, scale0);
    int remaining = k_tile_count - 1;
    // Unrolled by two so that each slice accumulator is a fixed set of registers.
    CUTLASS_PRAGMA_NO_UNROLL
    while (true) {
      if (remaining == 0) {
        warpgroup_wait<0>();
        promote(slice0, scale0);
        break;
      }
      issue(slice1, scale1);
      release_previous();
      promote(slice0, scale0);
      if (--remaining == 0) {
        warpgroup_wait<0>();
        promote(slice1, scale1);
        break;
      }
      issue(slice0, scale0);
      release_previous();
      promote(slice1, scale1);
      --remaining;
    }
    warpgroup_fence_operand(accum);
  }

  // Per-column B scales: slice t's wgmmas are issued, slice t-1 (complete after warpgroup_wait<1>) is promoted
  // with the scales of its own stage, and only then is that stage released. The last slice is promoted here
  // and released by the kernel's mma_tail(), as in CUTLASS's mainloop.
  template <class FrgTensorC, class Mma, class FrgA, class FrgB, class ScalesA, class ScalesB, class Slice>
  CUTLASS_DEVICE void mma_two_sided(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                                    int k_tile_count, Mma& tiled_mma, FrgA& tCrA, FrgB& tCrB, ScalesA& tCsSFA,
                                    ScalesB& tCsSFB, Slice& slice0, Slice& slice1) {
    using namespace cute;
    PipelineState smem_pipe_release = smem_pipe_read;
    auto issue = [&](auto& slice) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      warpgroup_fence_operand(slice);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), slice);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(slice);
      ++smem_pipe_read;
    };
    // accum += slice * scale_a * scale_b, the scales read from the (not yet released) stage of that slice.
    auto promote = [&](auto& slice) {
      const int stage = smem_pipe_release.index();
      Tensor sa = tCsSFA(_, _, _, make_coord(_0{}, stage));
      Tensor sb = tCsSFB(_, _, _, make_coord(_0{}, stage));
      warpgroup_fence_operand(slice);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += slice(i) * sa(i) * sb(i);
    };
    auto release = [&]() {
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    clear(accum);
    warpgroup_fence_operand(accum);
    if (k_tile_count <= 0) return;
    issue(slice0);
    int remaining = k_tile_count - 1;
    CUTLASS_PRAGMA_NO_UNROLL
    while (true) {
      if (remaining == 0) {
        warpgroup_wait<0>();
        promote(slice0);
        break;
      }
      issue(slice1);
      warpgroup_wait<1>();
      promote(slice0);
      release();
      if (--remaining == 0) {
        warpgroup_wait<0>();
        promote(slice1);
        break;
      }
      issue(slice0);
      warpgroup_wait<1>();
      promote(slice1);
      release();
      --remaining;
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace cuda
}  // namespace jax_moe_ffi
