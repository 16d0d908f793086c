"""The scaling-law sweep's analyses (`experiments.scaling` re-exports them): the choices on the
tune plays, the test-plays gaps paired by seed, the inner-lr check, the batch finding's rises and
the cause checks. Every one reads the final evaluation of each run; `scaling_report` turns them
into the paper's findings, figures and results rows."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from .scaling_design import (
    CAUSES,
    CHECK_INNER,
    CHOSEN,
    CHOSEN_LONGER,
    LARGE_BATCH,
    MORE,
    SIZES,
    WORKERS,
    Cell,
    quick_of,
    record_name,
    recorded,
)

# --------------------------------------------------------------------------------------------
# Analyses (every one reads the final evaluation of each run)
# --------------------------------------------------------------------------------------------


def table(histories: dict[str, pd.DataFrame], sweep: bool = False) -> pd.DataFrame:
    """One row per run: its cell's fields and the final tune- and test-plays loss/accuracy;
    with `sweep`, only the sweep's runs (not the cause checks')."""
    rows = []
    for label, h in histories.items():
        last, cell = h.iloc[-1], Cell.parse(label)
        rows.append({**dataclasses.asdict(cell), "method": cell.method,
                     **{k: float(last[k]) for k in ("tune_loss", "test_loss", "test_accuracy")}})
    t = pd.DataFrame(rows)
    return t[(t.more_syncs == 1) & (t.more_tokens == 1) & (t.base == 0)] if sweep else t


def choices(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (size, factor, tokens, method): the lr with the lowest seed-0 tune-plays loss in its
    grid (DDP: inner lr; DiLoCo: outer lr at the recorded inner lr), whether it sits on the
    grid's edge, and whether it agrees with the record (`recorded`: `CHOSEN`, at `MORE`× the
    tokens `CHOSEN_LONGER`, from `SMALL_BASE` `CHOSEN_SMALL_BASE`). The test plays are never
    read here."""
    t = table(histories)
    t = t[t.more_syncs == 1]
    quick = quick_of(histories)
    rows = []
    for (size, factor, more, base, m), g in t[t.seed == 0].groupby(
            ["size", "factor", "more_tokens", "base", "m"], sort=False):
        rec = recorded(quick, size, factor, more, base)
        if m == 0:
            grid, knob, key = g, "inner_lr", "DDP"
        else:
            grid, knob, key = g[g.inner_lr == rec["DDP"]], "outer_lr", m
        best = grid.loc[grid.tune_loss.idxmin()]
        values = sorted(grid[knob])
        rows.append({"size": size, "factor": factor, "tokens": more, "base": base,
                     "method": best.method, "knob": knob, "chosen": float(best[knob]),
                     "tune_loss": float(best.tune_loss),
                     "on_edge": len(values) > 1 and best[knob] in (values[0], values[-1]),
                     "recorded": rec[key], "agrees": rec[key] == best[knob]})
    return pd.DataFrame(rows)


def disagreements(histories: dict[str, pd.DataFrame]) -> list[str]:
    """A sentence for each choice of the grids that its record (`recorded`) does not hold."""
    return [f"{r.size}, {r.factor}× batch{f' from {r.base}' if r.base else ''}, {r.tokens}× "
            f"tokens, {r.method}: the tune plays now choose {r.knob} {r.chosen:g}, but "
            f"{record_name(r.tokens, r.base)} records {r.recorded:g}: update experiments.scaling"
            for r in choices(histories).itertuples() if not r.agrees]


def inner_check(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """DiLoCo (M in `CHECK_INNER`, at its chosen outer lr, seed 0) at DDP's inner lr and the
    grid's neighbours, at 1× and 4× the batch: tune- and test-plays loss, and the test loss
    against DDP's inner lr (%)."""
    t = table(histories, sweep=True)
    quick = quick_of(histories)
    rows = []
    for (size, factor), rec in CHOSEN[quick].items():
        for m in CHECK_INNER:
            g = t[(t["size"] == size) & (t.factor == factor) & (t.m == m) & (t.seed == 0)
                  & (t.outer_lr == rec.get(m))]
            if g.inner_lr.nunique() < 2:
                continue
            ref = float(g[g.inner_lr == rec["DDP"]].test_loss.iloc[0])
            for r in g.sort_values("inner_lr").itertuples():
                rows.append({"size": size, "factor": factor, "method": f"M={m}",
                             "inner_lr": r.inner_lr,
                             "is_ddps": r.inner_lr == rec["DDP"], "tune_loss": r.tune_loss,
                             "test_loss": r.test_loss,
                             "vs_ddps_lr_pct": 100 * (r.test_loss / ref - 1)})
    df = pd.DataFrame(rows)
    if len(df):
        best = df.groupby(["size", "factor", "method"], sort=False).tune_loss.transform("min")
        df["best_on_tune"] = df.tune_loss == best
    return df


def results(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (size, factor, method) at the chosen settings: test loss and accuracy over the seeds
    (mean, std), and DiLoCo's test loss against DDP's of the same seed (%, the paper's measure:
    negative = DiLoCo better), mean and std over the seeds."""
    t = table(histories, sweep=True)
    quick = quick_of(histories)
    keep = []
    for r in t.itertuples():
        rec = CHOSEN[quick][(r.size, r.factor)]
        keep.append(r.inner_lr == rec["DDP"] and (r.m == 0 or r.outer_lr == rec.get(r.m)))
    t = t[keep]
    ddp = {(r.size, r.factor, r.seed): r.test_loss for r in t[t.m == 0].itertuples()}
    t = t.assign(gap=[100 * (r.test_loss / ddp[(r.size, r.factor, r.seed)] - 1)
                      for r in t.itertuples()])
    params = {s: n for s, (_, n, _) in SIZES[quick].items()}
    rows = []
    for (size, factor, m), g in t.groupby(["size", "factor", "m"], sort=False):
        rows.append({"size": size, "params": params[size], "factor": factor, "M": m,
                     "method": g.method.iloc[0], "seeds": len(g),
                     "test_loss": g.test_loss.mean(), "test_loss_std": _std(g.test_loss),
                     "test_accuracy": g.test_accuracy.mean(),
                     "gap_pct": g.gap.mean(), "gap_std": _std(g.gap)})
    return pd.DataFrame(rows)


def _std(x) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else math.nan


def batch_rise(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Each method's test loss at `LARGE_BATCH`× the batch against its own at 1× (%, each at
    its recorded choices, mean over the seeds both have): in the sweep, at `MORE`× the tokens,
    and from `SMALL_BASE`. `base` is the cell's field (0: the size's batch), `batch` the global
    batch at 1× (sequences), `per_worker` that batch's share of one of M = 8 workers, `loss_1x`
    the method's own test loss at 1×."""
    quick = quick_of(histories)
    t = table(histories)
    t = t[t.more_syncs == 1]
    rows = []
    for (size, tokens, base), g in t.groupby(["size", "more_tokens", "base"], sort=False):
        if LARGE_BATCH not in set(g.factor):
            continue
        rec = {f: recorded(quick, size, f, tokens, base) for f in (1, LARGE_BATCH)}
        batch = base or SIZES[quick][size][2]
        for m in (0, *(k for k in rec[LARGE_BATCH] if k != "DDP")):
            means = []
            for factor in (1, LARGE_BATCH):
                x = g[(g.factor == factor) & (g.m == m) & (g.inner_lr == rec[factor]["DDP"])]
                x = x[x.outer_lr == rec[factor][m]] if m else x
                means.append(x.set_index("seed").test_loss)
            seeds = means[0].index.intersection(means[1].index)
            if len(seeds):
                rows.append({"size": size, "tokens": tokens, "base": base, "batch": batch,
                             "per_worker": batch / WORKERS[-1], "M": m, "seeds": len(seeds),
                             "loss_1x": means[0][seeds].mean(),
                             "rise_pct": 100 * (means[1][seeds].mean() / means[0][seeds].mean()
                                                - 1)})
    return pd.DataFrame(rows)


def causes(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per size of `CAUSES` and M in `CHECK_INNER`: DiLoCo's test loss against DDP's (%) in the
    sweep, at `MORE`× the outer steps on the same tokens (seed 0, the outer lr with the lowest
    tune-plays loss), and at `MORE`× the tokens (the recorded choices, paired by seed)."""
    quick = quick_of(histories)
    t = table(histories)
    sweep = results(histories)
    rows = []
    for size in CAUSES[quick]:
        rec, longer = CHOSEN[quick][(size, 1)], CHOSEN_LONGER[quick][(size, 1)]
        ddp0 = t[(t["size"] == size) & (t.factor == 1) & (t.m == 0) & (t.seed == 0)
                 & (t.inner_lr == rec["DDP"]) & (t.more_tokens == 1)
                 & (t.base == 0)].test_loss.iloc[0]
        for m in CHECK_INNER:
            row = sweep[(sweep["size"] == size) & (sweep.M == m) & (sweep.factor == 1)].iloc[0]
            rows.append({"size": size, "M": m, "variant": "the sweep", "gap_pct": row.gap_pct,
                         "gap_std": row.gap_std, "seeds": row.seeds})
            g = t[(t["size"] == size) & (t.m == m) & (t.more_syncs == MORE)]
            if len(g):
                best = g.loc[g.tune_loss.idxmin()]
                rows.append({"size": size, "M": m, "variant": f"{MORE}× the outer steps",
                             "gap_pct": 100 * (best.test_loss / ddp0 - 1), "gap_std": math.nan,
                             "seeds": 1, "outer_lr": best.outer_lr})
            long = t[(t["size"] == size) & (t.more_tokens == MORE) & (t.factor == 1)]
            gaps = []
            for seed in sorted(set(long.seed)):
                d = long[(long.m == 0) & (long.seed == seed) & (long.inner_lr == longer["DDP"])]
                x = long[(long.m == m) & (long.seed == seed) & (long.inner_lr == longer["DDP"])
                         & (long.outer_lr == longer[m])]
                if len(d) and len(x):
                    gaps.append(100 * (x.test_loss.iloc[0] / d.test_loss.iloc[0] - 1))
            if gaps:
                rows.append({"size": size, "M": m, "variant": f"{MORE}× the tokens",
                             "gap_pct": float(np.mean(gaps)), "gap_std": _std(gaps),
                             "seeds": len(gaps), "outer_lr": longer[m]})
    return pd.DataFrame(rows)
