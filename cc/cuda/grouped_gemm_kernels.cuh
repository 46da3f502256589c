// CUTLASS 3.x (Hopper, SM90a) grouped-GEMM kernel types used by grouped_gemm.cu.
//
// Every kernel here is a pointer-array ("grouped") GEMM: one launch computes G independent
// problems (M_g, N_g, K_g) whose shapes, base pointers and strides live in *device* arrays.
// That lets the group sizes stay on the GPU (no device->host copy, no host sync).
//
// Included by exactly one translation unit (grouped_gemm.cu). Everything is in an anonymous
// namespace so that the (many, large) template instantiations get internal linkage and do not
// leak into the shared library's dynamic symbol table.
#pragma once

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cuda/fp8_overlap_mainloop.cuh"
#include "cuda/fp8_wide_tile_mainloop.cuh"
#include "cuda/group_tensormaps.cuh"
#include "cuda/trimmed_tail_mainloop.cuh"

namespace jax_moe_ffi {
namespace cuda {
namespace {

// (M, N, K) of one group, in CUTLASS's GEMM naming. The kernel reads these from device memory.
using GroupShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

// --- Tile / schedule configurations ---------------------------------------------------------
//
// A note on clusters. CUTLASS's grouped tile scheduler rounds every group's tile grid up to the
// cluster shape. Along the ragged dimension (M of the forward / dgrad: the rows of one expert) a
// cluster of 2 therefore turns a group of 5 row tiles into 6, computed on TMA-zero-filled rows: with
// routed (uneven) group sizes that costs a 128-row tile on half the groups, on top of the partial last
// tile every ragged group has anyway. So the host's forward / dgrad clusters are along N (static) or 1x1;
// with JAX_MOE_FFI_GEMM_TILES=pick the 2x1 kernel runs where the setup kernel finds (almost) no such
// padding (grouped_gemm_run.cuh, Pick). The wgrad's M is K (static), so its 2x1 cluster costs nothing.

// Large: cooperative (both consumer warp groups share one 128x256 tile). The cluster shares (TMA
// multicast) the A tile between the two CTAs that compute neighbouring N tiles of the same rows.
// ClusterN = 2 is used when N has an even number of 256-wide tiles, else 1 (rounding N up would waste
// a tile column). The 2x1 form multicasts the weight tile instead: the wgrad's default since session 45 (static M;
// ChooseWgradTiles says why) and the forward / dgrad kernel the device picks (opt-in) when groups have even row-tile
// counts.
template <int ClusterM, int ClusterN>
struct CoopConfig {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  static constexpr const char* kName = ClusterM == 2   ? "coop_128x256x64_c2x1"
                                       : ClusterN == 2 ? "coop_128x256x64_c1x2"
                                                       : "coop_128x256x64_c1x1";
};

// Cooperative 128x192 with a 1x2 cluster: for N with an odd number of 256-wide tiles but an even
// number of 192-wide ones (N = 768: 3 tiles of 256, 4 of 192). Such N otherwise runs 1x1 (no
// multicast at all); here the A tile is shared by two CTAs and each CTA loads 32 KB per 64-deep k
// step for 3.1 MFLOP instead of 48 KB for 4.2 MFLOP (1x1, 128x256). A/B option (n192).
struct Coop192Config {
  using TileShape = cute::Shape<cute::_128, cute::_192, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  static constexpr const char* kName = "coop_128x192x64_c1x2";
};

// Small: ping-pong (the two consumer warp groups alternate tiles, so one's epilogue overlaps the
// other's mainloop) with 64-row tiles: used by the forward / dgrad when groups are short
// (average rows per group <= 128), where a 128-row tile would be mostly padding. Cluster along N.
struct PingpongConfig {
  using TileShape = cute::Shape<cute::_64, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  static constexpr const char* kName = "pingpong_64x128x128_c1x2";
};

// Ping-pong with 128x128 tiles. The wgrad default until session 45, now JAX_MOE_FFI_WGRAD_TILES=pingpong (2x1: its
// M is K, static): the wgrad contraction is over the rows of one group (m_g, typically a few hundred), so each tile
// has a short mainloop and a comparatively large epilogue (a K x N slab of output); ping-pong hides one warp group's
// epilogue behind the other's mainloop, which the cooperative schedule cannot (measured on an H100 in session 45, the
// cooperative 128x256 tile still wins: ChooseWgradTiles). The 1x2 form is a forward /
// dgrad option for short contractions (K = 768: 12 k-tiles per output tile). 2x2 is a wgrad option: its
// M and N (K and N of the layer) are static multiples of 256 in MoE shapes, so a 2x2 cluster pads
// nothing and multicasts both operands (16 KB per CTA and k step instead of 24 KB with 2x1).
template <int ClusterM, int ClusterN>
struct Pingpong128Config {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  static constexpr const char* kName = ClusterM == 2 && ClusterN == 2 ? "pingpong_128x128x64_c2x2"
                                       : ClusterM == 2                ? "pingpong_128x128x64_c2x1"
                                                                      : "pingpong_128x128x64_c1x2";
};

// The epilogue's subtile: a Config's own `EpilogueTile` where it names one (CoopEpiConfig, Fp8CoopWideEpi64Config and
// the experiment configs below), else
// CUTLASS's choice (128 x 32 for the cooperative tiles: eight TMA stores per 128x256 tile, each behind two named
// barriers and a wait for the previous store to have read its shared memory).
template <class Config, class = void>
struct EpilogueTileOf {
  using type = cutlass::epilogue::collective::EpilogueTileAuto;
};
template <class Config>
struct EpilogueTileOf<Config, std::void_t<typename Config::EpilogueTile>> {
  using type = typename Config::EpilogueTile;
};

// The epilogue collective of a kernel: CUTLASS's builder, or -- a Config naming kEpilogueStagesD (experiment builds;
// no C operand) -- the same TMA epilogue with that many output subtiles in flight in shared memory (the builder takes
// min(subtiles, 2), so each TMA store waits for the one before the previous to have read its buffer).
template <class Config, class EpiTile, class ElementC, class ElementOut, int kAlignOut, class Fusion, class = void>
struct EpilogueFor {
  using LayoutD = cutlass::layout::RowMajor;
  using type = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::TileShape, typename Config::ClusterShape,
      EpiTile, float, float, ElementC, LayoutD*, kAlignOut, ElementOut, LayoutD*, kAlignOut,
      typename Config::EpilogueSchedule, Fusion>::CollectiveOp;
};
template <class Config, class EpiTile, class ElementC, class ElementOut, int kAlignOut, class Fusion>
struct EpilogueFor<Config, EpiTile, ElementC, ElementOut, kAlignOut, Fusion,
                   std::void_t<decltype(Config::kEpilogueStagesD)>> {
  static_assert(std::is_void_v<ElementC>, "kEpilogueStagesD: no C operand (its smem reuse is the builder's)");
  using LayoutD = cutlass::layout::RowMajor;
  using Schedule = typename Config::EpilogueSchedule;
  using TileShape = typename Config::TileShape;
  using Tile = decltype(cutlass::epilogue::collective::detail::sm90_compute_tile_shape_or_override<
                        ElementOut, EpiTile, Schedule, TileShape>());
  static constexpr int kSubtiles = cute::size(cute::shape_div(cute::take<0, 2>(TileShape{}), Tile{}));
  // Fragment size as the builder computes it: a cooperative subtile is shared by two warp groups, a ping-pong one
  // belongs to one.
  static constexpr int kFragment =
      cute::size(Tile{}) / (cutlass::epilogue::collective::detail::sm90_is_cooperative_v<Schedule> ? 256 : 128);
  using Policy = cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<
      (kSubtiles < 4 ? kSubtiles : 4), Config::kEpilogueStagesD, kFragment, /*ReuseSmemC=*/false,
      /*DelayTmaStore=*/false, Schedule::NumEpilogueWarpGroups>;
  using type = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
      TileShape, Tile, float, float, ElementC, LayoutD*, kAlignOut, ElementOut, LayoutD*, kAlignOut, Fusion,
      Policy>::CollectiveOp;
};

// Auto's 128x256 1x2 tile for the plain forward / dgrad with 128 x 64 epilogue subtiles: half of the TMA stores and
// barriers per tile, for 16 KB more shared memory. Same accumulators, so bitwise the 128 x 32 form (CoopConfig<1, 2>,
// which the accumulate form, the pairs and the A/B splits keep). Session 22, alternating (tile_ab_epi_h200.md):
// qwen3-30b gate_up +2-3% forward and dgrad, deepseek-v3 gate_up unchanged. e128 (128 x 128 subtiles): an
// experiment-build A/B option (JAX_MOE_FFI_GEMM_TILES=e128), mixed.
template <int kEpiN>
struct CoopEpiConfig : CoopConfig<1, 2> {
  using EpilogueTile = cute::Shape<cute::_128, cute::Int<kEpiN>>;
  static constexpr const char* kName = kEpiN == 64 ? "coop_128x256x64_c1x2_epi128x64" : "coop_128x256x64_c1x2_epi128x128";
};

#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
// Experiments (JAX_MOE_FFI_GEMM_TILES=e64s3 / e32s4): auto's plain 1x2 kernel with 128 x 64 subtiles and 3 store
// stages, or 128 x 32 subtiles and 4 (the same 32 KB as 128 x 64 with 2). Session 23 (tile_ab_stages_h200.md): no
// consistent change against auto.
template <int kEpiN, int kStagesD>
struct CoopEpiStagesConfig : CoopConfig<1, 2> {
  using EpilogueTile = cute::Shape<cute::_128, cute::Int<kEpiN>>;
  static constexpr int kEpilogueStagesD = kStagesD;
  static constexpr const char* kName = kEpiN == 64 ? "coop_128x256x64_c1x2_epi128x64_s3" : "coop_128x256x64_c1x2_epi128x32_s4";
};

// Experiments (JAX_MOE_FFI_WGRAD_TILES = s4 | e64x64 | e64x128): the wgrad's ping-pong 128x128 2x1 kernel with
// CUTLASS's 64 x 32 output subtiles and 4 store stages in flight instead of 2, or 64 x 64 / 64 x 128 subtiles (4 / 2
// a tile instead of 8) with 2 (a ping-pong epilogue subtile has 64 rows: CUTLASS's builder asserts it). On skewed
// groups the wgrad runs at 0.85 of even (session 24) and the order of its problems is not why; the hypothesis: a
// short group's tile has one or two k-tiles, too short a mainloop for the ping-pong partner to hide this tile's
// epilogue behind, so the epilogue's latency (a wait on every store before its buffer is reused) sets the pace.
// Same accumulators, so bitwise the default. Compiled (session 24), not yet measured.
template <int kEpiM, int kEpiN, int kStagesD>
struct PingpongEpiStagesConfig : Pingpong128Config<2, 1> {
  using EpilogueTile = cute::Shape<cute::Int<kEpiM>, cute::Int<kEpiN>>;
  static constexpr int kEpilogueStagesD = kStagesD;
  static constexpr const char* kName = kEpiN == 32   ? "pingpong_128x128x64_c2x1_epi64x32_s4"
                                       : kEpiN == 64 ? "pingpong_128x128x64_c2x1_epi64x64"
                                                     : "pingpong_128x128x64_c2x1_epi64x128";
};
#endif

#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
// Experiment (JAX_MOE_FFI_WGRAD_TILES=k32): the wgrad's ping-pong 128x128 2x1 kernel with 32-deep k-tiles. The wgrad
// contracts over each group's rows, and the last k-tile of every group is zero-padded to the k-tile: ncu on the skewed
// qwen3-30b down wgrad (session 25) counted 8.5% more wgmma steps than with even sizes for the same FLOPs (half its
// groups have < 260 rows). 32-deep tiles halve that padding, for twice the pipeline barriers per FLOP. The same
// 16-deep wgmma steps in the same order over the same rows, the padded ones multiplying zeros: bitwise the default.
struct Pingpong128K32Config : Pingpong128Config<2, 1> {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_32>;
  static constexpr const char* kName = "pingpong_128x128x32_c2x1";
};

// Experiment (JAX_MOE_FFI_WGRAD_TILES=trim): the default wgrad kernel whose consumer issues only the 16-deep wgmma
// steps a group's last k-tile needs (TrimmedTailMainloop, trimmed_tail_mainloop.cuh). Bitwise the default.
struct Pingpong128TrimConfig : Pingpong128Config<2, 1> {
  static constexpr bool kTrimTail = true;
  static constexpr const char* kName = "pingpong_128x128x64_c2x1_trim";
};
#endif

// Per-group TMA descriptors built before the GEMM (group_tensormaps.cuh) instead of CUTLASS's per-SM descriptors
// rewritten on every group change: every kernel here, unless its Config sets kPrebuiltTensormaps = false (the
// experiment build's per-SM variants, for A/B). Epilogues that read C (the accumulate form) keep CUTLASS's; their
// mainloop still takes prebuilt descriptors. Session 23 (tile_ab_premaps_h200.md, fp8_premaps_*_h200.md; alternating,
// bitwise): bf16 wgrad +6-11% on the qwen3-30b shapes, forward / dgrad +1-3%, deepseek-v3 gate_up +0.5-1%; FP8 0 to +5%.
template <class Config, class = void>
struct PrebuiltMapsOf : std::true_type {};
template <class Config>
struct PrebuiltMapsOf<Config, std::void_t<decltype(Config::kPrebuiltTensormaps)>>
    : std::bool_constant<Config::kPrebuiltTensormaps> {};
template <class Config, class Mainloop>
using MainloopMapsFor = std::conditional_t<PrebuiltMapsOf<Config>::value, PrebuiltTensormapMainloop<Mainloop>, Mainloop>;
// A Config with kTrimTail (experiment builds): the mainloop wrapped in TrimmedTailMainloop, and its mailbox's shared
// memory (2 ints a stage, one 128-byte line) left out of the stage count.
template <class Config, class = void>
struct TrimTailOf : std::false_type {};
template <class Config>
struct TrimTailOf<Config, std::void_t<decltype(Config::kTrimTail)>> : std::bool_constant<Config::kTrimTail> {};
template <class Config, class Mainloop>
using MainloopTrimFor = std::conditional_t<TrimTailOf<Config>::value, TrimmedTailMainloop<Mainloop>, Mainloop>;
constexpr int kTrimTailSmemBytes = 256;

template <class Config, class Epilogue>
using EpilogueMapsFor = std::conditional_t<PrebuiltMapsOf<Config>::value && std::is_void_v<typename Epilogue::ElementC>,
                                           PrebuiltTensormapEpilogue<Epilogue>, Epilogue>;

#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
// Experiments (GEMM_TILES / WGRAD_TILES = persm, FP8_EXPERIMENT = wide128e64persm / wide64persm): a kernel with
// CUTLASS's per-SM descriptors, rewritten on each group change, for A/B against the default.
template <class Config>
struct PerSmMaps : Config {
  static constexpr bool kPrebuiltTensormaps = false;
};
#endif

// --- Kernel assembly ----------------------------------------------------------------------
//
// ElementIn : bf16 or f16 (both operands). ElementOut: bf16/f16 (same as input) or float.
// LayoutA / LayoutB in CUTLASS terms (A is M x K, B is K x N):
//   forward : A RowMajor (lhs rows, K contiguous),   B RowMajor    (rhs[g] is K x N, N contiguous)
//   dgrad   : A RowMajor,                            B ColumnMajor (rhs[g] is N x K, K contiguous)
//   wgrad   : A ColumnMajor (lhs_g^T, GEMM-M = K contiguous), B RowMajor (dout_g, N contiguous)
// D is always RowMajor (N contiguous). Accumulation is always f32.
//
// WithAddend = false: no C operand (ElementC = void), D = acc. This removes the C load pipeline and
// its shared memory (more room for mainloop stages).
// WithAddend = true : D = acc + C with C = D's own pointers (beta = 1, in place): the accumulate form,
// which sums the dgrads of two GEMMs sharing their lhs in the second one's epilogue (f32, one rounding)
// instead of a separate elementwise add over [M, N].
template <class ElementIn, class ElementOut, class LayoutA, class LayoutB, class Config,
          bool WithAddend = false>
struct GroupedGemm {
  using ElementAcc = float;
  using LayoutD = cutlass::layout::RowMajor;
  using ElementC = std::conditional_t<WithAddend, ElementOut, void>;
  static constexpr bool kWithAddend = WithAddend;

  // TMA needs 16-byte aligned rows: 8 elements of a 16-bit type, 4 of f32.
  static constexpr int kAlignIn = 16 / sizeof(ElementIn);
  static constexpr int kAlignOut = 16 / sizeof(ElementOut);

  using CollectiveEpilogue = EpilogueMapsFor<Config, typename EpilogueFor<
      Config, typename EpilogueTileOf<Config>::type, ElementC, ElementOut, kAlignOut,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, ElementAcc, ElementC, ElementAcc>>::type>;

  // Pointer-to-layout tags (LayoutA*) select the grouped variant: strides become per-group
  // device arrays of InternalStride.
  using BuilderMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementIn, LayoutA*, kAlignIn,
      ElementIn, LayoutB*, kAlignIn,
      ElementAcc,
      typename Config::TileShape, typename Config::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage)) +
          (TrimTailOf<Config>::value ? kTrimTailSmemBytes : 0)>,
      typename Config::KernelSchedule>::CollectiveOp;
  using CollectiveMainloop = MainloopTrimFor<Config, MainloopMapsFor<Config, BuilderMainloop>>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<GroupShape, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using ConfigT = Config;
  static_assert(!TrimTailOf<Config>::value || sizeof(typename Kernel::SharedStorage) <=
                                                    cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "trimmed-tail kernel: shared memory over the SM90 limit (raise kTrimTailSmemBytes)");
};


// --- Blockwise-scaled FP8 (DeepSeek-V3 recipe) ------------------------------------------------
//
// A: activations [rows, K] FP8 (E4M3, or E5M2 for gradients), one float32 scale per 1 x 128 block.
// B: weights with one float32 scale per 128 x 128 tile, K-major ([N, K] per group): Hopper's FP8
//    wgmma reads both operands K-major from shared memory, so the wrapper hands the weight in that
//    orientation (an FP8 transpose, a quarter of the bf16 bytes).
// The mainloop multiplies each 128-deep slice of the accumulation by scale_a(row) * scale_b(tile)
// in float32 ("promotion"), which also bounds the error of the tensor cores' reduced-precision FP8
// accumulation. Scale layouts are CUTLASS's MN-major ones: per group, SFA is [K/128, m_g] (rows
// contiguous) and SFB is [K/128, ceil(N/128)] (N tiles contiguous).
// kOverlap: the consumer mainloop of fp8_overlap_mainloop.cuh (promotion of slice t-1 overlaps the
// wgmmas of slice t) instead of CUTLASS's (promotion after each slice's wgmmas have finished).
template <bool Overlap>
struct Fp8CoopConfigT {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  static constexpr bool kOverlap = Overlap;
  static constexpr const char* kName = Overlap ? "fp8_blockwise_coop_128x128x128_c1x2_overlap"
                                               : "fp8_blockwise_coop_128x128x128_c1x2";
};
using Fp8CoopConfig = Fp8CoopConfigT<false>;
using Fp8CoopOverlapConfig = Fp8CoopConfigT<true>;

// Ping-pong: each consumer warp group owns a 64x128 tile and the two take turns on the tensor cores, so one's
// epilogue runs during the other's mainloop (the cooperative kernel's tensor cores idle in its epilogue).
template <bool Overlap>
struct Fp8PingpongConfigT {
  using TileShape = cute::Shape<cute::_64, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  static constexpr bool kOverlap = Overlap;
  static constexpr const char* kName = Overlap ? "fp8_blockwise_pingpong_64x128x128_c1x2_overlap"
                                               : "fp8_blockwise_pingpong_64x128x128_c1x2";
};
using Fp8PingpongConfig = Fp8PingpongConfigT<false>;
using Fp8PingpongOverlapConfig = Fp8PingpongConfigT<true>;

// 128x256 tiles (fp8_wide_tile_mainloop.cuh): the result promoted in 64-column slices so that it fits the
// registers; cluster CM x CN; kRegisterA: A read into registers once per k-tile (wgmma RS) instead of from shared
// memory by every slice, with 32-column slices (64 spilled: ~650 bytes per thread with ptxas 13.0). Forward /
// dgrad with E4M3 activations; <1, 2> is auto's choice where N has an even number of 256-wide tiles.
// kOneSlice: one 128-column slice per warp group (fp8_wide_tile_mainloop.cuh), auto's choice for K <= 2048.
template <int kClusterM, int kClusterN, bool kRegisterA = false, bool kOneSlice = false>
struct Fp8CoopWideConfig {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_128>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  static constexpr bool kOverlap = true;
  template <class Builder>
  using Mainloop = SlicedPromotionMainloop<Builder, kOneSlice ? 128 : kRegisterA ? 32 : 64, kRegisterA,
                                           kOneSlice>;  // RS: n64 slices spill
  static constexpr const char* kName =
      kOneSlice ? (kClusterM == 2 ? "fp8_blockwise_coop_128x256x128_c2x1_sliced128_one"
                                  : "fp8_blockwise_coop_128x256x128_c1x2_sliced128_one")
      : kRegisterA ? (kClusterM == 2 ? "fp8_blockwise_coop_128x256x128_c2x1_sliced32_rs"
                                   : "fp8_blockwise_coop_128x256x128_c1x2_sliced32_rs")
                 : (kClusterM == 2 ? "fp8_blockwise_coop_128x256x128_c2x1_sliced64"
                                   : "fp8_blockwise_coop_128x256x128_c1x2_sliced64");
};

// The wide kernels with 128 x 64 epilogue subtiles (CUTLASS's choice is 128 x 32: eight TMA stores per tile, each
// behind two named barriers). kOneSlice = true is auto's kernel for K <= 2048: session 22 (fp8_epi64_h200.md,
// alternating, bitwise the 128 x 32 form): qwen3-30b gate_up +1-13%, down +5-7%, even and skewed; at K = 7168 the
// 64-column-slice form (experiment wide64e64) was within the noise, so K > 2048 keeps 128 x 32.
template <bool kOneSlice>
struct Fp8CoopWideEpi64Config : Fp8CoopWideConfig<1, 2, false, kOneSlice> {
  using EpilogueTile = cute::Shape<cute::_128, cute::_64>;
  static constexpr const char* kName = kOneSlice ? "fp8_blockwise_coop_128x256x128_c1x2_sliced128_one_epi128x64"
                                                 : "fp8_blockwise_coop_128x256x128_c1x2_sliced64_epi128x64";
};

#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
// Experiments (JAX_MOE_FFI_FP8_EXPERIMENT=wide128e64s3 / wide128e32s4): auto's one-slice wide kernel with 128 x 64
// subtiles and 3 store stages, or 128 x 32 subtiles and 4. Session 23 (fp8_stages_h200.md): not faster than auto.
template <int kEpiN, int kStagesD>
struct Fp8CoopWideEpiStagesConfig : Fp8CoopWideConfig<1, 2, false, true> {
  using EpilogueTile = cute::Shape<cute::_128, cute::Int<kEpiN>>;
  static constexpr int kEpilogueStagesD = kStagesD;
  static constexpr const char* kName = kEpiN == 64 ? "fp8_blockwise_coop_128x256x128_c1x2_sliced128_one_epi128x64_s3"
                                                   : "fp8_blockwise_coop_128x256x128_c1x2_sliced128_one_epi128x32_s4";
};
#endif

// The consumer mainloop: a Config's own `Mainloop<Builder>` where it names one (the experiment configs of
// experiments/fp8_ceiling.cuh), else ours with overlapped promotion (kOverlap) or CUTLASS's.
template <class Config, class Builder, class = void>
struct PickFp8Mainloop {
  using type = std::conditional_t<Config::kOverlap, OverlappedPromotionMainloop<Builder>, Builder>;
};
template <class Config, class Builder>
struct PickFp8Mainloop<Config, Builder, std::void_t<typename Config::template Mainloop<Builder>>> {
  using type = typename Config::template Mainloop<Builder>;
};

// kScaleN: B's scale granularity along N -- 128 (weights: 128 x 128 tiles) or 1 (the weight gradient, where B
// is the incoming gradient transposed with one scale per row and 128-token block; CUTLASS's mainloop only).
// WithAddend: D = acc + C with C = D's own pointers (beta = 1, in place), as GroupedGemm's accumulate form: the
// second dgrad of a gate / up pair adds the first in its epilogue (grouped_gemm_fp8_acc).
template <class ElementA, class ElementB, class ElementOut, class Config, int kScaleN = 128, bool WithAddend = false>
struct GroupedGemmFp8Blockwise {
  using ElementAcc = float;
  using ElementC = std::conditional_t<WithAddend, ElementOut, void>;
  static constexpr bool kWithAddend = WithAddend;
  using LayoutA = cutlass::layout::RowMajor;     // [rows, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // B is K x N stored N-major rows of K: K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 16;  // 16 bytes of FP8
  static constexpr int kAlignB = 16;
  static constexpr int kAlignOut = 16 / sizeof(ElementOut);

  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleN, 128>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = EpilogueMapsFor<Config, typename EpilogueFor<
      Config, typename EpilogueTileOf<Config>::type, ElementC, ElementOut, kAlignOut,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, ElementAcc, ElementC, ElementAcc>>::type>;

  using BuilderMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignA,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignB,
      ElementAcc,
      typename Config::TileShape, typename Config::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::KernelSchedule>::CollectiveOp;
  using CollectiveMainloop = MainloopMapsFor<Config, typename PickFp8Mainloop<Config, BuilderMainloop>::type>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<GroupShape, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using ConfigT = Config;
};

}  // namespace
}  // namespace cuda
}  // namespace jax_moe_ffi
