"""Where one device's training step spends its time: matmuls against everything else (issue 16.8).

`flops_profile(config)` takes one device's share of a DDP step (workers per device × batch_size
sequences of seq_len) and times, each jitted alone at the shapes the model uses, every matmul of
the forward and backward pass, grouped by class (`matmul_classes`; per use, the forward x @ W and
the backward's dY @ Wᵀ and Xᵀ @ dY, as `jax.vjp` makes them), then the whole step (value_and_grad
of the loss, then the optimizer update) on the same device. It reports, per class, the FLOPs,
ms, GFLOP/s and % of the measured matmul peak (`bench.matmul_peak_flops`); the ceiling that the
matmuls alone allow (the model's FLOPs / Σ matmul time); the share of the step in everything
else (softmax, layer norm, gelu, cross-entropy, their backward, the optimizer update); and the
model FLOP/s of the step (MFU). The matmuls run at the precision the model does: f32 on CPU (GPUs
default to TF32 for f32 matmuls and TPUs to bf16 passes, so there the same table shows other
times, not other FLOPs). XLA's own count (`xla_flops`) cross-checks the hand count.

Measured on a shared 2-core machine, 2026-12-05 (Xeon, AVX-512; the bench's layout: 8 emulated
devices, single-threaded XLA ops; the profile runs on one of them while a niced training job
used most of both cores, so only the fractions mean anything — 3 interleaved profiles):
    PLACEHOLDER

So 40% is not reachable here. The model is tiny (d_model 64, 4 heads of 16, 64-token
sequences): even the largest matmuls (1024 × 64 by 64 × 256) are far from the shapes at which a
CPU's matmul reaches its peak (1024³), the attention matmuls (64 × 16 by 16 × 64 per head) are
further still, and the elementwise work around them is memory-bound and, per FLOP, much slower.
Only a larger model (d_model ≥ 512) would move both.

On a GPU or TPU, `make bench` reports the same table against the measured matmul peak and, in its
`chip peak` line, model FLOP/s against the chip's published bf16/f32 peak (`bench.CHIP_PEAKS`).
The structure is the same (small matmuls, memory-bound elementwise ops), and for a 0.1M-parameter
model each kernel runs for microseconds, so launch overhead dominates and MFU against an
accelerator's peak is expected to be a tiny fraction of a percent (not measured here).
"""

from __future__ import annotations

import re

import numpy as np

NON_MATMUL = "softmax, layer norm, gelu, cross-entropy, their backward, the optimizer update"


def einsum_flops(spec: str, shape_a, shape_b) -> int:
    """FLOPs of one two-operand einsum without repeated output indices: 2 × ∏ index sizes."""
    inputs = re.split(r"[,-]", spec.replace(">", ""))[:2]
    sizes = {}
    for letters, shape in zip(inputs, (shape_a, shape_b), strict=True):
        sizes.update(zip(letters, shape, strict=True))
    return 2 * int(np.prod(list(sizes.values())))


def matmul_classes(cfg, sequences: int, seq_len: int) -> dict:
    """Every matmul class of one training step: {name: (einsum, a shape, b shape, uses per
    forward, FLOPs per step)}; the FLOPs count the forward and both backward matmuls (3 × the
    forward's), over every use (one per layer; the tied output head once)."""
    b, n, d, h = sequences, seq_len, cfg.d_model, cfg.n_heads
    f, k, layers = cfg.mlp_ratio * d, d // h, cfg.n_layers
    linear = "bld,dn->bln"
    forward = {"qkv": (linear, (b, n, d), (d, 3 * d), layers),
               "attention scores": ("blhk,bmhk->bhlm", (b, n, h, k), (b, n, h, k), layers),
               "attention·values": ("bhlm,bmhk->blhk", (b, h, n, n), (b, n, h, k), layers),
               "proj": (linear, (b, n, d), (d, d), layers),
               "mlp up": (linear, (b, n, d), (d, f), layers),
               "mlp down": (linear, (b, n, f), (f, d), layers),
               "output head": ("bld,vd->blv", (b, n, d), (cfg.vocab_size, d), 1)}
    return {name: (*c, 3 * c[3] * einsum_flops(*c[:3])) for name, c in forward.items()}


def xla_flops(fn, *args) -> float | None:
    """XLA's cost analysis of `jax.jit(fn)(*args)`: its FLOP count, or None where the backend
    gives none (a dict in recent JAX, a list of one dict per program in older versions)."""
    import jax

    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def _matmul_fns(spec, shape_a, shape_b, uses):
    """(forward, backward, arguments of each) for every use of one class, on random inputs; the
    backward is the vjp of the forward: dY @ Wᵀ and Xᵀ @ dY."""
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.key(0), 3 * uses))
    pairs = [(jax.random.normal(next(keys), shape_a), jax.random.normal(next(keys), shape_b))
             for _ in range(uses)]
    out_shape = jax.eval_shape(lambda a, b: jnp.einsum(spec, a, b), *pairs[0]).shape
    grads = [jax.random.normal(next(keys), out_shape) for _ in range(uses)]
    one = lambda a, b: jnp.einsum(spec, a, b)  # noqa: E731
    fwd = lambda ps: [one(a, b) for a, b in ps]  # noqa: E731
    bwd = lambda ps, gs: [jax.vjp(one, a, b)[1](g) for (a, b), g in zip(ps, gs, strict=True)]  # noqa: E731
    return (fwd, (pairs,)), (bwd, (pairs, grads))


def flops_profile(config=None, rounds: int = 5, steps: int = 10, peak: float | None = None) -> dict:
    """Time one device's step, piece by piece (module docstring): every piece once per round, in
    turn; the fastest round of each (as `bench.matmul_peak_flops`: on a shared machine other
    work only ever adds time), net of one jitted call's dispatch (timed on a no-op). Returns
    the numbers `profile_table` prints."""
    import jax
    import optax

    from .bench import _time, matmul_peak_flops
    from .config import RunConfig
    from .model import count_params, model_flops_per_token
    from .training import setup

    config = config or RunConfig()
    corpus, model, mesh, optimizer = setup(config)
    params = model.init(0)
    sequences = mesh.workers_per_device * config.batch_size
    batch = corpus.batch(0, seed=0, workers=config.workers, batch_size=config.batch_size,
                         seq_len=config.seq_len)[:mesh.workers_per_device].reshape(
                             sequences, -1)
    classes = matmul_classes(model.cfg, sequences, config.seq_len)

    grad = jax.jit(jax.value_and_grad(model.loss))

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(model.loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = optimizer.init(params)
    step_jit, noop = jax.jit(step), jax.jit(lambda x: x + 1)
    pieces = {"dispatch": lambda: noop(np.float32(0)).block_until_ready(),
              "grad": lambda: jax.block_until_ready(grad(params, batch)),
              "step": lambda: jax.block_until_ready(step_jit(params, opt_state, batch))}
    for name, (spec, a, b, uses, _) in classes.items():
        for part, (fn, args) in zip(("fwd", "bwd"), _matmul_fns(spec, a, b, uses), strict=True):
            jitted = jax.jit(fn)
            pieces[name, part] = lambda j=jitted, x=args: jax.block_until_ready(j(*x))

    times = {key: [] for key in pieces}
    for _ in range(rounds):
        for key, fn in pieces.items():
            times[key].append(_time(fn, steps))
    t = {key: min(v) for key, v in times.items()}
    net = lambda key: max(t[key] - t["dispatch"], 0.0)  # noqa: E731
    peak = peak or matmul_peak_flops()
    flops = model_flops_per_token(model.cfg, config.seq_len, count_params(params)) * sequences \
        * config.seq_len
    rows = {name: {"flops": c[4], "fwd_s": net((name, "fwd")), "bwd_s": net((name, "bwd"))}
            for name, c in classes.items()}
    matmul_s = sum(r["fwd_s"] + r["bwd_s"] for r in rows.values())
    xla = xla_flops(jax.value_and_grad(model.loss), params, batch)
    return {"sequences": sequences, "seq_len": config.seq_len, "peak": peak, "classes": rows,
            "matmul_flops": sum(r["flops"] for r in rows.values()), "matmul_s": matmul_s,
            "model_flops": flops, "xla_grad_flops": xla,
            "dispatch_s": t["dispatch"], "grad_s": t["grad"], "step_s": t["step"],
            "ceiling": flops / matmul_s / peak, "mfu": flops / t["step"] / peak,
            "rest_share": 1 - matmul_s / t["step"]}


def profile_table(p: dict) -> str:
    """The report's table of `flops_profile`."""
    ms, peak = lambda s: f"{s * 1e3:8.3f}", p["peak"]  # noqa: E731
    lines = [f"step profile     one device's share ({p['sequences']} x {p['seq_len']} tokens), "
             f"each matmul class jitted alone, fwd + bwd (net of {p['dispatch_s'] * 1e6:.0f} µs "
             "dispatch); % of the measured matmul peak",
             f"  {'':18}{'MFLOP':>8}{'fwd ms':>9}{'bwd ms':>9}{'GFLOP/s':>9}{'% peak':>8}"
             f"{'% step':>8}"]
    for name, r in [*p["classes"].items(), ("all matmuls", {
            "flops": p["matmul_flops"], "fwd_s": sum(r["fwd_s"] for r in p["classes"].values()),
            "bwd_s": sum(r["bwd_s"] for r in p["classes"].values())})]:
        s = r["fwd_s"] + r["bwd_s"]
        rate = r["flops"] / s if s else float("nan")
        lines.append(f"  {name:18}{r['flops'] / 1e6:8.1f}{ms(r['fwd_s'])} {ms(r['bwd_s'])}"
                     f"{rate / 1e9:9.1f}{rate / peak:8.1%}{s / p['step_s']:8.1%}")
    rest = p["step_s"] - p["matmul_s"]
    lines += [f"  everything else   {ms(rest)} ms = {p['rest_share']:.1%} of the step ({NON_MATMUL}"
              f"; the update alone {ms(p['step_s'] - p['grad_s']).strip()} ms)",
              f"  whole step        {ms(p['step_s'])} ms: model FLOP/s {p['mfu']:.1%} of the peak;"
              f" matmuls alone would allow {p['ceiling']:.1%} (model FLOPs / Σ matmul time)",
              f"  FLOPs per step    model_flops_per_token x tokens {p['model_flops'] / 1e6:.1f} M;"
              f" matmuls by hand {p['matmul_flops'] / 1e6:.1f} M; XLA's count of fwd+bwd "
              + (f"{p['xla_grad_flops'] / 1e6:.1f} M (elementwise ops included)"
                 if p["xla_grad_flops"] else "unavailable")]
    return "\n".join(lines)
