"""The scaling-law sweep's report (`experiments.scaling` re-exports it): the paper's four
findings with their verdicts, evidence and what the cause checks found; the figures; the results
rows; and the committed findings read back for a notebook. It reads the analyses
(`scaling_findings`) and the design (`scaling_design`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .scaling_design import (
    CAUSE_INNER_LRS,
    CAUSE_OUTER_LRS,
    CHOSEN,
    EXPERIMENT,
    INNER_LRS,
    LARGE_BATCH,
    MORE,
    OUTER_LRS,
    TOKENS_PER_PARAM,
    WORKERS,
    Cell,
    config,
    quick_of,
)
from .scaling_findings import batch_rise, causes, choices, inner_check, results, table

# The scaling-law paper's Table 4: DiLoCo's evaluation loss against data-parallel's, %, per M, at
# its smallest (35M) and largest (2.4B) model; H = 30, 20 tokens per parameter, outer lr tuned
# per M from {0.2, 0.4, ..., 1.0}.
PAPER_LOSS_VS_DP_PCT = {"35M": {1: -0.1, 2: 0.7, 4: 2.0, 8: 3.9},
                        "2.4B": {1: -0.4, 2: -0.1, 4: 0.3, 8: 1.1}}
VERDICT = {1.0: "reproduced", 0.5: "reproduced only partly", 0.0: "not reproduced"}


def _sign(mean: float, std: float) -> int:
    """-1 / +1 when `mean` is below / above zero by more than one `std` (the spread over seeds),
    0 when within it (with one seed: the sign)."""
    noise = 0.0 if math.isnan(std) else std
    return -1 if mean < -noise else (1 if mean > noise else 0)


def _verdict(flags: list[bool]) -> float:
    return 1.0 if all(flags) else (0.5 if any(flags) else 0.0)


def findings(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The paper's four findings: `verdict` 1 (reproduced in every size or M), 0.5 (in some),
    0 (in none), with the evidence (test plays, mean ± std over the seeds)."""
    r = results(histories)
    plain = r[r.factor == 1]
    sizes = list(dict.fromkeys(plain["size"]))

    def gap(size, m, factor=1):
        row = r[(r["size"] == size) & (r.M == m) & (r.factor == factor)].iloc[0]
        return float(row.gap_pct), float(row.gap_std)

    def pm(v):
        return f"{v[0]:+.2f}%" + ("" if math.isnan(v[1]) else f" ± {v[1]:.2f}")

    m1 = {s: gap(s, 1) for s in sizes}
    grows = {s: [gap(s, m)[0] for m in WORKERS] for s in sizes}
    shrinks = {m: [gap(s, m)[0] for s in sizes] for m in WORKERS[1:]}
    out = [
        {"finding": "DiLoCo with M = 1 matches or beats DDP",
         "evidence": "; ".join(f"{s}: {pm(v)}" for s, v in m1.items()),
         "verdict": _verdict([_sign(*v) <= 0 for v in m1.values()])},
        {"finding": "the gap to DDP grows with M",
         "evidence": "; ".join(f"{s}: " + " → ".join(f"{g:+.1f}%" for g in v)
                               for s, v in grows.items()),
         "verdict": _verdict([bool(np.all(np.diff(v) > 0)) for v in grows.values()])},
        {"finding": "the gap shrinks as the model grows",
         "evidence": "; ".join(f"M = {m}: " + " → ".join(f"{g:+.1f}%" for g in v)
                               for m, v in shrinks.items()) + f" ({' → '.join(sizes)})",
         "verdict": _verdict([bool(np.all(np.diff(v) < 0)) for v in shrinks.values()])},
    ]
    rises = batch_rise(histories)
    sweep = rises[(rises.tokens == 1) & (rises.base == 0)] if len(rises) else rises
    if len(sweep):
        rise = {(r.size, r.M): r.rise_pct for r in sweep.itertuples()}
        at = list(dict.fromkeys(sweep["size"]))
        out.append({"finding": "DiLoCo tolerates a larger batch than DDP",
                    "evidence": f"{LARGE_BATCH}× the global batch at equal tokens and equal "
                                "outer steps, each retuned, test loss against 1×: " + "; ".join(
                                    f"{s}: DDP {rise[s, 0]:+.1f}%, M = 8 {rise[s, 8]:+.1f}%"
                                    for s in at),
                    "verdict": _verdict([rise[s, 8] < rise[s, 0] for s in at])})
    df = pd.DataFrame(out)
    df["verdict_text"] = [VERDICT[v] for v in df.verdict]
    checks = causes(histories)
    df["cause"] = [_cause(checks, rises, f) if v < 1 else "" for f, v
                   in zip(df.finding, df.verdict, strict=True)]
    return df


def _cause(c: pd.DataFrame, rises: pd.DataFrame, finding: str) -> str:
    """What the cause checks (`causes`, `batch_rise`) say about a finding not reproduced in full:
    the numbers, and which check brings it back (none: said so)."""
    if finding.startswith("DiLoCo tolerates"):
        return _batch_cause(rises)
    if c.empty:
        return ""
    more_steps, more_tokens = f"{MORE}× the outer steps", f"{MORE}× the tokens"

    def at(variant, m):
        return c[(c.variant == variant) & (c.M == m)]

    def fmt(rows):
        return ", ".join(f"{r.size} {r.gap_pct:+.2f}%" for r in rows.itertuples())

    if finding.startswith("DiLoCo with M = 1"):
        steps, tokens = at(more_steps, 1), at(more_tokens, 1)
        back = all(_sign(r.gap_pct, r.gap_std) <= 0 for r in tokens.itertuples())
        return (f"M = 1 against DDP with {more_steps} on the same tokens: {fmt(steps)}; with "
                f"{more_tokens} at the same H: {fmt(tokens)}. "
                + ("More tokens bring it back, more syncs do not: our runs are too short per "
                   "parameter for the outer optimizer to pay off" if back else
                   "Neither check brings it back"))
    if finding.startswith("the gap shrinks"):
        tokens = at(more_tokens, 8)
        if len(tokens) < 2:
            return ""
        shrinks = bool(np.all(np.diff(tokens.gap_pct) < 0))
        return (f"M = 8 with {more_tokens} ({' → '.join(tokens['size'])}): {fmt(tokens)}: the "
                + ("gap shrinks with the model once the runs are longer" if shrinks
                   else "gap does not shrink with the model in longer runs either"))
    if finding.startswith("the gap to DDP grows"):
        tokens = c[c.variant == more_tokens]
        by_m = {(r.size, r.M): r.gap_pct for r in tokens.itertuples()}
        return f"with {more_tokens}: " + "; ".join(
            f"{size}: M = 1 {by_m[size, 1]:+.2f}%, M = 8 {by_m[size, 8]:+.2f}%"
            for size in dict.fromkeys(tokens["size"]))
    return ""


def _batch_cause(rises: pd.DataFrame) -> str:
    """The batch finding's cause checks: every setting where DDP and M = 8 ran at 1× and 4×
    (the sweep's sizes, the largest from `SMALL_BASE`, `MORE`× the tokens), each with M = 8's
    own loss at 1×; whether one loss level separates the settings where the finding holds from
    those where it fails; and the rise per M where every M ran."""
    if rises.empty:
        return ""

    def setting(r):
        return r["size"] + (f" with {r.tokens}× the tokens" if r.tokens != 1 else "") + (
            f" from a global batch of {r.batch} ({r.per_worker:g} sequence"
            f"{'' if r.per_worker == 1 else 's'} per worker at M = 8)"
            if r.base else "")

    ddp = {(r.size, r.tokens, r.base): r.rise_pct for r in rises[rises.M == 0].itertuples()}
    m8 = rises[rises.M == 8]
    m8 = m8.assign(ddp=[ddp.get((r.size, r.tokens, r.base)) for r in m8.itertuples()]).dropna(
        subset=["ddp"])
    held, failed = m8[m8.rise_pct < m8.ddp].loss_1x, m8[m8.rise_pct >= m8.ddp].loss_1x
    out = ["; ".join(f"{setting(r)}: DDP {r.ddp:+.1f}%, M = 8 {r.rise_pct:+.1f}% (M = 8 at 1×: "
                     f"{r.loss_1x:.2f} nats)" for _, r in m8.iterrows())]
    if len(held) and len(failed) and held.min() > failed.max():
        out.append(f"The finding holds only where DiLoCo M = 8 ends at 1× at {held.min():.2f} "
                   "nats or more, far from trained: it has little to lose. Wherever it trains "
                   f"further at 1× ({failed.max():.2f} nats or less: a larger model, a smaller "
                   "batch per step or more tokens), the larger batch costs DiLoCo more than DDP")
    elif len(held) and len(failed):
        out.append("No loss level separates the settings where it holds from those where it "
                   "fails")
    sweep = rises[(rises.tokens == 1) & (rises.base == 0)]
    for size, g in sweep.groupby("size", sort=False):
        if g.M.nunique() > 2:
            out.append(f"{size}, every M: " + ", ".join(
                f"{'DDP' if r.M == 0 else f'M = {r.M}'} {r.rise_pct:+.1f}% "
                f"(1×: {r.loss_1x:.2f})" for r in g.itertuples()))
    return ". ".join(out)


# --------------------------------------------------------------------------------------------
# Figures and rows
# --------------------------------------------------------------------------------------------


def figures(group: str, histories: dict[str, pd.DataFrame]) -> dict[str, object]:
    from ..plots import scaling as sp

    quick = quick_of(histories)
    return {"scaling_gap": sp.gap(results(histories), PAPER_LOSS_VS_DP_PCT,
                                  TOKENS_PER_PARAM[quick]),
            "scaling_tuning": sp.tuning(table(histories, sweep=True), choices(histories)),
            "scaling_causes": sp.causes(causes(histories)),
            "scaling_batch": sp.batch(batch_rise(histories), LARGE_BATCH)}


def rows(group: str, histories: dict[str, pd.DataFrame]) -> list[dict]:
    """Results rows: the choices (tune plays), then test-plays losses and gaps (mean over the
    seeds, with std), the inner-lr check, and the findings."""
    from .common import describe

    quick = quick_of(histories)
    out = []

    def add(method, metric, value, published=None, std=None, seeds=None, config=""):
        out.append({"experiment": EXPERIMENT, "method": method, "metric": metric,
                    "value": float(value), "std": std, "seeds": seeds, "published": published,
                    "config": config})

    def cfg(size, factor, m):
        rec = CHOSEN[quick][(size, factor)]
        cell = Cell(size, factor, m, rec["DDP"], rec.get(m) if m else None, 0)
        return describe(config(quick, cell)) + f" lr={rec['DDP']:g}"

    for c in choices(histories).itertuples():
        edge = "; ON THE GRID'S EDGE" if c.on_edge else ""
        grid = INNER_LRS[quick] if c.knob == "inner_lr" else OUTER_LRS[quick]
        agree = "agrees with" if c.agrees else "DIFFERS from"
        if c.tokens != 1:
            grid = CAUSE_INNER_LRS[quick] if c.knob == "inner_lr" else CAUSE_OUTER_LRS[quick]
        tokens = f" · {c.tokens}× tokens" if c.tokens != 1 else ""
        tokens += f" · from batch {c.base}" if c.base else ""
        add(f"{c.size} · {c.factor}× batch{tokens} · {c.method}",
            f"chosen {c.knob.replace('_', ' ')}", c.chosen,
            config=f"grid {list(grid)}{edge}; {agree} the record ({c.recorded:g})")
    for r in results(histories).itertuples():
        label = f"{r.size} · {r.factor}× batch · {r.method}"
        add(label, "test-plays loss", r.test_loss, std=r.test_loss_std, seeds=r.seeds,
            config=cfg(r.size, r.factor, r.M))
        if r.M:
            paper = PAPER_LOSS_VS_DP_PCT["35M"][r.M] if r.factor == 1 else None
            add(label, "test loss vs DDP (%)", r.gap_pct, paper, std=r.gap_std, seeds=r.seeds,
                config=cfg(r.size, r.factor, r.M))
    for r in inner_check(histories).itertuples():
        tag = " (DDP's)" if r.is_ddps else ""
        best = "; best on the tune plays" if r.best_on_tune else ""
        batch = f" · {r.factor}× batch" if r.factor != 1 else ""
        add(f"{r.size}{batch} · {r.method} · inner lr {r.inner_lr:g}{tag}",
            "test loss vs DDP's inner lr (%)", r.vs_ddps_lr_pct,
            config=f"seed 0, at the chosen outer lr{best}")
    for r in batch_rise(histories).itertuples():
        tag = (f" · {r.tokens}× tokens" if r.tokens != 1 else "") + (
            f" · from batch {r.batch}" if r.base else "")
        add(f"{r.size}{tag} · {'DDP' if r.M == 0 else f'M={r.M}'}",
            f"test loss at {LARGE_BATCH}× the batch vs 1× (%)", r.rise_pct, seeds=r.seeds,
            config=f"global batch {r.batch} → {r.batch * LARGE_BATCH} sequences "
                   f"({r.per_worker:g} → {r.per_worker * LARGE_BATCH:g} per worker at M = 8), "
                   "equal tokens and outer steps, each at its recorded choices")
    for r in causes(histories).itertuples():
        add(f"{r.size} · M={r.M} · {r.variant}", "cause check: test loss vs DDP (%)", r.gap_pct,
            std=None if math.isnan(r.gap_std) else r.gap_std, seeds=r.seeds,
            config="" if math.isnan(getattr(r, "outer_lr", math.nan))
            else f"outer lr {r.outer_lr:g}")
    for f in findings(histories).itertuples():  # published 1: the paper reports it
        cause = f"; cause check: {f.cause}" if f.cause else ""
        add(f.finding, "reproduced (1), partly (0.5) or not (0)", f.verdict, 1.0,
            config=f"evidence: {f.evidence}{cause}")
    return out


def committed(figures_dir=None) -> dict[str, pd.DataFrame]:
    """The sweep's results as `make reproduce-scaling` last wrote them to `results.json` (for a
    notebook that should not train it): `gaps`, size × M, and `findings`; empty when absent."""
    import json
    from pathlib import Path

    from .. import paths

    path = Path(figures_dir or paths.figures_dir(False)) / "results.json"
    rows = pd.DataFrame(json.loads(path.read_text())) if path.exists() else pd.DataFrame()
    if rows.empty or EXPERIMENT not in set(rows.experiment):
        return {"gaps": pd.DataFrame(), "findings": pd.DataFrame()}
    rows = rows[rows.experiment == EXPERIMENT]
    gap = rows[rows.metric == "test loss vs DDP (%)"]
    parts = gap.method.str.split(" · ", expand=True)
    gaps = pd.DataFrame({"size": parts[0], "batch": parts[1], "M": parts[2],
                         "gap_pct": gap.value.to_numpy(), "gap_std": gap["std"].to_numpy()})
    verdicts = rows[rows.metric.str.startswith("reproduced")]
    text = verdicts.config.str.removeprefix("evidence: ").str.split("; cause check: ", n=1)
    findings = pd.DataFrame({"finding": verdicts.method.to_numpy(),
                             "verdict_text": [VERDICT[v] for v in verdicts.value],
                             "evidence": [t[0] for t in text],
                             "cause": [t[1] if len(t) > 1 else "" for t in text]})
    return {"gaps": gaps, "findings": findings}


def scaling_results(figures_dir=None) -> dict:
    """What a report shows of the scaling-law sweep without training it (public: `dl.`): the
    sweep as last committed (`committed`: `gaps`, `findings`) and the paper's Table 4
    (`paper`: size → {M: loss vs DP, %})."""
    return {**committed(figures_dir), "paper": PAPER_LOSS_VS_DP_PCT}
