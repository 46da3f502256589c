import os

# GPU runs: the tests that compare env knobs run a child process beside this one; with XLA's default preallocation
# (75% of the card) in both, the child fails to allocate (session 45, H100: 4 knob tests, all out of memory). Memory on
# demand instead, before jax starts a backend; an explicit setting wins.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_enable_x64", False)

# "ci" (the default): 10 fresh random examples per property test and run (CI must stay under 30 minutes on
# 2 cores; most examples are a new shape, i.e. a new XLA compile). "thorough": 100, for a local run before a
# release (HYPOTHESIS_PROFILE=thorough python -m pytest -q tests). Tests with their own @settings keep them.
_quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=10, deadline=None, suppress_health_check=_quiet)
settings.register_profile("thorough", max_examples=100, deadline=None, suppress_health_check=_quiet)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """`-m gpu` with several pytest-xdist workers fails on memory, not on the kernels: each worker keeps the device
    memory its tests took (the float32 references at the benchmark shapes take 12-32 GB), and the bitwise tests'
    child processes then find no free memory (session 41, H100: 17 failed / 15 errors, every one an allocation
    failure). Refuse that combination up front. Named GPU tests (small ones) may still run in parallel."""
    workers = getattr(config.option, "numprocesses", None)
    expr = (config.option.markexpr or "").replace(" ", "")
    selects_gpu = "gpu" in expr and "notgpu" not in expr
    if selects_gpu and workers not in (None, 0, 1) and os.environ.get("PYTEST_XDIST_WORKER") is None:
        raise pytest.UsageError(f"-m gpu runs in one process: drop `-n {workers}` (each xdist worker holds its own "
                                "share of GPU memory, and the benchmark-shape references need 12-32 GB)")


def pytest_collection_modifyitems(config, items):
    on_gpu = jax.default_backend() == "gpu"
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the H200 with -m gpu)")
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _float32_dots_as_on_cpu(request):
    """Tests not marked gpu are written against CPU float32 numerics. When they run on the GPU platform, XLA's
    default float32 dot there is TF32 (about 3e-4 relative apart), which broke their 1e-5 exactness bounds in the
    model-as-written reference, not in the rewrite (session 35). Run them at full float32 precision there."""
    if "gpu" not in request.keywords and jax.default_backend() == "gpu":
        with jax.default_matmul_precision("highest"):
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def _gpu_tests_need_the_cuda_library(request):
    """A gpu-marked test on a GPU without the CUDA library would time XLA's fallbacks and pass: fail instead."""
    if "gpu" in request.keywords and jax.default_backend() == "gpu":
        from jax_moe_ffi import _registry
        if not _registry.cuda_targets:
            pytest.fail(f"gpu test without the jax_moe_ffi CUDA library: {_registry.cuda_load_error} "
                        "(set JAX_MOE_FFI_CUDA_LIB; tools/device_session.sh does)")
