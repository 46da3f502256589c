// Wgrad mainloop that skips the zero-padded wgmma steps of a group's last k-tile (experiment builds only:
// JAX_MOE_FFI_WGRAD_TILES=trim; compiled in session 25, not yet run on a GPU).
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

  // Consumer: CUTLASS's loop (one k-tile of wgmmas in flight, each stage released one k-tile later), with the last
  // k-tile's wgmma steps limited to the mailbox's count.
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
    constexpr int kBlocks = size<2>(decltype(tCrA){});

    PipelineState smem_pipe_release = smem_pipe_read;
    const int slot = MailboxSlot(smem_pipe_read.index(), smem_pipe_read.phase());
    int last_blocks = kBlocks;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    for (int remaining = k_tile_count; remaining > 0; --remaining) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      if (remaining == k_tile_count) last_blocks = shared_tensors.last_k_blocks[slot];  // after the first wait
      const int read_stage = smem_pipe_read.index();
      const int blocks = remaining == 1 ? last_blocks : kBlocks;  // uniform across the warp group
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < kBlocks; ++k_block) {
        if (k_block < blocks) {
          cute::gemm(tiled_mma, tCrA(_, _, k_block, read_stage), tCrB(_, _, k_block, read_stage), accum);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
      ++smem_pipe_read;
      if (remaining != k_tile_count) {  // the k-tile before this one is done: release its stage
        warpgroup_wait<1>();
        warpgroup_fence_operand(accum);
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
    }
    warpgroup_fence_operand(accum);
  }

 private:
  static CUTLASS_DEVICE int MailboxSlot(int stage, int phase) { return stage + kStages * (phase & 1); }
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
