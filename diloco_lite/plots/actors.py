"""Figures of Decoupled DiLoCo on real actors (`diloco_lite.actors`, notebook 08).

A run's events as one tidy frame, one row per event (columns `time_s`, `lane`, `learner`,
`kind`, `fragment`), from either clock:

- `log_frame(result.log, config)`: a run on Ray actors (`train_actors`), from the syncer's log:
  its `kill`s are the driver's (a log without any, from an older run, gets one at the start of
  each of the `Cluster`'s failure windows); its `fail` is when the syncer learned of the death;
- `plan_frame(result.plan, config)`: the simulated clock (`train`), from its plan: send ->
  `answer`, close -> `merge`, arrive -> `apply`, reload -> `rejoin`; a failure window's start is
  both the `kill` and the `fail` (the simulated syncer knows at once); the asks, which a plan
  does not hold, are rebuilt from the schedule (on a free link: loopback's, the actors').

`events_frame` takes either. `down_frame` pairs each kill with the rejoin after it, and
`timeline_chart(real, simulated)` sets the two timelines one above the other on one time axis.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

# kind -> (legend label, colour, shape, sub-row of its lane: a top, b middle, c bottom)
KINDS = {
    "ask": ("syncer asks for a fragment", "#8C8C8C", "triangle-down", "a"),
    "merge": ("syncer publishes a merge", "#C44E52", "diamond", "c"),
    "answer": ("learner answers (sends Δ)", "#4C72B0", "circle", "a"),
    "apply": ("learner applies Θ", "#55A868", "square", "c"),
    "kill": ("process killed", "#000000", "cross", "b"),
    "fail": ("syncer learns of the death", "#DD8452", "triangle-left", "b"),
    "rejoin": ("learner rejoins", "#8172B3", "triangle-right", "b"),
}
COLUMNS = ["time_s", "lane", "learner", "kind", "fragment"]
DOWN_COLOR = "#F2C4C4"


def lane(m: int) -> str:
    """The row a learner's events go on ("syncer" for the syncer's own, m = -1)."""
    return "syncer" if m < 0 else f"learner {m}"


def _frame(rows: list) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["time_s", "kind", "learner", "fragment"])
    df = df[df.kind.isin(list(KINDS))].astype({"time_s": float, "learner": int, "fragment": int})
    df = df.assign(lane=df.learner.map(lane))
    return df.sort_values(["time_s", "learner"], kind="stable").reset_index(drop=True)[COLUMNS]


def _windows(config, end: float) -> list[tuple[int, float, float]]:
    """(learner, down_at, up_at) of the `Cluster`'s failure windows that start before `end`."""
    from ..clock import Timeline

    timeline = Timeline(config.cluster, config.workers)
    out = []
    for m in range(config.workers):
        i = 0
        while (w := timeline.window(m, i)) is not None and w[0] < end:
            out.append((m, float(w[0]), float(w[1])))
            i += 1
    return out


def log_frame(log, config) -> pd.DataFrame:
    """The events of a run on actors (`RunResult.log` of `train_actors`; module docstring).
    The syncer's `close` (the decision; `merge` is its publication, milliseconds later) is left
    out."""
    rows = [(t, kind, m, p) for t, kind, m, p in log]
    if not any(kind == "kill" for _, kind, _, _ in rows):
        end = max((t for t, *_ in rows), default=0.0)
        rows += [(down, "kill", m, -1) for m, down, _ in _windows(config, end)]
    return _frame(rows)


def _asks(plan, config, end: float) -> list[tuple]:
    """When the simulated syncer asked for each fragment: first after reference step offset(p),
    then at the first multiple of H reference steps after the previous version was published
    (`SyncerState.published`; on a free link it is published when it closes)."""
    from ..clock.schedule import Schedule

    schedule = Schedule.of(config.algorithm)
    H, t_ref = schedule.inner_steps, plan.t_ref
    closes = sorted((e.time_s, e.fragment) for b in plan.blocks for e in b.events
                    if e.kind == "close" and not e.flush)
    rows = []
    for p in range(schedule.fragments):
        k = schedule.offset(p)
        for t, _ in [c for c in closes if c[1] == p]:
            rows.append((k * t_ref, "ask", -1, p))
            nxt = k + H
            while nxt * t_ref <= t + 1e-9:
                nxt += H
            k = nxt
        if k * t_ref <= end + 1e-9:  # asked, not closed before the end (the flush takes it)
            rows.append((k * t_ref, "ask", -1, p))
    return rows


def plan_frame(plan, config) -> pd.DataFrame:
    """The events of a run on the simulated clock (`RunResult.plan` of `train`; module
    docstring). A learner answers and applies at its step boundaries: each learner's event is
    at the end of its step `at[m]` (`plan.step_time`), not at its group's first time."""
    def boundary(e, m):
        k = e.at.get(m, 0)
        return float(plan.step_time[m][k - 1]) if k > 0 else float(e.time_s)

    rows = []
    for b in plan.blocks:
        for e in b.events:
            if e.kind == "close":
                rows.append((e.time_s, "merge", -1, e.fragment))
            elif e.kind in ("send", "arrive") and not e.flush:
                kind = "answer" if e.kind == "send" else "apply"
                rows += [(boundary(e, m), kind, int(m), e.fragment) for m in np.flatnonzero(e.mask)]
            elif e.kind == "reload":
                rows += [(e.time_s, "rejoin", int(m), -1) for m in np.flatnonzero(e.mask)]
    evals = [e.time_s for b in plan.blocks for e in b.events if e.kind == "eval"]
    end = max(evals + [t for t, *_ in rows], default=0.0)
    for m, down, _ in _windows(config, end):
        rows += [(down, "kill", m, -1), (down, "fail", m, -1)]
    return _frame(rows + _asks(plan, config, end))


def events_frame(source, config) -> pd.DataFrame:
    """`log_frame` for a run's log (a list), `plan_frame` for a plan."""
    return log_frame(source, config) if isinstance(source, list) else plan_frame(source, config)


def down_frame(events: pd.DataFrame, end: float | None = None) -> pd.DataFrame:
    """Each learner's time down, from a kill to the rejoin after it (to `end`, by default the
    last event, when it never came back). Columns: lane, learner, start_s, end_s."""
    end = float(events.time_s.max()) if end is None else end
    rows = []
    for m, ev in events[events.learner >= 0].groupby("learner"):
        rejoins = ev[ev.kind == "rejoin"].time_s.tolist()
        for t in ev[ev.kind == "kill"].time_s:
            back = min((r for r in rejoins if r >= t), default=math.inf)
            rows.append((lane(m), int(m), float(t), min(back, end)))
    return pd.DataFrame(rows, columns=["lane", "learner", "start_s", "end_s"])


ROWS = {"a": -0.27, "b": 0.0, "c": 0.27}  # a lane's sub-rows, in lanes (1 = one lane)


def _panel(events: pd.DataFrame, title, x: alt.X, lanes: list, end: float) -> alt.LayerChart:
    """One timeline: lane i is centred on y = i (the syncer on top), its kinds on sub-rows."""
    kinds = list(KINDS)
    labels = [KINDS[k][0] for k in kinds]
    at = {name: i for i, name in enumerate(lanes)}
    df = events.assign(what=events.kind.map(lambda k: KINDS[k][0]),
                       y=events.lane.map(at) + events.kind.map(lambda k: ROWS[KINDS[k][3]]),
                       big=events.kind.map(lambda k: KINDS[k][3] == "b"))
    names = "[" + ", ".join(f"'{name}'" for name in lanes) + "]"
    y = alt.Y("y:Q", title=None, scale=alt.Scale(domain=[len(lanes) - 0.5, -0.5], nice=False,
                                                 zero=False),
              axis=alt.Axis(values=list(range(len(lanes))), labelExpr=f"{names}[datum.value]",
                            labelFontSize=12, grid=False, ticks=False, domain=False))
    # every other lane on a light stripe, so that each event reads against its own lane
    stripes = alt.Chart(pd.DataFrame({"y": np.arange(1, len(lanes), 2) - 0.5, "start_s": 0.0,
                                      "end_s": end}).assign(y2=lambda d: d.y + 1.0)).mark_rect(
        color="#F2F2F2").encode(x=alt.X("start_s:Q"), x2="end_s:Q", y=y, y2="y2:Q")
    down = down_frame(events)
    down = down.assign(y=down.lane.map(at) - 0.12, y2=down.lane.map(at) + 0.12)
    bars = alt.Chart(down).mark_rect(color=DOWN_COLOR).encode(
        x=alt.X("start_s:Q"), x2="end_s:Q", y=y, y2="y2:Q",
        tooltip=["lane", alt.Tooltip("start_s:Q", format=".2f", title="down at (s)"),
                 alt.Tooltip("end_s:Q", format=".2f", title="back at (s)")])
    legend = alt.Legend(orient="bottom", columns=4, title=None, symbolSize=90)
    encoding = dict(
        x=x, y=y,
        color=alt.Color("what:N", sort=labels, legend=legend, scale=alt.Scale(
            domain=labels, range=[KINDS[k][1] for k in kinds])),
        shape=alt.Shape("what:N", sort=labels, legend=legend, scale=alt.Scale(
            domain=labels, range=[KINDS[k][2] for k in kinds])),
        tooltip=["lane", "kind", "fragment", alt.Tooltip("time_s:Q", format=".3f",
                                                         title="seconds")])
    points = alt.Chart(df[~df.big]).mark_point(filled=True, size=45, opacity=0.9).encode(
        **encoding)
    life = alt.Chart(df[df.big]).mark_point(filled=True, size=150, opacity=1.0).encode(
        **encoding)  # kills, detections and rejoins: few, and the point of the figure
    return alt.layer(stripes, bars, points, life).properties(
        width=760, height=48 * len(lanes), title=alt.Title(title, fontSize=13))


def timeline_chart(real: pd.DataFrame, simulated: pd.DataFrame,
                   titles: tuple[str, str] = ("On Ray actors: real processes, wall-clock seconds",
                                              "On the simulated clock (train): the same config"),
                   ) -> alt.VConcatChart:
    """Two timelines of the same config, one above the other on one time axis: per lane (the
    syncer, each learner) its events (`events_frame`), and a learner's time down as a shaded
    bar (`down_frame`)."""
    learners = sorted((set(real.learner) | set(simulated.learner)) - {-1})
    lanes = ["syncer"] + [lane(m) for m in learners]
    end = math.ceil(max(float(real.time_s.max()), float(simulated.time_s.max())))
    x = alt.X("time_s:Q", title="seconds since the start", axis=alt.Axis(format="~g"),
              scale=alt.Scale(domain=[0, end], nice=False))
    top, bottom = (_panel(df, t, x, lanes, end)
                   for df, t in zip((real, simulated), titles, strict=True))
    return alt.vconcat(top, bottom, spacing=18).resolve_scale(x="shared").properties(
        title=alt.Title("Decoupled DiLoCo with a learner killed mid-run",
                        subtitle="shaded: the learner is down, from the kill to its rejoin"))
