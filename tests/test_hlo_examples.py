"""Structure of hlo_examples/ (committed files and a fresh regeneration) and the inspect CLI."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jax_moe_ffi import examples
from jax_moe_ffi.inspect import summarize_hlo

ROOT = Path(__file__).resolve().parent.parent
HLO = ROOT / "hlo_examples"


def _largest_dot_elems(text):
    """Elements of the largest dot output in optimized HLO text."""
    sizes = [0]
    for m in re.finditer(r"=\s*[a-z0-9]+\[([0-9,]*)\]\S*\s+dot\(", text):
        n = 1
        for d in filter(None, m.group(1).split(",")):
            n *= int(d)
        sizes.append(n)
    return max(sizes)


def _check_pair(before: str, after: str, name: str):
    sb, sa = summarize_hlo(before), summarize_hlo(after)
    assert not any(k.startswith("jax_moe_ffi") for k in sb.custom_calls), name
    assert sa.custom_calls.get("jax_moe_ffi_grouped_gemm", 0) >= 3, (name, sa.custom_calls)
    assert sa.custom_calls.get("jax_moe_ffi_dispatch", 0) >= 1 and sa.custom_calls.get("jax_moe_ffi_combine", 0) >= 1
    # only the router's [T, E] dot is left: nothing of the E x C (or E x T x F) dense expert compute
    fn, args = examples.EXAMPLES[name]()
    params, x = args
    t, d = x.shape
    e = params["router"].shape[-1]
    assert _largest_dot_elems(after) <= t * e, name
    assert _largest_dot_elems(before) > t * e, name  # the check can fail: before has the big dots
    assert sa.dot_flops < 0.05 * sb.dot_flops


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_committed_hlo_examples_have_the_rewrite(name):
    for tag in ("before", "after"):
        for ext in ("stablehlo.mlir", "hlo.txt"):
            assert (HLO / f"{name}.{tag}.{ext}").exists(), "run python hlo_examples/generate.py"
    _check_pair((HLO / f"{name}.before.hlo.txt").read_text(), (HLO / f"{name}.after.hlo.txt").read_text(), name)
    assert "jax_moe_ffi_grouped_gemm" in (HLO / f"{name}.after.stablehlo.mlir").read_text()


def test_regenerated_examples_match_structure(tmp_path):
    sys.path.insert(0, str(HLO))
    import generate  # hlo_examples/generate.py

    generate.generate(tmp_path)
    for name in examples.EXAMPLES:
        _check_pair((tmp_path / f"{name}.before.hlo.txt").read_text(),
                    (tmp_path / f"{name}.after.hlo.txt").read_text(), name)


def test_inspect_cli_on_a_module_function(tmp_path):
    out = subprocess.run([sys.executable, "-m", "jax_moe_ffi", "inspect", "jax_moe_ffi.examples:mixtral_dense",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "jax_moe_ffi_grouped_gemm x3" in out.stdout
    assert (tmp_path / "jax_moe_ffi.examples.mixtral_dense.after.hlo.txt").exists()


def test_summarize_counts_dot_flops():
    text = ("HloModule m\nENTRY %main (a: f32[4,8], b: f32[8,3]) -> f32[4,3] {\n"
            "  %a = f32[4,8]{1,0} parameter(0)\n  %b = f32[8,3]{1,0} parameter(1)\n"
            "  ROOT %dot.1 = f32[4,3]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
    s = summarize_hlo(text)
    assert s.dots == 1 and s.dot_flops == 2 * 4 * 3 * 8
