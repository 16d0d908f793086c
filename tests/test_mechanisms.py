"""The mechanism pictures (`plots.mechanisms`, `plots.mechanisms_events`) draw what the code
computes: each picture's data against a plain loop written here."""

import math

import numpy as np
import pytest

import diloco_lite as dl
from diloco_lite.plots import mechanisms, mechanisms_events


# ---- 1. ring all-reduce ---------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_ring_sums_and_sends_two_n_minus_one_over_n_of_the_array(n):
    rng = np.random.default_rng(n)
    arrays = [rng.standard_normal(10 * n).astype(np.float32) for _ in range(n)]
    results, sends, states = mechanisms.ring_allreduce(arrays)
    want = np.sum(arrays, axis=0)
    for r in results:
        np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
    # a plain loop over the sends, one chunk at a time, gives the same sums and bytes
    held = [np.array_split(a.copy(), n) for a in arrays]
    for s in sends.itertuples():
        add = s.phase == "reduce-scatter"
        assert s.dst == (s.src + 1) % n  # always to the next device on the ring
        held[s.dst][s.chunk] = held[s.dst][s.chunk] + states[s.step - 1][s.src][s.chunk] \
            if add else states[s.step - 1][s.src][s.chunk]
    for h in held:
        np.testing.assert_allclose(np.concatenate(h), want, rtol=1e-5, atol=1e-5)
    size = arrays[0].nbytes
    assert len(sends) == 2 * (n - 1) * n
    for d in range(n):  # every device sends 2(N−1)/N of the array, one chunk per step
        mine = sends[sends.src == d]
        assert mine.nbytes.sum() == 2 * (n - 1) * size // n
        assert list(mine.step) == list(range(1, 2 * n - 1))


def test_the_ring_picture_is_drawn_from_a_checked_run():
    chart = mechanisms.ring_chart(devices=4, values=8)
    assert "2(N−1)/N" in str(chart.to_dict()["title"])


# ---- 2. DiLoCo's two loops ------------------------------------------------------------------
def _plan(config):
    from diloco_lite.clock.plan import make_plan

    return make_plan(config, up_nbytes=[4] * 8, down_nbytes=[4] * 8, sizes=[1] * 8,
                     rejoin_nbytes=4, eval_at=[config.steps])


def test_the_loops_picture_has_every_step_and_a_sync_every_h_steps():
    from types import SimpleNamespace

    cfg = dl.RunConfig(algorithm=dl.DiLoCo(inner_steps=4), workers=3, steps=14)
    steps, syncs = mechanisms.loops_table(_plan(cfg))
    assert len(steps) == cfg.workers * cfg.steps
    closes = syncs[syncs.kind == "close"]
    assert list(closes.time_s[~closes.flush]) == [float(t) for t in range(1, cfg.steps + 1)
                                                  if t % 4 == 0]
    assert list(closes.time_s[closes.flush]) == [float(cfg.steps)]  # 14: the final average
    mechanisms.loops_chart(SimpleNamespace(plan=_plan(cfg), config=cfg)).to_dict()


# ---- 3. the fragment schedule ---------------------------------------------------------------
@pytest.mark.parametrize("H,P,tau", [(8, 4, 2), (6, 4, 1), (5, 2, 0), (4, 3, 3)])
def test_the_fragment_schedule_is_the_one_the_runs_use(H, P, tau):
    from diloco_lite.reference.common import first_send

    algo = dl.StreamingDiLoCo(inner_steps=H, fragments=P, overlap=tau)
    table = mechanisms.schedule_table(algo, steps=3 * H)
    want = [(p, t, t + tau) for p in range(P) for t in range(1, 3 * H + 1)
            if (t - (p + 1) * H // P) % H == 0]
    assert [tuple(r) for r in table[["fragment", "sent", "arrives"]].itertuples(index=False)] \
        == want
    assert all(first_send(p, H, P) == min(table.sent[table.fragment == p]) for p in range(P))
    mechanisms.schedule_chart(algo, 2 * H).to_dict()


# ---- 4. one Decoupled sync ------------------------------------------------------------------
@pytest.fixture(scope="module")
def worked_example():
    """Notebook 04's worked example (section 2) on links of 0.25 s latency."""
    from diloco_lite import reference

    cfg = dl.RunConfig(algorithm=dl.DecoupledDiLoCo(inner_steps=4, fragments=1, overlap=2,
                                                    quorum=2, grace_safety=0.5, bits=32,
                                                    merge="mean"),
                       model=dl.ModelConfig(d_model=32, n_layers=1, n_heads=2), batch_size=4,
                       seq_len=64, eval_every=8, workers=5, steps=12,
                       cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5, 3),
                                          link=dl.Link(latency_s=0.25)))
    log = []
    reference.decoupled(cfg, log=log)
    return cfg, log


@pytest.mark.parametrize("index", [0, 1])
def test_the_sync_diagram_has_each_answer_arrive_one_link_later(worked_example, index):
    cfg, log = worked_example
    s = mechanisms_events.sync_table(log, cfg, index=index)
    link, a, t_ref = cfg.cluster.link, cfg.algorithm, 1.0
    # a plain loop: each learner's answers of this sync are sent at its step boundaries after
    # the ask and before the publish, and arrive one link time later
    want = [(m, t, t + link.busy_s(0) + link.latency_s) for t, what, m, p in log
            if what == "answer" and p == 0 and s["ask"] <= t < s["publish"]]
    got = sorted(zip(s["answers"].learner, s["answers"].sent, s["answers"].arrived,
                     strict=True))
    assert got == sorted(want)
    assert all(m in s["merged"] for m, _, arrive in got if arrive <= s["close"])
    # the grace window: s · (τ·t_ref − (quorum − ask) − the reply's trip), as section 2 writes it
    arrivals = sorted(x for _, _, x in got)
    quorum = arrivals[a.quorum - 1]
    deadline = quorum + a.grace_safety * max(0.0, a.overlap * t_ref - (quorum - s["ask"])
                                             - link.latency_s)
    assert s["quorum"] == quorum
    assert s["close"] == pytest.approx(min(deadline, max(arrivals)) if len(arrivals) ==
                                       cfg.workers else deadline)
    assert s["publish"] == pytest.approx(s["close"] + link.latency_s)
    assert set(s["applies"].learner) <= set(range(cfg.workers))
    mechanisms_events.sync_chart(log, cfg, index=index).to_dict()


def test_the_first_sync_is_the_worked_example(worked_example):
    cfg, log = worked_example
    s = mechanisms_events.sync_table(log, cfg)
    assert (s["ask"], s["quorum"], s["close"], s["merged"]) == (4.0, 4.25, 5.0, (0, 1, 2, 3))
    assert sorted(s["applies"].itertuples(index=False)) == [(0, 6.0), (1, 6.0), (2, 6.0),
                                                            (3, 7.5)]


# ---- 5. what a failure costs each method ----------------------------------------------------
def _plain(failures, dom, horizon, dt=0.01):
    """Seconds of work lost and of recovery, by walking the clock in steps of dt."""
    lost = recovery = 0.0
    state, until, pending = "run", 0.0, sorted(failures)
    cycle = dom.interval_s + dom.commit_s
    t, i = 0.0, 0
    run_start = 0.0
    while t < horizon - dt / 2:
        while i < len(pending) and pending[i] <= t + 1e-9:
            f = pending[i]
            i += 1
            if state == "run":
                lost += f - (run_start + math.floor((f - run_start) / cycle) * cycle)
                state, until = "absorbed", f + dom.absorbed_s
            elif state == "exposed":  # a failure during the reload starts the recovery over
                state, until = "absorbed", f + dom.absorbed_s
        if state == "absorbed" and t + 1e-9 >= until:
            state, until = "exposed", until + dom.exposed_s
        if state == "exposed" and t + 1e-9 >= until:
            state, run_start = "run", until
        if state != "run":
            recovery += dt
        t += dt
    return lost, recovery


@pytest.mark.parametrize("method", ["dp", "elastic_dp", "decoupled"])
def test_the_failure_timeline_loses_what_a_plain_loop_says(method):
    from diloco_lite.systems import goodput as gp

    chaos, minutes = gp.ChaosConfig(), 4.0
    df, fails = mechanisms_events.failure_table(chaos, learners=8, minutes=minutes, seed=0)
    horizon = minutes * 60
    assert len(fails) > 3
    part = df[df.method == method]
    for lane in range(8):
        rows = part[part.lane == lane]
        on = [f for f, m in zip(fails.time_s, fails.lane, strict=True)
              if method != "decoupled" or m == lane]
        dom = gp.domain(method, chaos, 8)
        lost, recovery = _plain(on, dom, horizon)
        dur = (rows.end_s - rows.start_s).groupby(rows.state).sum()
        assert dur.get("work lost", 0.0) == pytest.approx(lost, abs=0.05 * (len(on) + 1))
        down = dur.get(mechanisms_events.DOWN, 0.0) + dur.get(mechanisms_events.RECOVER, 0.0)
        assert down == pytest.approx(recovery, abs=0.05 * (len(on) + 1))
        bars = rows[rows.state != "replica out until replaced"]
        assert (bars.end_s - bars.start_s).sum() == pytest.approx(horizon)  # no gap, no overlap
    if method == "elastic_dp":  # the failed replica stays out: one strip per failure
        assert (part.state == "replica out until replaced").sum() == len(fails)
    if method == "decoupled":  # only the failed learner's lane ever stops
        stopped = set(part.lane[part.state == mechanisms_events.DOWN])
        assert stopped == set(fails.lane)
    mechanisms_events.failure_chart(chaos, minutes=minutes).to_dict()


@pytest.mark.parametrize("failures", [[10.0, 30.0, 47.0, 90.0], [5.0, 44.9, 45.1, 120.0]])
def test_a_lockstep_job_folds_failures_into_a_reschedule_and_restarts_a_reload(failures):
    """Failures inside detect + reschedule are folded in, one inside the reload starts the
    recovery over: the cases the simulator's seed may not draw in a short window."""
    from diloco_lite.systems import goodput as gp

    dom, horizon = gp.domain("dp", gp.ChaosConfig()), 150.0
    rows = mechanisms_events._lockstep(failures, dom, horizon)
    dur = {}
    for state, a, b in rows:
        dur[state] = dur.get(state, 0.0) + b - a
    lost, recovery = _plain(failures, dom, horizon)
    assert dur.get("work lost", 0.0) == pytest.approx(lost, abs=0.05)
    assert dur[mechanisms_events.DOWN] + dur[mechanisms_events.RECOVER] == pytest.approx(
        recovery, abs=0.05)
    assert sum(dur.values()) == pytest.approx(horizon)
