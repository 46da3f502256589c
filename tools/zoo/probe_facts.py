"""Probes of the pass's sparsity facts with gates that look sparse but are not (or are, in a form it may reject).

Each probe is a dense all-experts MoE whose [T, E] gate is built one way; the pass may rewrite it only if the
result is exact. Prints, per probe, the sites `explain` found and the error of `optimize(fn)` against `fn`
(forward and gradients); WRONG marks an error over 1e-5 where the original is finite. Session 30 found with
these that masked logits squashed by tanh / sign, or brought back to moderate values (-1e4 / 1e4, -1e4 + 9990),
were rewritten as k-sparse (benchmarks/NOTES.md, session 30): run it at 70cb0db to see the old answers.

    python tools/zoo/probe_facts.py
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

import jax_moe_ffi as jmf
from jax_moe_ffi import models as M

T, D, F, E = 24, 16, 32, 8


def _body(p, x, gate):
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x, p["w_gate"])) * jnp.einsum("td,edf->tef", x, p["w_up"])
    return jnp.einsum("ted,te->td", jnp.einsum("tef,efd->ted", h, p["w_down"]), gate)


def _topk(p, x, k=2):
    probs = jax.nn.softmax(x @ p["router"], -1)
    w, ids = jax.lax.top_k(probs, k)
    return probs, w, ids


def _gate(p, x):
    probs, w, ids = _topk(p, x)
    return jnp.sum(jax.nn.one_hot(ids, E) * w[..., None], 1), probs


def _masked(fill, post):
    """softmax(post(where(chosen, logits, fill)))."""
    def f(p, x):
        logits = x @ p["router"]
        chosen = jnp.sum(jax.nn.one_hot(jax.lax.top_k(logits, 2)[1], E), 1) > 0
        return _body(p, x, jax.nn.softmax(post(jnp.where(chosen, logits, fill)), -1))
    return f


def _ids_gate(make_ids):
    def f(p, x):
        probs, w, ids = _topk(p, x)
        return _body(p, x, jnp.sum(jax.nn.one_hot(make_ids(ids), E) * w[..., None], 1))
    return f


def _scatter_dup(op):
    def f(p, x):
        _, w, ids = _topk(p, x)
        ids2, w2 = jnp.concatenate([ids, ids[:, :1]], 1), jnp.concatenate([w, 3 * w[:, :1]], 1)
        return _body(p, x, getattr(jnp.zeros((T, E)).at[jnp.arange(T)[:, None], ids2], op)(w2))
    return f


PROBES = {
    # masked logits through other functions (the session-30 soundness fix)
    "masked_tanh": _masked(-jnp.inf, jnp.tanh),
    "masked_sign": _masked(-jnp.inf, jnp.sign),
    "masked_fill_-1e4_div_1e4": _masked(-1e4, lambda v: v / 1e4),
    "masked_fill_-1e4_div_100": _masked(-1e4, lambda v: v / 100.0),
    "masked_fill_-1e4_add_9990": _masked(-1e4, lambda v: v + 9990.0),
    "masked_fill_-1e9_temperature_0.7": _masked(-1e9, lambda v: v / 0.7),  # sparse: may be rewritten
    "masked_fill_-1e9_sub_5": _masked(-1e9, lambda v: v - 5.0),  # sparse: may be rewritten
    "masked_max_-5": _masked(-jnp.inf, lambda v: jnp.maximum(v, -5.0)),
    # index arrays that are not one top_k
    "ids_first_choice_only": _ids_gate(lambda ids: ids[:, :1].repeat(2, 1)),
    "ids_duplicated_take": _ids_gate(lambda ids: jnp.take(ids, jnp.array([0, 0]), axis=1)),
    "ids_shifted": _ids_gate(lambda ids: (ids + 1) % E),
    "ids_tokens_reversed": _ids_gate(lambda ids: ids[::-1]),
    "ids_tokens_rolled": _ids_gate(lambda ids: jnp.roll(ids, 1, axis=0)),
    "ids_sorted": _ids_gate(lambda ids: jnp.sort(ids, -1)),  # same set per token: may be rewritten
    "scatter_add_duplicated_choice": _scatter_dup("add"),
    "scatter_set_duplicated_choice": _scatter_dup("set"),
    # gates transformed after the top_k
    "gate_at_mixing_matrix": lambda p, x: _body(p, x, _gate(p, x)[0] @ p["mix"]),
    "gate_plus_1pct_probs": lambda p, x: _body(p, x, _gate(p, x)[0] + 0.01 * _gate(p, x)[1]),
    "where_gate_ge_0": lambda p, x: _body(p, x, jnp.where(_gate(p, x)[0] >= 0, _gate(p, x)[1], 0.0)),
    "gate_max_eps": lambda p, x: _body(p, x, jnp.maximum(_gate(p, x)[0], 1e-3)),
    "gate_cos": lambda p, x: _body(p, x, jnp.cos(_gate(p, x)[0])),
    "gate_pow_0": lambda p, x: _body(p, x, _gate(p, x)[0] ** 0),
    "gate_roll_experts": lambda p, x: _body(p, x, jnp.roll(_gate(p, x)[0], 1, axis=1)),
    "gate_cumsum_experts": lambda p, x: _body(p, x, jnp.cumsum(_gate(p, x)[0], axis=1)),
    "gate_plus_reversed_tokens": lambda p, x: _body(p, x, _gate(p, x)[0] + _gate(p, x)[0][::-1]),
    "gate_or_threshold": lambda p, x: _body(p, x, jnp.where((_gate(p, x)[0] > 0) | (_gate(p, x)[1] > 0.3),
                                                            _gate(p, x)[1], 0.0)),
}


def _err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


def main():
    p = M.init_moe_params(jax.random.key(0), D, F, E)
    p["mix"] = jax.random.normal(jax.random.key(5), (E, E))
    x = jax.random.normal(jax.random.key(1), (T, D))
    print(f"jax {jax.__version__}; T={T} D={D} F={F} E={E}")
    wrong = 0
    for name, f in PROBES.items():
        sites = [s.family for s in jmf.explain(f, p, x).sites]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y0, y1 = jax.jit(f)(p, x), jax.jit(jmf.optimize(f))(p, x)
            loss = lambda g: (lambda q: jnp.sum(jnp.sin(g(q, x))))
            g0, g1 = jax.grad(loss(f))(p), jax.grad(loss(jmf.optimize(f)))(p)
        finite = bool(np.all(np.isfinite(np.asarray(y0))))
        fe = _err(y1, y0)
        ge = max(_err(a, b) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)))
        bad = finite and max(fe, ge) > 1e-5
        wrong += bad
        print(f"{name:36s} sites={str(sites):12s} fwd {fe:.1e} grad {ge:.1e}"
              + ("  WRONG" if bad else "") + ("" if finite else "  (the original is not finite)"))
    print(f"{wrong} wrong of {len(PROBES)}")


if __name__ == "__main__":
    main()
