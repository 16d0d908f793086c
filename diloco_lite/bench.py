"""`python -m diloco_lite bench`: speed measured against a minimal hand-written JAX loop.

Prints ratios (library / hand-written, target ≤ 1.10 for DDP; DiLoCo inner step / DDP step of
the same per-worker batch, target ≤ 1.05), tokens/s, achieved model FLOP/s as a fraction of this
machine's measured matmul peak, the cost of one DiLoCo sync, and the bandwidth sweep's time.
Timings alternate A/B over several rounds and report medians (machines here are noisy).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

ROUNDS, STEPS = 5, 10

# Published dense peak FLOP/s of one JAX device, (bf16, f32), for the chips Colab and the
# clouds lend, keyed on a substring of `jax.devices()[0].device_kind` (first match wins). A
# TPU v2/v3 device is one core (half a chip). None: the chip has no such fast path (TPUs run
# f32 matmuls as bf16 passes; the T4 has fp16, not bf16, tensor cores: its fp16 peak is shown).
CHIP_PEAKS = (
    ("T4", 65e12, 8.1e12),
    ("L4", 121e12, 30.3e12),
    ("A100", 312e12, 19.5e12),
    ("H100", 989e12, 67e12),
    ("H200", 989e12, 67e12),
    ("TPU v2", 22.5e12, None),
    ("TPU v3", 61.5e12, None),
    ("TPU v4", 275e12, None),
    ("TPU v5 lite", 197e12, None),
    ("TPU v5", 459e12, None),
    ("TPU v6 lite", 918e12, None),
)


def chip_peaks(device_kind: str) -> tuple[float | None, float | None] | None:
    """(bf16, f32) peak FLOP/s of one device of this kind, or None for an unlisted chip."""
    for key, bf16, f32 in CHIP_PEAKS:
        if key.lower() in device_kind.lower():
            return bf16, f32
    return None


def _time(fn, steps: int = STEPS) -> float:
    """Seconds per call of `fn()` (which must block until its result is ready)."""
    fn()  # compile / warm up
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps


def _paired(a, b, rounds: int = ROUNDS) -> tuple[float, float, float]:
    """Median seconds of a and b, and the median of the per-round ratios a/b."""
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(_time(a))
        tb.append(_time(b))
    return statistics.median(ta), statistics.median(tb), statistics.median(
        x / y for x, y in zip(ta, tb, strict=True))


def matmul_peak_flops(n: int = 1024) -> float:
    """Measured f32 matmul FLOP/s of one JAX device (XLA's CPU matmul uses every core)."""
    import jax

    x = jax.random.normal(jax.random.key(0), (n, n))
    f = jax.jit(lambda a: a @ a)
    seconds = min(_time(lambda: f(x).block_until_ready(), 5) for _ in range(3))
    return 2 * n**3 / seconds


def hand_written_ddp_step(model, mesh, optimizer):
    """The minimal DDP step one would write by hand: grad, pmean, update, in one shard_map."""
    import jax
    import optax

    def step(params, opt_state, batch_mxBxL1):
        loss, grads = jax.value_and_grad(model.loss)(params, batch_mxBxL1.reshape(
            -1, batch_mxBxL1.shape[-1]))
        loss, grads = jax.lax.pmean((loss, grads), "workers")
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(jax.shard_map(step, mesh=mesh.mesh, in_specs=(jax.P(), jax.P(),
                                                                 jax.P("workers")),
                                 out_specs=(jax.P(), jax.P(), jax.P()), check_vma=False))


def bench(config=None) -> dict:
    """Run every measurement and print a report; returns the numbers."""
    import jax

    from . import bandwidth
    from .algorithms.ddp import DDPDriver
    from .algorithms.diloco import DiLoCoDriver
    from .config import DiLoCo, RunConfig
    from .model import count_params, model_flops_per_token
    from .outer import take_leaves
    from .training import setup

    config = config or RunConfig()
    corpus, model, mesh, optimizer = setup(config)
    params = model.init(0)
    batch = corpus.batch(0, seed=0, workers=config.workers, batch_size=config.batch_size,
                         seq_len=config.seq_len)[None]
    out = {"devices": mesh.devices, "workers": config.workers}

    # 1. DDP: library step vs the hand-written one, same model, batch, optimizer.
    ddp = DDPDriver(model, mesh, optimizer)
    state = ddp.init(params)
    placed = ddp.place_batches(batch)
    hand = hand_written_ddp_step(model, mesh, optimizer)
    lib_fn = lambda: jax.block_until_ready(ddp.step_fn(*state, placed[0]))  # noqa: E731
    hand_fn = lambda: jax.block_until_ready(hand(*state, placed[0]))  # noqa: E731
    t_lib, t_hand, ratio = _paired(lib_fn, hand_fn)
    tokens = config.tokens_per_step
    flops = model_flops_per_token(model.cfg, config.seq_len, count_params(params)) * tokens
    peak = matmul_peak_flops()
    out.update(ddp_step_s=t_lib, hand_step_s=t_hand, ddp_vs_hand=ratio,
               tokens_per_s=tokens / t_lib, model_flops_per_s=flops / t_lib,
               matmul_peak_flops_per_s=peak, mfu=flops / t_lib / peak,
               device_kind=jax.devices()[0].device_kind)

    # 2. DiLoCo: one inner step (inside the H-step scan) vs one DDP step; one sync.
    h = 10
    cfg = dataclasses.replace(config, algorithm=DiLoCo(inner_steps=h), steps=10 * h)
    diloco = DiLoCoDriver(cfg.algorithm, model, mesh, optimizer, total_steps=cfg.steps)
    dstate = diloco.init(params)
    batches = diloco.place_batches(np.repeat(batch, h, axis=0))
    inner = lambda: jax.block_until_ready(  # noqa: E731
        diloco.inner(dstate["local"], dstate["inner"], batches))
    t_inner, t_ddp, inner_ratio = _paired(lambda: inner(), lib_fn, rounds=3)
    every = diloco.frags[0]  # DiLoCo: one fragment holding every tensor
    g, loc = take_leaves(dstate["global"], every), take_leaves(dstate["local"], every)
    sync = lambda: jax.block_until_ready(diloco.sync(g, dstate["outer"][0], loc))  # noqa: E731
    t_sync = statistics.median(_time(sync) for _ in range(3))
    out.update(diloco_inner_step_s=t_inner / h, diloco_inner_vs_ddp=inner_ratio / h,
               diloco_sync_s=t_sync, diloco_sync_vs_ddp_step=t_sync / t_ddp)

    # 3. The bandwidth simulator's full sweep.
    out.update({f"bandwidth_{k}": v for k, v in bandwidth.bench_sweep().items()})
    _report(out)
    return out


def _report(o: dict) -> None:
    print(f"diloco_lite bench — {o['workers']} workers on {o['devices']} devices\n")
    print(f"DDP step         library {o['ddp_step_s'] * 1e3:8.2f} ms   hand-written "
          f"{o['hand_step_s'] * 1e3:8.2f} ms   ratio {o['ddp_vs_hand']:.3f}  (target <= 1.10)")
    print(f"throughput       {o['tokens_per_s']:,.0f} tokens/s   "
          f"{o['model_flops_per_s'] / 1e9:.2f} GFLOP/s model = {o['mfu']:.1%} of the measured "
          f"matmul peak ({o['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s)")
    print(chip_line(o["device_kind"], o["devices"], o["model_flops_per_s"]))
    print(f"DiLoCo inner     {o['diloco_inner_step_s'] * 1e3:8.2f} ms/step   ratio to a DDP step "
          f"{o['diloco_inner_vs_ddp']:.3f}  (target <= 1.05)")
    print(f"DiLoCo sync      {o['diloco_sync_s'] * 1e3:8.2f} ms   = "
          f"{o['diloco_sync_vs_ddp_step']:.2f} DDP steps")
    print(f"bandwidth sweep  {o['bandwidth_sweep_s']:.3f} s for {o['bandwidth_cases']} cases")


def chip_line(device_kind: str, devices: int, model_flops_per_s: float) -> str:
    """Model FLOP/s against the published peak of the `devices` chips in use, when listed."""
    peaks = chip_peaks(device_kind)
    if peaks is None:
        return (f"chip peak       {device_kind}: not in bench.CHIP_PEAKS; the measured matmul "
                "peak above is the reference")
    parts = [f"{model_flops_per_s / (p * devices):.2%} of the {name} peak "
             f"({p * devices / 1e12:,.1f} TFLOP/s)"
             for name, p in zip(("bf16", "f32"), peaks, strict=True) if p]
    return f"chip peak        {devices} x {device_kind}: " + ", ".join(parts)
