"""The headline quality table: every method at equal tokens, over several seeds, by the papers'
protocol (`protocol`).

The classroom analogue of the Decoupled DiLoCo announcement's 64.1% (Decoupled DiLoCo) against
64.4% (the synchronous baseline): DDP, DiLoCo (M = 8, H = 50), Streaming DiLoCo (P = 4, τ = 1,
α = 0.5, 4-bit), the reference Decoupled DiLoCo (`decoupled.reference`), and the same
Decoupled DiLoCo under chaos (`decoupled.chaos_cluster`), each with `SEEDS` seeds, at the
protocol's 2,400 steps of 32 sequences (4.9M tokens, 48 outer steps at H = 50) and the outer
learning rate chosen on the tune plays (`protocol.TUNED`). A seed sets the model's
initialisation, every learner's batches and, under chaos, the failure draw.

Rows (`rows`): per method, the mean over seeds, the sample standard deviation (ddof = 1) and the
number of seeds of the **test plays'** accuracy and loss (`data.TEST_PLAYS`: nothing was chosen
on them), total bytes sent (up; and down for Decoupled), peak bytes per step and peak Gbit/s
up; beside each the gap to DDP where a paper published one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import describe, matching_configs

GROUPS = ("quality",)
SEEDS = (0, 1, 2)
METHODS = ("DDP", "DiLoCo", "Streaming DiLoCo", "Decoupled DiLoCo", "Decoupled DiLoCo, chaos")

# What the papers published about each method's quality against data-parallel training
# (docs/algorithms.md §7): (metric of ours it compares with, published value, what the
# published value is).
PUBLISHED = {
    "DiLoCo": ("perplexity / DDP perplexity", 15.02 / 15.30,
               "150M model, C4, M=8, H=500 (DiLoCo paper)"),
    "Streaming DiLoCo": ("loss / DDP loss", 2.45 / 2.45, "1B model, Dolma (Streaming paper)"),
    "Decoupled DiLoCo": ("accuracy gap to DDP (points)", 64.1 - 64.4,
                         "benchmark average, announcement"),
}


def label(method: str, seed: int) -> str:
    return f"{method} · seed {seed}"


def split_label(text: str) -> tuple[str, int]:
    """`label`'s inverse: 'DiLoCo · seed 2' -> ('DiLoCo', 2)."""
    method, _, seed = text.rpartition(" · seed ")
    return method, int(seed)


def groups(quick: bool) -> dict[str, dict]:
    """{'quality': {label(method, seed): RunConfig}}: every method at the protocol, once per seed
    (seed 0 of DiLoCo, Streaming and Decoupled DiLoCo is their tuning run at the chosen lr)."""
    from .protocol import method_config

    return {"quality": {label(m, s): method_config(quick, m, seed=s)
                        for m in METHODS for s in SEEDS}}


def summary(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per method: mean and std over seeds of each final metric, and the seed count."""
    finals = pd.DataFrame([{"method": split_label(k)[0], "seed": split_label(k)[1],
                            **h.iloc[-1].to_dict()} for k, h in histories.items()])
    cols = ["test_accuracy", "test_loss", "val_accuracy", "val_loss", "comm_bytes", "down_bytes",
            "peak_step_bytes", "peak_gbps", "goodput", "tokens"]
    g = finals.groupby("method", sort=False)
    out = g[cols].mean()
    std = g[cols].std(ddof=1).fillna(0.0)  # one seed: no spread to report
    for c in cols:
        out[f"{c}_std"] = std[c]
    out["seeds"] = g.size()
    return out.reset_index()


def rows(group: str, histories: dict[str, pd.DataFrame]) -> list[dict]:
    """Results rows: {experiment, method, metric, value (mean), std, seeds, published, config}."""
    s = summary(histories).set_index("method")
    configs = _configs(histories)
    out = []

    def add(method, metric, value, std=None, published=None, note=""):
        out.append({"experiment": "quality", "method": method, "metric": metric,
                    "value": float(value), "std": None if std is None else float(std),
                    "seeds": int(s.seeds[method]), "published": published,
                    "config": configs.get(method, "") + note})

    ddp = s.loc["DDP"] if "DDP" in s.index else None
    for method, r in s.iterrows():
        add(method, "held-out accuracy", r.test_accuracy, r.test_accuracy_std)
        add(method, "held-out loss", r.test_loss, r.test_loss_std)
        add(method, "total bytes sent", r.comm_bytes, r.comm_bytes_std)
        if r.down_bytes > 0:
            add(method, "total bytes down (syncer)", r.down_bytes, r.down_bytes_std)
        add(method, "peak bytes per step", r.peak_step_bytes, r.peak_step_bytes_std)
        add(method, "peak Gbit/s up", r.peak_gbps, r.peak_gbps_std)
        if ddp is None or method == "DDP":
            continue
        add(method, "bytes reduction vs DDP (x)", ddp.comm_bytes / r.comm_bytes)
        metric, value, what = PUBLISHED.get(method, (None, None, ""))
        gaps = {"accuracy gap to DDP (points)": 100 * (r.test_accuracy - ddp.test_accuracy),
                "perplexity / DDP perplexity": float(np.exp(r.test_loss - ddp.test_loss)),
                "loss / DDP loss": r.test_loss / ddp.test_loss}
        for name, gap in gaps.items():
            published = value if name == metric else None
            add(method, name, gap, published=published,
                note=f"; published: {what}" if published is not None else "")
    return out


def figures(group: str, histories: dict[str, pd.DataFrame]) -> dict[str, object]:
    from ..plots import quality

    return {"quality": quality.accuracy_with_spread(summary(histories))}


def _configs(histories: dict[str, pd.DataFrame]) -> dict[str, str]:
    """Method -> the config line of its seed-0 run (seeds listed), if these are our runs."""
    cfgs = matching_configs(groups, "quality", histories)
    if cfgs:
        seeds = sorted({split_label(k)[1] for k in histories})
        return {m: describe(cfgs[label(m, seeds[0])]) + f"; seeds {seeds}; reported on the "
                "test plays; outer lr chosen on the tune plays"
                for m in {split_label(k)[0] for k in histories}}
    return {}
