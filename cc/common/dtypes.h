// Scalar conversions between float and the 16-bit float formats, by bit manipulation so the CPU
// kernels need no compiler extension. Round-to-nearest-even, NaN kept NaN, overflow to Inf.
#pragma once

#include <cstdint>
#include <cstring>

namespace jax_moe_ffi {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    // zero or subnormal: value = man * 2^-24
    float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_f16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;                 // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;                // rounds to >= 65520: Inf
  if (a < 0x38800000u) {                                      // below the smallest normal 2^-14
    // subnormal: scale to units of 2^-24 and round to nearest even with the FPU's default mode
    float v = bits_to_float(a) * 16777216.0f;                 // exact (power-of-two scale)
    float r = v + 12582912.0f - 12582912.0f;                  // RNE to integer (1.5 * 2^23 trick)
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);           // RNE at bit 13
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

}  // namespace jax_moe_ffi

// ------------------------------------------------------------------------------------------ FP8
// Float -> FP8 (E4M3FN / E5M2) encoding by integer arithmetic only, shared verbatim by the CPU and
// CUDA quantize kernels (cpu/quantize.cc, cuda/quantize.cu) so both produce the same bits. No float
// operation is involved, so the result does not depend on flush-to-zero / denormals-are-zero modes
// (XLA:CPU runs with FTZ/DAZ set) or on compiler flags. Rounding: to nearest, ties to even.
// Overflow saturates to the largest finite value (OFP8 "satfinite"); NaN -> 0x7F | sign.
#if defined(__CUDACC__)
#define JMF_FP8_HD __host__ __device__ __forceinline__
#else
#define JMF_FP8_HD inline
#endif

namespace jax_moe_ffi {
namespace fp8 {

// Format constants. emax: unbiased exponent of the largest finite value (the OCP MX "emax_elem").
struct E4M3 {  // float8_e4m3fn: bias 7, no Inf, NaN = S.1111.111, max 448 = 1.75 * 2^8, subnormals m * 2^-9
  static constexpr int kMan = 3, kBias = 7, kEmax = 8;
  static constexpr uint32_t kMaxCode = 0x7E;
};
struct E5M2 {  // float8_e5m2: bias 15, Inf = S.11111.00, max 57344 = 1.75 * 2^15, subnormals m * 2^-16
  static constexpr int kMan = 2, kBias = 15, kEmax = 15;
  static constexpr uint32_t kMaxCode = 0x7B;
};
constexpr uint8_t kNaNCode = 0x7F;  // a NaN in both formats

JMF_FP8_HD int clz32(uint32_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(v));
#else
  return __builtin_clz(v);
#endif
}

// A finite nonzero float32 as sig * 2^(exp - 23) with sig in [2^23, 2^24) (subnormals normalised).
struct Parts {
  uint32_t sig;  // 0 for +-0
  int32_t exp;   // unbiased exponent of the leading bit
};
JMF_FP8_HD Parts f32_parts(uint32_t bits) {
  const uint32_t e = (bits >> 23) & 0xffu, m = bits & 0x7fffffu;
  if (e != 0) return Parts{m | 0x800000u, static_cast<int32_t>(e) - 127};
  if (m == 0) return Parts{0u, 0};
  const int p = 31 - clz32(m);  // position of the leading one, 0..22
  return Parts{m << (23 - p), -126 - (23 - p)};
}

// floor(log2(|v|)) of a finite nonzero float32 given its bits (exact, subnormals included).
JMF_FP8_HD int32_t f32_floor_log2(uint32_t abs_bits) { return f32_parts(abs_bits).exp; }

// Encodes sign * sig * 2^(exp - 23) (sig in [2^23, 2^24), or 0) as FP8 format F: RNE, saturating.
template <typename F>
JMF_FP8_HD uint8_t encode_parts(uint32_t sign, uint32_t sig, int32_t exp) {
  if (sig == 0) return static_cast<uint8_t>(sign);
  if (exp > F::kEmax) return static_cast<uint8_t>(sign | F::kMaxCode);
  int shift;
  uint32_t base;
  if (exp >= 1 - F::kBias) {  // normal in F: keep kMan fraction bits (+ the implicit one in q)
    shift = 23 - F::kMan;
    base = static_cast<uint32_t>(exp + F::kBias - 1) << F::kMan;
  } else {  // subnormal in F: units of 2^(1 - bias - kMan)
    shift = 23 - F::kMan + (1 - F::kBias - exp);
    base = 0;
    if (shift > 24) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
  }
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // carries into the exponent field correctly
  uint32_t code = base + q;
  if (code > F::kMaxCode) code = F::kMaxCode;
  return static_cast<uint8_t>(sign | code);
}

// FP8 code of float32(bits) * 2^scale_exp, computed exactly from the bits (one rounding).
// NaN -> NaN code; +-Inf -> +-max (the block kernels handle NaN/Inf blocks before calling this).
template <typename F>
JMF_FP8_HD uint8_t encode_f32_bits(uint32_t bits, int32_t scale_exp) {
  const uint32_t sign = (bits >> 24) & 0x80u, a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | kNaNCode);
  if (a == 0x7f800000u) return static_cast<uint8_t>(sign | F::kMaxCode);
  // Fast path (the common case): a normal input whose scaled exponent is normal in F. The same
  // rounding as encode_parts, on the fraction bits directly (a carry moves into the exponent).
  const int32_t eo = static_cast<int32_t>(a >> 23) - 127 + scale_exp;
  if ((a >> 23) != 0 && eo >= 1 - F::kBias && eo <= F::kEmax) {
    const uint32_t m = a & 0x7fffffu;
    const uint32_t r = m + ((1u << (22 - F::kMan)) - 1u) + ((m >> (23 - F::kMan)) & 1u);
    uint32_t code = (static_cast<uint32_t>(eo + F::kBias) << F::kMan) + (r >> (23 - F::kMan));
    if (code > F::kMaxCode) code = F::kMaxCode;
    return static_cast<uint8_t>(sign | code);
  }
  const Parts p = f32_parts(a);
  return encode_parts<F>(sign, p.sig, p.exp + scale_exp);
}

// Integer float16 -> float32 bits (exact, no float operation; NaN payloads kept).
JMF_FP8_HD uint32_t f16_bits_to_f32_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return sign | 0x7f800000u | (m << 13);
  if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0) return sign;
  const int p = 31 - clz32(m);  // 0..9: value = 1.f * 2^(p - 24)
  return sign | (static_cast<uint32_t>(p - 24 + 127) << 23) | ((m << (23 - p)) & 0x7fffffu);
}

// Blockwise power-of-two scale exponent: the smallest k with amax <= fp8_max * 2^k, i.e.
// ceil(log2(amax / fp8_max)) computed exactly (fp8_max = 1.75 * 2^emax in both formats), clamped to
// [-126, 127] so the float32 scale 2^k is a normal number. amax_bits: finite, nonzero.
template <typename F>
JMF_FP8_HD int32_t pow2_scale_exp(uint32_t amax_bits) {
  const Parts p = f32_parts(amax_bits);
  int32_t k = p.exp - F::kEmax + (p.sig > 0xe00000u ? 1 : 0);  // 0xe00000 = 1.75 * 2^23
  if (k < -126) k = -126;
  if (k > 127) k = 127;
  return k;
}

}  // namespace fp8
}  // namespace jax_moe_ffi
