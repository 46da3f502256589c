// Exhaustive check behind cc/cuda/quantize.cu's bit-identity with the CPU: the hardware conversion
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 of RN(x * 2^shift) equals fp8::encode_f32_bits(x, shift) (the CPU's
// integer encoder, common/dtypes.h) for every finite float32 x (both signs) and every shift in [-126, 127];
// and the f16 -> f32 cvt equals f16_bits_to_f32_bits. Run on an H100/H200 (exit status 0: no mismatch):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I cc -o /tmp/check_fp8_cvt tools/check_fp8_cvt.cu
//   /tmp/check_fp8_cvt        (tools/device_session.sh step "cvt"; about a minute on an H200)
#include <cstdio>
#include <cuda_runtime.h>
#include "common/dtypes.h"
using namespace jax_moe_ffi;

template <typename F>
__device__ __forceinline__ uint32_t cvt2(float lo, float hi) {
  uint16_t d;
  if (F::kEmax == 8) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ unsigned long long g_bad;
__device__ unsigned long long g_checked;
__device__ uint32_t g_first[4];

template <typename F>
__global__ void check(int shift) {
  const float mul = __uint_as_float(static_cast<uint32_t>(shift + 127) << 23);
  unsigned long long bad = 0, n = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < (1ull << 31); i += (uint64_t)gridDim.x * blockDim.x) {
    const uint32_t b = (uint32_t)i;  // positive patterns; the hi lane gets the negative twin
    if (b >= 0x7f800000u) continue;
    const float v = __uint_as_float(b);
    const float q = __fmul_rn(v, mul), qn = __fmul_rn(-v, mul);
    const uint32_t hw = cvt2<F>(q, qn);
    const uint32_t sw = fp8::encode_f32_bits<F>(b, shift) | (fp8::encode_f32_bits<F>(b | 0x80000000u, shift) << 8);
    ++n;
    if (hw != sw) {
      if (atomicAdd(&g_bad, 1ull) == 0) { g_first[0] = b; g_first[1] = shift; g_first[2] = hw; g_first[3] = sw; }
      ++bad;
    }
  }
  atomicAdd(&g_checked, n);
}

__global__ void check_f16(unsigned long long* bad) {
  for (uint32_t h = threadIdx.x + blockIdx.x * blockDim.x; h < 65536; h += blockDim.x * gridDim.x) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((uint16_t)h));
    if (__float_as_uint(f) != fp8::f16_bits_to_f32_bits((uint16_t)h)) atomicAdd(bad, 1ull);
  }
}

__global__ void misc(uint32_t* out) {
  out[0] = cvt2<fp8::E4M3>(1.0f, 2.0f);      // expect 0x4038
  uint32_t d; asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(0x7fff0001u), "r"(0x80000002u)); out[1] = d;  // 0x80000002
  out[2] = cvt2<fp8::E4M3>(464.0f, -1e30f);  // 0xfe7e
  out[3] = cvt2<fp8::E5M2>(61440.0f, 1e-30f);  // 0x007b
}

int main() {
  unsigned long long total_bad = 0, total = 0;
  for (int fmt = 0; fmt < 2; ++fmt) {
    for (int s = -126; s <= 127; ++s) {
      unsigned long long zero = 0;
      cudaMemcpyToSymbol(g_bad, &zero, 8);
      cudaMemcpyToSymbol(g_checked, &zero, 8);
      if (fmt == 0) check<fp8::E4M3><<<132 * 16, 256>>>(s); else check<fp8::E5M2><<<132 * 16, 256>>>(s);
      unsigned long long bad, n; uint32_t first[4];
      cudaMemcpyFromSymbol(&bad, g_bad, 8); cudaMemcpyFromSymbol(&n, g_checked, 8); cudaMemcpyFromSymbol(first, g_first, 16);
      if (cudaGetLastError() != cudaSuccess) { printf("CUDA error\n"); return 2; }
      total += n; total_bad += bad;
      if (bad) printf("%s shift %d: %llu mismatches, first x=%08x hw=%04x sw=%04x\n", fmt ? "e5m2" : "e4m3", s, bad, first[0], first[2], first[3]);
    }
  }
  printf("cvt vs encode_f32_bits: %llu pairs checked, %llu mismatches\n", total, total_bad);
  unsigned long long* d; cudaMalloc(&d, 8); cudaMemset(d, 0, 8);
  check_f16<<<64, 256>>>(d); unsigned long long b16; cudaMemcpy(&b16, d, 8, cudaMemcpyDeviceToHost);
  printf("f16 cvt vs f16_bits_to_f32_bits: %llu mismatches\n", b16);
  uint32_t* od; cudaMalloc(&od, 16); misc<<<1, 1>>>(od);
  uint32_t o[4]; cudaMemcpy(o, od, 16, cudaMemcpyDeviceToHost);
  printf("misc: %04x (4038) %08x (80000002) %04x (fe7e) %04x (007b)\n", o[0], o[1], o[2], o[3]);
  return total_bad || b16 ? 1 : 0;
}
