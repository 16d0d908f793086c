"""The papers' protocol at classroom scale (issue: accuracy comparisons that mean something).

Every other group runs 600 steps of 128 sequences, so DiLoCo at H = 50 takes 12 outer steps —
the papers take ~128 after a warm start. The protocol runs take the **same 4.9M tokens** as
those groups in **2,400 steps of 32 sequences** (8 workers × 4 × 64 characters): at the
reference H = 50 that is **48 outer steps**, at a quarter of the per-step cost, so that three
seeds of every method fit in `make reproduce` (52 min in all on 2 cores, measured). A smaller
batch is not a weaker comparison here: at equal tokens it trains DDP better too (DDP: 43.1% at
128 sequences, ~48% at 32), and the batch-size finding below compares the two batches.

Hyperparameters are chosen on the **tune plays** and every table reports the **test plays**
(`data.TUNE_PLAYS`, `data.TEST_PLAYS`: held-out plays, never trained on).

Groups:
- `tuning`: the outer learning rate of DiLoCo, Streaming and Decoupled DiLoCo from `OUTER_LRS`
  (seed 0), chosen by the final tune-plays loss (`choose`). The choice is recorded in `TUNED`
  (what the `quality`, `warm_start` and `m_sweep` runs use, so that the groups stay static);
  `rows` says whether the runs still agree with it, and `make reproduce` warns when not.
- `warm_start`: the DiLoCo paper's protocol: a DDP pre-training of `WARM_STEPS` steps, trained
  once (`reproduce.params_cached`), from which DDP and each method continue for the protocol's
  2,400 steps; beside them the same methods from scratch (seed 0 of `quality`).

The scaling-law paper's findings have their own, tuned sweep: `experiments.scaling`.

Quick mode: the protocol is `base_config(quick)` (40 steps of the 1-layer d=32 model, H = 8), so
its quick runs are shared with the other groups'; same groups, labels and code paths.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from ..config import DDP, DiLoCo, StreamingDiLoCo
from .common import H_REF, base_config, describe, matching_configs

GROUPS = ("tuning", "warm_start")
STEPS = {False: 2400, True: 40}
BATCH = {False: 4, True: 4}  # sequences per worker at M = 8: a global batch of 32 (quick: 32)
TUNABLE = ("DiLoCo", "Streaming DiLoCo", "Decoupled DiLoCo")
# Around the DiLoCo paper's 0.7 (Nesterov, momentum 0.9), and one step past 1.0: DiLoCo and
# Streaming choose 1.0, which must not be the grid's edge (a choice on an edge says so).
OUTER_LRS = (0.4, 0.7, 1.0, 1.3)
# The outer learning rates chosen on the tune plays by the `tuning` group (see `choose`).
TUNED = {"DiLoCo": 1.0, "Streaming DiLoCo": 1.0, "Decoupled DiLoCo": 0.7}
WARM_STEPS = {False: 600, True: 10}
WORKERS = (1, 2, 4, 8)


def protocol_base(quick: bool, **overrides):
    """DDP at the protocol: 8 workers × 4 sequences × 64 characters, 2,400 steps (quick: the
    quick base config)."""
    size = {} if quick else dict(batch_size=BATCH[quick], steps=STEPS[quick])
    return base_config(quick, **{**size, **overrides})


def method_config(quick: bool, method: str, *, seed: int = 0, outer_lr: float | None = None,
                  **overrides):
    """The protocol run of `method` (DDP, DiLoCo, Streaming DiLoCo, Decoupled DiLoCo, or
    "Decoupled DiLoCo, chaos") with `seed`, at the tuned outer lr unless `outer_lr` is given."""
    from . import decoupled

    h = H_REF[quick]
    lr = outer_lr if outer_lr is not None else TUNED.get(method.split(",")[0], 0.7)
    algos = {
        "DDP": lambda: DDP(),
        "DiLoCo": lambda: DiLoCo(inner_steps=h, outer_lr=lr),
        "Streaming DiLoCo": lambda: StreamingDiLoCo(inner_steps=h, fragments=4, overlap=1,
                                                    mix=0.5, bits=4, outer_lr=lr),
        "Decoupled DiLoCo": lambda: decoupled.reference(quick, outer_lr=lr),
        "Decoupled DiLoCo, chaos": lambda: decoupled.reference(quick, outer_lr=lr),
    }
    cluster = (dataclasses.replace(decoupled.chaos_cluster(quick), seed=seed)
               if method.endswith("chaos") else None)
    return protocol_base(quick, algorithm=algos[method](), seed=seed, cluster=cluster,
                         **overrides)


def warm_config(quick: bool):
    """The shared pre-training: DDP at the protocol's batch for `WARM_STEPS` steps."""
    return protocol_base(quick, steps=WARM_STEPS[quick])


def groups(quick: bool) -> dict[str, dict]:
    """Group name -> {label: RunConfig} (module docstring)."""
    tuning = {f"{m} · outer lr {lr:g}": method_config(quick, m, outer_lr=lr)
              for m in TUNABLE for lr in OUTER_LRS}
    warm = {}
    for m in ("DDP", *TUNABLE):
        warm[f"{m} · from scratch"] = method_config(quick, m)
        warm[f"{m} · warm start"] = method_config(quick, m, warm_start=warm_config(quick))
    return {"tuning": tuning, "warm_start": warm}


def m_sweep(quick: bool) -> dict:
    """Notebook 02's M sweep: DDP and DiLoCo (H = 50, the tuned outer lr) on M ∈ {1, 2, 4, 8}
    workers at the protocol's global batch of 32 sequences (M × B) and length."""
    base = protocol_base(quick)
    global_batch = 8 * BATCH[quick]
    out = {"DDP": base}
    for m in WORKERS:
        out[f"DiLoCo M={m}"] = dataclasses.replace(
            base, algorithm=DiLoCo(inner_steps=H_REF[quick], outer_lr=TUNED["DiLoCo"]),
            workers=m, batch_size=global_batch // m)
    return out


# --------------------------------------------------------------------------------------------
# Analyses
# --------------------------------------------------------------------------------------------


def choose(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The tuning grid: per method and outer lr, the final tune-plays loss and accuracy, and
    `chosen` (the lowest tune-plays loss of the method). Test plays are never read here."""
    rows = []
    for label, h in histories.items():
        method, _, lr = label.rpartition(" · outer lr ")
        rows.append({"method": method, "outer_lr": float(lr),
                     "tune_loss": float(h.tune_loss.iloc[-1]),
                     "tune_accuracy": float(h.tune_accuracy.iloc[-1])})
    df = pd.DataFrame(rows)
    best = df.loc[df.groupby("method", sort=False).tune_loss.idxmin()].set_index("method")
    df["chosen"] = [best.outer_lr[m] == lr for m, lr in zip(df.method, df.outer_lr, strict=True)]
    df["recorded"] = [TUNED[m] == lr for m, lr in zip(df.method, df.outer_lr, strict=True)]
    return df


def disagreements(histories: dict[str, pd.DataFrame]) -> list[str]:
    """Sentences for each method whose best outer lr on the tune plays is not `TUNED`'s."""
    df = choose(histories)
    out = []
    for m, g in df.groupby("method", sort=False):
        best = float(g[g.chosen].outer_lr.iloc[0])
        if best != TUNED[m]:
            out.append(f"{m}: the tune plays now choose outer lr {best:g}, but TUNED records "
                       f"{TUNED[m]:g}: set experiments.protocol.TUNED[{m!r}] = {best:g}")
    return out


def warm_table(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Test-plays accuracy and loss of every method from scratch and warm-started, and the gap
    to DDP in the same regime (points; perplexity ratio)."""
    rows = []
    for label, h in histories.items():
        method, _, regime = label.rpartition(" · ")
        rows.append({"method": method, "regime": regime,
                     "test_accuracy": float(h.test_accuracy.iloc[-1]),
                     "test_loss": float(h.test_loss.iloc[-1]),
                     "outer_steps": float(h.outer_steps.iloc[-1])})
    df = pd.DataFrame(rows)
    ddp = df[df.method == "DDP"].set_index("regime")
    df["gap_points"] = [100 * (a - ddp.test_accuracy[r])
                        for a, r in zip(df.test_accuracy, df.regime, strict=True)]
    df["ppl_ratio"] = [math.exp(v - ddp.test_loss[r])
                       for v, r in zip(df.test_loss, df.regime, strict=True)]
    return df


# --------------------------------------------------------------------------------------------
# Figures and rows
# --------------------------------------------------------------------------------------------


def figures(group: str, histories: dict[str, pd.DataFrame]) -> dict[str, object]:
    from ..plots import protocol as pp

    if group == "tuning":
        return {"protocol_tuning": pp.tuning(choose(histories))}
    return {"protocol_warm_start": pp.warm_start(warm_table(histories))}


def rows(group: str, histories: dict[str, pd.DataFrame]) -> list[dict]:
    """Results rows; every accuracy and loss here is on the test plays, except `tuning`'s."""
    configs = _configs(group, histories)
    out = []

    def add(method, metric, value, published=None, label=None, note=""):
        cfg = configs.get(label or method)
        out.append({"experiment": f"protocol {group}", "method": method, "metric": metric,
                    "value": float(value), "published": published,
                    "config": (describe(cfg) if cfg is not None else "") + note})

    if group == "tuning":
        grid = choose(histories)
        for r in grid.itertuples():
            label = f"{r.method} · outer lr {r.outer_lr:g}"
            add(label, "tune-plays loss", r.tune_loss, label=label)
            add(label, "tune-plays accuracy", r.tune_accuracy, label=label)
        for r in grid[grid.chosen].itertuples():
            agree = "agrees with" if TUNED[r.method] == r.outer_lr else "DIFFERS from"
            edge = "; ON THE GRID'S EDGE" if r.outer_lr in (min(OUTER_LRS), max(OUTER_LRS)) else ""
            add(r.method, "chosen outer lr (tune plays)", r.outer_lr,
                note=f"grid {list(OUTER_LRS)}{edge}; {agree} the recorded "
                     f"TUNED={TUNED[r.method]:g}")
    else:
        for r in warm_table(histories).itertuples():
            label = f"{r.method} · {r.regime}"
            add(label, "test-plays accuracy", r.test_accuracy, label=label)
            add(label, "test-plays loss", r.test_loss, label=label)
            if r.method != "DDP":
                published = 15.02 / 15.30 if (r.method == "DiLoCo"
                                              and r.regime == "warm start") else None
                add(label, "perplexity / DDP perplexity", r.ppl_ratio, published, label=label)
    return out


def _configs(group: str, histories: dict[str, pd.DataFrame]) -> dict:
    return matching_configs(groups, group, histories)
