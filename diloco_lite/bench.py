"""`python -m diloco_lite bench`: speed measured against a minimal hand-written JAX loop.

Prints ratios (targets in brackets): the library's DDP step / a hand-written one (≤ 1.05); a
DiLoCo inner step / a DDP step of the same per-worker batch (≤ 1.05); Decoupled DiLoCo's cost
per learner-step, every learner up and equally fast, events included / a DiLoCo inner step
(≤ 1.25); tokens/s and model FLOP/s against this machine's measured matmul peak; the cost of
one DiLoCo sync; a run's fixed cost (a first run, and a second that reuses its compiled
steps); the bandwidth sweep's time; where a device's step spends its time (`profile`: each
matmul class against the peak, and everything else). Timings alternate A/B over several rounds and
report medians (machines here are noisy). `--stress` runs several trainings at once (`stress`).
Last, end to end (`end_to_end_layouts`): the steady tokens/s (and whole-run seconds) of DDP,
DiLoCo H=50 and Decoupled DiLoCo H=50 runs as `train()` runs them, on 8 and on 2 emulated
devices, each layout in its own process.

Model FLOP/s, measured (issue 16.8; 2026-12-05, shared 2-core machine, noisy): 27-29% of the
measured matmul peak, and 40% is not reachable here. `profile.flops_profile` times each matmul
class of a device's share of the step: all of them together run at 35-46% of the peak (attention's
per-head 64 × 16 matmuls at 16-18%, the linear layers' weight gradients at a third of their
forward's speed), which alone caps the step at 36-48%; softmax, layer norm, gelu, cross-entropy,
their backward and AdamW take 23-44% of the step. On an accelerator the `chip peak` line and the
same table report against that chip; `profile`'s docstring has the details.

The layouts, measured (DiLoCo H=50, M=8, per 100 steps without evaluation, quiet machine): 2
devices 6.78 s, 8 devices 7.05-7.13 s, so the 2-device layout was not slower in steady state
here (issue 20's 98.5K vs 111.5K tokens/s did not reproduce); the whole-run advantage that
`__main__` quotes (14-39%, compilation included) was not re-measured under this load.

Where a DiLoCo run's time goes (M=8, H=50, 16 x 64 per worker, 600 steps, evaluation every 30)
— measured on a shared 2-core machine, 2026-12-04: each candidate toggled off in a throwaway
copy, A/B alternated per 100-step period, ratio of off/on (medians of 1-2 pairs; other jobs
loaded the machine during some pairs, so about ±5%):
    waiting for each block (block_until_ready)   8 devices 1.018, 2 devices 0.998: free
    single-threaded XLA ops flag (devices.py)     7.05 s (multi-threaded) vs 7.13 s: ~1%
    collective timeout flags                      thresholds only; not measured apart
    masked inner scan (jnp.where per step)        1.016: free (unmasked is not bit-identical)
    power-of-two scan pieces (32+16+2 per block)  0.98-1.00: ≤2% (one scan: bit-identical)
    events (send, close, arrive)                  0.95-1.06: within the noise
    evaluation (20 per run)                       1.059 for 4 per 100 steps: ~5% of a run
    host-side batch building                      0.035 s per 150 steps: 0.3%
    tqdm progress bar                             1.012 (one pair): ~1%
The code before all of these (commit d08f499), same machine, paired processes, 150-step runs:
86-87K tokens/s against today's 105-109K; the 148.8K of issue 20 was not a loss to them.

Toward issue 20's 160K tokens/s (`end_to_end_configs`' DiLoCo H=50 at 300-400 steps,
`steady_tokens_per_s` from step 100, in a process per setting with `$DILOCO_LITE_DEVICES` and
`XLA_FLAGS` set; quiet machine, 2026-12-05, ±4% between runs): by layout, 1 device (8 workers
vmapped, XLA's multi-threaded ops) 88.7K, 2 devices 115-123K, 8 devices 106K; on 2 devices, by
XLA flag: none 123K, --xla_cpu_use_onednn=true 126K, --xla_cpu_use_xnnpack=false 125K,
--xla_cpu_enable_concurrency_optimized_scheduler=true 124K, --xla_cpu_multi_thread_eigen=true
122K, --xla_cpu_experimental_ynn_fusion_type= (YNNPACK fusions off) 119K. None is more than the
noise; the last two also change the trained parameters' rounding. 160K would be about 41% of
the matmul peak, which the step's matmuls alone, at the speed XLA:CPU runs these shapes, allow
only with no time at all for the elementwise work (`profile`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from .profile import seconds_per_call

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
    return seconds_per_call(fn, steps)


def _paired(a, b, rounds: int = ROUNDS, steps: int = STEPS) -> tuple[float, float, float]:
    """Median seconds of a and b, and the median of the per-round ratios a/b."""
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(_time(a, steps))
        tb.append(_time(b, steps))
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


def plan_runner(config, corpus, model, mesh, optimizer, params):
    """`run()`: every block of `config`'s plan on the device, batches prepared beforehand (the
    cost of the method: inner steps and sync events, without evaluation or data loading)."""
    import jax

    from .algorithms import make_driver
    from .clock.plan import make_plan
    from .training import Watchdog, _block_batches, run_label

    driver = make_driver(config, model, mesh, optimizer, params)
    plan = make_plan(config, up_nbytes=driver.up_nbytes, down_nbytes=driver.down_nbytes,
                     sizes=driver.sizes, rejoin_nbytes=driver.rejoin_nbytes, eval_at=[])
    blocks = [(b, *_block_batches(corpus, config, b)) for b in plan.blocks]
    state0 = driver.init(params)

    def run():
        state = jax.tree.map(lambda x: x.copy(), state0)  # the inner call donates its buffers
        # watched only while it runs (a watchdog left running would end a notebook's kernel)
        with Watchdog(f"bench ({run_label(config)})") as watchdog:
            for block, batches, mask in blocks:
                state, _, _ = driver.run(state, block, batches, mask)
                # as `training.train` does: a block dispatched while the previous one's
                # collective still waits can deadlock XLA:CPU's device threads (`devices`;
                # seen here)
                jax.block_until_ready(state)
                watchdog.beat()

    return run


# End-to-end: runs as `train()` runs them (M = 8, 16 sequences × 64 characters per worker, the
# default model, evaluation on its default schedule), on the notebooks' layout (8 emulated
# devices, one worker each) and on `make reproduce`'s (2 devices, 4 workers vmapped on each).
# The device count is fixed when JAX starts, so each layout runs in its own process.
E2E_STEPS = 200  # about 4 minutes for both layouts on a quiet 2-core machine
E2E_LAYOUTS = (8, 2)


def end_to_end_configs(steps: int = E2E_STEPS) -> dict:
    """The three runs timed end to end, by name: DDP, DiLoCo H=50, and Decoupled DiLoCo H=50 as
    notebook 04's reference (P=4, τ=2, 4-bit, K=1, RDA)."""
    from .config import DDP, DecoupledDiLoCo, DiLoCo, RunConfig

    return {"DDP": RunConfig(algorithm=DDP(), steps=steps),
            "DiLoCo H=50": RunConfig(algorithm=DiLoCo(inner_steps=50), steps=steps),
            "Decoupled H=50": RunConfig(algorithm=DecoupledDiLoCo(
                inner_steps=50, fragments=4, overlap=2), steps=steps)}


def steady_tokens_per_s(history, tokens_per_step: int, from_step: int) -> float:
    """Tokens/s from the history's `wall_time_s`, between the first evaluation row at or after
    `from_step` and the row before the last: compilation left out (the inner scans, the sync's
    pieces and the evaluator compile in the first rows, the end-of-run flush in the last)."""
    rows = history[history["step"] >= from_step]
    first, last = rows.iloc[0], history.iloc[-2]
    return (last["step"] - first["step"]) * tokens_per_step / (last["wall_time_s"]
                                                                - first["wall_time_s"])


def end_to_end(steps: int = E2E_STEPS) -> dict:
    """In this process (its layout): each run of `end_to_end_configs`, once, timed whole
    (compilation included; later runs reuse the compiled pieces they share) and in steady state
    (`steady_tokens_per_s` from twice the sync interval on). Prints and returns
    {name: (steady tokens/s, whole-run seconds)}."""
    import json

    from .training import train

    out = {}
    for name, config in end_to_end_configs(steps).items():
        start = time.perf_counter()
        result = train(config, progress=False)
        whole = time.perf_counter() - start
        h = getattr(config.algorithm, "inner_steps", 1)
        out[name] = (steady_tokens_per_s(result.history, config.tokens_per_step, 2 * h), whole)
    print("end_to_end " + json.dumps(out), flush=True)
    return out


def child_env(devices: int, env=None) -> dict:
    """The environment of a process that emulates `devices` devices: `$DILOCO_LITE_DEVICES`
    set, and the XLA flags this process's `emulate_devices` added taken out again, so that the
    child's own call sets those of its count (single-threaded ops depend on it)."""
    import os

    from .devices import COLLECTIVE_TIMEOUTS, DEVICES_ENV, SINGLE_THREADED_OPS

    env = dict(os.environ if env is None else env)
    added = {f"--{k}={v}" for k, v in COLLECTIVE_TIMEOUTS.items()}
    added.add(f"--{SINGLE_THREADED_OPS}=false")
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f not in added)
    env.update({DEVICES_ENV: str(devices), "XLA_FLAGS": flags})
    if not flags:
        del env["XLA_FLAGS"]
    return env


def end_to_end_layouts(layouts=E2E_LAYOUTS, steps: int = E2E_STEPS,
                       timeout_s: float = 1800.0) -> dict:
    """`end_to_end` in a fresh process per device count: {devices: {name: (tokens/s, s)}}."""
    import json
    import subprocess
    import sys

    code = ("import diloco_lite as dl; dl.emulate_devices({n}); "
            "from diloco_lite.bench import end_to_end; end_to_end({steps})")
    out = {}
    for n in layouts:
        proc = subprocess.run([sys.executable, "-c", code.format(n=n, steps=steps)],
                              env=child_env(n), capture_output=True, text=True,
                              timeout=timeout_s)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("end_to_end ")]
        if proc.returncode or not lines:
            raise RuntimeError(f"end-to-end bench on {n} devices failed:\n{proc.stderr[-2000:]}")
        out[n] = {k: tuple(v) for k, v in json.loads(lines[-1].split(" ", 1)[1]).items()}
    return out


def end_to_end_table(results: dict, steps: int = E2E_STEPS) -> str:
    """The report's table: steady tokens/s (whole-run seconds) per run and layout."""
    layouts = list(results)
    names = list(next(iter(results.values())))
    head = "".join(f"{f'{n} devices' + (f' ({8 // n} workers each)' if n < 8 else ''):>30}"
                   for n in layouts)
    lines = [f"end-to-end       {steps}-step runs as train() runs them (M=8, 16 x 64 per worker, "
             "default evaluation): steady tokens/s, compile excluded (whole run s)",
             f"{'':16}{head}"]
    for name in names:
        cells = "".join(f"{f'{results[n][name][0]:,.0f} ({results[n][name][1]:.0f} s)':>30}"
                        for n in layouts)
        lines.append(f"{name:16}{cells}")
    return "\n".join(lines)


def bench(config=None) -> dict:
    """Run every measurement and print a report; returns the numbers."""
    import jax

    from .algorithms.ddp import DDPDriver, ddp_step_fn
    from .algorithms.learners import inner_fn
    from .config import DecoupledDiLoCo, DiLoCo, RunConfig
    from .model import count_params, model_flops_per_token
    from .profile import flops_profile
    from .systems import bandwidth
    from .training import setup

    config = config or RunConfig()
    corpus, model, mesh, optimizer = setup(config)
    params = model.init(0)
    batch = corpus.batch(0, seed=0, workers=config.workers, batch_size=config.batch_size,
                         seq_len=config.seq_len)
    out = {"devices": mesh.devices, "workers": config.workers,
           "device_kind": jax.devices()[0].device_kind}

    # 1. DDP: library step vs the hand-written one, same model, batch, optimizer.
    ddp = DDPDriver(model, mesh, optimizer, params)
    state = ddp.init(params)
    placed = jax.device_put((batch, np.ones(config.workers, np.float32)), mesh.sharding("workers"))
    hand = hand_written_ddp_step(model, mesh, optimizer)
    lib_step = ddp_step_fn(model, mesh, optimizer, donate=False)
    lib_fn = lambda: jax.block_until_ready(lib_step(*state, *placed))  # noqa: E731
    hand_fn = lambda: jax.block_until_ready(hand(*state, placed[0]))  # noqa: E731
    t_lib, t_hand, ratio = _paired(lib_fn, hand_fn)
    tokens = config.tokens_per_step
    flops = model_flops_per_token(model.cfg, config.seq_len, count_params(params)) * tokens
    peak = matmul_peak_flops()
    out.update(ddp_step_s=t_lib, hand_step_s=t_hand, ddp_vs_hand=ratio,
               tokens_per_s=tokens / t_lib, model_flops_per_s=flops / t_lib,
               matmul_peak_flops_per_s=peak, mfu=flops / t_lib / peak)
    out.update(profile=flops_profile(config))  # where a device's share of that step goes

    # 2. DiLoCo's inner step (inside an H-step scan, every mask on) against a DDP step.
    h, steps = 10, 40
    stacked = lambda tree: jax.device_put(  # noqa: E731
        jax.tree.map(lambda x: np.broadcast_to(x, (config.workers,) + np.shape(x)), tree),
        mesh.sharding("workers"))
    local, inner_state = stacked(params), stacked(jax.device_get(optimizer.init(params)))
    batches = jax.device_put((np.repeat(batch[:, None], h, axis=1),
                              np.ones((config.workers, h), bool)), mesh.sharding("workers"))
    inner = inner_fn(model, mesh, optimizer, donate=False)
    inner_call = lambda: jax.block_until_ready(inner(local, inner_state, *batches))  # noqa: E731
    t_inner, _, inner_ratio = _paired(inner_call, lib_fn, rounds=3)
    out.update(diloco_inner_step_s=t_inner / h, diloco_inner_vs_ddp=inner_ratio / h)

    # 3. Whole plans of equal length, every learner up and equally fast, events included:
    #    DiLoCo (H=10) and Decoupled DiLoCo (H=10, P=4, τ=2), per step of all M learners.
    base = dataclasses.replace(config, steps=steps)
    diloco = plan_runner(dataclasses.replace(base, algorithm=DiLoCo(inner_steps=h)),
                         corpus, model, mesh, optimizer, params)
    decoupled = plan_runner(dataclasses.replace(base, algorithm=DecoupledDiLoCo(
        inner_steps=h, fragments=4, overlap=2)), corpus, model, mesh, optimizer, params)
    t_dec, t_dil, _ = _paired(decoupled, diloco, rounds=3, steps=1)
    out.update(diloco_plan_step_s=t_dil / steps, decoupled_plan_step_s=t_dec / steps,
               diloco_plan_vs_inner=t_dil / steps / (t_inner / h),
               decoupled_vs_inner=t_dec / steps / (t_inner / h))

    # 4. A run's fixed cost: two short DiLoCo runs of one schedule (seeds 0 and 1) at the
    #    protocol's batch; the second reuses the first's compiled steps (`learners.inner_fn`).
    from .training import train

    short = dataclasses.replace(config, algorithm=DiLoCo(inner_steps=h), steps=100, batch_size=4)
    runs = []
    for seed in (0, 1):
        start = time.perf_counter()
        train(dataclasses.replace(short, seed=seed), progress=False)
        runs.append(time.perf_counter() - start)
    out.update(first_run_s=runs[0], second_run_s=runs[1])

    # 5. The bandwidth simulator's full sweep.
    out.update({f"bandwidth_{k}": v for k, v in bandwidth.bench_sweep().items()})

    # 6. End to end: whole runs on both layouts, each in its own process.
    out.update(end_to_end=end_to_end_layouts())
    _report(out)
    return out


def _report(o: dict) -> None:
    from .profile import profile_table

    print(f"diloco_lite bench — {o['workers']} workers on {o['devices']} × {o['device_kind']}\n")
    print(f"DDP step         library {o['ddp_step_s'] * 1e3:8.2f} ms   hand-written "
          f"{o['hand_step_s'] * 1e3:8.2f} ms   ratio {o['ddp_vs_hand']:.3f}  (target <= 1.05)")
    print(f"throughput       {o['tokens_per_s']:,.0f} tokens/s   "
          f"{o['model_flops_per_s'] / 1e9:.2f} GFLOP/s model = {o['mfu']:.1%} of the measured "
          f"matmul peak ({o['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s)")
    print(chip_line(o["device_kind"], o["devices"], o["model_flops_per_s"]))
    print(profile_table(o["profile"]))
    print(f"DiLoCo inner     {o['diloco_inner_step_s'] * 1e3:8.2f} ms/step   ratio to a DDP step "
          f"{o['diloco_inner_vs_ddp']:.3f}  (target <= 1.05)")
    print(f"whole plans      per step of all learners, events included, / a DiLoCo inner step: "
          f"DiLoCo H=10 {o['diloco_plan_vs_inner']:.3f}; Decoupled H=10 P=4 τ=2 "
          f"{o['decoupled_vs_inner']:.3f}  (target <= 1.25)")
    print(f"run fixed cost   100 DiLoCo steps of 8 × 4 sequences: first run "
          f"{o['first_run_s']:.1f} s, a second of the same schedule {o['second_run_s']:.1f} s "
          "(compiled steps shared)")
    print(f"bandwidth sweep  {o['bandwidth_sweep_s']:.3f} s for {o['bandwidth_cases']} cases")
    print(end_to_end_table(o["end_to_end"]))


def stress(runs: int = 3, rounds: int = 3, steps: int = 200, timeout_s: float = 1800.0) -> dict:
    """Several DDP trainings at once, each in its own process with 8 emulated devices, `rounds`
    times: on 2 cores this is the busy machine on which XLA's CPU collectives used to abort or
    hang (`devices`). A run passes if it finishes within `timeout_s`; prints and returns the
    counts (passed, failed: non-zero exit, timed out)."""
    import subprocess
    import sys

    code = ("import diloco_lite as dl; dl.emulate_devices(8); "
            f"r = dl.train(dl.RunConfig(steps={steps}), progress=False); "
            "print(float(r.final.val_loss))")
    counts = {"passed": 0, "failed": 0, "timed out": 0}
    for i in range(rounds):
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(runs)]
        for p in procs:
            try:
                p.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - start)))
                counts["passed" if p.returncode == 0 else "failed"] += 1
            except subprocess.TimeoutExpired:
                p.kill()
                counts["timed out"] += 1
        print(f"round {i + 1}/{rounds}: {runs} concurrent runs of {steps} DDP steps, "
              f"{time.perf_counter() - start:.0f} s; so far {counts}", flush=True)
    print(f"stress: {counts['passed']} of {runs * rounds} runs passed")
    return counts
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
