"""`train(config) -> RunResult`: the loop every algorithm shares.

First the run is planned on the host (`clock.plan.make_plan`): every learner's inner steps and
every sync event on the simulated clock, with the bytes, times and counters of each evaluation
point. Then the loop replays the plan's blocks: it draws each learner's batches as a pure
function of `(seed, learner, its own step)`, lets the algorithm driver run the block (inner
steps, then events), waits for it, and at each evaluation point measures held-out loss and
accuracy on fixed validation batches of whole held-out plays. One history row per evaluation
point; the train loss of a row is the mean over the learner-steps that finished (on the
simulated clock) since the row before.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import numpy as np
import pandas as pd

from .config import RunConfig, check
from .validate import check_nonnegative

EVAL_BATCH = 64  # held-out sequences per evaluation batch (RunConfig.eval_batches batches)


@dataclasses.dataclass
class RunResult:
    """What a run leaves behind: its config, a tidy history and the final global parameters."""

    config: RunConfig
    history: pd.DataFrame
    params: Any
    n_params: int
    fragments: pd.DataFrame | None = None  # per fragment: up_bytes, down_bytes, syncs
    counters: dict | None = None  # the plan's totals: processed, useful, lost steps, bytes, ...
    plan: Any = None  # the plan it replayed (`clock.plan`): every step and sync event, timed
    log: list | None = None  # on actors (`diloco_lite.actors`): (time_s, event, learner, fragment)
    wire: list | None = None  # on the testbed's hosts: what each host's interface sent, received

    @property
    def final(self) -> pd.Series:
        """The last history row (final held-out loss/accuracy, total bytes, ...)."""
        return self.history.iloc[-1]


def setup(config: RunConfig, workers: int | None = None):
    """Corpus, model (vocab from the corpus), worker mesh and inner optimizer for `config`
    (the mesh of `workers` workers when given: one learner of the actor runtime has its own)."""
    from .data import load_corpus
    from .devices import worker_mesh
    from .model import build_model
    from .steps import resolve_inner_optimizer

    corpus = load_corpus(config.corpus)
    model_cfg = config.model
    if model_cfg.vocab_size is None:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=corpus.vocab_size)
    check(model_cfg.vocab_size >= corpus.vocab_size, "ModelConfig.vocab_size",
          model_cfg.vocab_size, f">= the corpus vocabulary ({corpus.vocab_size})")
    return corpus, build_model(model_cfg), worker_mesh(workers or config.workers), \
        resolve_inner_optimizer(config)


def make_evaluator(model, corpus, config: RunConfig):
    """A jitted `evaluate(params) -> {val_loss, val_accuracy, tune_*, test_*}` over fixed
    held-out batches: `val` over all the held-out plays (the mean of the batches' means), `tune`
    over the sequences that start in `data.TUNE_PLAYS` (where hyperparameters are chosen) and
    `test` over those in `data.TEST_PLAYS` (what the quality tables report): one forward pass."""
    return _evaluator(model, corpus, config.eval_batches, config.seq_len)


@functools.lru_cache(maxsize=16)  # one compiled evaluator per model and batches
def _evaluator(model, corpus, eval_batches: int, seq_len: int):
    import jax
    import jax.numpy as jnp

    from .data import TUNE_PLAYS
    from .model import token_nll_and_correct

    shape = dict(batch_size=EVAL_BATCH, seq_len=seq_len)
    data = jnp.asarray(corpus.eval_batches(eval_batches, **shape))
    tune = jnp.asarray(np.isin(corpus.eval_plays(eval_batches, **shape), TUNE_PLAYS),
                       jnp.float32)

    @jax.jit
    def evaluate(params):
        def one(_, x):
            batch, tune_B = x
            nll_BxL, correct_BxL = token_nll_and_correct(model, params, batch)
            seq = jnp.stack([nll_BxL.mean(-1), correct_BxL.mean(-1)])  # [2, B]
            split = jnp.stack([seq @ tune_B, seq @ (1.0 - tune_B)])  # [tune|test, loss|acc]
            return None, (jnp.mean(nll_BxL), jnp.mean(correct_BxL), split)

        _, (losses, accs, split) = jax.lax.scan(one, None, (data, tune))
        counts = jnp.stack([jnp.sum(tune), jnp.sum(1.0 - tune)])
        return jnp.mean(losses), jnp.mean(accs), split.sum(0) / jnp.maximum(counts, 1.0)[:, None]

    def run(params) -> dict[str, float]:
        loss, acc, split = jax.device_get(evaluate(jax.device_get(params)))
        return {"val_loss": float(loss), "val_accuracy": float(acc),
                "tune_loss": float(split[0, 0]), "tune_accuracy": float(split[0, 1]),
                "test_loss": float(split[1, 0]), "test_accuracy": float(split[1, 1])}

    return run


def eval_points(config: RunConfig) -> list[int]:
    """Steps after which to evaluate: every `eval_every` (default: ~20 per run) and the last."""
    every = config.eval_every or max(1, config.steps // 20)
    return sorted({*range(every, config.steps, every), config.steps})


def train(config: RunConfig, *, progress: bool = True, init_params=None, plan=None,
          pace_s: float = 0.0) -> RunResult:
    """Run `config` and return its history and final parameters (deterministic given seed).

    The clock and schedule are planned first (`clock.plan.make_plan`); the loop then runs the
    plan's blocks on the device and writes a history row at every evaluation point. A run with
    a `warm_start` starts from that run's final parameters: `init_params` when given (the run
    cache passes them, `reproduce.params_cached`), else the warm start is trained first.
    `plan`: replay this plan instead of the simulated clock's (e.g. `RunResult.plan` of a run
    on real actors, `diloco_lite.actors`: what really happened, on the emulated mesh).
    `pace_s`: an emulated slower chip, `pace_s` seconds of compute added to every step (the
    loop sleeps that long times a block's steps before the block; the numbers do not change,
    the wall clock does): `actors.versus` paces the lock-step methods' processes so that their
    steps take as long as the actor runtime's padded ones."""
    import jax

    from .algorithms import make_driver
    from .clock.plan import make_plan
    from .model import count_params

    check(isinstance(config, RunConfig), "config", type(config).__name__, "a RunConfig")
    check_nonnegative("pace_s", pace_s)
    corpus, model, mesh, optimizer = setup(config)
    params = model.init(config.seed)
    if config.warm_start is not None:
        if init_params is None:
            init_params = train(config.warm_start, progress=progress).params
        same = jax.tree.structure(init_params) == jax.tree.structure(params) and all(
            np.shape(a) == np.shape(b) for a, b in zip(jax.tree.leaves(init_params),
                                                      jax.tree.leaves(params), strict=True))
        check(same, "init_params", "a tree of other shapes", f"the parameters of {config.model}")
        params = jax.tree.map(lambda x: np.asarray(x, np.float32), init_params)
    else:
        check(init_params is None, "init_params", "given", "None for a run without warm_start")
    driver = make_driver(config, model, mesh, optimizer, params)
    if plan is None:
        plan = make_plan(config, up_nbytes=driver.up_nbytes, down_nbytes=driver.down_nbytes,
                         sizes=driver.sizes, rejoin_nbytes=driver.rejoin_nbytes,
                         eval_at=eval_points(config))
    state = driver.init(params)
    evaluate = make_evaluator(model, corpus, config)
    n_params = count_params(params)

    rows, losses, diags, start, evaluating = [], [], [], time.perf_counter(), 0.0
    done = np.zeros(config.workers, int)
    # under jax.distributed (`diloco_lite.distributed`) every process runs this loop on its own
    # workers' batches; only process 0 evaluates (the others' rows hold NaN metrics)
    lead, own = jax.process_index() == 0, mesh.local_workers
    progress = progress and lead
    # both closed on every way out (an exception, a KeyboardInterrupt): a watchdog left running
    # would end the process (a notebook's kernel) `stall_s` later
    with _progress(config, progress) as bar, Watchdog(run_label(config)) as watchdog:
        for block in plan.blocks:
            batches, mask = _block_batches(corpus, config, block, own)
            if pace_s:
                time.sleep(pace_s * int(block.steps.max(initial=0)))
            state, block_losses, block_diags = driver.run(state, block, batches, mask)
            # Wait for the block before dispatching the next: programs queued ahead can hold
            # XLA:CPU's device threads while a collective waits for its last participants
            # (`devices`).
            jax.block_until_ready(state)
            watchdog.beat()
            if block_losses:
                losses.append((block_losses, block.steps))
            diags += block_diags
            done += block.steps
            bar.update(done.sum() / config.workers - bar.n)
            if block.events and block.events[-1].kind == "eval":
                began = time.perf_counter()
                metrics = (evaluate(driver.global_params(state)) if lead
                           else dict.fromkeys(METRICS, np.nan))
                evaluating += time.perf_counter() - began
                now = time.perf_counter() - start
                rows.append({**block.events[-1].stats, **metrics, "wall_time_s": now,
                             "train_time_s": now - evaluating, "diags": diags})
                diags = []
                bar.set_postfix(val=f"{metrics['val_loss']:.3f}",
                                acc=f"{metrics['val_accuracy']:.3f}")
    history = _history(rows, losses, plan)
    params = jax.device_get(driver.global_params(state))
    fragments = pd.DataFrame(plan.fragments).rename_axis("fragment").reset_index()
    return RunResult(config=config, history=history, params=params, n_params=n_params,
                     fragments=fragments, counters=plan.final, plan=plan)


class Watchdog:
    """Ends the process, with a message that says what to do, when a run makes no progress for
    `stall_s` seconds (`$DILOCO_LITE_STALL_S`, default 600): a run stuck in XLA's CPU
    collectives cannot be interrupted from Python, and would otherwise hang (or be killed by XLA
    much later with a cryptic message). Progress is a finished block (a few inner steps).

    A context manager: it watches only inside `with Watchdog(label) as dog: ... dog.beat()`,
    and is stopped on every way out of the block, an exception or a KeyboardInterrupt included
    (a watchdog left running would end a notebook's kernel `stall_s` after the user pressed
    stop)."""

    def __init__(self, label: str, stall_s: float | None = None):
        import os
        import threading

        self.label = label
        self.stall_s = float(stall_s or os.environ.get("DILOCO_LITE_STALL_S", 600))
        check(self.stall_s > 0, "Watchdog.stall_s", self.stall_s, "> 0 seconds")
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"diloco_lite watchdog: {label}")

    def __enter__(self) -> Watchdog:
        self.last = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def beat(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        """Stop watching, and wait for the watching thread to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        import os
        import sys

        while not self._stop.wait(min(10.0, self.stall_s / 4)):
            if time.monotonic() - self.last > self.stall_s and not self._stop.is_set():
                print(f"\ndiloco_lite: {self.label} has made no progress for {self.stall_s:g} s: "
                      "the emulated devices' collectives look stuck (XLA:CPU, more devices than "
                      "cores, a busy machine). Exiting now. What to do: restart the kernel (or "
                      "process) and run again; close other heavy programs; or emulate fewer "
                      "devices (DILOCO_LITE_DEVICES=4, or dl.emulate_devices(4): the workers are "
                      "then vmapped, with the same numbers). Finished runs of `make reproduce` "
                      "are cached and are not redone.", file=sys.stderr, flush=True)
                time.sleep(1.0)  # let a notebook's output carry the message
                os._exit(3)


METRICS = ("val_loss", "val_accuracy", "tune_loss", "tune_accuracy", "test_loss",
           "test_accuracy")
COLUMNS = ["step", "tokens", "sim_time_s", "train_loss", "val_loss", "val_accuracy",
           "tune_loss", "tune_accuracy", "test_loss", "test_accuracy",
           "comm_bytes", "down_bytes", "peak_step_bytes", "peak_gbps", "peak_down_gbps",
           "outer_steps",
           "syncer_wait_s", "goodput", "learner_steps", "useful_steps", "lost_steps",
           "overlap_lost_steps", "failures", "complete", "wall_time_s", "train_time_s"]


def _block_batches(corpus, config: RunConfig, block, own=None):
    """[M, N, B, L+1] batches of a block (learner m's own data indices from `first[m]`) and the
    [M, N] mask of the steps each learner really takes; unused slots hold zeros. With `own`
    (this process's workers, under jax.distributed) only their rows: [len(own), N, ...]."""
    m, n = config.workers, int(block.steps.max(initial=0))
    own = np.arange(m) if own is None else np.asarray(own)
    rows = None if own.size == m else own  # a process builds only its own workers' batches
    batches = np.zeros((own.size, n, config.batch_size, config.seq_len + 1), np.int32)
    mask = np.zeros((own.size, n), bool)
    cache = {}
    for i, w in enumerate(own):
        for j in range(block.steps[w]):
            k = config.data_offset + int(block.first[w]) + j
            if k not in cache:
                cache[k] = corpus.batch(k, seed=config.seed, workers=m,
                                        batch_size=config.batch_size, seq_len=config.seq_len,
                                        split=config.split, rows=rows)
            batches[i, j] = cache[k][i]
            mask[i, j] = True
    return batches, mask


def _history(rows: list[dict], losses: list[tuple], plan) -> pd.DataFrame:
    """One row per evaluation. `train_loss`: the mean over every learner-step that finished since
    the previous row (on the simulated clock); `pseudo_grad_norm`: ‖Δ‖ of the whole model, from
    each fragment's latest merge; `worker_drift`: the root mean ‖Δ_m‖² over learners, likewise;
    `pseudo_grad_cosine`: the mean pairwise cosine of the Δ_m over the merges since the row
    before (the end-of-run flush is left out of all three)."""
    import jax

    from .devices import fetch

    per_learner = [[] for _ in plan.step_time]
    for block_losses, steps in losses:
        parts = [np.asarray(x, float).reshape(-1, max(np.size(x) // steps.size, 1))
                 if np.ndim(x) else np.full((1, 1), float(x)) for x in fetch(block_losses)]
        block_losses = np.broadcast_to(np.concatenate(parts, axis=1) if len(parts) > 1
                                       else parts[0], (steps.size, max(int(steps.max()), 1)))
        for m in np.flatnonzero(steps):
            per_learner[m].append(block_losses[m, : steps[m]])
    times = np.concatenate([np.asarray(t, float) for t in plan.step_time])
    values = np.concatenate([np.concatenate(x) if x else np.zeros(0) for x in per_learner])
    latest: dict[int, np.ndarray] = {}
    out, previous = [], -np.inf
    for row in rows:
        row = dict(row)
        inside = (times > previous) & (times <= row["sim_time_s"])
        row["train_loss"] = float(values[inside].mean()) if inside.any() else np.nan
        previous = row["sim_time_s"]
        cosines = []
        for p, flush, diag in row.pop("diags"):
            if not flush:
                latest[p] = np.asarray(jax.device_get(diag))
                cosines.append(latest[p][1])
        if latest:
            total = np.sum(list(latest.values()), axis=0)
            row.update(pseudo_grad_norm=float(np.sqrt(total[0])),
                       pseudo_grad_cosine=float(np.mean(cosines)) if cosines else np.nan,
                       worker_drift=float(np.sqrt(total[2])))
        out.append(row)
    history = pd.DataFrame(out)
    return history[COLUMNS + [c for c in history.columns if c not in COLUMNS]]


def _progress(config: RunConfig, enabled: bool):
    """A progress bar over the run's steps; none when not `enabled` or when
    DILOCO_LITE_PROGRESS=0 (the book's executed notebooks: a bar frozen on the page says
    nothing, and without ipywidgets tqdm warns on every one)."""
    from tqdm.auto import tqdm

    enabled = enabled and os.environ.get("DILOCO_LITE_PROGRESS", "1") != "0"
    bar = "{l_bar}{bar}| {n:.0f}/{total} [{elapsed}<{remaining}{postfix}]"
    return tqdm(total=config.steps, desc=run_label(config), disable=not enabled, unit="step",
                leave=True, bar_format=bar)


def run_label(config: RunConfig) -> str:
    """A short name for a run, e.g. `DiLoCo H=50 M=8`, `DDP bf16 M=8` (`DDP(bits=16)`) or
    `Streaming P=4 τ=1 α=0.5 4-bit M=8` (`seed=2` appended for a seed other than 0)."""
    a = config.algorithm
    if a.name == "ddp":
        parts = ["DDP"] + (["bf16"] if a.bits == 16 else [])
    elif a.name == "diloco":
        parts = ["DiLoCo", f"H={a.inner_steps}"]
    else:
        parts = ["Streaming" if a.name == "streaming_diloco" else "Decoupled",
                 f"H={a.inner_steps}", f"P={a.fragments}", f"τ={a.overlap}"]
        parts += [f"α={a.mix:g}"] if a.mix else []
        parts += [f"{a.bits}-bit"]
        if a.name == "decoupled_diloco":
            parts += [f"K={a.quorum}", a.merge.upper() if a.merge == "rda" else "mean"]
    parts += ["elastic"] if getattr(a, "elastic", False) else []
    lr = getattr(a, "outer_lr", 0.7)
    parts += [f"outer lr {lr:g}"] if lr != 0.7 else []
    parts += [f"M={config.workers}"] + ([f"seed={config.seed}"] if config.seed else [])
    parts += [f"(warm start: {config.warm_start.steps} steps)"] if config.warm_start else []
    return " ".join(parts)
