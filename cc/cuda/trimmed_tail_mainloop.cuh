// Wgrad mainloop that skips the zero-padded wgmma steps of a group's last k-tile (experiment builds only:
// JAX_MOE_FFI_WGRAD_TILES=trim). Session 25: the first version (steps tested inside the loop) was bitwise the default
// on every benchmark shape but 0.75-0.88x its speed (wgrad_trim_ab_h200.md); this one, with the last k-tile peeled
// off the loop, is compiled and not yet measured.
//
// Why: the wgrad contracts over each group's rows, in 64-row k-tiles, and the last k-tile of a group holds
// rows % 64 real rows (TMA fills the rest with zeros). The tensor cores still run all four 16-deep wgmma steps of
// that k-tile. Nsight Compute on the skewed qwen3-30b down wgrad (session 25) counted 8.5% more wgmma steps than with
// even sizes for the same FLOPs: half of its groups have under 260 rows. 32-deep k-tiles halve the padding but cost
// more than they save (session 25, k32: 0.86-0.97x). Here the k-tiles stay 64 deep and only the last one issues
// ceil((rows % 64) / 16) of its 16-deep steps; the skipped steps multiply zeros, so the result is bitwise the same.
//
// How the consumer learns the row count: CUTLASS's consumer loop gets a k-tile count, not the group's K, so the
// producer warp (which sees each group's problem shape when it switches descriptors) leaves the number of steps the
// tile's last k-tile needs in a shared-memory mailbox before it acquires the stage of the tile's first k-tile; the
// consumer reads it after waiting for that stage. The mailbox has a slot per (stage, phase parity): the producer
// writes a slot two passes through the pipeline after its last use, by which time the consumer that read it has
// released that stage (the producer waited for that release when it acquired the stage one pass ago); the
// producer's arrive on the stage's full barrier orders the write before the consumer's wait.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace jax_moe_ffi {
namespace cuda {

template <class Base>
struct TrimmedTailMainloop : Base {
  using Base::Base;
  using Params = typename Base::Params;
  using TensorMapStorage = typename Base::TensorMapStorage;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TiledMma = typename Base::TiledMma;
  static constexpr int kStages = Base::DispatchPolicy::Stages;
  static constexpr int kTileK = cute::size<2>(typename Base::TileShape{});

  struct TensorStorage : Base::TensorStorage {
    int32_t last_k_blocks[2 * kStages];  // mailbox: wgmma k-blocks the tile's last k-tile needs
  };

  // Producer: the problem's K (the group's rows), from the update the kernel layer calls on every group change.
  template <class Maps, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& smem, Params const& p, Maps& maps,
                                                ProblemShape_MNKL shape, int32_t next_batch) {
    problem_k_ = static_cast<int32_t>(cute::get<2>(shape));
    Base::tensormaps_perform_update(smem, p, maps, shape, next_batch);
  }

  template <class LoadInputs, class TensorMaps, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           LoadInputs const& load_inputs, TensorMaps const& input_tensormaps,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, TensorStorage& shared_tensors) {
    if (k_tile_count > 0) {
      if (cute::elect_one_sync()) {
        shared_tensors.last_k_blocks[MailboxSlot(smem_pipe_write.index(), smem_pipe_write.phase() ^ 1)] =
            LastKBlocks(problem_k_);
      }
      __syncwarp();  // the write happens before the elected thread's arrive on the stage's full barrier
    }
    Base::load(p, pipeline, smem_pipe_write, load_inputs, input_tensormaps, blk_coord, k_tile_iter, k_tile_count,
               thread_idx, block_rank_in_cluster, static_cast<typename Base::TensorStorage&>(shared_tensors));
  }

  // Consumer: CUTLASS's loop (one k-tile of wgmmas in flight, each stage released one k-tile later) with the last
  // k-tile peeled off and its wgmma steps limited to the mailbox's count. The full k-tiles issue exactly CUTLASS's
  // unconditional wgmma sequence: a first version that tested every step against the count inside the loop ran
  // 0.75-0.88x of the default on every shape, even ones with nothing to trim (session 25, call 6: ptxas injected
  // wgmma fences around the conditional steps), so the conditional steps are confined to the peeled k-tile.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(Base::K_PIPE_MMAS == 1, "TrimmedTailMainloop: one k-tile of wgmmas in flight");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout wg_layout = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int wg_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(wg_layout(wg_idx));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    if (k_tile_count <= 0) return;

    PipelineState smem_pipe_release = smem_pipe_read;
    const int slot = MailboxSlot(smem_pipe_read.index(), smem_pipe_read.phase());
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    // First k-tile (the prologue): full unless it is also the last.
    pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
    const int last_blocks = shared_tensors.last_k_blocks[slot];  // after the first wait
    warpgroup_arrive();
    IssueSteps(tiled_mma, tCrA, tCrB, smem_pipe_read.index(), accum, k_tile_count == 1 ? last_blocks : kFullSteps);
    warpgroup_commit_batch();
    ++smem_pipe_read;
    warpgroup_fence_operand(accum);
    // A k-tile after the first: wait for its stage, issue its steps, then release the stage before it once that
    // k-tile's wgmmas are done (one k-tile in flight).
    auto next_k_tile = [&](auto issue) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      issue(smem_pipe_read.index());
      warpgroup_commit_batch();
      warpgroup_wait<1>();
      warpgroup_fence_operand(accum);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_read;
      ++smem_pipe_release;
    };
    // Middle k-tiles: CUTLASS's unconditional step sequence.
    CUTLASS_PRAGMA_NO_UNROLL
    for (int middle = k_tile_count - 2; middle > 0; --middle) {
      next_k_tile([&](int stage) { cute::gemm(tiled_mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), accum); });
    }
    // Last k-tile (when it is not the first): the mailbox's steps.
    if (k_tile_count > 1) {
      next_k_tile([&](int stage) { IssueSteps(tiled_mma, tCrA, tCrB, stage, accum, last_blocks); });
    }
    warpgroup_fence_operand(accum);
  }

 private:
  static constexpr int kFullSteps = kTileK / 16;  // 16-deep bf16 wgmma steps in a k-tile

  static CUTLASS_DEVICE int MailboxSlot(int stage, int phase) { return stage + kStages * (phase & 1); }

  // The first n (1 .. kFullSteps) wgmma steps of a stage's k-tile, each branch a fixed unrolled sequence.
  template <int kSteps, class Mma, class TA, class TB, class Acc>
  static CUTLASS_DEVICE void IssueFirst(Mma& tiled_mma, TA const& tCrA, TB const& tCrB, int stage, Acc& accum) {
    CUTLASS_PRAGMA_UNROLL
    for (int k_block = 0; k_block < kSteps; ++k_block) {
      cute::gemm(tiled_mma, tCrA(cute::_, cute::_, k_block, stage), tCrB(cute::_, cute::_, k_block, stage), accum);
      tiled_mma.accumulate_ = cute::GMMA::ScaleOut::One;
    }
  }
  template <class Mma, class TA, class TB, class Acc>
  static CUTLASS_DEVICE void IssueSteps(Mma& tiled_mma, TA const& tCrA, TB const& tCrB, int stage, Acc& accum, int n) {
    static_assert(kFullSteps == 4, "TrimmedTailMainloop: 64-deep bf16 k-tiles");
    switch (n) {
      case 1: IssueFirst<1>(tiled_mma, tCrA, tCrB, stage, accum); break;
      case 2: IssueFirst<2>(tiled_mma, tCrA, tCrB, stage, accum); break;
      case 3: IssueFirst<3>(tiled_mma, tCrA, tCrB, stage, accum); break;
      default: IssueFirst<4>(tiled_mma, tCrA, tCrB, stage, accum); break;
    }
  }
  // 16-deep wgmma steps (bf16) the last k-tile of a K-long contraction needs.
  static CUTLASS_DEVICE int32_t LastKBlocks(int32_t k) {
    constexpr int kBlockK = 16;
    const int32_t rem = k % kTileK;
    return rem == 0 ? kTileK / kBlockK : (rem + kBlockK - 1) / kBlockK;
  }

  int32_t problem_k_ = 0;  // producer warp only
};

}  // namespace cuda
}  // namespace jax_moe_ffi
