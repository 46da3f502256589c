"""Helpers shared by the op wrappers: argument checks with clear messages, one-time warnings."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
GPU_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Says once per process that a fast path was not taken (never silently)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def check_rank(op: str, name: str, x, rank: int, layout: str) -> None:
    if x.ndim != rank:
        raise ValueError(f"{op}: `{name}` must be rank {rank} {layout}, got shape {tuple(x.shape)}")


def check_float(op: str, name: str, x) -> None:
    if jnp.dtype(x.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{op}: `{name}` must be float32, bfloat16 or float16, got {x.dtype}")


def check_tokens_and_ids(op: str, x, expert_ids):
    """x [T, D] float and expert_ids [T, k] (one row per token): the inputs of every dispatch."""
    x = jnp.asarray(x)
    check_rank(op, "x", x, 2, "[T, D]")
    check_float(op, "x", x)
    expert_ids = jnp.asarray(expert_ids)
    check_rank(op, "expert_ids", expert_ids, 2, "[T, k]")
    if expert_ids.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: `expert_ids` {tuple(expert_ids.shape)} must have one row per token of "
                         f"`x` {tuple(x.shape)}")
    return x, expert_ids


def check_group_sizes(op: str, group_sizes, g: int):
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"{op}: `group_sizes` must be an integer array, got {group_sizes.dtype}")
    if group_sizes.ndim != 1 or group_sizes.shape[0] != g:
        raise ValueError(
            f"{op}: `group_sizes` must have shape ({g},) (one entry per group), got {tuple(group_sizes.shape)}")
    return group_sizes.astype(jnp.int32)


def out_dtype(op: str, in_dtype, preferred_element_type):
    """Output dtype: the input dtype, or float32 when asked (the accumulation type)."""
    if preferred_element_type is None:
        return jnp.dtype(in_dtype)
    dt = jnp.dtype(preferred_element_type)
    if dt not in (jnp.dtype(in_dtype), jnp.dtype(jnp.float32)):
        raise TypeError(
            f"{op}: `preferred_element_type` must be None, float32 or the input dtype {jnp.dtype(in_dtype)}, got {dt}")
    return dt


def float0_zeros(x):
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def _varying_axes(x) -> set:
    """The shard_map axes `x` varies over: `aval.vma` in some JAX versions, `aval.manual_axis_type.varying`
    in others (JAX 0.10); empty outside shard_map."""
    aval = jax.typeof(x)
    v = getattr(aval, "vma", None)
    if v is None:
        v = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return set(v or ())


def _varying_like(args):
    """Wraps a branch so that its outputs vary over the same shard_map axes as its inputs do. FFI calls
    type their results without the manual axes of their operands (`vma`), so under shard_map with
    check_vma=True the FFI branch and the pure-JAX branch of `platform_dependent` would disagree."""
    vma = set()
    for a in jax.tree.leaves(args):
        vma |= _varying_axes(a)
    pcast = getattr(jax.lax, "pcast", None)
    if not vma or pcast is None:
        return lambda fn: fn

    def cast(x):
        missing = tuple(sorted(vma - _varying_axes(x)))
        return pcast(x, missing, to="varying") if missing else x

    return lambda fn: (lambda *a: jax.tree.map(cast, fn(*a)))


# > 0 while a branch that never runs on a GPU (the cpu / default branch of `on_platforms`) is traced
_TRACING_NON_GPU_BRANCH = [0]


def _non_gpu_branch(fn):
    def traced(*a):
        _TRACING_NON_GPU_BRANCH[0] += 1
        try:
            return fn(*a)
        finally:
            _TRACING_NON_GPU_BRANCH[0] -= 1
    return traced


def on_platforms(target: str, args, *, cpu, cuda, fallback, cuda_unusable: str | None = None):
    """Runs `cpu` on CPU and `cuda` on CUDA; where the CUDA kernel cannot run (`cuda_unusable` says why)
    the GPU gets `fallback` (pure JAX / XLA) and a warning once -- never silently. Other platforms get
    `fallback`."""
    same = _varying_like(args)
    # The fallback as a checkpoint that saves nothing: when a differentiated region around this call is partially
    # evaluated (a stream region of optimize(streams=True) in a scanned layer), arrays the fallback builds from
    # constants alone would otherwise become residuals, and the platform-dependent cond zero-fills the residual
    # slots of every branch it does not take -- on the Qwen3 train step an f32 [8192, 8, 2048] zeros (537 MB,
    # 0.16 ms) a step from the combine's fallback, on a GPU that runs the CUDA kernel (session 27).
    fallback = jax.checkpoint(fallback, prevent_cse=False, policy=jax.checkpoint_policies.nothing_saveable)
    # Batched like the FFI calls (vmap_method="sequential"): a loop over the batch. XLA's ragged_dot, which most
    # fallbacks are, has no batching rule for an unbatched operand ("ragged_dot vmap over any dim but 0 - NYI"), so
    # vmap over a rewritten float32 model failed on a GPU, where the fallback runs (session 37's GPU-platform run).
    fallback = jax.custom_batching.sequential_vmap(fallback)
    cpu, fallback_other = _non_gpu_branch(cpu), _non_gpu_branch(fallback)
    if cuda_unusable is None:
        return jax.lax.platform_dependent(*args, cpu=same(cpu), cuda=same(cuda), default=same(fallback_other))

    def cuda_branch(*a):
        # platform_dependent traces every branch on every platform (nested calls too): warn only where this
        # fallback would run, i.e. on a GPU and not inside an enclosing call's CPU / default branch
        if jax.default_backend() == "gpu" and not _TRACING_NON_GPU_BRANCH[0]:
            warn_once(f"{target}:{cuda_unusable}",
                      f"jax_moe_ffi: {target} runs a pure-JAX/XLA fallback on GPU because {cuda_unusable}")
        return fallback(*a)

    return jax.lax.platform_dependent(*args, cpu=same(cpu), cuda=same(cuda_branch),
                                      default=same(fallback_other))


def ffi_on_platforms(target: str, ffi_fn, fallback_fn, *args):
    """The same FFI call on CPU and CUDA (one signature on both); the pure-JAX `fallback_fn` on a GPU
    without the CUDA library (said once) and on other platforms."""
    from jax_moe_ffi import _registry
    unusable = None if target in _registry.cuda_targets else \
        f"the CUDA library is not loaded ({_registry.cuda_load_error})"
    return on_platforms(target, args, cpu=ffi_fn, cuda=ffi_fn, fallback=fallback_fn, cuda_unusable=unusable)
