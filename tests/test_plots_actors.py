"""The timeline figure of notebook 08 (`plots.actors`): a real run's log and the simulated
clock's plan as the same rows of events, and the chart of both. No Ray, no training: a small
hand-written log, and a plan from the simulated clock (host only)."""

import numpy as np
import pytest

import diloco_lite as dl
from diloco_lite.clock import Cluster, syncer_state
from diloco_lite.clock.plan import make_plan
from diloco_lite.plots import actors as ap
from tests.helpers import tiny_run


def config(failures=((1, 0.5, 1.3),), steps=12, **cluster):
    algo = dl.DecoupledDiLoCo(inner_steps=4, fragments=2, overlap=1, quorum=2, grace_safety=0.5,
                              bits=32)
    return tiny_run(algo, workers=3, steps=steps, eval_every=4,
                    cluster=Cluster(**{"step_time_s": 0.2, "failures": failures, **cluster}))


def plan_of(cfg):
    P = cfg.algorithm.fragments
    return make_plan(cfg, up_nbytes=[100] * P, down_nbytes=[100] * P, sizes=[1] * P,
                     rejoin_nbytes=0, eval_at=[4, 8, cfg.steps])


# A run on actors as the syncer logs it: (time_s, event, learner, fragment)
LOG = [
    (0.4, "ask", -1, 0), (0.4, "answer", 0, 0), (0.4, "answer", 1, 0), (0.4, "answer", 2, 0),
    (0.41, "close", -1, 0), (0.42, "merge", -1, 0),
    (0.6, "apply", 0, 0), (0.6, "apply", 1, 0), (0.6, "apply", 2, 0),
    (0.8, "ask", -1, 1), (0.8, "answer", 0, 1), (0.8, "answer", 2, 1),
    (0.91, "close", -1, 1), (0.92, "merge", -1, 1),
    (1.9, "fail", 1, -1), (3.1, "rejoin", 1, -1), (3.2, "apply", 1, 1), (3.3, "merge", -1, 0),
]


def test_the_log_becomes_rows_with_the_kill_at_the_window_start():
    cfg = config()
    df = ap.log_frame(LOG, cfg)
    assert list(df.columns) == ap.COLUMNS
    assert "close" not in set(df.kind)  # the decision; its publication is the merge
    assert len(df) == len(LOG) - 2 + 1  # two closes out, one kill in
    kill = df[df.kind == "kill"]
    assert kill.time_s.tolist() == [0.5] and kill.lane.tolist() == ["learner 1"]
    assert set(df.lane) == {"syncer", "learner 0", "learner 1", "learner 2"}
    assert (df[df.lane == "syncer"].kind.isin(["ask", "merge"])).all()
    assert df.time_s.is_monotonic_increasing
    down = ap.down_frame(df)
    assert down[["lane", "start_s", "end_s"]].values.tolist() == [["learner 1", 0.5, 3.1]]
    # a window that starts after the run's last event is not a kill
    late = ap.log_frame(LOG, config(failures=((2, 9.0, 10.0),)))
    assert "kill" not in set(late.kind)


def test_a_learner_that_never_comes_back_is_down_to_the_end():
    df = ap.log_frame([e for e in LOG if e[1] != "rejoin"], config(((1, 0.5, np.inf),)))
    assert ap.down_frame(df)[["start_s", "end_s"]].values.tolist() == [[0.5, 3.3]]


@pytest.mark.parametrize("cluster", [{}, dict(step_time_s=(0.2, 0.3, 0.25), jitter=0.3)])
def test_the_plan_becomes_the_same_rows_with_the_syncers_own_asks(monkeypatch, cluster):
    """Sends, closes, arrivals and reloads become answers, merges, applies and rejoins at each
    learner's own step boundary; the asks rebuilt from the schedule are the ones the simulated
    syncer made (recorded here from `SyncerState.ask`)."""
    asked = []
    ask = syncer_state.SyncerState.ask
    monkeypatch.setattr(syncer_state.SyncerState, "ask",
                        lambda self, p, t: asked.append((round(t, 9), p)) or ask(self, p, t))
    cfg = config(steps=24, **cluster)
    plan = plan_of(cfg)
    df = ap.plan_frame(plan, cfg)
    assert list(df.columns) == ap.COLUMNS
    asks = df[df.kind == "ask"]
    assert sorted(zip(asks.time_s.round(9), asks.fragment, strict=True)) == sorted(asked)
    events = [e for b in plan.blocks for e in b.events]
    sends = sum(int(e.mask.sum()) for e in events if e.kind == "send" and not e.flush)
    assert (df.kind == "answer").sum() == sends
    assert (df.kind == "merge").sum() == sum(e.kind == "close" for e in events)
    # the failure: killed and known at the window's start, back at the reload
    life = df[df.learner == 1].set_index("kind").time_s
    assert life["kill"] == life["fail"] == 0.5
    assert life["rejoin"] == next(e.time_s for e in events if e.kind == "reload") == 1.3
    # every answer and apply is at the end of one of its learner's steps
    for m in range(cfg.workers):
        ends = set(np.round(plan.step_time[m], 9))
        mine = df[(df.learner == m) & df.kind.isin(["answer", "apply"])]
        assert set(mine.time_s.round(9)) <= ends
    # events_frame picks the reader
    assert ap.events_frame(plan, cfg).equals(df)
    assert ap.events_frame(LOG, cfg).equals(ap.log_frame(LOG, cfg))


def test_the_timeline_chart_draws_both_clocks(tmp_path):
    from diloco_lite.plots import save

    cfg = config()
    real, sim = ap.log_frame(LOG, cfg), ap.plan_frame(plan_of(cfg), cfg)
    chart = ap.timeline_chart(real, sim)
    spec = chart.to_dict()
    assert len(spec["vconcat"]) == 2
    for panel in spec["vconcat"]:
        stripes, bars, points, life = panel["layer"]
        assert stripes["mark"]["type"] == bars["mark"]["type"] == "rect"
        assert points["mark"]["type"] == life["mark"]["type"] == "point"
        axis = points["encoding"]["y"]["axis"]
        assert axis["values"] == [0, 1, 2, 3]  # the syncer on top, then each learner
        assert axis["labelExpr"] == ("['syncer', 'learner 0', 'learner 1', 'learner 2']"
                                     "[datum.value]")
    save(chart, "timeline", tmp_path)
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("kind", list(ap.KINDS))
def test_every_kind_has_a_label_a_colour_a_shape_and_a_row(kind):
    label, colour, shape, row = ap.KINDS[kind]
    assert label and colour.startswith("#") and shape and row in "abc"
