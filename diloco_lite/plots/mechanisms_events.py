"""Pictures of mechanisms that happen on a clock, drawn from an event log or a simulator.

- `sync_table` / `sync_chart`: one Decoupled DiLoCo sync as a sequence diagram, from the event
  log of `reference.decoupled(config, log=log)` (notebook 04): the ask, the answers crossing
  the link, the quorum, the grace window, the close and merge, the reply, each learner applying;
- `failure_table` / `failure_chart`: the same failures (the goodput simulator's, notebook 06)
  and what each method loses to them: data-parallel stops everybody and redoes the work since
  its checkpoint, elastic data-parallel stalls everybody briefly and runs without the failed
  replica, Decoupled DiLoCo loses only the failed learner's work since its last sync.

tests/test_mechanisms.py checks each table against a plain loop.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from . import method_label
from .decoupled import TIMELINE
from .mechanisms import _lanes_axis, _lanes_scale


# ---- 4. one Decoupled sync ------------------------------------------------------------------
def sync_table(log: list, config, fragment: int = 0, index: int = 0) -> dict:
    """The events of the `index`-th sync of `fragment` in a reference run's log: `answers`
    (learner, sent, arrived, merged), `applies` (learner, time_s), `steps` (learner, time_s)
    and the syncer's times: ask, quorum (the K-th arrival), close, publish, merged learners."""
    asks = [t for t, w, _, p in log if w == "ask" and p == fragment]
    ask = asks[index]
    close, merged = next((t, who) for t, w, who, p in log
                         if w == "close" and p == fragment and t >= ask)
    publishes = [t for t, w, _, p in log if w == "publish" and p == fragment and t >= close]
    publish, after = publishes[0], (publishes[1:] or [math.inf])[0]
    sent = [(t, m) for t, w, m, p in log if w == "answer" and p == fragment]
    arrived = [(t, m) for t, w, m, p in log if w == "arrive" and p == fragment]
    rows = []
    for m in sorted({m for _, m in sent}):  # a learner's answers arrive in the order it sent
        for s, a in zip([t for t, n in sent if n == m], [t for t, n in arrived if n == m],
                        strict=False):
            if ask <= s < publish:
                rows.append(dict(learner=m, sent=s, arrived=a, merged=m in merged))
    answers = pd.DataFrame(rows, columns=["learner", "sent", "arrived", "merged"])
    counted = sorted(answers.arrived[answers.arrived <= close])
    applies = pd.DataFrame([dict(learner=m, time_s=t) for t, w, m, p in log
                            if w == "apply" and p == fragment and publish <= t < after],
                           columns=["learner", "time_s"])
    end = max([publish, *applies.time_s]) + 0.5
    steps = pd.DataFrame([dict(learner=m, time_s=t) for t, w, m, _ in log
                          if w == "step" and ask - 1 <= t <= end], columns=["learner", "time_s"])
    return dict(ask=ask, quorum=counted[config.algorithm.quorum - 1], close=close,
                publish=publish, merged=tuple(merged), answers=answers, applies=applies,
                steps=steps, learners=config.workers, end=end)


def sync_chart(log: list, config, fragment: int = 0, index: int = 0) -> alt.LayerChart:
    """One sync as a sequence diagram: lanes for the syncer and the learners, time across."""
    s, a = sync_table(log, config, fragment, index), config.algorithm
    M, lat = s["learners"], config.cluster.link.latency_s
    lanes = ["syncer"] + [f"learner {m}" for m in range(M)]
    y = alt.Y("y:Q", scale=_lanes_scale(len(lanes)), axis=_lanes_axis(lanes))
    x = alt.X("t:Q", title="simulated seconds", scale=alt.Scale(
        domain=[s["ask"] - 0.6, s["end"]], nice=False))
    ans = s["answers"].assign(y=s["answers"].learner + 1, y2=0.0, t=s["answers"].sent,
                              what=["answer (merged)" if x else "answer (left out)"
                                    for x in s["answers"].merged])
    reply = pd.DataFrame({"t": s["close"], "t2": s["publish"], "y": 0.0,
                          "y2": [m + 1 for m in range(M)], "learner": range(M)})
    colors = {"answer (merged)": TIMELINE["answer"][1], "answer (left out)": "#AAAAAA"}
    layers = [
        alt.Chart(s["steps"].assign(y=s["steps"].learner + 1, t=s["steps"].time_s)).mark_tick(
            color="#BBBBBB", thickness=1.5, size=16, clip=True).encode(
            x=x, y=y, tooltip=["learner", alt.Tooltip("t:Q", title="step ends (s)")]),
        alt.Chart(pd.DataFrame({"t": [s["close"]], "t2": [s["quorum"]], "y": [-0.3],
                                "y2": [0.3]})).mark_rect(color="#F2C4C4").encode(
            x=x, x2="t2:Q", y=y, y2="y2:Q"),
        alt.Chart(pd.DataFrame({"t": [s["ask"]], "y": [0.0], "y2": [M + 0.3]})).mark_rule(
            strokeDash=[3, 3], color=TIMELINE["ask"][1]).encode(x=x, y=y, y2="y2:Q"),
        alt.Chart(ans).mark_rule(strokeWidth=2).encode(
            x=x, x2="arrived:Q", y=y, y2="y2:Q",
            color=alt.Color("what:N", title=None, scale=alt.Scale(
                domain=list(colors), range=list(colors.values())),
                legend=alt.Legend(orient="bottom")),
            strokeDash=alt.condition("datum.merged", alt.value([1, 0]), alt.value([5, 3])),
            tooltip=["learner", alt.Tooltip("sent:Q", title="sent at (s)"),
                     alt.Tooltip("arrived:Q", title="arrives at (s)"), "merged"]),
        alt.Chart(ans).mark_point(filled=True, size=60, opacity=1).encode(
            x=x, y=y, color=alt.Color("what:N", legend=None)),
        alt.Chart(reply).mark_rule(strokeWidth=1.5, color=TIMELINE["publish"][1],
                                   opacity=0.8).encode(
            x=x, x2="t2:Q", y=y, y2="y2:Q",
            tooltip=["learner", alt.Tooltip("t:Q", title="Θ_p sent at (s)"),
                     alt.Tooltip("t2:Q", title="published at (s)")]),
        alt.Chart(s["applies"].assign(y=s["applies"].learner + 1, t=s["applies"].time_s))
        .mark_point(shape="square", filled=True, size=90, opacity=1,
                    color=TIMELINE["apply"][1]).encode(
            x=x, y=y, tooltip=["learner", alt.Tooltip("t:Q", title="applies Θ_p at (s)")]),
    ]
    who = ", ".join(map(str, s["merged"]))
    notes = [(s["ask"], 0, f"ask p{fragment}", "right", -10, -14),
             (s["quorum"], 0, f"quorum: K = {a.quorum}", "left", -4, -22),
             ((s["quorum"] + s["close"]) / 2, 0, "grace window", "center", 0, 0),
             (s["close"], 0, f"close: merge {who}, outer step", "left", 8, -14)]
    silent = sorted(set(range(M)) - set(s["answers"].learner))
    notes += [(s["publish"], m + 1, "no answer: mid-step until after the close", "left", 10, -14)
              for m in silent]
    notes += [(s["publish"], 1, "Θ_p arrives: published", "left", 6, -14)]
    text = pd.DataFrame(notes, columns=["t", "y", "text", "align", "dx", "dy"])
    for align in ("left", "right", "center"):
        for (dx, dy), part in text[text["align"] == align].groupby(["dx", "dy"]):
            layers.append(alt.Chart(part).mark_text(align=align, dx=dx, dy=dy, fontSize=11,
                                                    color="#333").encode(x=x, y=y, text="text:N"))
    marks = pd.DataFrame({"t": [s["quorum"], s["close"]], "y": [0.0, 0.0],
                          "what": ["quorum", "close"]})
    layers.append(alt.Chart(marks).mark_point(filled=True, opacity=1, size=110).encode(
        x=x, y=y, shape=alt.Shape("what:N", legend=None, scale=alt.Scale(
            domain=["quorum", "close"], range=["circle", "diamond"])),
        color=alt.value(TIMELINE["close"][1]), tooltip=["what", "t:Q"]))
    return alt.layer(*layers).properties(width=700, height=52 * len(lanes), title=alt.Title(
        f"One sync of fragment p{fragment}, zoomed in: ask at {s['ask']:g} s, close at "
        f"{s['close']:g} s, published at {s['publish']:g} s",
        subtitle=[f"reference.decoupled's event log: {M} learners, K = {a.quorum}, τ = "
                  f"{a.overlap}, grace safety s = {a.grace_safety:g}, links of {lat:g} s latency. "
                  "Grey ticks: each learner's steps.",
                  "Blue: an answer leaves at its learner's next step boundary and arrives "
                  f"{lat:g} s later; the K-th arrival is the quorum, the grace window (pink)",
                  "runs out, the syncer closes, merges and takes the outer step; brown: the new "
                  "Θ_p crosses back; green: each learner applies it τ of its own steps after "
                  "the ask."]))


# ---- 5. what a failure costs each method ----------------------------------------------------
STATES = {"work kept": "#55A868", "checkpoint": "#4C72B0", "work lost": "#DD8452",
          "down (detect, reschedule)": "#C44E52", "recovering (reload, rejoin)": "#8172B3",
          "replica out until replaced": "#333333"}
DOWN, RECOVER = "down (detect, reschedule)", "recovering (reload, rejoin)"


def _work(a: float, b: float, dom, failed: bool) -> list:
    """[a, b) of running: work and checkpoints in cycles; if it ends in a failure, the work
    since the last completed cycle is lost."""
    cycle = dom.interval_s + dom.commit_s
    done = a + math.floor((b - a) / cycle) * cycle if failed else b
    rows = [("work kept", a, done)] if dom.commit_s == 0 else []
    k = a
    while dom.commit_s > 0 and k < done:
        rows += [("work kept", k, min(k + dom.interval_s, done)),
                 ("checkpoint", k + dom.interval_s, min(k + cycle, done))]
        k += cycle
    return rows + ([("work lost", done, b)] if failed else [])


def _lockstep(failures: list, dom, horizon: float) -> list:
    """The whole job on the given failure times: a failure while it runs loses the work since
    the last cycle, then detect + reschedule (failures meanwhile are folded in), then reload (a
    failure there starts the recovery over)."""
    rows, run_start = [], 0.0
    for f in failures:
        if f < run_start - dom.exposed_s:
            continue  # during detect + reschedule: folded into it
        if f < run_start:
            rows[-1] = (RECOVER, rows[-1][1], f)  # during the reload: it starts over
        else:
            rows += _work(run_start, f, dom, failed=True)
        rows += [(DOWN, f, f + dom.absorbed_s),
                 (RECOVER, f + dom.absorbed_s, f + dom.absorbed_s + dom.exposed_s)]
        run_start = f + dom.absorbed_s + dom.exposed_s
    rows += _work(run_start, horizon, dom, failed=False)
    return [(s, a, min(b, horizon)) for s, a, b in rows if min(b, horizon) > a]


def failure_table(chaos, *, learners: int = 8, minutes: float = 4.0,
                  seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(intervals: method, lane, state, start_s, end_s; failures: lane, time_s). The failures
    are the simulator's for Decoupled DiLoCo with `learners` learners (`systems.goodput.
    timeline`, same seed): lane m is learner m's 1/M of the chips, and data-parallel and elastic
    data-parallel meet the same failures, each with its own `goodput.domain` timings."""
    from ..systems import goodput as gp

    horizon = minutes * 60.0
    sim = pd.DataFrame(gp.timeline("decoupled", chaos, learners=learners, hours=minutes / 60,
                                   seed=seed))
    fails = sim[sim.state == "down"].rename(columns={"domain": "lane", "start_s": "time_s"})
    fails = fails[["lane", "time_s"]].sort_values("time_s").reset_index(drop=True)
    rows = []
    dec = gp.domain("decoupled", chaos, learners)
    for r in sim.itertuples():
        if r.state == "up":
            rows += [("decoupled", r.domain, *w) for w in _work(
                r.start_s, r.end_s, dec, failed=r.end_s < horizon)]
        else:
            rows.append(("decoupled", r.domain, DOWN if r.state == "down" else RECOVER,
                         r.start_s, r.end_s))
    for scheme in ("dp", "elastic_dp"):
        job = _lockstep(list(fails.time_s), gp.domain(scheme, chaos), horizon)
        rows += [(scheme, m, *w) for m in range(learners) for w in job]
    rows += [("elastic_dp", f.lane, "replica out until replaced", f.time_s,
              min(f.time_s + chaos.replacement_s, horizon)) for f in fails.itertuples()]
    cols = ["method", "lane", "state", "start_s", "end_s"]
    return pd.DataFrame(rows, columns=cols), fails


def failure_chart(chaos, *, learners: int = 8, minutes: float = 4.0,
                  seed: int = 0) -> alt.VConcatChart:
    """The same failures, three methods: one panel each, one lane per 1/M of the chips."""
    df, fails = failure_table(chaos, learners=learners, minutes=minutes, seed=seed)
    df = df.assign(start_min=df.start_s / 60, end_min=df.end_s / 60)
    fails = fails.assign(t=fails.time_s / 60)
    lanes = [f"group {m}" for m in range(learners)]
    y = alt.Y("y:Q", scale=_lanes_scale(learners), axis=_lanes_axis(lanes))
    x = alt.X("start_min:Q", title="minutes", scale=alt.Scale(domain=[0, minutes], nice=False))
    color = alt.Color("state:N", title=None, scale=alt.Scale(
        domain=list(STATES), range=list(STATES.values())),
        legend=alt.Legend(orient="bottom", columns=3, symbolType="square"))
    panels = []
    for method in ("dp", "elastic_dp", "decoupled"):
        part = df[df.method == method]
        out = part.state == "replica out until replaced"
        bars = part[~out].assign(y=part.lane - 0.32, y2=part.lane + 0.32)
        strip = part[out].assign(y=part.lane + 0.18, y2=part.lane + 0.32)
        kept = (bars.end_s - bars.start_s)[bars.state == "work kept"].sum()
        share = kept / (learners * minutes * 60)
        tip = ["state", alt.Tooltip("lane:Q", title="lane (1/M of the chips)"),
               alt.Tooltip("start_s:Q", format=".1f", title="from (s)"),
               alt.Tooltip("end_s:Q", format=".1f", title="to (s)")]
        layers = [alt.Chart(d).mark_rect().encode(x=x, x2="end_min:Q", y=y, y2="y2:Q",
                                                  color=color, tooltip=tip)
                  for d in (bars, strip) if len(d)]
        layers.append(alt.Chart(fails.assign(y=fails.lane)).mark_point(
            shape="cross", size=70, filled=True, color="black", opacity=1, angle=45).encode(
            x=alt.X("t:Q"), y=y, tooltip=[alt.Tooltip("lane:Q", title="failed lane"),
                                          alt.Tooltip("time_s:Q", format=".1f")]))
        what = {"dp": "every failure stops all the chips; they redo the work since the "
                      "checkpoint",
                "elastic_dp": "every failure stalls all the chips briefly; the failed "
                              "replica's 256 chips stay out",
                "decoupled": "a failure stops only its learner, which loses its work since "
                             "its last sync"}[method]
        panels.append(alt.layer(*layers).properties(
            width=680, height=22 * learners, title=alt.Title(
                f"{method_label(method)}: {share:.0%} of the chip-time kept",
                subtitle=what, fontSize=13)))
    return alt.vconcat(*panels, spacing=14).properties(title=alt.Title(
        f"The same failures (×), three methods: {minutes:g} minutes of "
        f"{chaos.chips / 1e6:g}M chips in {learners} lanes",
        subtitle=["The failures are the goodput simulator's (seed "
                  f"{seed}) for Decoupled DiLoCo with {learners} learners: lane m is learner "
                  f"m's 1/{learners} of the chips ({chaos.chips / learners / 1e3:,.0f}k).",
                  "Orange: work done, then thrown away; red and purple: no work at all. The "
                  "shares count the green, in these minutes only (the figures below average "
                  "a week)."]))
