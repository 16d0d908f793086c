"""Figures of the scaling-law sweep (`experiments.scaling`): DiLoCo's gap to DDP against M per
model size beside the paper's, and the outer-lr grids on the tune plays."""

from __future__ import annotations

import altair as alt
import pandas as pd

SIZE_COLOURS = ["#9ecae1", "#4292c6", "#08306b"]  # light to dark: small to large


def _sizes(values) -> alt.Scale:
    order = list(dict.fromkeys(values))
    return alt.Scale(domain=order, range=SIZE_COLOURS[-len(order):] if len(order) <= 3
                     else None)


def gap(results: pd.DataFrame, paper: dict, tokens_per_param: float) -> alt.LayerChart:
    """Test-plays loss against DDP's (%, below zero: DiLoCo better) for M = 1…8 at a fixed
    global batch, one line per model size (mean over seeds, ± one std), and the paper's Table 4
    at 35M and 2.4B parameters (dashed). `results`: `scaling.results`."""
    df = results[(results.M > 0) & (results.factor == 1)].assign(
        model=lambda d: [f"{s} params" for s in d["size"]],
        lo=lambda d: d.gap_pct - d.gap_std.fillna(0), hi=lambda d: d.gap_pct + d.gap_std.fillna(0))
    ref = pd.DataFrame([{"model": f"paper, {name}", "M": m, "gap_pct": v}
                        for name, by_m in paper.items() for m, v in by_m.items()])
    x = alt.X("M:O", title="workers M (global batch fixed)", axis=alt.Axis(labelAngle=0))
    seeds = int(df.seeds.max()) if len(df) else 0
    colour = alt.Color("model:N", title=f"ours ({seeds} seeds)", scale=_sizes(df.model))
    ours = alt.Chart(df).encode(x=x, color=colour)
    lines = ours.mark_line(point=True, strokeWidth=2.5).encode(
        y=alt.Y("gap_pct:Q", title="test loss vs DDP (%)"),
        tooltip=["model", "M", alt.Tooltip("gap_pct:Q", format="+.2f"),
                 alt.Tooltip("gap_std:Q", format=".2f", title="std"), "seeds"])
    bars = ours.mark_errorbar().encode(y=alt.Y("lo:Q", title="test loss vs DDP (%)"), y2="hi:Q")
    theirs = alt.Chart(ref).mark_line(strokeDash=[5, 4], color="#8C8C8C",
                                      point=alt.OverlayMarkDef(color="#8C8C8C")).encode(
        x=x, y="gap_pct:Q", detail="model:N", tooltip=["model", "M", "gap_pct"])
    names = alt.Chart(ref[ref.M == 8]).mark_text(align="left", dx=6, color="#666",
                                                  fontSize=10).encode(
        x=x, y="gap_pct:Q", text="model:N")
    zero = alt.Chart().mark_rule(color="#666", strokeDash=[2, 2]).encode(y=alt.datum(0))
    return alt.layer(theirs, names, bars, lines, zero).properties(
        width=420, height=280,
        title=f"DiLoCo against DDP as M and the model grow ({tokens_per_param:g} tokens per "
              "parameter)")


def _bar_labels(base: alt.Chart, field: str) -> list:
    """The `text` column beside each horizontal bar (right of a positive `field`, left of a
    negative one, in dark grey whatever the bar's colour), and the zero rule."""
    def label(sign, align, dx):
        return base.transform_filter(f"datum.{field} {sign} 0").mark_text(
            align=align, dx=dx, fontSize=10).encode(text="text:N", color=alt.value("#333"))

    zero = alt.Chart().mark_rule(color="#333").encode(x=alt.datum(0))
    return [label(">=", "left", 4), label("<", "right", -4), zero]


def tuning(table: pd.DataFrame, choices: pd.DataFrame) -> alt.FacetChart:
    """Seed 0's final tune-plays loss against DiLoCo's outer lr, one line per M, one panel per
    model size (1× batch, at DDP's chosen inner lr); the chosen lr of each M ringed."""
    sweep = choices[(choices.factor == 1) & (choices.tokens == 1) & (choices.base == 0)]
    chosen = {(c.size, c.method): c.chosen for c in sweep.itertuples() if c.knob == "outer_lr"}
    inner = {c.size: c.chosen for c in sweep.itertuples() if c.knob == "inner_lr"}
    df = table[(table.factor == 1) & (table.seed == 0) & (table.m > 0)]
    df = df[[lr == inner.get(s) for s, lr in zip(df["size"], df.inner_lr, strict=True)]]
    df = df.assign(chosen=[chosen.get((s, m)) == o for s, m, o
                           in zip(df["size"], df.method, df.outer_lr, strict=True)],
                   model=[f"{s} params" for s in df["size"]])
    base = alt.Chart().encode(
        x=alt.X("outer_lr:Q", title="outer learning rate", scale=alt.Scale(zero=False)),
        y=alt.Y("tune_loss:Q", title="tune-plays loss (nats/char)", scale=alt.Scale(zero=False)),
        color=alt.Color("method:N", title="DiLoCo", sort=[f"M={m}" for m in (1, 2, 4, 8)],
                        scale=alt.Scale(scheme="oranges", domain=[f"M={m}" for m in (1, 2, 4, 8)])),
        tooltip=["model", "method", "outer_lr:Q", alt.Tooltip("tune_loss:Q", format=".4f")])
    lines = base.mark_line(point=True, strokeWidth=2)
    ring = base.transform_filter("datum.chosen").mark_point(size=220, filled=False,
                                                            strokeWidth=2)
    return alt.layer(lines, ring, data=df).properties(width=230, height=210).facet(
        column=alt.Column("model:N", title=None, sort=list(dict.fromkeys(df.model))),
    ).resolve_scale(y="independent").properties(
        title="Choosing DiLoCo's outer lr per M and model size on the tune plays (ringed)")


def causes(table: pd.DataFrame) -> alt.FacetChart:
    """DiLoCo's test loss against DDP's (%) for M = 1 and 8 on the smaller models: in the sweep,
    with 4× the outer steps on the same tokens, and with 4× the tokens. `table`:
    `scaling.causes`."""
    df = table.assign(model=[f"{s} params" for s in table["size"]],
                      method=[f"M={m}" for m in table.M],
                      text=[f"{v:+.1f}%" for v in table.gap_pct])
    order = list(dict.fromkeys(df.variant))
    base = alt.Chart().encode(
        y=alt.Y("variant:N", sort=order, title=None),
        x=alt.X("gap_pct:Q", title="test loss vs DDP (%)", scale=alt.Scale(padding=45)),
        color=alt.Color("variant:N", sort=order, legend=None,
                        scale=alt.Scale(range=["#8C8C8C", "#DD8452", "#4C72B0"])),
        tooltip=["model", "method", "variant", alt.Tooltip("gap_pct:Q", format="+.2f"),
                 "seeds"])
    chart = alt.layer(base.mark_bar(), *_bar_labels(base, "gap_pct"), data=df)
    return chart.properties(width=200, height=90).facet(
        row=alt.Row("model:N", title=None), column=alt.Column("method:N", title=None),
    ).properties(title="Why DiLoCo trails DDP here: more outer steps, or more tokens?")


def batch(rises: pd.DataFrame, factor: int) -> alt.FacetChart:
    """Each method's test loss at `factor`× the global batch against its own at 1× (%, equal
    tokens and outer steps), one panel per setting: the sweep's sizes, the largest from a
    smaller batch, longer runs; each titled with DiLoCo M = 8's own loss at 1×. Lower: the
    method tolerates the larger batch better. `rises`: `scaling.batch_rise`."""
    m8 = {(r.size, r.tokens, r.base): r.loss_1x for r in rises[rises.M == 8].itertuples()}

    def setting(r):
        extra = f", {r.tokens}× tokens" if r.tokens != 1 else ""
        loss = m8.get((r.size, r.tokens, r.base))
        at_1x = f" · M=8 at 1×: {loss:.2f} nats" if loss is not None else ""
        return f"{r.size}{extra}: batch {r.batch} → {r.batch * factor}{at_1x}"

    df = rises.assign(setting=[setting(r) for r in rises.itertuples()],
                      method=["DDP" if m == 0 else f"M={m}" for m in rises.M],
                      text=[f"{v:+.1f}%" for v in rises.rise_pct])
    methods = ["DDP"] + [f"M={m}" for m in (1, 2, 4, 8)]
    base = alt.Chart().encode(
        y=alt.Y("method:N", sort=methods, title=None),
        x=alt.X("rise_pct:Q", title=f"test loss at {factor}× the batch vs 1× (%)",
                scale=alt.Scale(padding=40)),
        color=alt.Color("method:N", legend=None, scale=alt.Scale(
            domain=methods, range=["#8C8C8C", "#fdd0a2", "#fdae6b", "#f16913", "#a63603"])),
        tooltip=["setting", "method", alt.Tooltip("rise_pct:Q", format="+.2f"), "seeds"])
    chart = alt.layer(base.mark_bar(), *_bar_labels(base, "rise_pct"), data=df).properties(
        width=260, height=alt.Step(16))
    return chart.facet(
        facet=alt.Facet("setting:N", title=None, sort=list(dict.fromkeys(df.setting))),
        columns=2).resolve_scale(y="independent").properties(
        title=f"Does DiLoCo tolerate a {factor}× larger batch better than DDP? (lower: yes)")
