// CUDA FP8 quantisation (MXFP8 and DeepSeek-V3 blockwise) as typed XLA FFI handlers. Same targets,
// bindings and semantics as cpu/quantize.cc (see there and jax_moe_ffi/ops/quantize.py):
//
//   jax_moe_ffi_quantize_mxfp8     : x[..., R, C] -> data fp8 (same shape), scale u8 (E8M0)
//                                    colwise = false: blocks of 32 along C, scale [..., R, ceil(C/32)]
//                                    colwise = true : blocks of 32 along R, scale [..., ceil(R/32), C]
//   jax_moe_ffi_quantize_blockwise : x[..., R, C] -> data fp8, scale f32: 1x128 blocks along C (scale
//                                    [..., R, ceil(C/128)]) or along R when colwise ([..., ceil(R/128), C]),
//                                    or 128x128 tiles ([..., ceil(R/128), ceil(C/128)]); attrs block_rows,
//                                    block_cols, pow2_scale, colwise
//   jax_moe_ffi_quantize_tiles_t   : x[..., R, C] in 128x128 tiles -> data (x's shape, or empty when not
//                                    wanted), data_t [..., C, R] (the codes transposed), scale f32 [...,
//                                    ceil(R/128), ceil(C/128)]; attr pow2_scale. One pass: the FP8 GEMM's
//                                    weight in both K-major orientations (forward and dgrad)
//
// Bit-identical to the CPU handlers. The block maximum is the integer maximum of the |x| bit patterns and
// every scale is computed from those bits with the integer helpers of common/dtypes.h, as on the CPU (the
// only float operation there, s = amax / fp8_max, is __fdiv_rn: the IEEE division). Elements are encoded as
// fp8(x * 2^shift) (power-of-two scales: MXFP8 and pow2 blockwise) or fp8(x / s) (__fdiv_rn), where fp8() is
// the hardware cvt.rn.satfinite.{e4m3,e5m2}x2.f32: round to nearest even, saturating to the largest finite
// value -- for every finite float32 exactly fp8::encode_f32_bits(., 0), the CPU's integer encoder (checked
// exhaustively on the H200 for every finite pattern and every shift: tools/check_fp8_cvt.cu). x * 2^shift is
// exact unless it falls below 2^-126, and anything that small encodes to +-0 either way (the smallest FP8
// subnormal is 2^-16), so fp8(x * 2^shift) == encode_f32_bits(x, shift). NaN/Inf blocks do not go through
// the conversion: their codes are forced to 0x7F. Why not the integer encoder here: it costs ~25 integer
// instructions per element, which made these kernels ALU-bound at ~55% of copy bandwidth (Hopper issues 64
// integer lanes per clock per SM; copy speed needs ~4 elements per clock per SM). The library is built
// without --use_fast_math / -ftz=true, which the float steps rely on.
//
// Kernels (no scratch, no host synchronisation: command-buffer compatible). A chunk is 8 consecutive
// elements of a row (one 16-byte load for bf16/f16, two for f32, when the row length is a multiple of
// 8 and the pointers are aligned; else bounds-checked scalar loads) and 8 FP8 bytes out (one 8-byte
// store). Grids are sized to the resident CTAs (SMs x occupancy) and loop (grid-stride).
//   rowblock: 1 x B blocks along C (B = 32 MXFP8, 128 blockwise). B/8 adjacent lanes own one block and
//             reduce its maximum with __shfl_xor_sync. Each thread walks the flat (row, chunk) space
//             with the grid stride and issues kUnroll independent chunk loads before any reduction
//             (kUnroll x 16 bytes in flight per thread; rows and chunks advance incrementally, no
//             division in the loop).
//   band:     a CTA of 256 threads takes 128 x 128 tiles of [R, C]: warp w covers rows 32 (w / 2) ..
//             +32 and columns 64 (w % 2) .. +64, lane l holds 8 rows (8 (l / 8) + i) x 8 columns
//             (8 (l % 8) + j), i.e. 8 chunk loads (128 bytes) in flight, all issued up front.
//             colwise 32  (MXFP8 along R): per-column maxima over a warp's 32 rows (2 shuffles);
//             colwise 128 (1x128 along R): the same, then across the 4 row warps through shared memory;
//             tile 128x128: one maximum per CTA tile (shuffles + shared memory).
//             One __syncthreads per tile for the latter two, with double-buffered shared memory so the
//             next tile's loads are not held back by a second barrier.
// A partial last block (or tile) is padded with zeros logically: missing elements are not read and
// count as 0 in the maximum.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/dtypes.h"
#include "common/ffi_helpers.h"
#include "common/quantize_shapes.h"

namespace jax_moe_ffi {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kUnrollDefault = 4;  // rowblock: chunks per thread in flight
constexpr int kTile = 128;  // band kernel: rows and columns of a CTA tile
constexpr uint32_t kF32NaNBits = 0x7fc00000u;
constexpr uint32_t kF32OneBits = 0x3f800000u;
constexpr uint32_t kF32MinNormalBits = 0x00800000u;
constexpr uint32_t kNaN4 = 0x7f7f7f7fu;  // four FP8 NaN codes

ffi::Error cuda_error(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("jax_moe_ffi: ") + what + ": " + cudaGetErrorString(e));
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }


// ------------------------------------------------------------------------------------ PTX helpers
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Brings the line holding p into L2 (no register written, nothing waits on it).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ float f16_to_f32(uint16_t h) {  // exact (subnormals included)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// FP8 codes of two floats (RNE, saturating to +-max): lo in bits 0..7, hi in bits 8..15.
template <typename F>
__device__ __forceinline__ uint32_t cvt2(float lo, float hi) {
  uint16_t d;
  if (F::kEmax == 8)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}

// ------------------------------------------------------------------------------- input element types
// A chunk of 8 elements lives in kW 32-bit words as loaded (bf16/f16: two per word, element 2i in the
// low half). Maxima are taken over |x| bit patterns word by word (16-bit lanes for bf16/f16: the order
// of |x| bits is the order of magnitudes, NaN above Inf above finite), so `abs` / `max` work on words
// and `bits` turns one element of a word array into float32 bits.
struct F32In {
  using S = float;
  static constexpr int kW = 8;
  static __device__ __forceinline__ void load8(const float* p, uint32_t* w) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
  }
  static __device__ __forceinline__ void load_scalar(const float* p, int n, uint32_t* w) {
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = j < n ? __float_as_uint(p[j]) : 0u;
  }
  static __device__ __forceinline__ uint32_t abs(uint32_t w) { return w & 0x7fffffffu; }
  static __device__ __forceinline__ uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
  static __device__ __forceinline__ uint32_t bits(const uint32_t* m, int j) { return m[j]; }
  static __device__ __forceinline__ float value(const uint32_t* w, int j) { return __uint_as_float(w[j]); }
  static __device__ __forceinline__ uint32_t fold(const uint32_t* m) {  // max over the 8 elements
    uint32_t a = max(max(m[0], m[1]), max(m[2], m[3])), b = max(max(m[4], m[5]), max(m[6], m[7]));
    return max(a, b);
  }
};

template <typename Derived>
struct Half2In {  // shared by bf16 and f16
  using S = uint16_t;
  static constexpr int kW = 4;
  static __device__ __forceinline__ void load8(const uint16_t* p, uint32_t* w) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
  }
  static __device__ __forceinline__ void load_scalar(const uint16_t* p, int n, uint32_t* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = 2 * i < n ? p[2 * i] : 0u, hi = 2 * i + 1 < n ? p[2 * i + 1] : 0u;
      w[i] = lo | (hi << 16);
    }
  }
  static __device__ __forceinline__ uint32_t abs(uint32_t w) { return w & 0x7fff7fffu; }
  static __device__ __forceinline__ uint32_t max(uint32_t a, uint32_t b) { return max_u16x2(a, b); }
  static __device__ __forceinline__ uint16_t half(const uint32_t* w, int j) {
    return static_cast<uint16_t>(j % 2 ? w[j / 2] >> 16 : w[j / 2] & 0xffffu);
  }
  static __device__ __forceinline__ uint32_t bits(const uint32_t* m, int j) { return Derived::to_f32_bits(half(m, j)); }
  static __device__ __forceinline__ uint32_t fold(const uint32_t* m) {
    const uint32_t t = max(max(m[0], m[1]), max(m[2], m[3]));
    const uint32_t lo = t & 0xffffu, hi = t >> 16;
    return Derived::to_f32_bits(static_cast<uint16_t>(lo > hi ? lo : hi));
  }
};
struct BF16In : Half2In<BF16In> {
  static __device__ __forceinline__ uint32_t to_f32_bits(uint16_t h) { return static_cast<uint32_t>(h) << 16; }
  static __device__ __forceinline__ float value(const uint32_t* w, int j) {
    return __uint_as_float(j % 2 ? w[j / 2] & 0xffff0000u : w[j / 2] << 16);
  }
};
struct F16In : Half2In<F16In> {
  static __device__ __forceinline__ uint32_t to_f32_bits(uint16_t h) { return fp8::f16_bits_to_f32_bits(h); }
  static __device__ __forceinline__ float value(const uint32_t* w, int j) { return f16_to_f32(half(w, j)); }
};

// Loads elements [c0, c0 + 8) of a row into w (zeros past `cols`).
template <typename In, bool kVec>
__device__ __forceinline__ void load_chunk(const typename In::S* row, int64_t c0, int64_t cols, uint32_t* w) {
  if (kVec && c0 < cols) {  // kVec: cols % 8 == 0 and aligned, a chunk is entirely in or out
    In::load8(row + c0, w);
  } else if (!kVec && c0 < cols) {
    In::load_scalar(row + c0, static_cast<int>(cols - c0 < 8 ? cols - c0 : 8), w);
  } else {
#pragma unroll
    for (int i = 0; i < In::kW; ++i) w[i] = 0;
  }
}

template <bool kVec>
__device__ __forceinline__ void store_chunk(uint8_t* row, int64_t c0, int64_t cols, uint2 q) {
  if (c0 >= cols) return;
  if (kVec) {
    *reinterpret_cast<uint2*>(row + c0) = q;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (c0 + i < cols) row[c0 + i] = static_cast<uint8_t>((i < 4 ? q.x : q.y) >> (8 * (i % 4)));
  }
}

// Per-column maxima of |x| over rows: the word-wise maximum of abs(words).
template <typename In>
__device__ __forceinline__ void absmax_into(uint32_t* m, const uint32_t* w) {
#pragma unroll
  for (int i = 0; i < In::kW; ++i) m[i] = In::max(m[i], In::abs(w[i]));
}

// ----------------------------------------------------------------------------------- block scales
enum Mode { kMx = 0, kDiv = 1, kPow2 = 2 };

// How one block is encoded, from its max |x| bits. Mirrors mx_scale / block_scale of cpu/quantize.cc.
struct Code {
  float m;        // kMx / kPow2: elements are fp8(x * m), m = 2^shift; kDiv: fp8(x / m)
  bool nan;       // NaN or Inf in the block: every element is the NaN code
  uint32_t out;   // the scale as written: E8M0 byte (kMx) or float32 bits (blockwise)
};

__device__ __forceinline__ float exp2i(int32_t e) {  // 2^e for e in [-126, 127]
  return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

template <typename F, int kMode>
__device__ __forceinline__ Code block_code(uint32_t amax) {
  Code r{1.0f, false, 0};
  if (amax >= 0x7f800000u) {
    r.nan = true;
    r.out = kMode == kMx ? 0xffu : kF32NaNBits;
    return r;
  }
  if (kMode == kMx) {
    // se in [-127, 127 - kEmax] (amax < 2^128), so the shift -se is in [-119, 127]: 2^-se is normal.
    int32_t se = -127;  // all-zero block: elements +-0 * 2^127 = +-0
    if (amax != 0) {
      se = fp8::f32_floor_log2(amax) - F::kEmax;
      se = se < -127 ? -127 : se;
    }
    r.m = exp2i(-se);
    r.out = static_cast<uint32_t>(se + 127);
    return r;
  }
  if (amax == 0) {  // scale 1: x * 1 = x / 1 = +-0
    r.out = kF32OneBits;
    return r;
  }
  if (kMode == kPow2) {
    const int32_t k = fp8::pow2_scale_exp<F>(amax);  // in [-126, 120] (amax < 2^128): 2^-k is normal
    r.m = exp2i(-k);
    r.out = static_cast<uint32_t>(k + 127) << 23;
    return r;
  }
  constexpr float kMax = F::kEmax == 8 ? 448.0f : 57344.0f;
  uint32_t sb = __float_as_uint(__fdiv_rn(__uint_as_float(amax), kMax));
  if (sb < kF32MinNormalBits) sb = kF32MinNormalBits;
  r.m = __uint_as_float(sb);
  r.out = sb;
  return r;
}

// The FP8 codes of one chunk, element j with its block's factor m[j] (bytes in element order).
template <typename In, typename F, int kMode>
__device__ __forceinline__ uint2 encode8(const uint32_t* w, const float* m) {
  float q[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float v = In::value(w, j);
    q[j] = kMode == kDiv ? __fdiv_rn(v, m[j]) : __fmul_rn(v, m[j]);  // __fmul_rn: never contracted
  }
  uint2 r;
  r.x = cvt2<F>(q[0], q[1]) | (cvt2<F>(q[2], q[3]) << 16);
  r.y = cvt2<F>(q[4], q[5]) | (cvt2<F>(q[6], q[7]) << 16);
  return r;
}

// x / s correctly rounded (bitwise __fdiv_rn) from r = __frcp_rn(s), for s >= 2^-126 (every blockwise scale):
// q1 = RN(x r) is within one ulp of x / s, so the residual x - q1 s is exact (it does not underflow when
// |x| >= 2^-100) and RN(q1 + (x - q1 s) r) is the correctly rounded quotient (Markstein's correction step, with
// r the correctly rounded reciprocal). Zeros (the sign of -0 / s) and tiny |x| take __fdiv_rn itself.
// Experiment builds only (JAX_MOE_FFI_QUANT_EXPERIMENT=markstein): tried in session 17 because the 1 x 128 row
// quantiser runs at ~81% of copy bandwidth against MXFP8's >100%. On the H200 it was bitwise __fdiv_rn (every
// bf16 pattern, 2^22 float32 patterns near block maxima, the random / special-value cases) but no faster
// (within 2%: the division is not what limits this kernel), so the default keeps __fdiv_rn.
__device__ __forceinline__ float div_by_scale(float x, float s, float r) {
  if (!(fabsf(x) >= 0x1p-100f)) return __fdiv_rn(x, s);
  const float q1 = __fmul_rn(x, r);
  const float e = __fmaf_rn(-q1, s, x);
  return __fmaf_rn(e, r, q1);
}

// encode8 for one block factor shared by the chunk, dividing through div_by_scale (kDiv only).
template <typename In, typename F>
__device__ __forceinline__ uint2 encode8_div_fast(const uint32_t* w, float s) {
  const float r = __frcp_rn(s);
  float q[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) q[j] = div_by_scale(In::value(w, j), s, r);
  uint2 out;
  out.x = cvt2<F>(q[0], q[1]) | (cvt2<F>(q[2], q[3]) << 16);
  out.y = cvt2<F>(q[4], q[5]) | (cvt2<F>(q[6], q[7]) << 16);
  return out;
}

// encode8 for one block factor shared by the chunk (kDiv only), from q1 = RN(x r), r = RN(1/s): q1 is within 2.5 f32
// ulps of x / s (two roundings of relative size <= 2^-24 each, ulps >= 2^-24 |q|), so fp8(q1) == fp8(RN(x / s))
// unless an FP8 rounding boundary lies between them -- a midpoint between two normal FP8 values (the f32 mantissa
// bits below F's: exactly half) within 3 ulps of q1, or the subnormal FP8 range (|q1| < F's smallest normal); there
// (about 7 in 2^20 elements of random data) it divides. Zeros are exact either way. Experiment builds only
// (JAX_MOE_FFI_QUANT_EXPERIMENT=midpoint*, session 28): the 1 x 128 kernel is instruction-bound (ncu, call 5:
// 211 instructions per 8 elements against MXFP8's 128, issue slots 70% busy at 50% occupancy; __fdiv_rn is MUFU +
// FFMAs + FCHK + a branch per element).
template <typename In, typename F>
__device__ __forceinline__ uint2 encode8_div_midpoint(const uint32_t* w, float s) {
  constexpr uint32_t kLow = F::kEmax == 8 ? 0xfffffu : 0x1fffffu;  // f32 mantissa bits below E4M3's 3 / E5M2's 2
  constexpr uint32_t kMid = (kLow + 1) >> 1;
  constexpr uint32_t kMinNormal = F::kEmax == 8 ? 0x3c800000u : 0x38800000u;  // 2^-6 / 2^-14
  const float r = __frcp_rn(s);
  float q[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float v = In::value(w, j);
    q[j] = __fmul_rn(v, r);
    const uint32_t b = __float_as_uint(q[j]) & 0x7fffffffu;
    if (b - 1u < kMinNormal + 3u || (b & kLow) - (kMid - 3u) <= 6u) q[j] = __fdiv_rn(v, s);
  }
  uint2 out;
  out.x = cvt2<F>(q[0], q[1]) | (cvt2<F>(q[2], q[3]) << 16);
  out.y = cvt2<F>(q[4], q[5]) | (cvt2<F>(q[6], q[7]) << 16);
  return out;
}

template <int kMode>
__device__ __forceinline__ void store_scale(void* scale, int64_t i, uint32_t v) {
  if (kMode == kMx)
    static_cast<uint8_t*>(scale)[i] = static_cast<uint8_t>(v);
  else
    static_cast<uint32_t*>(scale)[i] = v;
}

// -------------------------------------------------------------------------------- rowblock kernel
// x viewed as [rows, cols]; the flat unit space rows x upr (upr = units per row, padded to whole blocks; a unit is
// kChunks chunks of 8 elements) is walked with the grid stride, kUnroll units per thread per iteration. `iters` is the
// same for every thread, so all lanes of a warp reach the shuffles together.
// kChunks = 2 (the 1 x 128 default where rows are 16-byte vectors, session 28): 8 lanes per block instead of 16, and
// one walk step, block code and scale decision per 16 elements instead of per 8 -- the index arithmetic and reduction
// that, beside the division, made the 8-element form at 1 x 128 execute 1.64x the MXFP8 kernel's instructions (ncu,
// session 28 call 5); +14-21% on the five benchmark shapes (quantize_rows_ab_x16_s28_h200.md). Each chunk is loaded,
// encoded and stored as with kChunks = 1, so the codes and scales do not depend on kChunks. (Session 28 shipped this
// as a separate kernel; merged in session 29, measured 0-2% below it, bitwise: quantize_rows_ab_merged2_s29_h200.md.)
// kDivForm (kDiv only): 0 __fdiv_rn, 1 div_by_scale (Markstein), 2 encode8_div_midpoint; kMinBlocks: resident CTAs
// per SM asked of the compiler (a register cap; experiments).
template <typename In, typename F, int kMode, int kBlock, bool kVec, int kUnroll = kUnrollDefault,
          int kDivForm = 0, int kMinBlocks = 1, int kChunks = 1>
__global__ void __launch_bounds__(kThreads, kMinBlocks) rowblock_kernel(const typename In::S* __restrict__ x, int64_t rows,
                                                             int64_t cols, uint8_t* __restrict__ data,
                                                             void* __restrict__ scale, int64_t iters) {
  constexpr int kLanes = kBlock / (8 * kChunks);  // threads per block: 4 (MXFP8), 16 or 8 (1x128)
  const int64_t nb = (cols + kBlock - 1) / kBlock;
  const int64_t upr = nb * kLanes;  // a multiple of kLanes: a lane group never straddles two rows
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;  // a multiple of 32
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t r = f0 / upr, c = f0 - (f0 / upr) * upr;  // this thread's next unit
  const int64_t dr = stride / upr, dc = stride - dr * upr;
  for (int64_t it = 0; it < iters; ++it) {
    uint32_t w[kUnroll][kChunks][In::kW];
    int64_t rr[kUnroll];
    int64_t cc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // all loads first
      rr[u] = r;
      cc[u] = c;
      c += dc;
      r += dr;
      if (c >= upr) {
        c -= upr;
        ++r;
      }
#pragma unroll
      for (int h = 0; h < kChunks; ++h) {
        if (rr[u] < rows) {
          load_chunk<In, kVec>(x + rr[u] * cols, (cc[u] * kChunks + h) * 8, cols, w[u][h]);
        } else {
#pragma unroll
          for (int i = 0; i < In::kW; ++i) w[u][h][i] = 0;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      uint32_t a[kChunks][In::kW];
#pragma unroll
      for (int i = 0; i < In::kW; ++i) {
#pragma unroll
        for (int h = 0; h < kChunks; ++h) a[h][i] = In::abs(w[u][h][i]);
      }
      uint32_t mx = In::fold(a[0]);
#pragma unroll
      for (int h = 1; h < kChunks; ++h) {
        const uint32_t f = In::fold(a[h]);
        mx = f > mx ? f : mx;
      }
#pragma unroll
      for (int o = 1; o < kLanes; o <<= 1) {
        const uint32_t n = __shfl_xor_sync(kFull, mx, o);
        mx = n > mx ? n : mx;
      }
      if (rr[u] >= rows) continue;  // after the shuffles: every lane took part
      const Code code = block_code<F, kMode>(mx);
      uint2 q[kChunks];  // every chunk encoded, then every chunk stored
#pragma unroll
      for (int h = 0; h < kChunks; ++h) {
        if constexpr (kDivForm == 1 && kMode == kDiv) {
          q[h] = encode8_div_fast<In, F>(w[u][h], code.m);
        } else if constexpr (kDivForm == 2 && kMode == kDiv) {
          q[h] = encode8_div_midpoint<In, F>(w[u][h], code.m);
        } else {
          float m[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) m[j] = code.m;
          q[h] = encode8<In, F, kMode>(w[u][h], m);
        }
      }
#pragma unroll
      for (int h = 0; h < kChunks; ++h) {
        if (code.nan) q[h] = make_uint2(kNaN4, kNaN4);
        store_chunk<kVec>(data + rr[u] * cols, (cc[u] * kChunks + h) * 8, cols, q[h]);
      }
      if (cc[u] % kLanes == 0) store_scale<kMode>(scale, rr[u] * nb + cc[u] / kLanes, code.out);
    }
  }
}

// ------------------------------------------------------------------------------------ band kernel
// Byte b of each of four words, packed little-endian: (w0.b, w1.b, w2.b, w3.b).
__device__ __forceinline__ uint32_t gather_byte(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int b) {
  const uint32_t sel = static_cast<uint32_t>(b) | (static_cast<uint32_t>(b + 4) << 4);  // bytes b of x, b of y
  return __byte_perm(__byte_perm(w0, w1, sel), __byte_perm(w2, w3, sel), 0x5410);
}

// A thread's 8 x 8 block of codes (q[i]: row r0 + i, columns c0 .. c0 + 7) written transposed into
// out[cols, rows]: row c0 + j gets bytes (q[0].j, ..., q[7].j) at columns r0 .. r0 + 7. One 8-byte store
// per row when rows % 8 == 0 (r0 is a multiple of 8, so it is aligned), else bounds-checked bytes.
template <bool kVec>
__device__ __forceinline__ void store_transposed8x8(uint8_t* out, int64_t rows, int64_t cols, int64_t r0,
                                                    int64_t c0, const uint2* q) {
  if (r0 >= rows) return;
  const bool vec = kVec && rows % 8 == 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (c0 + j >= cols) break;
    uint2 t;
    if (j < 4) {
      t.x = gather_byte(q[0].x, q[1].x, q[2].x, q[3].x, j);
      t.y = gather_byte(q[4].x, q[5].x, q[6].x, q[7].x, j);
    } else {
      t.x = gather_byte(q[0].y, q[1].y, q[2].y, q[3].y, j - 4);
      t.y = gather_byte(q[4].y, q[5].y, q[6].y, q[7].y, j - 4);
    }
    uint8_t* row = out + (c0 + j) * rows;
    if (vec) {
      *reinterpret_cast<uint2*>(row + r0) = t;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (r0 + i < rows) row[r0 + i] = static_cast<uint8_t>((i < 4 ? t.x : t.y) >> (8 * (i % 4)));
    }
  }
}

// Per-column maxima of a warp's 32 rows: lanes k, k + 8, k + 16, k + 24 hold the same columns.
template <typename In>
__device__ __forceinline__ void warp_col_maxima(uint32_t* cm) {
#pragma unroll
  for (int j = 0; j < In::kW; ++j) {
    cm[j] = In::max(cm[j], __shfl_xor_sync(kFull, cm[j], 8));
    cm[j] = In::max(cm[j], __shfl_xor_sync(kFull, cm[j], 16));
  }
}

// ... then across the 4 row warps of a 128-row band through shared memory `red` ([row warp][column warp][lane
// column][word]); one __syncthreads.
template <typename In>
__device__ __forceinline__ void band_col_maxima(uint32_t* cm, uint32_t* red, int wr, int wc, int sl, int k) {
  constexpr int kW = In::kW;
  uint32_t* red_w = red + ((wr * 2 + wc) * 8 + k) * kW;
  if (sl == 0) {
#pragma unroll
    for (int j = 0; j < kW; ++j) red_w[j] = cm[j];
  }
  __syncthreads();
#pragma unroll
  for (int rw = 0; rw < 4; ++rw) {
    const uint32_t* red_g = red + ((rw * 2 + wc) * 8 + k) * kW;
#pragma unroll
    for (int j = 0; j < kW; ++j) cm[j] = In::max(cm[j], red_g[j]);
  }
}

// Eight float32 scales (bits) of columns c0 .. c0 + 7 at s[c0 ..] (two 16-byte stores when kVec).
template <bool kVec>
__device__ __forceinline__ void store_scales8(uint32_t* s, int64_t c0, int64_t cols, const uint32_t* out) {
  if (kVec) {
    reinterpret_cast<uint4*>(s + c0)[0] = make_uint4(out[0], out[1], out[2], out[3]);
    reinterpret_cast<uint4*>(s + c0)[1] = make_uint4(out[4], out[5], out[6], out[7]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c0 + j < cols) s[c0 + j] = out[j];
  }
}

enum Band { kCol32 = 0, kCol128 = 1, kTile128 = 2 };

// x viewed as [batch, rows, cols], walked in 128 x 128 tiles (see the header comment for the layout).
//   kCol32:   MXFP8 blocks of 32 rows x 1 column, scale u8 [batch, ceil(rows/32), cols]
//   kCol128:  blockwise 128 rows x 1 column, scale f32 [batch, ceil(rows/128), cols]
//   kTile128: blockwise 128 x 128 tiles, scale f32 [batch, ceil(rows/128), ceil(cols/128)]
//   data_t (kTile128 only, may be null): also write the codes transposed, data_t[b, c, r] = data[b, r, c]
//   (the K-major copy an FP8 GEMM needs of a weight stored N-major: 128x128 tiles and their scales are the
//   same either way). `data` may then be null (only the transposed copy is wanted).
//   kPrefetch (experiment band_prefetch): at the start of each tile, ask L2 for this thread's chunks of the CTA's
//   next tile. Tried because ncu showed the kernel waiting on its loads (the first use of the loaded words and the
//   barrier after them: 37% of the stall samples; DRAM 70% busy; session 29 call 1); measured 11-13% slower on five
//   weight shapes (the extra L2 requests; L2 was 80% busy), while the kernel without it already moves its bytes at
//   98-101% of the rate of XLA's copy (quantize_weights_ab_s29_h200.md).
template <typename In, typename F, int kMode, int kBand, bool kVec, bool kPrefetch = false>
__global__ void __launch_bounds__(kThreads) band_kernel(const typename In::S* __restrict__ x, int64_t rows,
                                                         int64_t cols, uint8_t* __restrict__ data,
                                                         void* __restrict__ scale, int64_t tiles,
                                                         uint8_t* __restrict__ data_t) {
  constexpr int kW = In::kW;
  // kCol128: per-column maxima of each row warp ([warp row][column warp][lane column][word]);
  // kTile128: one maximum per warp. Two buffers: tile t uses buffer t % 2.
  __shared__ uint32_t red[2][kBand == kCol128 ? 4 * 2 * 8 * kW : kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wr = warp / 2, wc = warp % 2, sl = lane / 8, k = lane % 8;
  const int r_in = wr * 32 + sl * 8, c_in = wc * 64 + k * 8;
  const int64_t nbr = (rows + kTile - 1) / kTile, nbc = (cols + kTile - 1) / kTile;
  int buf = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, buf ^= 1) {
    const int64_t tc = tile % nbc, tr = (tile / nbc) % nbr, b = tile / (nbc * nbr);
    const int64_t r0 = tr * kTile + r_in, c0 = tc * kTile + c_in;
    const typename In::S* xb = x + b * rows * cols;
    if (kPrefetch && tile + gridDim.x < tiles) {
      const int64_t nt = tile + gridDim.x;
      const int64_t nr0 = (nt / nbc) % nbr * kTile + r_in, nc0 = nt % nbc * kTile + c_in;
      const typename In::S* nxb = x + nt / (nbc * nbr) * rows * cols;
      if (nc0 < cols) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (nr0 + i < rows) prefetch_l2(nxb + (nr0 + i) * cols + nc0);
      }
    }
    uint32_t w[8][kW];
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // all 8 loads first
      if (r0 + i < rows) {
        load_chunk<In, kVec>(xb + (r0 + i) * cols, c0, cols, w[i]);
      } else {
#pragma unroll
        for (int j = 0; j < kW; ++j) w[i][j] = 0;
      }
    }
    uint32_t cm[kW];  // per-column maxima over this thread's 8 rows
#pragma unroll
    for (int j = 0; j < kW; ++j) cm[j] = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) absmax_into<In>(cm, w[i]);

    float m[8];
    uint32_t nan_lo = 0, nan_hi = 0;  // byte masks of NaN/Inf columns (kCol*)
    uint8_t* db = data != nullptr ? data + b * rows * cols : nullptr;
    if (kBand == kTile128) {
      uint32_t mx = In::fold(cm);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint32_t n = __shfl_xor_sync(kFull, mx, o);
        mx = n > mx ? n : mx;
      }
      if (lane == 0) red[buf][warp] = mx;
      __syncthreads();
      mx = 0;
#pragma unroll
      for (int v = 0; v < kThreads / 32; ++v) mx = red[buf][v] > mx ? red[buf][v] : mx;
      const Code code = block_code<F, kMode>(mx);
      if (threadIdx.x == 0) static_cast<uint32_t*>(scale)[tile] = code.out;  // tile = (b, tr, tc) row-major
#pragma unroll
      for (int j = 0; j < 8; ++j) m[j] = code.m;
      if (code.nan) nan_lo = nan_hi = kFull;
    } else {
      warp_col_maxima<In>(cm);
      int64_t srow;  // row of the scale array
      bool writer;   // this lane writes its 8 columns' scales
      if (kBand == kCol128) {
        band_col_maxima<In>(cm, red[buf], wr, wc, sl, k);
        srow = b * nbr + tr;
        writer = wr == 0 && sl == 0;
      } else {
        const int64_t nb32 = (rows + 31) / 32;
        srow = b * nb32 + tr * 4 + wr;
        writer = sl == 0 && tr * kTile + wr * 32 < rows;
      }
      uint32_t out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const Code code = block_code<F, kMode>(In::bits(cm, j));
        m[j] = code.m;
        out[j] = code.out;
        if (code.nan) (j < 4 ? nan_lo : nan_hi) |= 0xffu << (8 * (j % 4));
      }
      if (writer && c0 < cols) {
        if (kBand == kCol32) {
          uint8_t* s = static_cast<uint8_t*>(scale) + srow * cols + c0;
          if (kVec) {
            *reinterpret_cast<uint2*>(s) = make_uint2(out[0] | out[1] << 8 | out[2] << 16 | out[3] << 24,
                                                      out[4] | out[5] << 8 | out[6] << 16 | out[7] << 24);
          } else {
#pragma unroll
            for (int j = 0; j < 8; ++j)
              if (c0 + j < cols) s[j] = static_cast<uint8_t>(out[j]);
          }
        } else {
          store_scales8<kVec>(static_cast<uint32_t*>(scale) + srow * cols, c0, cols, out);
        }
      }
    }
    uint2 q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = encode8<In, F, kMode>(w[i], m);
      q[i].x = (q[i].x & ~nan_lo) | (kNaN4 & nan_lo);
      q[i].y = (q[i].y & ~nan_hi) | (kNaN4 & nan_hi);
      if (db != nullptr && r0 + i < rows) store_chunk<kVec>(db + (r0 + i) * cols, c0, cols, q[i]);
    }
    if (kBand == kTile128 && data_t != nullptr) store_transposed8x8<kVec>(data_t + b * rows * cols, rows, cols, r0, c0, q);
  }
}

// --------------------------------------------------------------------------- groups_t kernel
// quantize_groups_t (common/quantize_shapes.h): the band kernel's 1 x 128 blocks along the rows, but a CTA
// tile's 128 rows are one padded block b of one group (rows past the group's end, and every row of a block
// past the last group's, count as +0), and the codes go out transposed to data_t[c, 128 b + r]. Same lane
// layout and the same two-level column maxima as kCol128.
__global__ void groups_t_plan_kernel(const int32_t* __restrict__ sizes, int64_t g, int64_t m, int32_t* plan) {
  groups_t_plan(sizes, g, m, plan, plan + g + 1);
}

template <typename In, typename F, bool kVec>
__global__ void __launch_bounds__(kThreads) groups_t_kernel(const typename In::S* __restrict__ x, int64_t cols,
                                                             int64_t p, const int32_t* __restrict__ plan, int64_t g,
                                                             uint8_t* __restrict__ data_t, void* __restrict__ scale,
                                                             int64_t tiles) {
  constexpr int kW = In::kW;
  __shared__ uint32_t red[2][4 * 2 * 8 * kW];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wr = warp / 2, wc = warp % 2, sl = lane / 8, k = lane % 8;
  const int r_in = wr * 32 + sl * 8, c_in = wc * 64 + k * 8;
  const int32_t* row_off = plan;
  const int32_t* block_off = plan + g + 1;
  const int64_t used = block_off[g];
  const int64_t nbc = (cols + kTile - 1) / kTile;
  int buf = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, buf ^= 1) {
    const int64_t tc = tile % nbc, b = tile / nbc;
    int64_t row_begin = 0, row_end = 0;  // the source rows of block b
    if (b < used) {
      int64_t lo = 0, hi = g - 1;  // the group holding block b: the first i with block_off[i + 1] > b
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (block_off[mid + 1] > b) hi = mid; else lo = mid + 1;
      }
      row_begin = row_off[lo] + (b - block_off[lo]) * kTile;
      row_end = row_begin + kTile < row_off[lo + 1] ? row_begin + kTile : row_off[lo + 1];
    }
    const int64_t r0 = row_begin + r_in, c0 = tc * kTile + c_in;
    uint32_t w[8][kW];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (r0 + i < row_end) {
        load_chunk<In, kVec>(x + (r0 + i) * cols, c0, cols, w[i]);
      } else {
#pragma unroll
        for (int j = 0; j < kW; ++j) w[i][j] = 0;
      }
    }
    uint32_t cm[kW];
#pragma unroll
    for (int j = 0; j < kW; ++j) cm[j] = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) absmax_into<In>(cm, w[i]);
    warp_col_maxima<In>(cm);
    band_col_maxima<In>(cm, red[buf], wr, wc, sl, k);
    float m[8];
    uint32_t out[8], nan_lo = 0, nan_hi = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const Code code = block_code<F, kDiv>(In::bits(cm, j));
      m[j] = code.m;
      out[j] = code.out;
      if (code.nan) (j < 4 ? nan_lo : nan_hi) |= 0xffu << (8 * (j % 4));
    }
    if (wr == 0 && sl == 0 && c0 < cols) store_scales8<kVec>(static_cast<uint32_t*>(scale) + b * cols, c0, cols, out);
    uint2 q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = encode8<In, F, kDiv>(w[i], m);
      q[i].x = (q[i].x & ~nan_lo) | (kNaN4 & nan_lo);
      q[i].y = (q[i].y & ~nan_hi) | (kNaN4 & nan_hi);
      if (r0 + i >= row_end) q[i] = make_uint2(0, 0);  // padding stays +0 in a NaN block too (as on the CPU)
    }
    store_transposed8x8<kVec>(data_t, p, cols, b * kTile + r_in, c0, q);
  }
}

// ------------------------------------------------------------------------------------ dispatch
template <typename Fn>
ffi::Error with_in(ffi::DataType t, Fn&& f) {
  switch (t) {
    case ffi::DataType::F32: return f(F32In{});
    case ffi::DataType::BF16: return f(BF16In{});
    default: return f(F16In{});
  }
}

template <typename Fn>
ffi::Error with_fmt(ffi::DataType t, Fn&& f) {
  if (t == ffi::DataType::F8E4M3FN) return f(fp8::E4M3{});
  return f(fp8::E5M2{});
}

// 16-byte input loads, 8-byte data stores and (colwise band kernels) 8/16-byte scale stores: with
// cols % 8 == 0 every row start and chunk is then aligned too.
bool vec_ok(int64_t cols, const void* x, const void* data, const void* scale, bool colwise) {
  auto al = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  return cols % 8 == 0 && al(x, 16) && al(data, 8) && (!colwise || al(scale, 16));
}

// CTAs of a kernel that fit on the device at once (SMs x occupancy); the occupancy is computed once.
template <auto kKernel>
int64_t resident_ctas() {
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, 0) != cudaSuccess) {
      cudaGetLastError();  // not sticky; fall back to one CTA per SM
      n = 1;
    }
    return n > 0 ? n : 1;
  }();
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms <= 0) {
    cudaGetLastError();
    sms = 132;
  }
  return static_cast<int64_t>(per_sm) * sms;
}

template <typename In, typename F, int kMode, int kBlock, bool kVec, int kUnroll = kUnrollDefault,
          int kDivForm = 0, int kMinBlocks = 1, int kChunks = 1>
void launch_rowblock(cudaStream_t stream, const void* x, int64_t rows, int64_t cols, void* data, void* scale) {
  constexpr auto kernel = rowblock_kernel<In, F, kMode, kBlock, kVec, kUnroll, kDivForm, kMinBlocks, kChunks>;
  const int64_t units = rows * cdiv(cols, kBlock) * (kBlock / (8 * kChunks));
  int64_t grid = cdiv(units, int64_t{kThreads} * kUnroll);
  const int64_t resident = resident_ctas<kernel>();
  if (grid > resident) grid = resident;
  const int64_t iters = cdiv(units, grid * kThreads * kUnroll);
  kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(static_cast<const typename In::S*>(x), rows, cols,
                                                              static_cast<uint8_t*>(data), scale, iters);
}

// The 1 x 128 default where rows are 16-byte vectors: 16 elements per thread, kUnroll units in flight.
template <typename In, typename F, int kMode, int kUnroll = 2>
void launch_rowblock16(cudaStream_t stream, const void* x, int64_t rows, int64_t cols, void* data, void* scale) {
  launch_rowblock<In, F, kMode, 128, true, kUnroll, 0, 1, 2>(stream, x, rows, cols, data, scale);
}

template <auto kKernel, typename In>
void launch_band_kernel(cudaStream_t stream, const void* x, int64_t batch, int64_t rows, int64_t cols, void* data,
                        void* scale, void* data_t) {
  const int64_t tiles = batch * cdiv(rows, kTile) * cdiv(cols, kTile);
  int64_t grid = tiles;
  const int64_t resident = resident_ctas<kKernel>();
  if (grid > resident) grid = resident;
  kKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(static_cast<const typename In::S*>(x), rows, cols,
                                                               static_cast<uint8_t*>(data), scale, tiles,
                                                               static_cast<uint8_t*>(data_t));
}

#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
// JAX_MOE_FFI_QUANT_EXPERIMENT (read per call; experiment builds only). The band kernel: band_prefetch (an L2 prefetch
// of each CTA's next tile). The 1 x 128 row quantiser: the default (16 elements per thread, 2 units in flight, where
// rows are 16-byte vectors) | x16_unroll4 (4 in flight) | x8 (8 elements per thread, 4 in flight: the default until
// session 28) and its variants markstein (div_by_scale) | unroll8 | markstein_unroll8 | midpoint
// (encode8_div_midpoint) | unroll2 | occ6 (__launch_bounds__ min 6 CTAs) | midpoint_unroll2 | midpoint_occ6.
std::string QuantRowExperiment() {
  const char* v = std::getenv("JAX_MOE_FFI_QUANT_EXPERIMENT");
  return v != nullptr ? v : "";
}
#endif

template <typename In, typename F, int kMode, int kBand, bool kVec>
void launch_band(cudaStream_t stream, const void* x, int64_t batch, int64_t rows, int64_t cols, void* data,
                 void* scale, void* data_t = nullptr) {
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
  if (QuantRowExperiment() == "band_prefetch")
    return launch_band_kernel<band_kernel<In, F, kMode, kBand, kVec, true>, In>(stream, x, batch, rows, cols, data,
                                                                              scale, data_t);
#endif
  launch_band_kernel<band_kernel<In, F, kMode, kBand, kVec>, In>(stream, x, batch, rows, cols, data, scale, data_t);
}

// One quantisation: x as [batch, rows, cols] (rowblock kernels ignore the batch: rows = batch * rows).
struct Job {
  const void* x;
  void* data;
  void* scale;
  int64_t batch, rows, cols;
  void* data_t = nullptr;  // 128x128 tiles only: also the transposed codes (then `data` may be null)
};


// 1 x 128 blocks along rows (blockwise activations and gradients).
template <typename In, typename F, int kMode, bool kVec>
void launch_rowblock_128(cudaStream_t stream, const Job& j) {
  const int64_t rows = j.batch * j.rows;
#ifdef JAX_MOE_FFI_FP8_EXPERIMENTS
  if constexpr (kMode == kDiv) {
    const std::string e = QuantRowExperiment();
    if (e == "markstein")
      return launch_rowblock<In, F, kMode, 128, kVec, kUnrollDefault, 1>(stream, j.x, rows, j.cols, j.data, j.scale);
    if (e == "unroll8")
      return launch_rowblock<In, F, kMode, 128, kVec, 8, 0>(stream, j.x, rows, j.cols, j.data, j.scale);
    if (e == "markstein_unroll8")
      return launch_rowblock<In, F, kMode, 128, kVec, 8, 1>(stream, j.x, rows, j.cols, j.data, j.scale);
    // session 28: fewer instructions (midpoint), more resident warps (unroll2, occ6: a 42-register cap)
    if (e == "midpoint")
      return launch_rowblock<In, F, kMode, 128, kVec, kUnrollDefault, 2>(stream, j.x, rows, j.cols, j.data, j.scale);
    if (e == "unroll2")
      return launch_rowblock<In, F, kMode, 128, kVec, 2, 0>(stream, j.x, rows, j.cols, j.data, j.scale);
    if (e == "occ6")
      return launch_rowblock<In, F, kMode, 128, kVec, kUnrollDefault, 0, 6>(stream, j.x, rows, j.cols, j.data, j.scale);
    if (e == "midpoint_unroll2")
      return launch_rowblock<In, F, kMode, 128, kVec, 2, 2>(stream, j.x, rows, j.cols, j.data, j.scale);
    if (e == "midpoint_occ6")
      return launch_rowblock<In, F, kMode, 128, kVec, kUnrollDefault, 2, 6>(stream, j.x, rows, j.cols, j.data, j.scale);
    if (e == "x8")  // the default before session 28: rowblock_kernel, 8 elements per thread
      return launch_rowblock<In, F, kMode, 128, kVec>(stream, j.x, rows, j.cols, j.data, j.scale);
    if constexpr (kVec) {
      if (e == "x16_unroll4")
        return launch_rowblock16<In, F, kMode, kUnrollDefault>(stream, j.x, rows, j.cols, j.data, j.scale);
    }
  }
#endif
  if constexpr (kVec) return launch_rowblock16<In, F, kMode>(stream, j.x, rows, j.cols, j.data, j.scale);
  launch_rowblock<In, F, kMode, 128, kVec>(stream, j.x, rows, j.cols, j.data, j.scale);
}

// Only the meaningful kernels are instantiated: MXFP8 (kMx) has 32-element blocks, blockwise 128.
template <typename In, typename F, int kMode>
ffi::Error run(cudaStream_t stream, const Job& j, bool colwise, bool tiles) {
  auto go = [&](auto vec_tag) {
    constexpr bool kVec = decltype(vec_tag)::value;
    if constexpr (kMode == kMx) {
      if (colwise)
        launch_band<In, F, kMode, kCol32, kVec>(stream, j.x, j.batch, j.rows, j.cols, j.data, j.scale);
      else
        launch_rowblock<In, F, kMode, 32, kVec>(stream, j.x, j.batch * j.rows, j.cols, j.data, j.scale);
    } else {
      if (tiles)
        launch_band<In, F, kMode, kTile128, kVec>(stream, j.x, j.batch, j.rows, j.cols, j.data, j.scale, j.data_t);
      else if (colwise)
        launch_band<In, F, kMode, kCol128, kVec>(stream, j.x, j.batch, j.rows, j.cols, j.data, j.scale);
      else
        launch_rowblock_128<In, F, kMode, kVec>(stream, j);
    }
  };
  if (vec_ok(j.cols, j.x, j.data, j.scale, colwise) && reinterpret_cast<uintptr_t>(j.data_t) % 8 == 0)
    go(std::true_type{});
  else
    go(std::false_type{});
  return cuda_error("quantize kernel");
}

// The call's checks (common/quantize_shapes.h, the same as the CPU handlers') and the job's view of x.
ffi::Error check_call(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& data,
                      ffi::AnyBuffer::Dimensions sd, int64_t block_rows, int64_t block_cols, bool colwise, Job* job) {
  QuantizeView v;
  if (auto e = check_quantize_call(op, x, data.element_type(), data.dimensions(), sd, block_rows, block_cols, colwise,
                                   &v);
      e.failure())
    return e;
  job->batch = v.batch;
  job->rows = v.rows;
  job->cols = v.cols;
  return ffi::Error::Success();
}

// ------------------------------------------------------------------------------------- handlers
ffi::Error QuantizeMxfp8Cuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                             ffi::Result<ffi::Buffer<ffi::U8>> scale, bool colwise) {
  Job job{x.untyped_data(), data->untyped_data(), scale->untyped_data(), 0, 0, 0};
  if (auto e = check_call("quantize_mxfp8", x, *data, scale->dimensions(), 1, 32, colwise, &job); e.failure())
    return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  return with_in(x.element_type(), [&](auto in_tag) -> ffi::Error {
    using In = decltype(in_tag);
    return with_fmt(data->element_type(), [&](auto fmt_tag) -> ffi::Error {
      return run<In, decltype(fmt_tag), kMx>(stream, job, colwise, false);
    });
  });
}

ffi::Error QuantizeBlockwiseCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                                 ffi::Result<ffi::Buffer<ffi::F32>> scale, int64_t block_rows, int64_t block_cols,
                                 bool pow2_scale, bool colwise) {
  if (block_cols != 128 || (block_rows != 1 && block_rows != 128))
    return invalid("quantize_blockwise: blocks must be 1x128 or 128x128, got " + std::to_string(block_rows) + "x" +
                   std::to_string(block_cols));
  const bool tiles = block_rows > 1;
  Job job{x.untyped_data(), data->untyped_data(), scale->untyped_data(), 0, 0, 0};
  if (auto e = check_call("quantize_blockwise", x, *data, scale->dimensions(), block_rows, block_cols, colwise, &job);
      e.failure())
    return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  return with_in(x.element_type(), [&](auto in_tag) -> ffi::Error {
    using In = decltype(in_tag);
    return with_fmt(data->element_type(), [&](auto fmt_tag) -> ffi::Error {
      using F = decltype(fmt_tag);
      return pow2_scale ? run<In, F, kPow2>(stream, job, colwise, tiles)
                        : run<In, F, kDiv>(stream, job, colwise, tiles);
    });
  });
}

// 128x128 tiles, codes written transposed (data_t) and, unless `data` is empty, also as laid out.
ffi::Error QuantizeTilesTransposedCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                                       ffi::Result<ffi::AnyBuffer> data_t, ffi::Result<ffi::Buffer<ffi::F32>> scale,
                                       bool pow2_scale) {
  QuantizeView v;
  if (auto e = check_quantize_tiles_t_call(x, *data, *data_t, scale->dimensions(), &v); e.failure()) return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  const bool plain = !(data->dimensions().size() == 1 && data->dimensions()[0] == 0);
  Job job{x.untyped_data(), plain ? data->untyped_data() : nullptr, scale->untyped_data(),
          v.batch, v.rows, v.cols, data_t->untyped_data()};
  return with_in(x.element_type(), [&](auto in_tag) -> ffi::Error {
    using In = decltype(in_tag);
    return with_fmt(data_t->element_type(), [&](auto fmt_tag) -> ffi::Error {
      using F = decltype(fmt_tag);
      return pow2_scale ? run<In, F, kPow2>(stream, job, false, true) : run<In, F, kDiv>(stream, job, false, true);
    });
  });
}

// The FP8 weight gradient's operands: see common/quantize_shapes.h (quantize_groups_t).
ffi::Error QuantizeGroupsTransposedCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> group_sizes,
                                        ffi::Result<ffi::AnyBuffer> data_t, ffi::Result<ffi::Buffer<ffi::F32>> scale,
                                        ffi::Result<ffi::Buffer<ffi::S32>> plan) {
  GroupsTView v;
  if (auto e = check_quantize_groups_t_call(x, group_sizes.dimensions(), *data_t, scale->dimensions(),
                                            plan->dimensions(), &v);
      e.failure())
    return e;
  int32_t* pl = plan->typed_data();
  groups_t_plan_kernel<<<1, 1, 0, stream>>>(group_sizes.typed_data(), v.g, v.m, pl);
  if (v.c == 0) return cuda_error("quantize_groups_t plan kernel");
  const int64_t tiles = (v.p / kTile) * cdiv(v.c, kTile);
  return with_in(x.element_type(), [&](auto in_tag) -> ffi::Error {
    using In = decltype(in_tag);
    return with_fmt(data_t->element_type(), [&](auto fmt_tag) -> ffi::Error {
      using F = decltype(fmt_tag);
      auto go = [&](auto vec_tag) {
        constexpr auto kernel = groups_t_kernel<In, F, decltype(vec_tag)::value>;
        int64_t grid = tiles;
        const int64_t resident = resident_ctas<kernel>();
        if (grid > resident) grid = resident;
        kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
            static_cast<const typename In::S*>(x.untyped_data()), v.c, v.p, pl, v.g,
            static_cast<uint8_t*>(data_t->untyped_data()), scale->untyped_data(), tiles);
      };
      if (vec_ok(v.c, x.untyped_data(), data_t->untyped_data(), scale->untyped_data(), true))
        go(std::true_type{});
      else
        go(std::false_type{});
      return cuda_error("quantize_groups_t kernel");
    });
  });
}

}  // namespace
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeTilesTransposedCuda, jax_moe_ffi::QuantizeTilesTransposedCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [..., R, C]
                                  .Ret<xla::ffi::AnyBuffer>()               // data [..., R, C] fp8, or empty
                                  .Ret<xla::ffi::AnyBuffer>()               // data_t [..., C, R] fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()   // scale [..., R/128, C/128]
                                  .Attr<bool>("pow2_scale"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeMxfp8Cuda, jax_moe_ffi::QuantizeMxfp8Cuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()              // x [..., R, C]
                                  .Ret<xla::ffi::AnyBuffer>()              // data, same shape, fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>()   // scale (E8M0)
                                  .Attr<bool>("colwise"),                  // blocks along R instead of C
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeBlockwiseCuda, jax_moe_ffi::QuantizeBlockwiseCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [..., R, C]
                                  .Ret<xla::ffi::AnyBuffer>()               // data, same shape, fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()   // scale
                                  .Attr<int64_t>("block_rows")              // 1 | 128
                                  .Attr<int64_t>("block_cols")              // 128
                                  .Attr<bool>("pow2_scale")
                                  .Attr<bool>("colwise"),                   // 1x128 blocks along R
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeGroupsTransposedCuda, jax_moe_ffi::QuantizeGroupsTransposedCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                          // x [M, C]
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()    // group_sizes [G]
                                  .Ret<xla::ffi::AnyBuffer>()                          // data_t [C, P] fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()              // scale [P/128, C]
                                  .Ret<xla::ffi::Buffer<xla::ffi::DataType::S32>>(),   // plan [2, G+1]
                              {xla::ffi::Traits::kCmdBufferCompatible});
