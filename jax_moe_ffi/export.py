"""`jax.export` support: the package's custom calls are not on JAX's built-in stable list, so exporting
a function that uses them needs these disabled safety checks (the targets keep a stable ABI per version)."""
from __future__ import annotations

import jax

from jax_moe_ffi import _registry


def export_disabled_checks() -> list:
    names = set(_registry.cpu_targets) | set(_registry.cuda_targets)
    return [jax.export.DisabledSafetyCheck.custom_call(n) for n in sorted(names)]
