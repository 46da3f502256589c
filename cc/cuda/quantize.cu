// CUDA FP8 quantisation (MXFP8 and DeepSeek-V3 blockwise) as typed XLA FFI handlers. Same targets,
// bindings and semantics as cpu/quantize.cc (see there and jax_moe_ffi/ops/quantize.py):
//
//   jax_moe_ffi_quantize_mxfp8     : x[..., C] -> data[..., C] fp8, scale[..., ceil(C/32)] u8 (E8M0)
//   jax_moe_ffi_quantize_blockwise : x[..., R, C] -> data fp8, scale f32 ([..., R, ceil(C/128)] for 1x128,
//                                    [..., ceil(R/128), ceil(C/128)] for 128x128); attrs block_rows,
//                                    block_cols, pow2_scale
//
// Bit-identical to the CPU handlers by construction: the block maximum is the integer maximum of the
// |x| bit patterns, scale exponents come from those bits, every FP8 encoding is fp8::encode_* from
// common/dtypes.h (integer RNE + saturation, the same source the CPU compiles -- cuda_fp8.h is not used),
// and the only float operations (blockwise, non-power-of-two: s = amax / fp8_max and x / s) are
// __fdiv_rn, the IEEE round-to-nearest division the CPU computes with FTZ/DAZ cleared. The library is
// built without --use_fast_math / -ftz=true, which this relies on.
//
// Kernels (no scratch, no host synchronisation, no device->host copies: command-buffer compatible):
//   rowblock: 1 x B blocks along the last axis (B = 32 for MXFP8, 128 for 1x128). Each thread owns 8
//             consecutive elements (one 16-byte load for bf16/f16, two for f32, when the row length is a
//             multiple of 8 and the pointers are aligned; else bounds-checked scalar loads), B/8 lanes form
//             a block and reduce the maximum with __shfl_xor_sync. grid.x covers one row's chunks,
//             grid.y strides over rows (no 64-bit division per element).
//   tile:     128 x 128 tiles over the last two axes, one 256-thread CTA per tile: thread t holds 8 rows
//             (t/16 + 16 i) x 8 columns (t%16 * 8) in registers, a warp-shuffle + shared-memory reduction
//             gives the tile maximum, then each thread encodes and stores its 64 elements.
// A partial last block (or tile) is padded with zeros logically: missing elements are not read and
// count as 0 in the maximum.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/dtypes.h"
#include "common/ffi_helpers.h"

namespace jax_moe_ffi {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;
constexpr uint32_t kF32NaNBits = 0x7fc00000u;
constexpr uint32_t kF32OneBits = 0x3f800000u;
constexpr uint32_t kF32MinNormalBits = 0x00800000u;

ffi::Error cuda_error(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("jax_moe_ffi: ") + what + ": " + cudaGetErrorString(e));
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_float_type(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}
bool is_fp8_type(ffi::DataType t) { return t == ffi::DataType::F8E4M3FN || t == ffi::DataType::F8E5M2; }

// ------------------------------------------------------------------------------- input element types
struct F32In {
  using S = float;
  static __device__ __forceinline__ uint32_t bits(float v) { return __float_as_uint(v); }
  // 8 elements from a 16-byte-aligned address.
  static __device__ __forceinline__ void load8(const float* p, uint32_t* v) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
};
struct BF16In {
  using S = uint16_t;
  static __device__ __forceinline__ uint32_t bits(uint16_t h) { return static_cast<uint32_t>(h) << 16; }
  static __device__ __forceinline__ void load8(const uint16_t* p, uint32_t* v) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = w[i] << 16;
      v[2 * i + 1] = w[i] & 0xffff0000u;
    }
  }
};
struct F16In {
  using S = uint16_t;
  static __device__ __forceinline__ uint32_t bits(uint16_t h) { return fp8::f16_bits_to_f32_bits(h); }
  static __device__ __forceinline__ void load8(const uint16_t* p, uint32_t* v) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = fp8::f16_bits_to_f32_bits(static_cast<uint16_t>(w[i] & 0xffffu));
      v[2 * i + 1] = fp8::f16_bits_to_f32_bits(static_cast<uint16_t>(w[i] >> 16));
    }
  }
};

// Loads elements [c0, c0 + 8) of a row (zeros past `cols`).
template <typename In, bool kVec>
__device__ __forceinline__ void load_chunk(const typename In::S* row, int64_t c0, int64_t cols, uint32_t* v) {
  if (kVec) {  // cols % 8 == 0 and aligned: a chunk is entirely in or out
    if (c0 < cols) {
      In::load8(row + c0, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = c0 + i < cols ? In::bits(row[c0 + i]) : 0u;
  }
}

template <bool kVec>
__device__ __forceinline__ void store_chunk(uint8_t* row, int64_t c0, int64_t cols, const uint8_t* b) {
  if (kVec) {
    if (c0 < cols) {
      uint2 w;
      w.x = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
      w.y = b[4] | (b[5] << 8) | (b[6] << 16) | (static_cast<uint32_t>(b[7]) << 24);
      *reinterpret_cast<uint2*>(row + c0) = w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (c0 + i < cols) row[c0 + i] = b[i];
  }
}

// ----------------------------------------------------------------------------------- block scales
enum Mode { kMx = 0, kDiv = 1, kPow2 = 2 };

// The scale of one block from its max |x| bits, and how to encode its elements. Mirrors
// mx_block / block_scale / block_encode of cpu/quantize.cc.
struct Scale {
  int kind;          // 0: NaN/Inf block, 1: blockwise zero block, 2: exponent shift, 3: division
  int32_t shift;     // kind 2: encode x * 2^shift
  float s;           // kind 3: x / s
  uint32_t out;      // the scale as written: E8M0 byte (kMx) or float32 bits (blockwise)
};

template <typename F, int kMode>
__device__ __forceinline__ Scale block_scale(uint32_t amax) {
  Scale r{0, 0, 1.0f, 0};
  if (amax >= 0x7f800000u) {
    r.kind = 0;
    r.out = kMode == kMx ? 0xffu : kF32NaNBits;
    return r;
  }
  if (kMode == kMx) {
    int32_t se = -127;
    if (amax != 0) {
      se = fp8::f32_floor_log2(amax) - F::kEmax;
      se = se < -127 ? -127 : (se > 127 ? 127 : se);
    }
    r.kind = 2;
    r.shift = -se;
    r.out = static_cast<uint32_t>(se + 127);
    return r;
  }
  if (amax == 0) {
    r.kind = 1;
    r.out = kF32OneBits;
    return r;
  }
  if (kMode == kPow2) {
    const int32_t k = fp8::pow2_scale_exp<F>(amax);
    r.kind = 2;
    r.shift = -k;
    r.out = static_cast<uint32_t>(k + 127) << 23;
    return r;
  }
  constexpr float kMax = F::kEmax == 8 ? 448.0f : 57344.0f;
  uint32_t sb = __float_as_uint(__fdiv_rn(__uint_as_float(amax), kMax));
  if (sb < kF32MinNormalBits) sb = kF32MinNormalBits;
  r.kind = 3;
  r.s = __uint_as_float(sb);
  r.out = sb;
  return r;
}

template <typename F>
__device__ __forceinline__ uint8_t encode(const Scale& sc, uint32_t x) {
  switch (sc.kind) {
    case 0: return fp8::kNaNCode;
    case 1: return static_cast<uint8_t>((x >> 24) & 0x80u);
    case 2: return fp8::encode_f32_bits<F>(x, sc.shift);
    default: return fp8::encode_f32_bits<F>(__float_as_uint(__fdiv_rn(__uint_as_float(x), sc.s)), 0);
  }
}

template <int kMode>
__device__ __forceinline__ void store_scale(void* scale, int64_t i, uint32_t v) {
  if (kMode == kMx)
    static_cast<uint8_t*>(scale)[i] = static_cast<uint8_t>(v);
  else
    static_cast<uint32_t*>(scale)[i] = v;
}

// -------------------------------------------------------------------------------- rowblock kernel
template <typename In, typename F, int kMode, int kBlock, bool kVec>
__global__ void __launch_bounds__(kThreads) rowblock_kernel(const typename In::S* __restrict__ x, int64_t rows,
                                                             int64_t cols, uint8_t* __restrict__ data,
                                                             void* __restrict__ scale) {
  constexpr int kLanes = kBlock / 8;  // threads per block: 4 (MXFP8) or 16 (1x128)
  const int64_t nb = (cols + kBlock - 1) / kBlock;
  const int64_t chunks = nb * kLanes;  // chunks per row, a multiple of kLanes
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t c0 = ch * 8;
  const bool active = ch < chunks;  // whole kLanes groups are active or not (blockDim % kLanes == 0)
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    uint32_t v[8];
    const typename In::S* xr = x + r * cols;
    if (active) {
      load_chunk<In, kVec>(xr, c0, cols, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0;
    }
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t a = v[i] & 0x7fffffffu;
      m = a > m ? a : m;
    }
#pragma unroll
    for (int o = 1; o < kLanes; o <<= 1) {
      const uint32_t n = __shfl_xor_sync(kFull, m, o);
      m = n > m ? n : m;
    }
    if (!active) continue;  // after the shuffles: every lane took part
    const Scale sc = block_scale<F, kMode>(m);
    uint8_t b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) b[i] = encode<F>(sc, v[i]);
    store_chunk<kVec>(data + r * cols, c0, cols, b);
    if (ch % kLanes == 0) store_scale<kMode>(scale, r * nb + ch / kLanes, sc.out);
  }
}

// ------------------------------------------------------------------------------------ tile kernel
constexpr int kTile = 128;

template <typename In, typename F, int kMode, bool kVec>
__global__ void __launch_bounds__(kThreads) tile_kernel(const typename In::S* __restrict__ x, int64_t batch,
                                                         int64_t rows, int64_t cols, uint8_t* __restrict__ data,
                                                         float* __restrict__ scale) {
  __shared__ uint32_t warp_max[kThreads / 32];
  const int64_t nbr = (rows + kTile - 1) / kTile, nbc = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * nbr * nbc;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t c0_in_tile = (t % 16) * 8;
  const int r_in_tile = t / 16;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t tc = tile % nbc, tr = (tile / nbc) % nbr, b = tile / (nbc * nbr);
    const typename In::S* xb = x + b * rows * cols;
    const int64_t c0 = tc * kTile + c0_in_tile;
    uint32_t v[8][8];
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t r = tr * kTile + r_in_tile + 16 * i;
      if (r < rows) {
        load_chunk<In, kVec>(xb + r * cols, c0, cols, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[i][j] = 0;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t a = v[i][j] & 0x7fffffffu;
        m = a > m ? a : m;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint32_t n = __shfl_xor_sync(kFull, m, o);
      m = n > m ? n : m;
    }
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    m = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) m = warp_max[w] > m ? warp_max[w] : m;
    __syncthreads();  // warp_max is reused by the next tile
    const Scale sc = block_scale<F, kMode>(m);
    if (t == 0) reinterpret_cast<uint32_t*>(scale)[tile] = sc.out;  // tile index = (b, tr, tc) row-major
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t r = tr * kTile + r_in_tile + 16 * i;
      if (r >= rows) continue;
      uint8_t q[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) q[j] = encode<F>(sc, v[i][j]);
      store_chunk<kVec>(data + (b * rows + r) * cols, c0, cols, q);
    }
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

// 16-byte input loads and 8-byte stores: every row start and chunk is then aligned too.
bool vec_ok(int64_t cols, const void* x, const void* data) {
  return cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(data) % 8 == 0;
}

// Launches the rowblock kernel for a known input type, format and mode.
template <typename In, typename F, int kMode, int kBlock>
ffi::Error run_rowblock(cudaStream_t stream, const void* x, int64_t rows, int64_t cols, void* data, void* scale) {
  const int64_t chunks = cdiv(cols, kBlock) * (kBlock / 8);
  const int threads = static_cast<int>(chunks >= kThreads ? kThreads : cdiv(chunks, 32) * 32);
  const dim3 grid(static_cast<unsigned>(cdiv(chunks, threads)),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  const auto* xs = static_cast<const typename In::S*>(x);
  auto* d = static_cast<uint8_t*>(data);
  if (vec_ok(cols, x, data))
    rowblock_kernel<In, F, kMode, kBlock, true><<<grid, threads, 0, stream>>>(xs, rows, cols, d, scale);
  else
    rowblock_kernel<In, F, kMode, kBlock, false><<<grid, threads, 0, stream>>>(xs, rows, cols, d, scale);
  return cuda_error("quantize rowblock kernel");
}

template <typename In, typename F, int kMode>
ffi::Error run_tiles(cudaStream_t stream, const void* x, int64_t batch, int64_t rows, int64_t cols, void* data,
                     float* scale) {
  const int64_t tiles = batch * cdiv(rows, kTile) * cdiv(cols, kTile);
  const unsigned grid = static_cast<unsigned>(tiles < (int64_t{1} << 30) ? tiles : (int64_t{1} << 30));
  const auto* xs = static_cast<const typename In::S*>(x);
  auto* d = static_cast<uint8_t*>(data);
  if (vec_ok(cols, x, data))
    tile_kernel<In, F, kMode, true><<<grid, kThreads, 0, stream>>>(xs, batch, rows, cols, d, scale);
  else
    tile_kernel<In, F, kMode, false><<<grid, kThreads, 0, stream>>>(xs, batch, rows, cols, d, scale);
  return cuda_error("quantize tile kernel");
}

// ------------------------------------------------------------------------------------- handlers
ffi::Error QuantizeMxfp8Cuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                             ffi::Result<ffi::Buffer<ffi::U8>> scale) {
  auto xd = x.dimensions();
  if (xd.size() < 1) return invalid("quantize_mxfp8: x must have rank >= 1");
  if (!is_float_type(x.element_type())) return invalid("quantize_mxfp8: x must be float32/bfloat16/float16");
  if (!is_fp8_type(data->element_type()))
    return invalid("quantize_mxfp8: data must be float8_e4m3fn or float8_e5m2");
  auto dd = data->dimensions();
  auto sd = scale->dimensions();
  const int64_t cols = xd[xd.size() - 1];
  bool ok = dd.size() == xd.size() && sd.size() == xd.size();
  for (size_t i = 0; ok && i < xd.size(); ++i)
    ok = dd[i] == xd[i] && sd[i] == (i + 1 == xd.size() ? cdiv(cols, 32) : xd[i]);
  if (!ok)
    return invalid("quantize_mxfp8: x " + dims_str(xd) + " needs data of the same shape and scale with the last "
                   "dimension ceil(C/32), got data " + dims_str(dd) + " and scale " + dims_str(sd));
  const int64_t total = static_cast<int64_t>(x.element_count());
  if (total == 0) return ffi::Error::Success();
  const int64_t rows = total / cols;
  return with_in(x.element_type(), [&](auto in_tag) -> ffi::Error {
    using In = decltype(in_tag);
    return with_fmt(data->element_type(), [&](auto fmt_tag) -> ffi::Error {
      using F = decltype(fmt_tag);
      return run_rowblock<In, F, kMx, 32>(stream, x.untyped_data(), rows, cols, data->untyped_data(),
                                          scale->typed_data());
    });
  });
}

ffi::Error QuantizeBlockwiseCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                                 ffi::Result<ffi::Buffer<ffi::F32>> scale, int64_t block_rows, int64_t block_cols,
                                 bool pow2_scale) {
  auto xd = x.dimensions();
  if (!is_float_type(x.element_type())) return invalid("quantize_blockwise: x must be float32/bfloat16/float16");
  if (!is_fp8_type(data->element_type()))
    return invalid("quantize_blockwise: data must be float8_e4m3fn or float8_e5m2");
  if (block_cols != 128 || (block_rows != 1 && block_rows != 128))
    return invalid("quantize_blockwise: blocks must be 1x128 or 128x128, got " + std::to_string(block_rows) + "x" +
                   std::to_string(block_cols));
  const bool tiles = block_rows > 1;
  const size_t rank = xd.size();
  if (rank < (tiles ? 2u : 1u))
    return invalid("quantize_blockwise: x must have rank >= " + std::string(tiles ? "2" : "1") + ", got " +
                   dims_str(xd));
  auto dd = data->dimensions();
  auto sd = scale->dimensions();
  const int64_t cols = xd[rank - 1];
  bool ok = dd.size() == rank && sd.size() == rank;
  for (size_t i = 0; ok && i < rank; ++i) {
    int64_t want = xd[i];
    if (i + 1 == rank) want = cdiv(cols, block_cols);
    if (tiles && i + 2 == rank) want = cdiv(xd[i], block_rows);
    ok = dd[i] == xd[i] && sd[i] == want;
  }
  if (!ok)
    return invalid("quantize_blockwise: x " + dims_str(xd) + " with " + std::to_string(block_rows) + "x" +
                   std::to_string(block_cols) + " blocks needs data of the same shape and a matching scale, got "
                   "data " + dims_str(dd) + " and scale " + dims_str(sd));
  const int64_t total = static_cast<int64_t>(x.element_count());
  if (total == 0) return ffi::Error::Success();
  return with_in(x.element_type(), [&](auto in_tag) -> ffi::Error {
    using In = decltype(in_tag);
    return with_fmt(data->element_type(), [&](auto fmt_tag) -> ffi::Error {
      using F = decltype(fmt_tag);
      void* d = data->untyped_data();
      float* s = scale->typed_data();
      if (tiles) {
        const int64_t rows = xd[rank - 2];
        const int64_t batch = total / (rows * cols);
        return pow2_scale ? run_tiles<In, F, kPow2>(stream, x.untyped_data(), batch, rows, cols, d, s)
                          : run_tiles<In, F, kDiv>(stream, x.untyped_data(), batch, rows, cols, d, s);
      }
      const int64_t rows = total / cols;
      return pow2_scale ? run_rowblock<In, F, kPow2, 128>(stream, x.untyped_data(), rows, cols, d, s)
                        : run_rowblock<In, F, kDiv, 128>(stream, x.untyped_data(), rows, cols, d, s);
    });
  });
}

}  // namespace
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeMxfp8Cuda, jax_moe_ffi::QuantizeMxfp8Cuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()              // x [..., C]
                                  .Ret<xla::ffi::AnyBuffer>()              // data [..., C] fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>(),  // scale [..., ceil(C/32)] E8M0
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeBlockwiseCuda, jax_moe_ffi::QuantizeBlockwiseCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [..., R, C]
                                  .Ret<xla::ffi::AnyBuffer>()               // data, same shape, fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()   // scale
                                  .Attr<int64_t>("block_rows")              // 1 | 128
                                  .Attr<int64_t>("block_cols")              // 128
                                  .Attr<bool>("pow2_scale"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
