"""Third-party model group: keras-hub (JAX backend) and MaxText MoE layers through the rewrite pass.

Run by `.ci/models.sh` in its own Python 3.12 venv (MaxText needs 3.12); in an environment without
keras-hub / MaxText the modules skip with a reason (an error when JMF_MODELS_REQUIRED=1).
"""
import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is imported anywhere

import pytest  # noqa: E402

import moe_check  # noqa: E402


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.models)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = moe_check.RESULTS
    if not rows:
        return
    tr = terminalreporter
    tr.section("jax_moe_ffi: third-party MoE sites rewritten")
    tr.write_line(f"{'model':68s} {'mode':8s} {'sites':>9s} {'GG':>3s} {'rel fwd':>9s} {'rel grad':>9s} "
                  f"{'own noise':>9s}  result")
    for r in rows:
        sites = f"{r['sites_found']}/{r['sites_expected']}"
        fwd = f"{r['rel_fwd']:.1e}" if "rel_fwd" in r else "-"
        grad = f"{r['rel_grad']:.1e}" if "rel_grad" in r else "-"
        noise = f"{r['rel_grad_base']:.1e}" if "rel_grad_base" in r else "-"
        gg = str(r.get("grouped_gemm_calls", "-"))
        res = "ok" if r.get("ok") else ("xfail: " + r["xfail"] if "xfail" in r else "FAILED")
        tr.write_line(f"{r['model']:68s} {r['mode']:8s} {sites:>9s} {gg:>3s} {fwd:>9s} {grad:>9s} {noise:>9s}  {res}")
    exact = {}
    for r in rows:  # one entry per configuration: its exact-mode check (capacity layers are also run dropless)
        if r["mode"] == "exact" or r["model"] not in exact:
            exact[r["model"]] = r
    expected = sum(r["sites_expected"] for r in exact.values())
    ok = sum(r["sites_found"] for r in exact.values() if r.get("ok"))
    tr.write_line(f"MoE sites rewritten and exact: {ok}/{expected} over {len(exact)} model configurations "
                  f"({sum(1 for r in rows if r.get('ok'))}/{len(rows)} checks ok, "
                  f"{sum(1 for r in rows if 'xfail' in r)} xfail)")
