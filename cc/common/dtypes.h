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
