// Load check of the CUDA library: lets Python confirm it opened the library it expects and that the
// library's device code runs (the probe kernel writes a known value through device memory).
#include <cuda_runtime.h>

namespace {
__global__ void probe_kernel(int* out) { *out = 1; }
}  // namespace

extern "C" int jax_moe_ffi_cuda_library_version() { return 1; }

// Returns 0 when a kernel of this library ran on the current device, else the CUDA error code.
extern "C" int jax_moe_ffi_cuda_probe() {
  int* d = nullptr;
  int h = 0;
  cudaError_t e = cudaMalloc(&d, sizeof(int));
  if (e != cudaSuccess) return static_cast<int>(e);
  probe_kernel<<<1, 1>>>(d);
  e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) return static_cast<int>(e);
  return h == 1 ? 0 : -1;
}
