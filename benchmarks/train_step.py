"""End-to-end training step: a Qwen3-30B-A3B-shaped decoder (attention + MoE with the real hidden, expert and
top-k sizes, depth reduced, `lax.scan` over layers), full step (forward, backward, optax AdamW), written the
naive way (GShard capacity-einsum MoE) and run as written, through `optimize(mode="exact")`,
`optimize(mode="dropless")`, the same two with `offload="device"` (`*_save`: the layer's jax.checkpoint keeps the
expert GEMM outputs instead of recomputing them), FP8 (`optimize(mode="dropless", recipe="blockwise")`), and
dropless anchors on XLA's `ragged_dot` and tokamax (when importable). Not in the default list:
`ours_exact_noremat`, `ours_noremat`, `ours_fp8_noremat` (the model without jax.checkpoint on its layers);
`*_keepcse` (optimized variants that keep the model's jax.checkpoint(prevent_cse=True) where optimize() drops it in
the scan body); `tokamax_nocse` (the tokamax anchor written with prevent_cse=False); `ours_fp8*_inbody` (the FP8
variants with the weights quantised per layer inside the scan, where optimize() quantises them once before it);
`<variant>_noinit` (any variant compiled under `runtime.uninitialized_scan_outputs()`: its scans' stacked outputs are
not zero-filled first). Reports step time, tokens/s, model TFLOP/s (model FLOPs, no padding, and for the capacity
variants only the (token, expert) pairs their capacity keeps, measured on the timed step's inputs: `pairs_kept`), peak
memory, and the loss after N steps on the same data.

  python benchmarks/train_step.py                       # GPU: Qwen3-30B-A3B shapes, 4 layers, bf16
  python benchmarks/train_step.py --batch 16 --variants ours_save_noinit,ours_fp8_save_noinit   # 16 x 2048 tokens
  python benchmarks/train_step.py --tiny --steps 3      # CPU smoke run

Writes benchmarks/results/train_step_<machine>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_moe_ffi as jmf  # noqa: E402
from jax_moe_ffi import runtime  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 16384          # reduced from 151936 (the LM head would dominate a 4-layer model)
    d_model: int = 2048
    heads: int = 32
    kv_heads: int = 4
    head_dim: int = 128
    d_ff: int = 768             # moe_intermediate_size
    experts: int = 128
    top_k: int = 8
    layers: int = 4             # 48 in the real model
    capacity_factor: float = 1.25
    aux_loss: float = 0.01      # Switch-style load-balancing loss weight (0: none; see make_loss)
    batch: int = 4
    seq: int = 2048

    @property
    def tokens(self):
        return self.batch * self.seq


TINY = Config(vocab=512, d_model=64, heads=4, kv_heads=2, head_dim=16, d_ff=32, experts=8, top_k=2, layers=2,
              batch=2, seq=32)


def init(cfg: Config, key, dtype):
    ks = iter(jax.random.split(key, 16))
    L, D, E, F = cfg.layers, cfg.d_model, cfg.experts, cfg.d_ff
    n = lambda shape, fan_in: (jax.random.normal(next(ks), shape, jnp.float32) / math.sqrt(fan_in)).astype(dtype)
    return {
        "embed": n((cfg.vocab, D), 1.0) * 0.02,
        "layers": {
            "ln1": jnp.ones((L, D), dtype), "ln2": jnp.ones((L, D), dtype),
            "wq": n((L, D, cfg.heads * cfg.head_dim), D), "wk": n((L, D, cfg.kv_heads * cfg.head_dim), D),
            "wv": n((L, D, cfg.kv_heads * cfg.head_dim), D), "wo": n((L, cfg.heads * cfg.head_dim, D), D),
            "router": n((L, D, E), D), "w_gate": n((L, E, D, F), D), "w_up": n((L, E, D, F), D),
            "w_down": n((L, E, F, D), F),
        },
        "ln_f": jnp.ones((D,), dtype),
        "head": n((D, cfg.vocab), D),
    }


def rms(x, w):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype) * w


ATTENTION_IMPL = [None]  # jax.nn.dot_product_attention implementation, chosen once in main()


def attention(cfg, p, h):
    b, s, _ = h.shape
    q = (h @ p["wq"]).reshape(b, s, cfg.heads, cfg.head_dim)
    k = (h @ p["wk"]).reshape(b, s, cfg.kv_heads, cfg.head_dim)
    v = (h @ p["wv"]).reshape(b, s, cfg.kv_heads, cfg.head_dim)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=ATTENTION_IMPL[0])
    return o.reshape(b, s, -1) @ p["wo"]


def pick_attention(choice: str, cfg, dtype) -> str:
    """"xla" materialises the [B, H, S, S] scores (what the first H200 run used: it dominated the step);
    "cudnn" is the fused flash-attention kernel. "auto": cudnn when it compiles here, else xla."""
    if choice != "auto":
        return choice
    if jax.default_backend() != "gpu":
        return "xla"
    q = jnp.zeros((1, 256, cfg.heads, cfg.head_dim), dtype)
    kv = jnp.zeros((1, 256, cfg.kv_heads, cfg.head_dim), dtype)
    try:
        f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        jax.block_until_ready(jax.jit(jax.grad(lambda q: jnp.sum(f(q, kv, kv).astype(jnp.float32))))(q))
        return "cudnn"
    except Exception as e:  # noqa: BLE001
        print(f"cuDNN attention unavailable ({type(e).__name__}: {str(e)[:200]}); using XLA attention")
        return "xla"


def router(p, x, cfg):
    probs = jax.nn.softmax((x @ p["router"]).astype(jnp.float32), axis=-1)
    w, e = jax.lax.top_k(probs, cfg.top_k)
    return w / jnp.sum(w, -1, keepdims=True), e


def moe_capacity_einsum(cfg, p, x):
    """The naive way: GShard one-hot dispatch/combine einsums with an expert capacity (drops overflow)."""
    t = x.shape[0]
    w, e = router(p, x, cfg)
    cap = max(1, int(math.ceil(t * cfg.top_k / cfg.experts * cfg.capacity_factor)))
    mask = jax.nn.one_hot(e, cfg.experts, dtype=jnp.int32)
    pos = (jnp.cumsum(mask.reshape(t * cfg.top_k, cfg.experts), axis=0) - 1).reshape(mask.shape)
    keep = mask * (pos < cap)
    pos1h = jax.nn.one_hot(jnp.sum(pos * keep, -1), cap, dtype=x.dtype)
    dispatch = jnp.einsum("tke,tkc->tec", keep.astype(x.dtype), pos1h)
    combine = jnp.einsum("tke,tkc,tk->tec", keep.astype(x.dtype), pos1h, w.astype(x.dtype))
    xe = jnp.einsum("tec,td->ecd", dispatch, x)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", xe, p["w_gate"])) * jnp.einsum("ecd,edf->ecf", xe, p["w_up"])
    return jnp.einsum("tec,ecd->td", combine, jnp.einsum("ecf,efd->ecd", h, p["w_down"]))


def moe_ragged(ragged_dot):
    """A dropless MoE on a ragged_dot implementation (argsort dispatch, scatter-add combine): the anchors."""
    def moe(cfg, p, x):
        t, d = x.shape
        w, e = router(p, x, cfg)
        order = jnp.argsort(e.reshape(-1), stable=True)
        rows = x[order // cfg.top_k]
        sizes = jnp.bincount(e.reshape(-1), length=cfg.experts).astype(jnp.int32)
        h = jax.nn.silu(ragged_dot(rows, p["w_gate"], sizes)) * ragged_dot(rows, p["w_up"], sizes)
        y = ragged_dot(h, p["w_down"], sizes) * w.reshape(-1)[order][:, None].astype(x.dtype)
        return jnp.zeros((t, d), y.dtype).at[order // cfg.top_k].add(y)
    return moe


def load_balancing_loss(cfg, p, x):
    """Switch Transformer's auxiliary loss, E * sum_e f_e P_e (f_e: share of the top-k choices that go to
    expert e, P_e: mean router probability of e), as MoE models train with (Mixtral, Qwen3-MoE). Without it
    this benchmark's random data drove the router to a few experts within its 10 AdamW steps: the capacity
    model then kept 17% of the routed pairs and the dropless groups were very skewed."""
    probs = jax.nn.softmax((x @ p["router"]).astype(jnp.float32), axis=-1)
    _, e = jax.lax.top_k(probs, cfg.top_k)
    f = jnp.mean(jax.nn.one_hot(e, cfg.experts, dtype=jnp.float32), axis=(0, 1))
    return cfg.experts * jnp.sum(f * jnp.mean(probs, axis=0))


def decoder(cfg, moe, params, tokens, per_layer, remat: bool = False, prevent_cse: bool = True):
    """The embedding and the scanned layers (attention, then `moe`): (hidden states, the stacked
    per_layer(p, x) of every layer, x being the MoE input)."""
    b, s = tokens.shape

    def layer(h, p):
        h = h + attention(cfg, p, rms(h, p["ln1"]))
        x = rms(h, p["ln2"]).reshape(b * s, -1)
        return h + moe(cfg, p, x).reshape(b, s, -1), per_layer(p, x)

    return jax.lax.scan(jax.checkpoint(layer, prevent_cse=prevent_cse) if remat else layer, params["embed"][tokens],
                        params["layers"])


def make_loss(cfg, moe, remat: bool = True, prevent_cse: bool = True):
    def loss(params, tokens):
        aux_fn = (lambda p, x: load_balancing_loss(cfg, p, x)) if cfg.aux_loss else \
            (lambda p, x: jnp.zeros((), jnp.float32))
        h, aux = decoder(cfg, moe, params, tokens, aux_fn, remat, prevent_cse)
        logits = (rms(h, params["ln_f"]) @ params["head"]).astype(jnp.float32)
        labels = jnp.roll(tokens, -1, axis=1)
        lp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.mean(jnp.take_along_axis(lp, labels[:, :-1, None], -1)) + cfg.aux_loss * jnp.mean(aux)
    return loss


def model_flops(cfg: Config, kept: float = 1.0) -> float:
    """Training FLOPs of the model per step (3x forward), routed experts only, causal attention halved.
    `kept`: the share of the (token, expert) pairs that reach an expert. A capacity model drops the rest
    (they cost it no expert FLOPs, and neither padding slots count), a dropless one keeps all (1.0)."""
    d, t, s = cfg.d_model, cfg.tokens, cfg.seq
    attn_proj = 2 * d * (2 * cfg.heads * cfg.head_dim + 2 * cfg.kv_heads * cfg.head_dim)
    attn_scores = 2 * 2 * s * cfg.heads * cfg.head_dim * 0.5
    moe = 2 * 3 * cfg.top_k * d * cfg.d_ff * kept + 2 * d * cfg.experts
    per_token = cfg.layers * (attn_proj + attn_scores + moe) + 2 * d * cfg.vocab
    return 3.0 * per_token * t


# the variants that run the model's capacity rule (they drop the pairs past an expert's capacity)
CAPACITY_VARIANTS = ("naive", "ours_exact", "ours_exact_save", "ours_exact_noremat", "ours_exact_keepcse")


def capacity_kept_share(cfg: Config, params, tokens) -> tuple[float, list[float]]:
    """The share of (token, expert) pairs the capacity rule keeps on this batch, over all layers and per
    layer: the capacity model's forward (each layer's input is what that model computes), the router's
    expert counts, and min(count, capacity) per expert (the running-count GShard rule keeps the first C)."""
    cap = max(1, int(math.ceil(cfg.tokens * cfg.top_k / cfg.experts * cfg.capacity_factor)))

    @jax.jit
    def counts(params, tokens):
        expert_counts = lambda p, x: jnp.bincount(router(p, x, cfg)[1].reshape(-1), length=cfg.experts)
        return decoder(cfg, moe_capacity_einsum, params, tokens, expert_counts)[1]

    c = counts(params, tokens)
    kept = jnp.minimum(c, cap).sum(-1) / c.sum(-1)
    return float(jnp.minimum(c, cap).sum() / c.sum()), [round(float(v), 4) for v in kept]


def main(argv=None):
    import optax

    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="a tiny config for a CPU smoke run")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=0,
                    help=f"sequences per step (default {Config.batch} x {Config.seq} tokens): more tokens per step "
                         "share the per-step costs (the optimizer update, the FP8 weights' quantisation)")
    ap.add_argument("--attention", default="auto", choices=["auto", "cudnn", "xla"],
                    help="attention implementation (auto: cuDNN flash attention on GPU when it compiles)")
    ap.add_argument("--variants", default="naive,ours_exact,ours_exact_save,ours,ours_save,ours_fp8,ours_fp8_save,"
                                          "xla_ragged_dot,tokamax")
    ap.add_argument("--xla-flags", default="xla", choices=["xla", "runtime"],
                    help="xla: XLA's defaults; runtime: jax_moe_ffi.runtime.apply_xla_flags() first (latency-hiding "
                         "scheduler, stream annotations, CONCURRENT scheduling inside XLA's CUDA graphs)")
    ap.add_argument("--out", default="", help="result name (default train_step_<machine>)")
    ap.add_argument("--warmup", type=int, default=100, help="AdamW learning-rate warm-up steps (to 1e-3)")
    ap.add_argument("--aux-loss", type=float, default=None,
                    help=f"load-balancing loss weight (default {Config.aux_loss}; 0 turns it off)")
    args = ap.parse_args(argv)
    if args.xla_flags == "runtime":
        print("XLA flags added:", runtime.apply_xla_flags())
    cfg = TINY if args.tiny else Config()
    if args.aux_loss is not None:
        cfg = dataclasses.replace(cfg, aux_loss=args.aux_loss)
    if args.layers:
        cfg = dataclasses.replace(cfg, layers=args.layers)
    if args.batch:
        cfg = dataclasses.replace(cfg, batch=args.batch)
    dtype = jnp.float32 if args.tiny else jnp.bfloat16
    ATTENTION_IMPL[0] = pick_attention(args.attention, cfg, dtype)
    print(f"attention: {ATTENTION_IMPL[0]}")
    params0 = init(cfg, jax.random.PRNGKey(0), dtype)
    data = jax.random.randint(jax.random.PRNGKey(1), (args.steps, cfg.batch, cfg.seq), 0, cfg.vocab)
    naive_loss = make_loss(cfg, moe_capacity_einsum)
    losses = {
        "naive": naive_loss,
        "ours_exact": jmf.optimize(naive_loss, mode="exact"),
        # offload="device": the model's own jax.checkpoint(layer) keeps the dispatched rows and expert GEMM
        # outputs, so the backward re-runs attention and the router but no expert GEMM (more memory)
        "ours_exact_save": jmf.optimize(naive_loss, mode="exact", offload="device"),
        "ours": jmf.optimize(naive_loss, mode="dropless"),
        "ours_save": jmf.optimize(naive_loss, mode="dropless", offload="device"),
        # the same model without jax.checkpoint on its layers (every residual kept): what saving everything costs
        "ours_exact_noremat": jmf.optimize(make_loss(cfg, moe_capacity_einsum, remat=False), mode="exact"),
        # dropless bf16 / FP8 on that model: no recompute of attention and its projections in the backward
        "ours_noremat": jmf.optimize(make_loss(cfg, moe_capacity_einsum, remat=False), mode="dropless"),
        "ours_fp8_noremat": jmf.optimize(make_loss(cfg, moe_capacity_einsum, remat=False), mode="dropless",
                                         recipe="blockwise"),
        "ours_fp8": jmf.optimize(naive_loss, mode="dropless", recipe="blockwise"),
        # offload="device" with FP8 also keeps the weights' FP8 quantisation (runtime.FP8_WEIGHTS_NAME): the
        # backward's recompute does not quantise the weights a second time
        "ours_fp8_save": jmf.optimize(naive_loss, mode="dropless", recipe="blockwise", offload="device"),
        "xla_ragged_dot": make_loss(cfg, moe_ragged(jax.lax.ragged_dot)),
    }
    # optimize() rebuilds a scanned layer's jax.checkpoint with prevent_cse=False (its barrier copies the sliced
    # weights); *_keepcse keep the model's prevent_cse=True, for the same-run A/B of that choice
    for name in ("ours_exact", "ours", "ours_save", "ours_fp8_save"):
        kw = losses[name].jax_moe_ffi_options
        losses[name + "_keepcse"] = jmf.optimize(naive_loss, **{**kw, "keep_prevent_cse": True})
    # FP8: optimize() quantises the stacked expert weights once before the layer scan; *_inbody quantise them per
    # layer inside it (JAX_MOE_FFI_HOIST_FP8_WEIGHTS=0 when optimize() is called), for the same-run A/B
    os.environ["JAX_MOE_FFI_HOIST_FP8_WEIGHTS"] = "0"
    for name in ("ours_fp8", "ours_fp8_save"):
        losses[name + "_inbody"] = jmf.optimize(naive_loss, **losses[name].jax_moe_ffi_options)
    del os.environ["JAX_MOE_FFI_HOIST_FP8_WEIGHTS"]
    tokamax = _common.import_tokamax() if "tokamax" in args.variants and jax.default_backend() == "gpu" else None
    if tokamax is not None:
        tokamax_moe = moe_ragged(lambda a, b, s: tokamax.ragged_dot(a, b, s, implementation="mosaic"))
        losses["tokamax"] = make_loss(cfg, tokamax_moe)
        # the anchor written with prevent_cse=False, as optimize() rebuilds the layers: the same setting for both
        losses["tokamax_nocse"] = make_loss(cfg, tokamax_moe, prevent_cse=False)
    print(jmf.explain(naive_loss, params0, data[0]))
    # AdamW with the linear warm-up every LLM recipe starts with: at a constant 1e-3 from step 0, Adam's
    # normalised steps moved the router weights by about half their initial scale within the 10 steps, and
    # the router collapsed onto a few experts (the capacity model then kept 17-30% of the routed pairs)
    opt = optax.adamw(optax.linear_schedule(0.0, 1e-3, args.warmup))
    rows = []
    for name in args.variants.split(","):
        # <variant>_noinit: the same variant with its scans' stacked outputs left uninitialised
        # (runtime.uninitialized_scan_outputs around its compilation), for the same-run A/B of the zero fill
        base = name.removesuffix("_noinit")
        if base not in losses:
            print(f"{name}: not run (not available here)")
            continue
        scope = runtime.uninitialized_scan_outputs() if name != base else contextlib.nullcontext()
        kept = []  # capacity variants: the share of pairs their capacity keeps, on the timed step's inputs
        trained = (lambda p, b: kept.append(capacity_kept_share(cfg, p, b))) if base in CAPACITY_VARIANTS else None
        try:
            with scope:
                ms, traj, peak = _common.train_variant(losses[base], params0, list(data), opt, trained=trained)
        except Exception as e:  # noqa: BLE001 - one failing variant must not cost the others
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append({"case": "tiny" if args.tiny else f"qwen3-30b-a3b x{cfg.layers} layers", "impl": name,
                         "pass": "train_step", "groups": "routed", "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        share = kept[0][0] if kept else 1.0
        flops = model_flops(cfg, share)
        rows.append({"case": f"qwen3-30b-a3b x{cfg.layers} layers" if not args.tiny else "tiny", "impl": name,
                     "pass": "train_step", "groups": "routed", "ms": ms, "tflops": flops / ms / 1e9,
                     "tokens_per_s": cfg.tokens / ms * 1e3, "peak_bytes": peak, "loss_first": traj[0],
                     "loss_last": traj[-1], "steps": args.steps, "pairs_kept": round(share, 4),
                     **({"pairs_kept_per_layer": kept[0][1]} if kept else {})})
        print(f"{name:>15}: {ms:9.2f} ms/step  {flops / ms / 1e9:8.2f} model TFLOP/s  "
              f"{cfg.tokens / ms * 1e3:10.0f} tok/s  loss {traj[0]:.4f} -> {traj[-1]:.4f}"
              + (f"  (capacity keeps {share:.1%} of the routed pairs: {kept[0][1]})" if kept else ""), flush=True)
        save(args, cfg, dtype, rows, argv, done=False)  # a run stopped by its time limit keeps what it has
    print(f"wrote {save(args, cfg, dtype, rows, argv, done=True)}")


def save(args, cfg, dtype, rows, argv, done: bool):
    meta = _common.metadata(sys.argv if argv is None else ["benchmarks/train_step.py"] + argv)
    meta["config"] = dataclasses.asdict(cfg)
    meta["dtype"] = str(jnp.dtype(dtype))
    meta["attention"] = ATTENTION_IMPL[0]
    if not done:
        meta["partial"] = "the run was still going when this was written (variants so far only)"
    name = args.out or f"train_step_{_common.machine_tag()}" + ("_tiny" if args.tiny else "")
    return _common.write_results(name, meta,
                                 rows, "tflops", "Training step (model TFLOP/s)")


if __name__ == "__main__":
    main()
