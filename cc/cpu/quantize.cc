// CPU FP8 quantisation (MXFP8 and DeepSeek-V3 blockwise) as typed XLA FFI handlers: the reference
// implementation of the op family and what CI runs. Semantics: jax_moe_ffi/ops/quantize.py.
//
//   jax_moe_ffi_quantize_mxfp8     : x[..., R, C] f32|bf16|f16 -> data (same shape) f8e4m3fn|f8e5m2,
//                                    scale u8 (E8M0: biased exponent, 127 = 2^0, 255 = NaN):
//                                    colwise = false: blocks of 32 along C, scale[..., R, ceil(C/32)]
//                                    colwise = true : blocks of 32 along R, scale[..., ceil(R/32), C]
//                                    attr colwise (bool)
//   jax_moe_ffi_quantize_blockwise : x[..., R, C] -> data (same shape, fp8), scale f32:
//                                    block_rows = 1   : scale[..., R, ceil(C/block_cols)], or with colwise
//                                                       blocks along R: scale[..., ceil(R/block_cols), C]
//                                    block_rows = 128 : scale[..., ceil(R/128), ceil(C/128)]
//                                    attrs block_rows (1|128), block_cols (128), pow2_scale (bool), colwise
//                                    (bool, 1 x 128 blocks only)
//   jax_moe_ffi_quantize_tiles_t   : x[..., R, C] in 128x128 tiles -> data (x's shape, or empty), data_t
//                                    [..., C, R] = the codes transposed, scale[..., ceil(R/128), ceil(C/128)];
//                                    attr pow2_scale
//
// The kernels quantise along the LAST axis, along axis -2 (colwise: the "columnwise" quantisation of a
// GEMM rhs, without a transpose) or, for 128x128 tiles, over the last two; the Python wrapper moves any
// other axis last. The FP8 element type comes from the `data` buffer's dtype.
//
// Bit-exactness with cuda/quantize.cu: block maxima are integer maxima of |x| bit patterns, scale
// exponents are read from those bits, and every FP8 encoding goes through fp8::encode_* in
// common/dtypes.h (integer RNE + saturation; the GPU uses the hardware conversion, which gives the same
// bits for every finite float32). The one float operation, the blockwise quotient x / s
// of the non-power-of-two recipe, is an IEEE float32 division in both (CUDA: __fdiv_rn); here it runs
// with FTZ/DAZ cleared for the duration of the call (XLA:CPU executes with both set) so subnormal
// inputs divide exactly as on the GPU.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "common/dtypes.h"
#include "common/ffi_helpers.h"
#include "common/quantize_shapes.h"

namespace jax_moe_ffi {
namespace {

constexpr int64_t kMxBlock = 32;
constexpr uint8_t kE8M0NaN = 0xff;
constexpr uint32_t kF32NaNBits = 0x7fc00000u;
constexpr uint32_t kF32OneBits = 0x3f800000u;
constexpr uint32_t kF32MinNormalBits = 0x00800000u;  // 2^-126: the smallest blockwise scale

// IEEE denormal handling for the scope of a handler (restores the caller's mode on exit).
class ScopedIeeeDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  ScopedIeeeDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~0x8040u); }  // FTZ (15), DAZ (6)
  ~ScopedIeeeDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#elif defined(__aarch64__)
  ScopedIeeeDenormals() {
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    uint64_t v = saved_ & ~(uint64_t{1} << 24);  // FZ
    asm volatile("msr fpcr, %0" : : "r"(v));
  }
  ~ScopedIeeeDenormals() { asm volatile("msr fpcr, %0" : : "r"(saved_)); }

 private:
  uint64_t saved_;
#else
  ScopedIeeeDenormals() {}
#endif
};


int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Converts n elements starting at element `offset` of a float-like buffer to float32 bit patterns.
void load_bits(ffi::DataType type, const void* data, int64_t offset, int64_t n, uint32_t* dst) {
  switch (type) {
    case ffi::DataType::F32:
      std::memcpy(dst, static_cast<const uint32_t*>(data) + offset, n * sizeof(uint32_t));
      break;
    case ffi::DataType::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint32_t>(src[i]) << 16;
      break;
    }
    default: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = fp8::f16_bits_to_f32_bits(src[i]);
    }
  }
}

// max |x| as a bit pattern: NaN (> 0x7f800000) dominates, then Inf (== 0x7f800000), then magnitude.
uint32_t amax_bits(const uint32_t* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = x[i] & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

// ------------------------------------------------------------------------------------------ MXFP8
// The E8M0 scale of a block from its max |x| bits, and how its elements are encoded.
struct MxScale {
  uint8_t byte;   // E8M0 scale as written
  bool nan;       // NaN or Inf in the block: NaN scale and NaN elements
  int32_t shift;  // otherwise elements are encode_f32_bits(x, shift)
};

template <typename F>
MxScale mx_scale(uint32_t amax) {
  if (amax >= 0x7f800000u) return MxScale{kE8M0NaN, true, 0};
  int32_t se = -127;  // all-zero block: the smallest scale, 2^-127
  if (amax != 0) {
    se = fp8::f32_floor_log2(amax) - F::kEmax;
    se = se < -127 ? -127 : (se > 127 ? 127 : se);
  }
  return MxScale{static_cast<uint8_t>(se + 127), false, -se};
}

template <typename F>
inline uint8_t mx_encode(const MxScale& s, uint32_t x) {
  return s.nan ? fp8::kNaNCode : fp8::encode_f32_bits<F>(x, s.shift);
}

// One block of n <= 32 elements (a partial last block is padded with zeros, which never change amax).
template <typename F>
void mx_block(const uint32_t* x, int64_t n, uint8_t* out, uint8_t* scale) {
  const MxScale s = mx_scale<F>(amax_bits(x, n));
  *scale = s.byte;
  for (int64_t i = 0; i < n; ++i) out[i] = mx_encode<F>(s, x[i]);
}

template <typename F>
void mx_all(ffi::DataType type, const void* x, int64_t rows, int64_t cols, uint8_t* data, uint8_t* scale) {
  const int64_t nb = cdiv(cols, kMxBlock);
  std::vector<uint32_t> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    load_bits(type, x, r * cols, cols, row.data());
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * kMxBlock;
      const int64_t n = cols - c0 < kMxBlock ? cols - c0 : kMxBlock;
      mx_block<F>(row.data() + c0, n, data + r * cols + c0, scale + r * nb + b);
    }
  }
}

// Blocks of `br` rows along axis -2 of [batch, rows, cols] (colwise): each column of a band of br
// rows is one block. scale_of(amax) gives a block's scale, store(i, scale) writes scale i and
// encode(scale, x) encodes an element.
template <typename Scale, typename ScaleFn, typename StoreFn, typename EncodeFn>
void colwise_bands(ffi::DataType type, const void* x, int64_t batch, int64_t rows, int64_t cols, int64_t br,
                   uint8_t* data, ScaleFn scale_of, StoreFn store, EncodeFn encode) {
  const int64_t nbr = cdiv(rows, br);
  std::vector<uint32_t> band(br * cols), amax(cols);
  std::vector<Scale> sc(cols);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t tr = 0; tr < nbr; ++tr) {
      const int64_t r0 = tr * br;
      const int64_t nr = rows - r0 < br ? rows - r0 : br;
      const int64_t base = (b * rows + r0) * cols;  // first element of the band
      load_bits(type, x, base, nr * cols, band.data());
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t i = 0; i < nr; ++i) {
        const uint32_t* row = band.data() + i * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const uint32_t a = row[c] & 0x7fffffffu;
          amax[c] = a > amax[c] ? a : amax[c];
        }
      }
      for (int64_t c = 0; c < cols; ++c) {
        sc[c] = scale_of(amax[c]);
        store((b * nbr + tr) * cols + c, sc[c]);
      }
      for (int64_t i = 0; i < nr; ++i) {
        const uint32_t* row = band.data() + i * cols;
        uint8_t* out = data + base + i * cols;
        for (int64_t c = 0; c < cols; ++c) out[c] = encode(sc[c], row[c]);
      }
    }
  }
}

template <typename F>
void mx_cols(ffi::DataType type, const void* x, int64_t batch, int64_t rows, int64_t cols, uint8_t* data,
             uint8_t* scale) {
  colwise_bands<MxScale>(
      type, x, batch, rows, cols, kMxBlock, data, [](uint32_t amax) { return mx_scale<F>(amax); },
      [scale](int64_t i, const MxScale& s) { scale[i] = s.byte; },
      [](const MxScale& s, uint32_t v) { return mx_encode<F>(s, v); });
}

// The [batch, rows, cols] view of x (rows = 1 for rank 1).
ffi::Error QuantizeMxfp8Cpu(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                            ffi::Result<ffi::Buffer<ffi::U8>> scale, bool colwise) {
  QuantizeView v;
  if (auto e = check_quantize_call("quantize_mxfp8", x, data->element_type(), data->dimensions(),
                                   scale->dimensions(), 1, kMxBlock, colwise, &v);
      e.failure())
    return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  const int64_t batch = v.batch, rows = v.rows, cols = v.cols;
  auto* out = static_cast<uint8_t*>(data->untyped_data());
  const bool e4m3 = data->element_type() == ffi::DataType::F8E4M3FN;
  if (colwise) {
    if (e4m3)
      mx_cols<fp8::E4M3>(x.element_type(), x.untyped_data(), batch, rows, cols, out, scale->typed_data());
    else
      mx_cols<fp8::E5M2>(x.element_type(), x.untyped_data(), batch, rows, cols, out, scale->typed_data());
  } else if (e4m3) {
    mx_all<fp8::E4M3>(x.element_type(), x.untyped_data(), batch * rows, cols, out, scale->typed_data());
  } else {
    mx_all<fp8::E5M2>(x.element_type(), x.untyped_data(), batch * rows, cols, out, scale->typed_data());
  }
  return ffi::Error::Success();
}

// -------------------------------------------------------------------------------------- blockwise
// Scale of one block and the per-element encoder. amax: max |x| bits over the block.
struct BlockScale {
  enum Kind { kNaN, kZero, kPow2, kDiv } kind;
  uint32_t scale_bits;  // float32 scale written out
  int32_t k;            // kPow2: scale = 2^k
  float s;              // kDiv: scale as float
};

template <typename F>
BlockScale block_scale(uint32_t amax, bool pow2) {
  if (amax >= 0x7f800000u) return BlockScale{BlockScale::kNaN, kF32NaNBits, 0, 0.0f};
  if (amax == 0) return BlockScale{BlockScale::kZero, kF32OneBits, 0, 1.0f};
  if (pow2) {
    const int32_t k = fp8::pow2_scale_exp<F>(amax);
    return BlockScale{BlockScale::kPow2, static_cast<uint32_t>(k + 127) << 23, k, 0.0f};
  }
  constexpr float kMax = F::kEmax == 8 ? 448.0f : 57344.0f;
  float s = bits_to_float(amax) / kMax;  // IEEE RNE (denormals honoured: ScopedIeeeDenormals)
  uint32_t sb = float_to_bits(s);
  if (sb < kF32MinNormalBits) sb = kF32MinNormalBits;  // never a subnormal (or zero) scale
  return BlockScale{BlockScale::kDiv, sb, 0, bits_to_float(sb)};
}

template <typename F>
inline uint8_t block_encode(const BlockScale& bs, uint32_t x) {
  switch (bs.kind) {
    case BlockScale::kNaN: return fp8::kNaNCode;
    case BlockScale::kZero: return static_cast<uint8_t>((x >> 24) & 0x80u);  // +-0
    case BlockScale::kPow2: return fp8::encode_f32_bits<F>(x, -bs.k);
    default: return fp8::encode_f32_bits<F>(float_to_bits(bits_to_float(x) / bs.s), 0);
  }
}

// 1 x block_cols blocks along the last axis.
template <typename F>
void blockwise_rows(ffi::DataType type, const void* x, int64_t rows, int64_t cols, int64_t bc, bool pow2,
                    uint8_t* data, float* scale) {
  const int64_t nb = cdiv(cols, bc);
  std::vector<uint32_t> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    load_bits(type, x, r * cols, cols, row.data());
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * bc;
      const int64_t n = cols - c0 < bc ? cols - c0 : bc;
      const BlockScale bs = block_scale<F>(amax_bits(row.data() + c0, n), pow2);
      std::memcpy(scale + r * nb + b, &bs.scale_bits, 4);
      uint8_t* out = data + r * cols + c0;
      for (int64_t i = 0; i < n; ++i) out[i] = block_encode<F>(bs, row[c0 + i]);
    }
  }
}

// block_rows x block_cols tiles over the last two axes, leading axes are a batch.
template <typename F>
void blockwise_tiles(ffi::DataType type, const void* x, int64_t batch, int64_t rows, int64_t cols, int64_t br,
                     int64_t bc, bool pow2, uint8_t* data, float* scale) {
  const int64_t nbr = cdiv(rows, br), nbc = cdiv(cols, bc);
  std::vector<uint32_t> band(br * cols);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t tr = 0; tr < nbr; ++tr) {
      const int64_t r0 = tr * br;
      const int64_t nr = rows - r0 < br ? rows - r0 : br;
      const int64_t base = (b * rows + r0) * cols;  // first element of the band
      load_bits(type, x, base, nr * cols, band.data());
      for (int64_t tc = 0; tc < nbc; ++tc) {
        const int64_t c0 = tc * bc;
        const int64_t n = cols - c0 < bc ? cols - c0 : bc;
        uint32_t amax = 0;
        for (int64_t i = 0; i < nr; ++i) {
          const uint32_t m = amax_bits(band.data() + i * cols + c0, n);
          amax = m > amax ? m : amax;
        }
        const BlockScale bs = block_scale<F>(amax, pow2);
        std::memcpy(scale + (b * nbr + tr) * nbc + tc, &bs.scale_bits, 4);
        for (int64_t i = 0; i < nr; ++i) {
          uint8_t* out = data + base + i * cols + c0;
          const uint32_t* in = band.data() + i * cols + c0;
          for (int64_t j = 0; j < n; ++j) out[j] = block_encode<F>(bs, in[j]);
        }
      }
    }
  }
}

// 1 x bc blocks along axis -2 (colwise).
template <typename F>
void blockwise_cols(ffi::DataType type, const void* x, int64_t batch, int64_t rows, int64_t cols, int64_t bc,
                    bool pow2, uint8_t* data, float* scale) {
  colwise_bands<BlockScale>(
      type, x, batch, rows, cols, bc, data, [pow2](uint32_t amax) { return block_scale<F>(amax, pow2); },
      [scale](int64_t i, const BlockScale& s) { std::memcpy(scale + i, &s.scale_bits, 4); },
      [](const BlockScale& s, uint32_t v) { return block_encode<F>(s, v); });
}

ffi::Error QuantizeBlockwiseCpu(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                                ffi::Result<ffi::Buffer<ffi::F32>> scale, int64_t block_rows,
                                int64_t block_cols, bool pow2_scale, bool colwise) {
  if (block_cols != 128 || (block_rows != 1 && block_rows != 128))
    return invalid("quantize_blockwise: blocks must be 1x128 or 128x128, got " + std::to_string(block_rows) +
                   "x" + std::to_string(block_cols));
  const bool tiles = block_rows > 1;
  QuantizeView v;
  if (auto e = check_quantize_call("quantize_blockwise", x, data->element_type(), data->dimensions(),
                                   scale->dimensions(), block_rows, block_cols, colwise, &v);
      e.failure())
    return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  ScopedIeeeDenormals ieee;
  const int64_t batch = v.batch, rows = v.rows, cols = v.cols;
  auto* out = static_cast<uint8_t*>(data->untyped_data());
  float* sc = scale->typed_data();
  const ffi::DataType t = x.element_type();
  const void* xp = x.untyped_data();
  const bool e4m3 = data->element_type() == ffi::DataType::F8E4M3FN;
  if (tiles) {
    if (e4m3)
      blockwise_tiles<fp8::E4M3>(t, xp, batch, rows, cols, block_rows, block_cols, pow2_scale, out, sc);
    else
      blockwise_tiles<fp8::E5M2>(t, xp, batch, rows, cols, block_rows, block_cols, pow2_scale, out, sc);
  } else if (colwise) {
    if (e4m3)
      blockwise_cols<fp8::E4M3>(t, xp, batch, rows, cols, block_cols, pow2_scale, out, sc);
    else
      blockwise_cols<fp8::E5M2>(t, xp, batch, rows, cols, block_cols, pow2_scale, out, sc);
  } else if (e4m3) {
    blockwise_rows<fp8::E4M3>(t, xp, batch * rows, cols, block_cols, pow2_scale, out, sc);
  } else {
    blockwise_rows<fp8::E5M2>(t, xp, batch * rows, cols, block_cols, pow2_scale, out, sc);
  }
  return ffi::Error::Success();
}

// 128x128 tiles (as jax_moe_ffi_quantize_blockwise), the codes also written transposed: data_t[b, c, r].
ffi::Error QuantizeTilesTransposedCpu(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                                      ffi::Result<ffi::AnyBuffer> data_t, ffi::Result<ffi::Buffer<ffi::F32>> scale,
                                      bool pow2_scale) {
  QuantizeView v;
  if (auto e = check_quantize_tiles_t_call(x, *data, *data_t, scale->dimensions(), &v); e.failure()) return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  ScopedIeeeDenormals ieee;
  const int64_t batch = v.batch, rows = v.rows, cols = v.cols;
  std::vector<uint8_t> tmp;
  uint8_t* out = static_cast<uint8_t*>(data->untyped_data());
  if (data->dimensions().size() == 1 && data->dimensions()[0] == 0) {  // shape (0,): only data_t wanted
    tmp.resize(static_cast<size_t>(batch * rows * cols));
    out = tmp.data();
  }
  if (data_t->element_type() == ffi::DataType::F8E4M3FN)
    blockwise_tiles<fp8::E4M3>(x.element_type(), x.untyped_data(), batch, rows, cols, 128, 128, pow2_scale, out,
                               scale->typed_data());
  else
    blockwise_tiles<fp8::E5M2>(x.element_type(), x.untyped_data(), batch, rows, cols, 128, 128, pow2_scale, out,
                               scale->typed_data());
  auto* t = static_cast<uint8_t*>(data_t->untyped_data());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[(b * cols + c) * rows + r] = out[(b * rows + r) * cols + c];
  return ffi::Error::Success();
}

// The FP8 weight gradient's operands (common/quantize_shapes.h, quantize_groups_t): each group's rows in
// 128-row blocks along the rows, written transposed into data_t [C, P] at the group's block offset.
template <typename F>
void groups_t_blocks(ffi::DataType type, const void* x, int64_t c, int64_t p, const int32_t* row_off,
                     const int32_t* block_off, int64_t g, uint8_t* data_t, float* scale) {
  std::vector<uint32_t> band(128 * c), amax(c);
  std::vector<BlockScale> sc(c);
  for (int64_t i = 0; i < g; ++i) {
    for (int64_t b = block_off[i]; b < block_off[i + 1]; ++b) {
      const int64_t r0 = row_off[i] + (b - block_off[i]) * 128;
      const int64_t nr = std::min<int64_t>(128, row_off[i + 1] - r0);
      load_bits(type, x, r0 * c, nr * c, band.data());
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t j = 0; j < c; ++j) amax[j] = std::max(amax[j], band[r * c + j] & 0x7fffffffu);
      for (int64_t j = 0; j < c; ++j) {
        sc[j] = block_scale<F>(amax[j], false);
        std::memcpy(scale + b * c + j, &sc[j].scale_bits, 4);
      }
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t j = 0; j < c; ++j) data_t[j * p + b * 128 + r] = block_encode<F>(sc[j], band[r * c + j]);
    }
  }
}

ffi::Error QuantizeGroupsTransposedCpu(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> group_sizes,
                                       ffi::Result<ffi::AnyBuffer> data_t, ffi::Result<ffi::Buffer<ffi::F32>> scale,
                                       ffi::Result<ffi::Buffer<ffi::S32>> plan) {
  GroupsTView v;
  if (auto e = check_quantize_groups_t_call(x, group_sizes.dimensions(), *data_t, scale->dimensions(),
                                            plan->dimensions(), &v);
      e.failure())
    return e;
  int32_t* row_off = plan->typed_data();
  int32_t* block_off = row_off + v.g + 1;
  groups_t_plan(group_sizes.typed_data(), v.g, v.m, row_off, block_off);
  // Padding and unused blocks: +0 codes, scale 1 (an all-zero block); the groups' blocks overwrite them.
  auto* out = static_cast<uint8_t*>(data_t->untyped_data());
  std::fill(out, out + v.c * v.p, uint8_t{0});
  std::fill(scale->typed_data(), scale->typed_data() + v.c * (v.p / 128), 1.0f);
  if (v.c == 0) return ffi::Error::Success();
  ScopedIeeeDenormals ieee;
  if (data_t->element_type() == ffi::DataType::F8E4M3FN)
    groups_t_blocks<fp8::E4M3>(x.element_type(), x.untyped_data(), v.c, v.p, row_off, block_off, v.g, out,
                               scale->typed_data());
  else
    groups_t_blocks<fp8::E5M2>(x.element_type(), x.untyped_data(), v.c, v.p, row_off, block_off, v.g, out,
                               scale->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_moe_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeTilesTransposedCpu, jax_moe_ffi::QuantizeTilesTransposedCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [..., R, C]
                                  .Ret<xla::ffi::AnyBuffer>()               // data [..., R, C] fp8, or empty
                                  .Ret<xla::ffi::AnyBuffer>()               // data_t [..., C, R] fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()   // scale [..., R/128, C/128]
                                  .Attr<bool>("pow2_scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeMxfp8Cpu, jax_moe_ffi::QuantizeMxfp8Cpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [..., R, C]
                                  .Ret<xla::ffi::AnyBuffer>()               // data, same shape, fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>()    // scale (E8M0)
                                  .Attr<bool>("colwise"));                  // blocks along R instead of C

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeBlockwiseCpu, jax_moe_ffi::QuantizeBlockwiseCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()               // x [..., R, C]
                                  .Ret<xla::ffi::AnyBuffer>()               // data, same shape, fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()   // scale
                                  .Attr<int64_t>("block_rows")              // 1 | 128
                                  .Attr<int64_t>("block_cols")              // 128
                                  .Attr<bool>("pow2_scale")
                                  .Attr<bool>("colwise"));                  // 1x128 blocks along R

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMoeFfiQuantizeGroupsTransposedCpu, jax_moe_ffi::QuantizeGroupsTransposedCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()                        // x [M, C]
                                  .Arg<xla::ffi::Buffer<xla::ffi::DataType::S32>>()  // group_sizes [G]
                                  .Ret<xla::ffi::AnyBuffer>()                        // data_t [C, P] fp8
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()            // scale [P/128, C]
                                  .Ret<xla::ffi::Buffer<xla::ffi::DataType::S32>>());  // plan [2, G+1]
