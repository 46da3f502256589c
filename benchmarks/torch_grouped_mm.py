"""torch._grouped_mm anchor (what TorchTitan uses), run as a separate process by grouped_gemm.py.
Prints one JSON row per measurement. Same shapes, group sizes and FLOP counting as grouped_gemm.py."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import torch  # noqa: E402


def bench(fn, min_time_s=0.3, trials=5):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); fn(); end.record(); torch.cuda.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    reps = int(max(1, min(200, min_time_s / trials / one)))
    times = []
    for _ in range(trials):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", default="even,skew")
    ap.add_argument("--passes", default="fwd,fwd_bwd")
    ap.add_argument("--cases", default="")
    args = ap.parse_args()
    shapes = _common.load_shapes()
    dev = "cuda"
    torch.manual_seed(0)
    for case in shapes["grouped_gemm"]:
        if args.cases and not any(c in case["name"] for c in args.cases.split(",")):
            continue
        m, k, n, g = case["M"], case["K"], case["N"], case["G"]
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        # torch._grouped_mm wants the weight K-major per group: store [G, N, K], pass its transpose
        w = (torch.randn(g, n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5)
        cot = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * k * n
        for kind in args.groups.split(","):
            sizes = torch.tensor(_common.group_sizes(m, g, kind, shapes), device=dev, dtype=torch.int32)
            offs = torch.cumsum(sizes, 0, dtype=torch.int32)
            for p in args.passes.split(","):
                if p == "fwd":
                    fn = lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
                elif p == "dgrad":  # the lhs gradient as torch's backward forms it: cot_g @ (w_g^T)^T
                    fn = lambda: torch._grouped_mm(cot, w, offs=offs, out_dtype=torch.bfloat16)
                elif p == "wgrad":  # the weight gradient: offs split the contraction (rows), out [G, K, N]
                    fn = lambda: torch._grouped_mm(a.t(), cot, offs=offs, out_dtype=torch.bfloat16)
                elif p != "fwd_bwd":
                    print(f"torch_grouped_mm: pass {p} not timed", file=sys.stderr)
                    continue
                else:
                    a2 = a.detach().requires_grad_(True)
                    w2 = w.detach().requires_grad_(True)

                    def fn():
                        out = torch._grouped_mm(a2, w2.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
                        return torch.autograd.grad(out, (a2, w2), cot)
                try:
                    ms = bench(fn)
                except Exception as e:  # noqa: BLE001
                    print(f"torch_grouped_mm {case['name']} {p} {kind} failed: {e}", file=sys.stderr)
                    continue
                tf = (3 * flops if p == "fwd_bwd" else flops) / ms / 1e9
                print(json.dumps({"case": case["name"], "impl": "torch_grouped_mm", "pass": p, "groups": kind,
                                  "ms": ms, "tflops": tf, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
