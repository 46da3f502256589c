"""Loads the native libraries and registers every `jax_moe_ffi_*` FFI target with XLA.

CPU handlers come from the nanobind extension `_jax_moe_ffi_cpu`; CUDA handlers from the plain shared
library `libjax_moe_ffi_cuda.so` (no Python ABI), loaded with ctypes. Registration touches no JAX backend,
so importing the package does not initialise one.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import jax

_PKG_DIR = Path(__file__).resolve().parent

# FFI target name -> exported symbol of the CUDA library. Same target names as the CPU extension.
CUDA_SYMBOLS = {
    "jax_moe_ffi_grouped_gemm": "JaxMoeFfiGroupedGemmCuda",
    "jax_moe_ffi_grouped_gemm_acc": "JaxMoeFfiGroupedGemmAccCuda",
    "jax_moe_ffi_grouped_gemm_wgrad": "JaxMoeFfiGroupedGemmWgradCuda",
    "jax_moe_ffi_grouped_gemm_pair": "JaxMoeFfiGroupedGemmPairCuda",
    "jax_moe_ffi_grouped_gemm_wgrad_pair": "JaxMoeFfiGroupedGemmWgradPairCuda",
    "jax_moe_ffi_grouped_gemm_sum": "JaxMoeFfiGroupedGemmSumCuda",
    "jax_moe_ffi_grouped_gemm_fp8": "JaxMoeFfiGroupedGemmFp8Cuda",
    "jax_moe_ffi_grouped_gemm_fp8_wgrad": "JaxMoeFfiGroupedGemmFp8WgradCuda",
    "jax_moe_ffi_grouped_gemm_fp8_acc": "JaxMoeFfiGroupedGemmFp8AccCuda",
    "jax_moe_ffi_dispatch_plan": "JaxMoeFfiDispatchPlanCuda",
    "jax_moe_ffi_dispatch": "JaxMoeFfiDispatchCuda",
    "jax_moe_ffi_combine": "JaxMoeFfiCombineCuda",
    "jax_moe_ffi_combine_bwd": "JaxMoeFfiCombineBwdCuda",
    "jax_moe_ffi_quantize_mxfp8": "JaxMoeFfiQuantizeMxfp8Cuda",
    "jax_moe_ffi_quantize_blockwise": "JaxMoeFfiQuantizeBlockwiseCuda",
    "jax_moe_ffi_quantize_tiles_t": "JaxMoeFfiQuantizeTilesTransposedCuda",
    "jax_moe_ffi_quantize_groups_t": "JaxMoeFfiQuantizeGroupsTransposedCuda",
    "jax_moe_ffi_top_k": "JaxMoeFfiTopKCuda",
}

cpu_targets: tuple[str, ...] = ()
cuda_targets: tuple[str, ...] = ()
cuda_library_path: str | None = None
cuda_load_error: str | None = None


def _register_cpu() -> tuple[str, ...]:
    from jax_moe_ffi import _jax_moe_ffi_cpu  # built by CMake; fails loudly if the build is missing

    names = []
    for name, capsule in _jax_moe_ffi_cpu.targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu", api_version=1)
        names.append(name)
    return tuple(sorted(names))


def _find_cuda_library() -> Path | None:
    env = os.environ.get("JAX_MOE_FFI_CUDA_LIB")
    if env:
        return Path(env)
    candidate = _PKG_DIR / "libjax_moe_ffi_cuda.so"
    return candidate if candidate.exists() else None


def _register_cuda() -> tuple[str, ...]:
    global cuda_library_path, cuda_load_error
    path = _find_cuda_library()
    if path is None:
        cuda_load_error = "libjax_moe_ffi_cuda.so was not built (no CUDA at build time)"
        return ()
    try:
        lib = ctypes.cdll.LoadLibrary(str(path))
    except OSError as e:  # e.g. no NVIDIA driver on this machine
        cuda_load_error = f"could not load {path}: {e}"
        return ()
    cuda_library_path = str(path)
    names = []
    for name, symbol in CUDA_SYMBOLS.items():
        fn = getattr(lib, symbol, None)
        if fn is None:
            continue  # a partial build (e.g. CI's compile subset); ops check `cuda_targets`
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform="CUDA", api_version=1)
        names.append(name)
    return tuple(sorted(names))


def register_all() -> None:
    global cpu_targets, cuda_targets
    if cpu_targets:
        return
    cpu_targets = _register_cpu()
    cuda_targets = _register_cuda()
