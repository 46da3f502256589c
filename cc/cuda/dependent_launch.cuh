// Programmatic dependent launch (PDL) for the kernel chain of one grouped-GEMM call:
// setup (+ scale repack, zeros) -> per-group descriptors -> grouped GEMM.
//
// Why: each call is three or four stream-ordered launches, and the persistent GEMM's 132 CTAs (one per SM, ~215 KB
// of shared memory each) are only scheduled once the kernel before them has drained. With PDL the descriptor kernel
// and the GEMM are launched with cudaLaunchAttributeProgrammaticStreamSerialization: their CTAs may become resident
// while the kernel before them still runs, and wait (griddepcontrol.wait) for it to complete and its writes to be
// visible before they touch global memory. The kernels before them say early that their dependents may launch
// (griddepcontrol.launch_dependents): a hint, with no effect on a successor launched without the attribute (XLA's).
//
// Correctness rests on one rule: every kernel we launch with the attribute waits first thing, so by the time it
// passes the wait its predecessor has completed, and that predecessor (launched with the attribute or not) had
// itself waited for everything before it. Hence every write of the chain is visible to the GEMM, and XLA's next
// kernel (launched normally) still waits for the whole GEMM. `JAX_MOE_FFI_PDL` (read on every call; 1 / 0) switches
// the attribute; the device-side instructions are no-ops in a kernel launched without it.
#pragma once

namespace jax_moe_ffi {
namespace cuda {

// Waits until the grids this one depends on (programmatically) have completed and their memory is visible.
__device__ __forceinline__ void WaitForPrecedingGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets a grid launched after this one with the PDL attribute start (its CTAs wait for this grid's completion).
__device__ __forceinline__ void LetDependentGridsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace cuda
}  // namespace jax_moe_ffi
