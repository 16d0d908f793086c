"""`train(config) -> RunResult`: the loop every algorithm shares.

Per block of steps (1 for DDP, up to the next sync for DiLoCo) the loop draws the global batches
as a pure function of `(seed, step)`, lets the algorithm driver advance, books the bytes, and at
evaluation points measures held-out loss and accuracy on fixed validation batches of whole
held-out plays. One history row per evaluation point.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import pandas as pd

from .config import RunConfig, check

EVAL_BATCH = 64  # held-out sequences per evaluation batch (RunConfig.eval_batches batches)


@dataclasses.dataclass
class RunResult:
    """What a run leaves behind: its config, a tidy history and the final global parameters."""

    config: RunConfig
    history: pd.DataFrame
    params: Any
    n_params: int

    @property
    def final(self) -> pd.Series:
        """The last history row (final held-out loss/accuracy, total bytes, ...)."""
        return self.history.iloc[-1]


def setup(config: RunConfig):
    """Corpus, model (vocab from the corpus), worker mesh and inner optimizer for `config`."""
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
    return corpus, build_model(model_cfg), worker_mesh(config.workers), \
        resolve_inner_optimizer(config)


def make_evaluator(model, corpus, config: RunConfig):
    """A jitted `evaluate(params) -> (val_loss, val_accuracy)` over fixed held-out batches."""
    import jax
    import jax.numpy as jnp

    from .model import loss_and_accuracy

    data = jnp.asarray(corpus.eval_batches(config.eval_batches, batch_size=EVAL_BATCH,
                                           seq_len=config.seq_len))

    @jax.jit
    def evaluate(params):
        def one(_, batch):
            return None, loss_and_accuracy(model, params, batch)

        _, (losses, accs) = jax.lax.scan(one, None, data)
        return jnp.mean(losses), jnp.mean(accs)

    return lambda params: tuple(float(x) for x in evaluate(jax.device_get(params)))


def eval_points(config: RunConfig) -> list[int]:
    """Steps after which to evaluate: every `eval_every` (default: ~20 per run) and the last."""
    every = config.eval_every or max(1, config.steps // 20)
    return sorted({*range(every, config.steps, every), config.steps})


def train(config: RunConfig, *, progress: bool = True) -> RunResult:
    """Run `config` and return its history and final parameters (deterministic given seed)."""
    import jax

    from .algorithms import make_driver
    from .model import count_params

    check(isinstance(config, RunConfig), "config", type(config).__name__, "a RunConfig")
    corpus, model, mesh, optimizer = setup(config)
    driver = make_driver(config, model, mesh, optimizer)
    state = driver.init(model.init(config.seed))
    evaluate = make_evaluator(model, corpus, config)
    n_params = count_params(driver.global_params(state))

    rows, pending, start = [], [], time.perf_counter()
    comm_bytes = peak = 0
    evals = iter(eval_points(config))
    next_eval = next(evals)
    bar = _progress(config, progress)
    step = 0
    while step < config.steps:
        n = min(driver.block(step), config.steps - step)
        batches = np.stack([
            corpus.batch(t, seed=config.seed, workers=config.workers,
                         batch_size=config.batch_size, seq_len=config.seq_len, split=config.split)
            for t in range(step, step + n)
        ])
        state, info = driver.advance(state, driver.place_batches(batches), step)
        step += n
        comm_bytes += info.pop("bytes")
        peak = max(peak, info.pop("peak_step_bytes"))
        pending.append(info)
        bar.update(n)
        if step >= next_eval:
            val_loss, val_acc = evaluate(driver.global_params(state))
            row = _collect(pending)
            row.update(step=step, tokens=step * config.tokens_per_step, val_loss=val_loss,
                       val_accuracy=val_acc, comm_bytes=comm_bytes, peak_step_bytes=peak,
                       wall_time_s=time.perf_counter() - start)
            rows.append(row)
            pending = []
            bar.set_postfix(train=f"{row['train_loss']:.3f}", val=f"{val_loss:.3f}",
                            acc=f"{val_acc:.3f}")
            next_eval = next(evals, config.steps + 1)
    bar.close()
    columns = ["step", "tokens", "train_loss", "val_loss", "val_accuracy", "comm_bytes",
               "peak_step_bytes", "wall_time_s"]
    history = pd.DataFrame(rows)
    history = history[columns + [c for c in history.columns if c not in columns]]
    params = jax.device_get(driver.global_params(state))
    return RunResult(config=config, history=history, params=params, n_params=n_params)


def _collect(infos: list[dict]) -> dict:
    """Mean of every numeric diagnostic over the steps since the last row (NaN when absent)."""
    import jax

    infos = jax.device_get(infos)
    keys = {k for info in infos for k in info}
    out = {}
    for k in sorted(keys):
        values = [float(np.mean(info[k])) for info in infos if k in info]
        out["train_loss" if k == "loss" else k] = float(np.mean(values)) if values else np.nan
    return out


def _progress(config: RunConfig, enabled: bool):
    from tqdm.auto import tqdm

    name = type(config.algorithm).__name__
    return tqdm(total=config.steps, desc=f"{name} M={config.workers}", disable=not enabled,
                unit="step", leave=True)
