// A consumer mainloop for the blockwise FP8 grouped GEMM on 128 x 256 tiles: the result is promoted in
// n-slices narrower than the tile, so that it fits the consumer warp group's registers.
//
// Why: session 17's ceiling kernels (benchmarks/results/fp8_ceiling_h200.md) put a 128x256 tile 10-16% above
// the shipped 128x128 one, but a blockwise 128x256 tile needs, per consumer thread, the 64x256 float32 result
// (128 registers) plus a slice accumulator of the same size for the 128-deep k-tile being multiplied before its
// scales are applied -- 256 registers against a budget of 232.
//
// Here the k-tile's tensor-core work is split along N into slices of kSliceN columns (wgmma m64 x kSliceN x 32
// from the same shared-memory stage), each into a small slice accumulator that is promoted into its columns of
// the result: result[:, slice] += acc_slice * (scale_a(row) * scale_b(column block)). Two slice accumulators
// alternate, so the promotion of slice s runs while slice s+1's wgmmas execute (as in fp8_overlap_mainloop.cuh);
// at kSliceN = 64 that is 128 + 2 x 32 registers of accumulators. Cost: A is read from shared memory once per
// slice instead of once per k-tile. Measured (H200, sessions 18-19, fp8_wide*_h200.md): +2-8% over the 128x128
// kernel on 4 of the 5 benchmark shapes, so JAX_MOE_FFI_FP8_TILES=auto takes it (1x2 cluster) where N has an even
// number of 256-wide tiles.
//
// Numerics: per output element the same float32 operations in the same order as the 128x128 overlapped
// mainloop (slice over 128 of K by the tensor cores, then one FFMA with scale_a * scale_b), so the output is
// bitwise that kernel's (GPU test test_gpu_fp8_wide_tiles_match_128x128_bitwise, passed on the H200).
//
// Supported: cooperative tiles (two consumer warp groups of 64 rows), one scale block per k-tile, per-row A
// scales and B scales per 128 columns (the forward / dgrad recipe). Anything else fails to compile.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cuda/fp8_overlap_mainloop.cuh"

namespace jax_moe_ffi {
namespace cuda {

// kARegisters: A is copied from shared memory into registers once per k-tile and every slice's wgmmas read it
// there (wgmma's RS form), so that per slice only B is read from shared memory. Bitwise the other path, but 15-20%
// slower (session 19): at n64 it spills, so it runs 32-column slices, twice the wgmma issues and promotions per
// k-tile, and the A copy into registers is not hidden. Opt-in only (JAX_MOE_FFI_FP8_TILES=wide_rs*).
//
// kOneSlice: one slice accumulator per warp group, 128 columns (128 + 64 registers; A read from shared memory twice
// per k-tile instead of four times), waited for and promoted before the next slice is issued: a warp group's
// promotion runs under the other warp group's wgmmas only. Measured (H200, session 20, fp8_wide_ordered*_h200.md):
// +4-7% (even groups) and +1-3% (skewed) over the double-buffered 64-column slices on the qwen3-30b shapes
// (K = 2048 and 768: 16 and 6 k-tiles per tile), -2-3% on K = 4096 and 7168, so auto takes it for K <= 2048.
// (Forcing the two warp groups to take turns issuing, with a pair of named barriers, was bitwise too but 1-4%
// slower than leaving them free.)
template <class Base, int kSliceN, bool kARegisters = false, bool kOneSlice = false>
struct SlicedPromotionMainloop : Base {
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

  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kSlices = kTileN / kSliceN;
  static_assert(kTileN % kSliceN == 0 && kSlices % 2 == 0, "sliced promotion: an even number of slices per tile");
  static_assert(!(kARegisters && kOneSlice), "sliced promotion: one slice per warp group reads A from shared memory");
  static_assert(cute::size(TiledMma{}) == 2 * cutlass::NumThreadsPerWarpGroup && cute::size<0>(TileShape{}) == 128,
                "sliced promotion: cooperative 128-row tiles (two consumer warp groups of 64 rows)");
  static_assert(cute::size<2>(TileShape{}) == Base::ScaleGranularityK, "sliced promotion: one scale block per k-tile");
  static_assert(Base::ScaleMsPerTile == 128 && Base::ScaleGranularityN % kSliceN == 0,
                "sliced promotion: per-row A scales, one B scale per slice");

  // The same wgmma family as the tile's, kSliceN columns wide, over the same two warp groups.
  using SliceShape = cute::Shape<cute::_128, cute::Int<kSliceN>, cute::_128>;
  using SliceAtom = std::conditional_t<
      kARegisters,
      decltype(cute::GMMA::rs_op_selector<typename Base::ElementA, typename Base::ElementB, float, SliceShape,
                                          cute::GMMA::Major::K, cute::GMMA::Major::K>()),
      decltype(cute::GMMA::ss_op_selector<typename Base::ElementA, typename Base::ElementB, float, SliceShape,
                                          cute::GMMA::Major::K, cute::GMMA::Major::K>())>;
  using SliceMma =
      decltype(cute::make_tiled_mma(SliceAtom{}, cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

#if defined(JAX_MOE_FFI_FP8_OWN_SCALE_LOADS)
  // The scale loads of the auxiliary producer warp (thread_idx is its lane), per k-tile: A's 128 row scales, lane l
  // copying rows l, l + 32, ...; B's kTileN / ScaleGranularityN block scales, lane b copying block b. Why not the
  // inherited one: there every lane below ScaleNsPerTile copies all of the tile's B scales, so on 256-wide tiles
  // (two B blocks) lanes 0 and 1 both write the same two floats into shared memory -- equal values, but a
  // write-write race that compute-sanitizer's racecheck reports. Same loads otherwise (cp.async, predicated on
  // the group's M and N, one commit per lane per stage), so the output is unchanged -- except that the inherited
  // one also copies, on a partial last n-tile, the B block past N (a scale of the next k-block, or one past the
  // group's end at the last k-tile; used only for columns never stored), which this one does not. Index math
  // checked against CUTLASS's partition on the host (tools/checks/fp8_scale_loads.cu, run by CI); on the GPU
  // (session 39, H100) racecheck reports no hazard and the wide-tile kernels stay bitwise the 128x128 one.
  // -DJAX_MOE_FFI_FP8_OWN_SCALE_LOADS=OFF builds the inherited loads instead.
  template <class TensorA, class TensorB, class TensorSFA, class TensorSFB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load_auxiliary(Params const& /*mainloop_params*/, MainloopPipeline pipeline,
                                     PipelineState smem_pipe_write,
                                     cute::tuple<TensorA, TensorB, TensorSFA, TensorSFB> const& load_inputs,
                                     BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                                     int thread_idx, uint32_t /*block_rank_in_cluster*/,
                                     TensorStorage& shared_tensors) {
    using namespace cute;
    constexpr int kTileM = size<0>(TileShape{});
    constexpr int kTileK = size<2>(TileShape{});
    constexpr int kBlocksN = kTileN / Base::ScaleGranularityN;
    static_assert(kBlocksN <= cutlass::NumThreadsPerWarp, "one lane per B scale block");
    // Global scales indexed by element coordinates (m or n, k, l): zero strides inside a scale block.
    Tensor mSFA = get<2>(load_inputs);
    Tensor mSFB = get<3>(load_inputs);
    Tensor sSFA = make_tensor(make_smem_ptr(shared_tensors.smem_SFA.data()), typename Base::SmemLayoutSFA{});
    Tensor sSFB = make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()), typename Base::SmemLayoutSFB{});
    const int m0 = int(get<0>(blk_coord)) * kTileM;
    const int n0 = int(get<1>(blk_coord)) * kTileN;
    const int rows = size<0>(mSFA);     // the group's M (row granularity 1)
    const int columns = size<0>(mSFB);  // the group's N rounded up to whole scale blocks
    using Copy = cutlass::arch::cp_async<sizeof(ElementBlockScale), cutlass::arch::CacheOperation::Always>;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++smem_pipe_write) {
      pipeline.producer_acquire(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      const int k = int(*k_tile_iter) * kTileK;
      CUTLASS_PRAGMA_UNROLL
      for (int r = thread_idx; r < kTileM; r += cutlass::NumThreadsPerWarp) {
        Copy(&sSFA(r, 0, stage), &mSFA(m0 + r, k, 0), m0 + r < rows);
      }
      if (thread_idx < kBlocksN) {
        const int n = thread_idx * Base::ScaleGranularityN;
        Copy(&sSFB(n, 0, stage), &mSFB(n0 + n, k, 0), n0 + n < columns);
      }
      pipeline.producer_commit(smem_pipe_write, cutlass::arch::cpasync_barrier_arrive_noinc);
    }
  }
#endif  // JAX_MOE_FFI_FP8_OWN_SCALE_LOADS

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors,
                          Params const& /*mainloop_params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator must live in registers");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (M,K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (N,K,PIPE)
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    // Element i of a thread's result has its scales at element i of these.
    auto scales_like_result = PartitionScalesLikeResult<Base>(shared_tensors, thread_idx);
    Tensor tCsSFA = get<0>(scales_like_result);  // (MMA,MMA_M,MMA_N,(MMA_K,PIPE))
    Tensor tCsSFB = get<1>(scales_like_result);
    SliceMma slice_mma;
    auto wg_mma = slice_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA,kSlices,MMA_K,PIPE)
    // A: shared-memory descriptors (MMA,1,MMA_K,PIPE), or (kARegisters) one k-tile in registers (MMA,1,MMA_K)
    // with its shared-memory source partitioned for the copy.
    auto make_a = [&] {
      if constexpr (kARegisters) {
        auto thr_mma = slice_mma.get_thread_slice(thread_idx);
        Tensor frag = thr_mma.partition_fragment_A(sA(_, _, _0{}));
        // ldmatrix: for 8-bit K-major A its 8x8 b16 tiles are the wgmma A fragment (one instruction per k-block).
        auto smem_copy = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, typename Base::ElementA>{}, slice_mma);
        auto thr_copy = smem_copy.get_thread_slice(thread_idx);
        return cute::make_tuple(frag, smem_copy, thr_copy.partition_S(sA));
      } else {
        return cute::make_tuple(wg_mma.make_fragment_A(wg_mma.partition_A(sA)), 0, 0);
      }
    };
    auto a_parts = make_a();
    auto& tCrA = get<0>(a_parts);
    Tensor slice0 = partition_fragment_C(slice_mma, make_shape(get<0>(TileShape{}), Int<kSliceN>{}));  // (MMA,1,1)
    Tensor slice1 = make_fragment_like(slice0);
    static_assert(decltype(size<1>(tCrA))::value == 1 && decltype(size<1>(tCrB))::value == kSlices);
    static_assert(decltype(size<1>(slice0))::value == 1 && decltype(size<2>(slice0))::value == 1);
    static_assert(decltype(size<1>(accum))::value == 1 && decltype(size<2>(accum))::value == 1);
    // A warp group's m64 x N result holds, per thread, 4 values for each 8-column chunk, chunk-major: slice s's
    // values are the contiguous run [s * size(slice), (s + 1) * size(slice)) of the result's.
    static_assert(decltype(size(accum))::value == kSlices * decltype(size(slice0))::value);

    // Per k-tile: scale_a(row) * scale_b(column block), one set for each of two consecutive k-tiles (the
    // last slice of k-tile t is promoted after k-tile t+1's scales are read).
    Tensor scale_a = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor scale_b = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));
    constexpr int kBlocks = kTileN / Base::ScaleGranularityN;
    constexpr int kRowScales = decltype(size(filter_zeros(scale_a)))::value;
    ElementBlockScale combined[2][kBlocks][kRowScales];

    PipelineState smem_pipe_release = smem_pipe_read;

    auto read_scales = [&](int stage, auto parity) {
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), scale_a);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), scale_b);
      Tensor rows = filter_zeros(scale_a);
      CUTLASS_PRAGMA_UNROLL
      for (int blk = 0; blk < kBlocks; ++blk) {
        // any element of the result's block `blk` carries that block's B scale
        const ElementBlockScale b = scale_b(blk * (size(accum) / kBlocks));
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRowScales; ++r) combined[parity][blk][r] = rows(r) * b;
      }
    };
    // The row-scale index of element i of a slice: filter_zeros(scale_a) enumerates the distinct rows in the
    // order of their first appearance in the result's layout; the row of element i depends on i only through
    // the (2, 2, n8) value mode's second index.
    auto row_of = [&](int i) { return (i / 2) % 2; };
    static_assert(kRowScales == 2, "sliced promotion: two rows (r, r + 8) per thread of an m64 wgmma");

    constexpr int kKBlocks = decltype(size<2>(tCrA))::value;
    // The A operand of k-block kb (shared-memory descriptor, or registers).
    auto a_of = [&](int kb, int stage) -> decltype(auto) {
      if constexpr (kARegisters) return tCrA(_, _0{}, kb); else return tCrA(_, _0{}, kb, stage);
    };
    // wgmmas of slice s, k-blocks [kb0, kb1), into `slice`, as one commit group.
    auto issue = [&](auto& slice, int stage, auto s, int kb0, int kb1) {
      warpgroup_fence_operand(slice);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = kb0; k_block < kb1; ++k_block) {
        slice_mma.accumulate_ = k_block == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        cute::gemm(slice_mma, a_of(k_block, stage), tCrB(_, s, k_block, stage), slice(_, _0{}, _0{}));
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(slice);
    };
    auto promote = [&](auto& slice, auto parity, auto s) {
      constexpr int kBlk = decltype(s)::value * kSliceN / Base::ScaleGranularityN;
      constexpr int kBase = decltype(s)::value * decltype(size(slice0))::value;
      warpgroup_fence_operand(slice);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(slice); ++i) accum(kBase + i) += slice(i) * combined[parity][kBlk][row_of(i)];
    };
    auto release_previous_and_promote_its_last_slice = [&](auto parity) {
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
      promote(slice1, Int<1 - decltype(parity)::value>{}, Int<kSlices - 1>{});
    };

    clear(accum);
    warpgroup_fence_operand(accum);
    if (k_tile_count <= 0) return;

    if constexpr (kOneSlice) {
      CUTLASS_PRAGMA_NO_UNROLL
      for (int k = 0; k < k_tile_count; ++k) {
        pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
        const int stage = smem_pipe_read.index();
        read_scales(stage, _0{});
        for_each(make_seq<kSlices>{}, [&](auto s) {
          constexpr int kS = decltype(s)::value;
          issue(slice0, stage, s, 0, kKBlocks);
          warpgroup_wait<0>();
          // The stage's last reader in this warp group has retired; the last k-tile's stage is released by the
          // kernel's mma_tail(), as in CUTLASS's mainloop.
          if constexpr (kS == kSlices - 1) {
            if (k + 1 < k_tile_count) pipeline.consumer_release(smem_pipe_read);
          }
          promote(slice0, _0{}, s);
        });
        ++smem_pipe_read;
      }
      warpgroup_fence_operand(accum);
      return;
    }

    // One k-tile: its kSlices slices alternate between the two accumulators (even slices in slice0). Slice s is
    // issued, then slice s-1 (of this k-tile, or the previous k-tile's last) is waited for and promoted. After
    // the first slice's wait the previous k-tile's wgmmas are all complete: its stage goes back to the producer.
    auto k_tile_shared_a = [&](auto parity, auto first) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      read_scales(stage, parity);
      for_each(make_seq<kSlices>{}, [&](auto s) {
        constexpr int kS = decltype(s)::value;
        if constexpr (kS % 2 == 0) issue(slice0, stage, s, 0, kKBlocks); else issue(slice1, stage, s, 0, kKBlocks);
        warpgroup_wait<1>();
        if constexpr (kS == 0) {
          if constexpr (!decltype(first)::value) release_previous_and_promote_its_last_slice(parity);
        } else if constexpr (kS % 2 == 1) {
          promote(slice0, parity, Int<kS - 1>{});
        } else {
          promote(slice1, parity, Int<kS - 1>{});
        }
      });
      ++smem_pipe_read;
    };

    // A in registers: the first and the last slice of a k-tile commit one group per k-block, so that A's k-block kb
    // is overwritten with the next k-tile's as soon as the last slice's wgmma for kb has retired (groups retire in
    // order: at most kKBlocks - 1 later groups may still run), without draining the tensor cores.
    auto k_tile_register_a = [&](auto parity, auto first) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      if constexpr (kARegisters) {
        auto smem_copy = get<1>(a_parts);  // (an empty type: cute::get returns it by value)
        auto tCsA = get<2>(a_parts);
        Tensor tCrA_copy = smem_copy.get_thread_slice(thread_idx).retile_D(tCrA);
        CUTLASS_PRAGMA_UNROLL
        for (int kb = 0; kb < kKBlocks; ++kb) {
          warpgroup_wait<kKBlocks - 1>();
          copy(smem_copy, tCsA(_, _, kb, stage), tCrA_copy(_, _, kb));
          issue(slice0, stage, _0{}, kb, kb + 1);
        }
        if constexpr (!decltype(first)::value) release_previous_and_promote_its_last_slice(parity);
        // Read after that promotion, so that one scale set is live (registers are short here).
        read_scales(stage, parity);
        for_each(make_seq<kSlices - 1>{}, [&](auto s_minus_1) {
          constexpr int kS = decltype(s_minus_1)::value + 1;
          auto& buf = [&]() -> auto& { if constexpr (kS % 2 == 0) return slice0; else return slice1; }();
          auto& prev = [&]() -> auto& { if constexpr (kS % 2 == 0) return slice1; else return slice0; }();
          if constexpr (kS < kSlices - 1) {
            issue(buf, stage, Int<kS>{}, 0, kKBlocks);
            warpgroup_wait<1>();
          } else {
            CUTLASS_PRAGMA_UNROLL
            for (int kb = 0; kb < kKBlocks; ++kb) issue(buf, stage, Int<kS>{}, kb, kb + 1);
            warpgroup_wait<kKBlocks>();
          }
          promote(prev, parity, Int<kS - 1>{});
        });
      }
      ++smem_pipe_read;
    };
    auto k_tile = [&](auto parity, auto first) {
      if constexpr (kARegisters) k_tile_register_a(parity, first); else k_tile_shared_a(parity, first);
    };

    // Unrolled by two k-tiles so that each scale set is a fixed set of registers.
    // The first k-tile is peeled with a compile-time flag: with a run-time one, ptxas reported C7514 ("wgmma.mma_async
    // instructions are serialized due to non wgmma instructions reading accumulator registers") for this loop.
    k_tile(_0{}, cute::true_type{});
    int remaining = k_tile_count - 1;
    CUTLASS_PRAGMA_NO_UNROLL
    while (true) {
      if (remaining == 0) {
        warpgroup_wait<0>();
        promote(slice1, _0{}, Int<kSlices - 1>{});
        break;
      }
      k_tile(_1{}, cute::false_type{});
      if (--remaining == 0) {
        warpgroup_wait<0>();
        promote(slice1, _1{}, Int<kSlices - 1>{});
        break;
      }
      k_tile(_0{}, cute::false_type{});
      --remaining;
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace cuda
}  // namespace jax_moe_ffi
