"""The simulated clock: the cluster spec, the one schedule, and lock-step plans timed by hand.

Plans are pure host computations (no device): `make_plan` on a config and made-up fragment
sizes, then read the events and counters it recorded."""

import math

import numpy as np
import pytest

import diloco_lite as dl
from diloco_lite.clock import Cluster, FailureRate, Link, Timeline, gather_factor, ring_factor
from diloco_lite.clock.plan import make_plan
from diloco_lite.clock.schedule import Schedule


def plan(algo, cluster=None, workers=4, steps=12, nbytes=1000, evals=None):
    p = 1 if isinstance(algo, (dl.DDP, dl.DiLoCo)) else algo.fragments
    cfg = dl.RunConfig(algorithm=algo, workers=workers, steps=steps, cluster=cluster)
    return make_plan(cfg, up_nbytes=[nbytes] * p, down_nbytes=[nbytes] * p, sizes=[1] * p,
                     rejoin_nbytes=0, eval_at=evals or [steps])


def events(pl, kind=None):
    return [e for b in pl.blocks for e in b.events if kind is None or e.kind == kind]


def final(pl):
    return events(pl, "eval")[-1].stats


# --------------------------------------------------------------------------------------------
# The cluster spec
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, field", [
    (lambda: Cluster(step_time_s=-1.0), "Cluster.step_time_s"),
    (lambda: Cluster(step_time_s=float("nan")), "Cluster.step_time_s"),
    (lambda: Cluster(step_time_s=(1.0, 0.0)), r"Cluster.step_time_s\[1\]"),
    (lambda: Cluster(jitter=1.0), "Cluster.jitter"),
    (lambda: Cluster(speed_spread=-0.1), "Cluster.speed_spread"),
    (lambda: Cluster(failures=((0, 5.0, 3.0),)), "up_at_s"),
    (lambda: Cluster(failures=((0, 1.0, 5.0), (0, 4.0, 6.0))), "must not overlap"),
    (lambda: Cluster(failures=((-1, 1.0, 2.0),)), "learner"),
    (lambda: Cluster(failures=((0, 1.0),)), "triple"),
    (lambda: Link(gbit_per_s=0), "Link.gbit_per_s"),
    (lambda: Link(latency_s=-1), "Link.latency_s"),
    (lambda: FailureRate(mtbf_s=0, down_s=1), "FailureRate.mtbf_s"),
])
def test_cluster_rejects_bad_values(make, field):
    with pytest.raises(ValueError, match=field):
        make()


@pytest.mark.parametrize("cluster, field", [
    (Cluster(step_time_s=(1.0, 2.0)), "Cluster.step_time_s"),
    (Cluster(failures=((8, 1.0, 2.0),)), "learner"),
])
def test_run_config_checks_the_cluster_against_the_workers(cluster, field):
    with pytest.raises(ValueError, match=field):
        dl.RunConfig(workers=8, cluster=cluster)


def test_quorum_larger_than_the_learners_is_a_clear_error():
    with pytest.raises(ValueError, match=r"DecoupledDiLoCo.quorum=9 .*\[1, 8\]"):
        dl.RunConfig(algorithm=dl.DecoupledDiLoCo(quorum=9), workers=8)


def test_timeline_is_deterministic_and_seeded():
    c = Cluster(step_time_s=2.0, speed_spread=0.3, jitter=0.2, seed=3,
                failures=FailureRate(mtbf_s=50.0, down_s=5.0))
    a, b = Timeline(c, 4), Timeline(c, 4)
    durations = [a.duration(1, k) for k in range(2000)]
    windows = [a.window(2, i) for i in range(30)]
    # whatever was asked before: b is asked about other learners first, then backwards
    b.duration(0, 3000), b.duration(3, 10), b.window(0, 40), b.window(3, 5)
    assert [b.duration(1, k) for k in reversed(range(2000))] == durations[::-1]
    assert [b.window(2, i) for i in reversed(range(30))] == windows[::-1]
    base = a.nominal[1]
    assert all(0.8 * base <= d <= 1.2 * base for d in durations)
    windows = [a.window(2, i) for i in range(400)]
    gaps = [w[0] - (windows[i - 1][1] if i else 0.0) for i, w in enumerate(windows)]
    assert all(up - down == 5.0 for down, up in windows) and 40 < np.mean(gaps) < 60
    other = Timeline(Cluster(step_time_s=2.0, speed_spread=0.3, jitter=0.2, seed=4), 4)
    assert other.duration(1, 0) != durations[0]
    assert Timeline(None, 3).t_ref == 1.0 and Timeline(None, 3).duration(2, 99) == 1.0


def test_link_and_ring_factor():
    assert Link(gbit_per_s=2.0).busy_s(1e9) == 4.0  # 8e9 bits at 2e9 bit/s
    assert Link().busy_s(1e12) == 0.0
    assert ring_factor(1) == 0 and ring_factor(8) == 1.75
    assert gather_factor(1) == 0 and gather_factor(8) == 7


# --------------------------------------------------------------------------------------------
# The one schedule
# --------------------------------------------------------------------------------------------


def test_schedule_offsets_by_hand():
    s = Schedule(inner_steps=8, fragments=4, overlap=1)
    assert [s.offset(p) for p in range(4)] == [2, 4, 6, 8]
    assert s.sends_after(6) == [2] and s.sends_after(8) == [3] and s.sends_after(10) == [0]
    assert s.sends_after(0) == [] and list(s.send_steps(0, 20)) == [2, 10, 18]
    assert [Schedule(50).offset(0)] == [50]  # DiLoCo: after steps H, 2H, ...
    more = Schedule(inner_steps=3, fragments=5)  # more fragments than steps: offsets in [1, H]
    assert [more.offset(p) for p in range(5)] == [3, 1, 1, 2, 3]
    phases, fractions = s.phases()
    assert list(phases) == [1, 3, 5, 7] and list(fractions) == [0.25] * 4
    assert Schedule.of(dl.DDP()) == Schedule(1, 1, 0)
    assert Schedule.of(dl.DiLoCo(inner_steps=7)) == Schedule(7, 1, 0)
    assert Schedule.of(dl.DecoupledDiLoCo()) == Schedule(24, 24, 2)


# --------------------------------------------------------------------------------------------
# Lock-step plans, timed by hand
# --------------------------------------------------------------------------------------------


def test_default_clock_counts_steps_and_books_every_sync():
    pl = plan(dl.DiLoCo(inner_steps=4), steps=12, evals=[4, 8, 12])
    rows = [e.stats for e in events(pl, "eval")]
    assert [r["sim_time_s"] for r in rows] == [4.0, 8.0, 12.0]
    assert [r["comm_bytes"] for r in rows] == [4000, 8000, 12000]  # 4 workers × 1000 per sync
    assert rows[-1]["goodput"] == 1.0 and rows[-1]["learner_steps"] == 48
    assert [b.steps.tolist() for b in pl.blocks] == [[4] * 4] * 3  # a block is a round


def test_ddp_step_is_compute_plus_the_ring_all_reduce():
    # 1000 B × 1.5 (ring all-reduce, 4 workers) = 12 kbit: 12 ms, and 2·3 hops of 50 ms
    link = Link(gbit_per_s=0.001, latency_s=0.05)
    pl = plan(dl.DDP(), Cluster(step_time_s=0.5, link=link), steps=10)
    assert final(pl)["sim_time_s"] == pytest.approx(10 * (0.5 + 0.012 + 6 * 0.05))


def test_a_diloco_sync_is_compute_plus_the_ring_all_gather():
    # 1000 B × 3 (all-gather: every other worker's payload, 4 workers) = 24 kbit: 24 ms, and
    # 3 hops of 50 ms; two syncs of H = 4 steps of 0.5 s
    link = Link(gbit_per_s=0.001, latency_s=0.05)
    pl = plan(dl.DiLoCo(inner_steps=4), Cluster(step_time_s=0.5, link=link), steps=8)
    assert final(pl)["sim_time_s"] == pytest.approx(2 * (4 * 0.5 + 0.024 + 3 * 0.05))


def test_a_slow_worker_sets_the_lock_step_pace():
    times = (1.0, 1.0, 3.0, 1.0)
    pl = plan(dl.DiLoCo(inner_steps=4), Cluster(step_time_s=times), steps=12)
    stats = final(pl)
    assert stats["sim_time_s"] == 36.0
    # the fast ones idle 2/3 of the time: offered 3·36 + 12 learner-steps, 48 useful
    assert stats["goodput"] == pytest.approx(48 / (3 * 36 + 12))


def test_overlap_lets_a_late_fragment_arrive_while_training_goes_on():
    """Streaming τ=2 on a slow link: a fragment takes 2.5 s to arrive; it is only needed two
    steps later, so a run stalls only by 0.5 s per sync instead of 2.5 s."""
    link = Link(gbit_per_s=1000 * 8 * 3 / 2.5e9)  # the all-gather of 4 workers: 3 payloads
    algo = dl.StreamingDiLoCo(inner_steps=4, fragments=1, overlap=2, bits=4)
    slow = final(plan(algo, Cluster(link=link), steps=12))
    tau0 = final(plan(dl.StreamingDiLoCo(inner_steps=4, fragments=1, overlap=0, bits=4),
                      Cluster(link=link), steps=12))
    assert tau0["sim_time_s"] == pytest.approx(12 + 3 * 2.5)
    # the sync after step 12 is still in flight when the steps end: the run ends when it lands
    assert slow["sim_time_s"] == pytest.approx(12 + 2 * 0.5 + 2.5)


def test_non_elastic_failure_redoes_the_round_elastic_drops_the_worker():
    fail = Cluster(failures=((1, 5.5, 20.0),))
    stop = final(plan(dl.DiLoCo(inner_steps=4), fail, steps=12))
    # round 2 (steps 5-8) is lost at 5.5 s: 4 workers × 1 step done; restart at 20 s
    assert stop["sim_time_s"] == 20.0 + 8 and stop["lost_steps"] == 4
    elastic = plan(dl.DiLoCo(inner_steps=4, elastic=True), fail, steps=12)
    stats = final(elastic)
    assert stats["sim_time_s"] == 12.0
    # worker 1 loses its step 5 (done at 5 s, not synced yet); it is back at 20 s, after the
    # run, so it never rejoins
    assert stats["lost_steps"] == 1 and not events(elastic, "reload")
    closes = events(elastic, "close")
    assert [c.weights.tolist() for c in closes] == [[1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 1, 1]]


def test_elastic_worker_rejoins_at_the_next_sync_with_a_peers_state():
    pl = plan(dl.DiLoCo(inner_steps=4, elastic=True), Cluster(failures=((2, 1.5, 6.0),)),
              steps=12)
    (reload,) = events(pl, "reload")
    assert reload.mask.tolist() == [False, False, True, False] and reload.peer[2] == 0
    assert reload.time_s == 8.0  # back at 6 s, joins at the sync after step 8
    closes = events(pl, "close")
    assert [c.weights[2] for c in closes] == [0, 0, 1]


def test_a_worker_that_never_returns_stops_a_lock_step_job_with_a_clear_error():
    with pytest.raises(ValueError, match="elastic=True or DecoupledDiLoCo"):
        plan(dl.DiLoCo(inner_steps=4), Cluster(failures=((1, 3.0, math.inf),)))


def test_ddp_elastic_averages_over_the_up_workers():
    pl = plan(dl.DDP(elastic=True), Cluster(failures=((3, 2.5, 4.5),)), steps=6)
    weights = [c.weights.tolist() for c in events(pl, "close")]
    assert weights == [[1] * 4, [1] * 4, [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1] * 4]


def test_two_restarts_to_the_same_checkpoint_count_each_lost_step_once():
    """Worker 1 fails at 5.5 s (back at 8 s): round 2 restarts at 8 s; worker 2 fails at 9.5 s
    during the redo (back at 12 s): it restarts again. Each attempt lost one step of 4 workers."""
    pl = plan(dl.DiLoCo(inner_steps=4), Cluster(failures=((1, 5.5, 8.0), (2, 9.5, 12.0))),
              steps=12)
    stats = final(pl)
    assert stats["lost_steps"] == 8 and stats["failures"] == 2
    assert stats["sim_time_s"] == 12.0 + 8 and stats["learner_steps"] == 48 + 8
