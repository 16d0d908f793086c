"""Where a device's training step spends its time: matmuls against the rest (issue 16.8).

`flops_profile(config)` takes a device's share of a DDP step (workers per device × batch_size
sequences of seq_len) and times, each jitted alone at the shapes the model uses, every matmul of
the forward and backward pass, grouped by class (`matmul_classes`; per use the forward A @ B,
and the backward's dA = dY @ Bᵀ and dB = Aᵀ @ dY as `jax.vjp` makes them, for a linear layer
A its input and B its weight), then the whole step (value_and_grad of the loss, the optimizer
update). Each piece runs on every device at once, each device on its own copy, as a DDP step
runs (on a CPU the emulated devices share the cores; on one accelerator this is that chip
alone). It reports per class the FLOPs, the ms, the FLOP/s and the % of the matmul peak (an
n³ f32 matmul on every device, as `bench.matmul_peak_flops`, timed in the same rounds); the
ceiling the matmuls alone allow (model FLOPs / Σ matmul time); the share of the step in
everything else (`NON_MATMUL`); and the step's model FLOP/s against the peak (MFU, computed as
`bench` does, with `model.model_flops_per_token`). XLA's own count (`xla_flops`) cross-checks
the hand count. The matmuls run at the model's precision, the backend's default: f32 on CPU;
GPUs run f32 matmuls as TF32 and TPUs as bf16 passes by default, which changes the times there,
not the FLOPs.

Measured on a shared 2-core machine, 2026-12-05 (Xeon, AVX-512; `make bench`'s layout: 8
emulated devices, 16 × 64 tokens each; a niced training job of higher priority used most of both
cores, so the absolute times are meaningless and even the fractions noisy; 4 profiles, 5
interleaved rounds each), % of the matmul peak (136-139 GFLOP/s here under that load):
    qkv 41-44%, proj 42-50%, mlp up 40-73%, mlp down 45-82%, output head 54-71%,
    attention scores 16-18%, attention·values 16-17%; all matmuls 35-46%
    the matmuls alone would allow (model FLOPs / Σ matmul time)   36-48%
    everything else (elementwise ops, their backward, AdamW)      23-44% of the step
    model FLOP/s of the whole step                                27-29% (as `bench` reports)
    every matmul at the peak, the rest as measured                39-57%
The ceiling and the rest's share move together (time noise gave the matmuls, it took from the rest);
the step's MFU is the stable number. In every profile the weight gradients (dB) of the linear
layers took 2.6-3.9× their forward's time for the same FLOPs: XLA:CPU emits them as a dot with a
transposed left operand, outside the fast matmul fusion the other dots use (in the compiled
step's HLO too). Computing them in the other operand order (a `jax.custom_vjp` on the linear
layers' matmul, tried apart, not adopted: it changes float rounding, ≤1e-7 in the gradients)
made the fwd+bwd 0.90× as long (one device alone, 10 paired rounds), which would put the MFU
near 30-32%: still not 40%.

So 40% is not reachable on this CPU with this model: its matmuls are small (d_model 64: 1024
tokens per device by weights of 64 × 64 to 64 × 256; attention per head 64 × 16 by 16 × 64, at a
sixth of the peak), so even with no other work the step would run at about 36-48% of the peak,
and the memory-bound elementwise work around them (a quarter to two fifths of the step) brings
that to 27-29%. Only matmuls at the peak, which these shapes do not reach on this CPU, would
leave room for 40%. Both would improve with width (matmul FLOPs grow as d_model², the elementwise
work as d_model), but the bench model is the protocol's.

On a GPU or TPU `make bench` prints the same table, against a peak measured there (TF32 or bf16
passes, see above), and its `chip peak` line gives model FLOP/s against the chip's published
bf16/f32 peak (`bench.CHIP_PEAKS`). The structure is the same (small matmuls, memory-bound
elementwise ops), only more so: a 0.1M-parameter model's kernels run for microseconds each, so
launch overhead dominates and MFU against an accelerator's peak is expected to be tiny (not
measured: no accelerator was available).
"""

from __future__ import annotations

import re
import statistics
import time

import numpy as np

NON_MATMUL = "softmax, layer norm, gelu, cross-entropy, their backward, the optimizer update"


def seconds_per_call(fn, steps: int) -> float:
    """Seconds per call of `fn()` (which must block until its result is ready), after one
    call that compiles and warms up."""
    fn()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps


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


PARTS = ("fwd", "dA", "dB")  # A @ B, then the backward's gradients of A and of B


def _matmul_fns(spec, shape_a, shape_b, uses):
    """{part: (function, arguments)} for every use of one class, on random inputs: the forward
    A @ B, and the backward's dA = dY @ Bᵀ and dB = Aᵀ @ dY as `jax.vjp` makes them (for a
    linear layer A is its input, B its weight)."""
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.key(0), 3 * uses))
    pairs = [(jax.random.normal(next(keys), shape_a), jax.random.normal(next(keys), shape_b))
             for _ in range(uses)]
    one = lambda a, b: jnp.einsum(spec, a, b)  # noqa: E731
    grads = [jax.random.normal(next(keys), jax.eval_shape(one, *pairs[0]).shape)
             for _ in range(uses)]
    grad = lambda i: lambda ps, gs: [jax.vjp(one, a, b)[1](g)[i]  # noqa: E731
                                     for (a, b), g in zip(ps, gs, strict=True)]
    return {"fwd": (lambda ps: [one(a, b) for a, b in ps], (pairs,)),
            "dA": (grad(0), (pairs, grads)), "dB": (grad(1), (pairs, grads))}


def _everywhere(fn, args, mesh):
    """A call of `fn(*args)` on every device of `mesh` at once, each on its own copy of `args`
    (as a DDP step runs: every device busy with its share), blocking until all are done."""
    import jax

    copies = mesh.put(jax.tree.map(lambda x: np.broadcast_to(
        np.asarray(x), (mesh.devices, *np.shape(x))), args), "workers")
    body = lambda *a: jax.tree.map(lambda y: y[None], fn(*jax.tree.map(lambda x: x[0], a)))  # noqa: E731
    f = jax.jit(jax.shard_map(body, mesh=mesh.mesh, in_specs=jax.P("workers"),
                              out_specs=jax.P("workers"), check_vma=False))
    return lambda: jax.block_until_ready(f(*copies))


def flops_profile(config=None, rounds: int = 5, steps: int = 10, peak_n: int = 1024) -> dict:
    """Time one device's share of a step, piece by piece (module docstring), and the matmul peak
    as `bench.matmul_peak_flops` does (an n³ f32 matmul), each on every device at once: every
    piece once per round, in turn, against the peak matmul of its round; each net of one call's
    dispatch (timed on a no-op). FLOP/s are of all devices together, against the peak of all
    devices together. Returns the numbers `profile_table` prints."""
    import jax
    import optax

    from .config import RunConfig
    from .model import count_params, model_flops_per_token
    from .training import setup

    config = config or RunConfig()
    corpus, model, mesh, optimizer = setup(config)
    params, per_device = model.init(0), mesh.workers_per_device
    sequences = per_device * config.batch_size
    batch = corpus.batch(0, seed=0, workers=config.workers, batch_size=config.batch_size,
                         seq_len=config.seq_len)[:per_device].reshape(sequences, -1)
    classes = matmul_classes(model.cfg, sequences, config.seq_len)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(model.loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    calls = {"dispatch": (lambda x: x + 1, (np.float32(0),)),
             "peak": (lambda a: a @ a, (np.ones((peak_n, peak_n), np.float32),)),
             "grad": (jax.value_and_grad(model.loss), (params, batch)),
             "step": (step, (params, optimizer.init(params), batch))}
    for name, (spec, a, b, uses, _) in classes.items():
        calls.update({(name, part): fn for part, fn in _matmul_fns(spec, a, b, uses).items()})
    pieces = {key: _everywhere(fn, args, mesh) for key, (fn, args) in calls.items()}

    times = {key: [] for key in pieces}
    for _ in range(rounds):
        for key, fn in pieces.items():
            times[key].append(seconds_per_call(fn, steps))
    # each piece as a multiple of the peak matmul of its round (a change of load between rounds
    # cancels), median over the rounds, times the median peak matmul
    unit = statistics.median(times["peak"])
    t = {key: unit * statistics.median(x / p for x, p in zip(v, times["peak"], strict=True))
         for key, v in times.items()}
    net = lambda key: max(t[key] - t["dispatch"], 0.0)  # noqa: E731
    # FLOP counts: per device; FLOP/s, the peak included: of all devices together
    peak, devices = mesh.devices * 2 * peak_n**3 / net("peak"), mesh.devices
    flops = model_flops_per_token(model.cfg, config.seq_len, count_params(params)) * sequences \
        * config.seq_len
    rows = {name: {"flops": c[4], **{part: net((name, part)) for part in PARTS}}
            for name, c in classes.items()}
    matmul_s = sum(r[part] for r in rows.values() for part in PARTS)
    matmul_flops = sum(r["flops"] for r in rows.values())
    return {"sequences": sequences, "seq_len": config.seq_len, "devices": devices, "peak": peak,
            "classes": rows, "matmul_flops": matmul_flops, "matmul_s": matmul_s,
            "model_flops": flops,
            "xla_grad_flops": xla_flops(jax.value_and_grad(model.loss), params, batch),
            "dispatch_s": t["dispatch"], "grad_s": t["grad"], "step_s": t["step"],
            "ceiling": devices * flops / matmul_s / peak,
            "mfu": devices * flops / t["step"] / peak, "rest_share": 1 - matmul_s / t["step"],
            # every matmul at the peak, everything else as measured
            "at_peak_bound": devices * flops / (t["step"] - matmul_s
                                                + devices * matmul_flops / peak) / peak}


def profile_table(p: dict) -> str:
    """The report's table of `flops_profile`."""
    ms = lambda s: f"{s * 1e3:8.3f}"  # noqa: E731
    total = {"flops": p["matmul_flops"],
             **{part: sum(r[part] for r in p["classes"].values()) for part in PARTS}}
    lines = [f"step profile     a device's share ({p['sequences']} x {p['seq_len']} tokens) on "
             f"each of the {p['devices']} devices at once; each matmul class jitted alone (A @ B, "
             f"then the backward's dA and dB), net of {p['dispatch_s'] * 1e6:.0f} µs dispatch; "
             f"MFLOP per device, GFLOP/s of all devices, against the matmul peak measured "
             f"alongside ({p['peak'] / 1e9:.1f} GFLOP/s)",
             f"  {'':18}{'MFLOP':>8}{'fwd ms':>9}{'dA ms':>9}{'dB ms':>9}{'GFLOP/s':>9}"
             f"{'% peak':>8}{'% step':>8}"]
    for name, r in [*p["classes"].items(), ("all matmuls", total)]:
        s = sum(r[part] for part in PARTS)
        rate = p["devices"] * r["flops"] / s if s else float("nan")
        lines.append(f"  {name:18}{r['flops'] / 1e6:8.1f}" + " ".join(ms(r[x]) for x in PARTS)
                     + f"{rate / 1e9:9.1f}{rate / p['peak']:8.1%}{s / p['step_s']:8.1%}")
    rest = p["step_s"] - p["matmul_s"]
    lines += [f"  everything else   {ms(rest)} ms = {p['rest_share']:.1%} of the step "
              f"({NON_MATMUL}; the update alone {ms(p['step_s'] - p['grad_s']).strip()} ms)",
              f"  whole step        {ms(p['step_s'])} ms: model FLOP/s {p['mfu']:.1%} of the "
              f"peak; the matmuls alone would allow {p['ceiling']:.1%} (model FLOPs / their "
              f"time); every matmul at the peak and the rest as is, {p['at_peak_bound']:.1%}",
              f"  FLOPs per step    model_flops_per_token x tokens {p['model_flops'] / 1e6:.1f} M;"
              f" matmuls by hand {p['matmul_flops'] / 1e6:.1f} M; XLA's count of fwd+bwd "
              + (f"{p['xla_grad_flops'] / 1e6:.1f} M (elementwise ops included)"
                 if p["xla_grad_flops"] else "unavailable")]
    return "\n".join(lines)
