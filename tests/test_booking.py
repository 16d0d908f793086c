"""Goodput and lost steps booked by what the merges hold, a failed learner out of the quorum,
the end-of-run flush by the plain mean, and the edges of the planners (issue 16).

Each scenario's numbers are worked out by hand in its docstring from the clock's rules
(`clock.syncer`, `clock.recorder`): who answers when, which sync closes with whom, which
arrival overwrites what."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite.actors.booking import Books
from diloco_lite.algorithms.learners import close_fn
from diloco_lite.clock import Cluster, FailureRate, Link, Timeline
from diloco_lite.clock.booking import ASK, PUBLISH, RESPONSE
from diloco_lite.clock.plan import make_plan
from diloco_lite.clock.recorder import Recorder
from diloco_lite.clock.schedule import Schedule
from diloco_lite.clock.syncer import plan_decoupled
from diloco_lite.devices import AXIS, worker_mesh
from diloco_lite.wire import WireFormat
from tests.helpers import final_stats as final
from tests.helpers import plan_events as events

T2 = float(16 * 64) ** 2  # (tokens per step)² with RunConfig's default batch 16 × 64


def plan(cluster=None, workers=4, steps=12, algo=None, rejoin_nbytes=0, **kw):
    algo = algo or dl.DecoupledDiLoCo(**{**dict(inner_steps=4, fragments=1, overlap=0,
                                                quorum=1), **kw})
    cfg = dl.RunConfig(algorithm=algo, workers=workers, steps=steps, cluster=cluster)
    p = getattr(algo, "fragments", 1) if not isinstance(algo, (dl.DDP, dl.DiLoCo)) else 1
    return make_plan(cfg, up_nbytes=[100] * p, down_nbytes=[10] * p, sizes=[1] * p,
                     rejoin_nbytes=rejoin_nbytes, eval_at=[steps])


def test_each_hosts_bytes_are_booked_where_they_travel():
    """M = 2, P = 1, H = 4, τ = 0, K = 1, 8 steps; an answer is 100 B, a reply 10 B, a rejoin
    1,000 B (Θ: one value, 4 B; the rest a peer's inner optimizer state, 996 B). Learner 1 is
    down from 2.5 s to 3 s: back, it loads Θ from the syncer and learner 0's state through the
    syncer. Both answer the asks at 4 and 8 s, and both get each reply. The budget (16 steps)
    runs out at 9 s with learner 0's step; the flush takes learner 0's one step since 8 s.
    Host 0 (the syncer) receives 5 answers and the state; learner 0's host sends 3 answers and
    the state, learner 1's 2 answers; each receives 2 replies, learner 1's also the rejoin."""
    pl = plan(Cluster(failures=((1, 2.5, 3.0),)), workers=2, steps=8, rejoin_nbytes=1000)
    assert pl.hosts == dict(tx=[2 * 2 * 10 + 1000, 3 * 100 + 996, 2 * 100],
                            rx=[5 * 100 + 996, 2 * 10, 2 * 10 + 1000])
    f = final(pl)
    assert f["comm_bytes"] == 500 and f["down_bytes"] == 40 + 1000


def test_a_failed_learner_is_out_of_the_merge_and_of_the_quorum():
    """M = 5, step times (1, 1, 1, 3, 3), H = 2, τ = 1, no grace; learner 0 fails at 2.5 s,
    after answering the ask of 2 s. With K = 4 the close at 3 s (learners 3 and 4 answer after
    their first step) merges learners 1–4 only: weights (2T)²/2 for 1 and 2, T² for 3 and 4.
    With K = 5 only 4 learners are up: no outer step is ever taken before the run ends (6 steps
    each = 30 learner-steps: at 11 s learners 1 and 2 have done 11, 3 and 4 three, learner 0
    two); the end-of-run flush merges learners 1–4 (28 steps), and learner 0's two are lost."""
    cluster = Cluster(step_time_s=(1, 1, 1, 3, 3), failures=((0, 2.5, 100.0),))
    four = plan(cluster, workers=5, steps=6, inner_steps=2, overlap=1, quorum=4,
                grace_safety=0.0)
    first = events(four, "close")[0]
    assert first.time_s == 3.0
    np.testing.assert_array_equal(first.weights, np.array([0, 2, 2, 1, 1]) * T2)

    five = plan(cluster, workers=5, steps=6, inner_steps=2, overlap=1, quorum=5,
                grace_safety=0.0)
    closes = events(five, "close")
    assert [c.flush for c in closes] == [True]
    assert closes[0].weights[0] == 0 and (closes[0].weights[1:] > 0).all()
    f = final(five)
    assert f["sim_time_s"] == 11.0 and f["outer_steps"] == 0
    assert (f["learner_steps"], f["useful_steps"], f["lost_steps"]) == (30, 28, 2)
    assert f["goodput"] == pytest.approx(28 / (3 * 11 + 2 * 11 / 3))


def test_work_overwritten_on_arrival_is_lost():
    """M = 4, step times (1, 1, 1, 1.5), H = 4, τ = 0, K = 1, 24 steps. Asks at 4, 8, …, 24 s;
    each closes at once with the learners at a step boundary. Learner 3 (t = 1.5 k) is at one
    only at 12 and 24 s: it is merged twice (2 steps each time); its 3 steps before each of the
    other four arrivals (at 4.5, 9, 16.5 and 21 s) are overwritten: 12 steps lost. The run ends
    at 27 s with 96 learner-steps (learner 3: 18); the flush merges 2 steps of each learner.
    Useful: 3 × (6 × 4 + 2) + (2 + 2 + 2) = 84; goodput 84 / (3 × 27 + 27 / 1.5) = 84 / 99."""
    pl = plan(Cluster(step_time_s=(1, 1, 1, 1.5)), workers=4, steps=24, inner_steps=4)
    closes = [c for c in events(pl, "close") if not c.flush]
    assert [c.time_s for c in closes] == [4.0, 8.0, 12.0, 16.0, 20.0, 24.0]
    assert [bool(c.weights[3] > 0) for c in closes] == [False, False, True, False, False, True]
    f = final(pl)
    assert f["sim_time_s"] == 27.0 and f["learner_steps"] == 96
    assert f["useful_steps"] == 84 and f["lost_steps"] == 12 and f["overlap_lost_steps"] == 0
    assert f["goodput"] == pytest.approx(84 / 99)


def test_steps_after_a_merged_answer_are_overwritten_not_merged():
    """M = 2, step times (1, 2.5) (t_ref = 1.75), H = 3, τ = 0, K = 2, 6 steps. The ask at
    5.25 s: learner 0 answers at 6 s with 6 steps, learner 1 at 7.5 s with 3; the close at 7.5
    s merges those 9. Learner 0's steps at 7 and 8 s came after its answer: the arrival at 8 s
    overwrites them (the overlap loss). The run ends at 9 s (12 learner-steps); the flush
    merges learner 0's one step since. Useful 10, lost 2; goodput 10 / (9 + 9 / 2.5)."""
    pl = plan(Cluster(step_time_s=(1, 2.5)), workers=2, steps=6, inner_steps=3, quorum=2,
              grace_safety=0.0)
    closes = events(pl, "close")
    assert [(c.time_s, c.flush) for c in closes] == [(7.5, False), (9.0, True)]
    f = final(pl)
    assert (f["learner_steps"], f["useful_steps"], f["lost_steps"]) == (12, 10, 2)
    assert f["overlap_lost_steps"] == 2
    assert f["goodput"] == pytest.approx(10 / 12.6)


def test_an_answer_merged_before_its_learner_fails_is_useful():
    """Issue 30 defect 2, the books. M = K = 2, P = 1, H = 4, τ = 0, 12 steps, answers and
    fragments take 2 s (latency); learner 1 down from 7 s to 10 s. Asks at 4 s and 12 s.
    The first sync closes at 6 s with both answers (4 steps each) and is published at 8 s:
    learner 1 failed in between, but its 4 steps are in that merge (useful); its steps 5-7 are
    lost. Learner 0 applies the merge after its step 8: its steps 5-8 are overwritten (lost).
    The ask at 12 s merges learner 0's steps 9-12 and learner 1's 11-12 (back at 10 s),
    published at 16 s, after the budget ran out at 14 s (learner 0's 14th step; learner 1 has
    done 10): steps 13-14 of learner 0 and 13 of learner 1 are in no merge (lost).
    Useful 4 + 4 + 4 + 2 = 14, lost 3 + 4 + 3 = 10. (Booked at the publish, after the failure,
    learner 1's merged answer used to count as lost: 10 useful, 14 lost.)"""
    pl = plan(Cluster(link=dl.Link(latency_s=2.0), failures=((1, 7.0, 10.0),)), workers=2,
              quorum=2)
    assert [(c.time_s, (c.weights / T2).tolist()) for c in events(pl, "close")] == [
        (8.0, [4, 4]), (16.0, [4, 2])]
    assert [len(t) for t in pl.step_time] == [14, 10]
    f = final(pl)
    assert (f["learner_steps"], f["useful_steps"], f["lost_steps"]) == (24, 14, 10)
    assert f["overlap_lost_steps"] == 4  # overwritten by an arrival: learner 0's steps 5-8


def test_the_overlap_share_kept_by_alpha():
    """Lock-step Streaming DiLoCo, P = 1, H = 4, τ = 1, α = 0.5, 8 steps, equal speeds: the sync
    after step 4 merges 4 steps per worker; the arrival after step 5 keeps half of step 5's
    work (0.5 lost); the sync after step 8 merges 0.5 + 3. Per worker: useful 7.5, lost 0.5."""
    algo = dl.StreamingDiLoCo(inner_steps=4, fragments=1, overlap=1, mix=0.5, bits=32)
    f = final(plan(workers=2, steps=8, algo=algo))
    assert (f["learner_steps"], f["useful_steps"], f["lost_steps"]) == (16, 15, 1)
    assert f["overlap_lost_steps"] == 1 and f["goodput"] == pytest.approx(15 / 16)


SCENARIOS = [
    dict(cluster=Cluster(failures=FailureRate(mtbf_s=30, down_s=5), jitter=0.3), workers=4,
         steps=60, inner_steps=4, fragments=2, overlap=1, quorum=2),
    dict(cluster=Cluster(step_time_s=(1, 1, 1.7), failures=((2, 8.2, 20.0),)), workers=3,
         steps=30, inner_steps=3, fragments=3, overlap=2, mix=0.5),
    dict(cluster=Cluster(step_time_s=(1, 4)), workers=2, steps=12, inner_steps=4, overlap=3),
    # a finite link (an answer takes 2.35 s, a fragment 1.63 s down) and failures: learner 1
    # fails at 7 s, after the close of fragment 1 that merged its answer (6.35 s) and before
    # its publish (7.98 s); learner 2 fails while its answer is on the wire
    dict(cluster=Cluster(link=Link(gbit_per_s=1e-6, latency_s=1.55), step_time_s=(1, 1, 1.3),
                         failures=((1, 7.0, 10.5), (2, 13.4, 15.0))),
         workers=3, steps=40, inner_steps=4, fragments=2, overlap=1, quorum=2),
    dict(cluster=Cluster(failures=FailureRate(mtbf_s=40, down_s=6)), workers=4, steps=60,
         algo=dl.DiLoCo(inner_steps=5)),
    dict(cluster=Cluster(failures=FailureRate(mtbf_s=40, down_s=6)), workers=4, steps=60,
         algo=dl.StreamingDiLoCo(inner_steps=6, fragments=3, overlap=2, elastic=True)),
    dict(cluster=Cluster(failures=FailureRate(mtbf_s=40, down_s=6), jitter=0.2), workers=4,
         steps=40, algo=dl.DDP(elastic=True)),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_answer_holds_new_work_and_the_books_balance(scenario):
    """Replaying a plan's events by hand: every (non-flush) answer of learner m for fragment p
    holds ≥ 1 step since m last took p, and none already merged (a learner whose answer was
    merged answers again only after applying the result); at the end every learner-step is
    useful or lost, and a close merges only learners that are up."""
    pl = plan(**scenario)
    frags = len(pl.fragments)
    base = {}  # (m, p) -> position of the last arrival/reload
    merged_since_base = set()
    answered = {}  # (m, p) -> position of the last answer
    for block in pl.blocks:
        for ev in block.events:
            if ev.kind in ("arrive", "reload"):
                ps = range(frags) if ev.kind == "reload" else [ev.fragment]
                for m in np.flatnonzero(ev.mask):
                    for p in ps:
                        base[m, p] = ev.at[m]
                        merged_since_base.discard((m, p))
            elif ev.kind == "send" and not ev.flush:
                for m in np.flatnonzero(ev.mask):
                    assert ev.at[m] > base.get((m, ev.fragment), 0), (m, ev.time_s)
                    assert (m, ev.fragment) not in merged_since_base, (m, ev.time_s)
                    answered[m, ev.fragment] = ev.at[m]
            elif ev.kind == "close" and not ev.flush:
                for m in np.flatnonzero(ev.weights):
                    merged_since_base.add((m, ev.fragment))
    f = final(pl)
    assert f["useful_steps"] + f["lost_steps"] == pytest.approx(f["learner_steps"], abs=1e-9)
    assert 0 <= f["overlap_lost_steps"] <= f["lost_steps"]
    assert f["goodput"] == pytest.approx(
        f["useful_steps"] / pl_offered(scenario, f["sim_time_s"]))


def pl_offered(scenario, t):
    """Learner-steps the cluster could do in t seconds at nominal speed, by hand."""
    times = np.broadcast_to(np.asarray(scenario["cluster"].step_time_s, float),
                            (scenario["workers"],))
    return float(np.sum(t / times))


def test_a_decoupled_run_whose_learners_all_die_says_it_ended_short():
    down = Cluster(failures=tuple((m, 2.5, math.inf) for m in range(4)))
    with pytest.warns(RuntimeWarning, match="ends short"):
        pl = plan(down, workers=4, steps=6)
    f = final(pl)
    assert f["complete"] is False and f["step"] == 2 and f["learner_steps"] == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert final(plan(workers=4, steps=6))["complete"] is True


def test_elastic_lock_step_with_every_worker_down_for_good_is_a_clear_error():
    down = Cluster(failures=((0, 1.5, math.inf), (1, 1.5, math.inf)))
    for algo in (dl.DiLoCo(inner_steps=2, elastic=True), dl.DDP(elastic=True)):
        with pytest.raises(ValueError, match=r"Cluster\.failures=.*every worker is down"):
            plan(down, workers=2, steps=6, algo=algo)


# --------------------------------------------------------------------------------------------
# The end-of-run flush merges by the plain weighted mean, never by RDA
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flush, expected", [(True, [-0.5, -0.5]),
                                             (False, [-0.7 * 1.9 / math.sqrt(2)] * 2)])
def test_the_flush_averages_two_orthogonal_deltas(flush, expected):
    """Learners 0 and 1 send Δ = (1, 0) and (0, 1) (the others weight 0), Θ = 0, RDA asked
    for. The flush is their mean: Θ = −(0.5, 0.5). An outer step merges them by RDA instead
    (norm 1, direction (1, 1)/√2) and takes Nesterov(0.7, 0.9) from zero momentum:
    Θ = −0.7 · (1 + 0.9) · (1, 1)/√2."""
    mesh = worker_mesh(8)
    wire = WireFormat(32)
    deltas = np.zeros((8, 2), np.float32)
    deltas[0, 0] = deltas[1, 1] = 1.0
    sent = jax.device_put([jax.vmap(wire.encode)(jnp.asarray(deltas))], mesh.sharding(AXIS))
    outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
    glob = jax.device_put([jnp.zeros(2)], mesh.sharding())
    weights = jnp.asarray([1.0, 1.0] + [0.0] * 6)
    close = close_fn(mesh, outer, wire, wire)
    new, _, _ = close(glob, outer.init(glob), sent, weights, mean_leaves=(False,), rda=True,
                      flush=flush)
    np.testing.assert_allclose(np.asarray(new[0]), expected, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# The booking order (`clock.booking`): one for the simulated clock and the actors' books
# --------------------------------------------------------------------------------------------


class CallLog(Recorder):
    """A `Recorder` that also writes down the booking calls made on it."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls = []

    def _log(name):  # noqa: N805 - builds the methods below
        def call(self, *args, **kw):
            self.calls.append((name, *args, *sorted(kw.items())))
            return getattr(Recorder, name)(self, *args, **kw)
        return call

    step, send, drop, closing, close = map(_log, ("step", "send", "drop", "closing", "close"))
    arrive, fail, reload, eval = map(_log, ("arrive", "fail", "reload", "eval"))


def test_both_clocks_book_in_one_order():
    """M = 2, P = 1, H = 2, τ = 0, K = 1, no grace, 3 steps each; step times 1 s and 1.25 s
    (t_ref 1.125 s), messages take 0.25 s; an evaluation at step 2. Worked out by hand: the
    ask at 2.25 s; learner 1 answers at 2.5 s, the run's 4th learner-step (the evaluation
    follows it); its answer arrives at 2.75 s and closes the sync alone (quorum 1): weight
    (2 steps)² / 2 = 2 with one token a step, nothing on the wire; the merge reaches both at
    3 s (waited 0.5 s since the ask). At 3 s, in the order of kinds: learner 0's step
    boundary, where it answers, not knowing of the close (booked as sent and left out at
    once); the publish; learner 0's apply. Learner 1 applies at 3.75 s, the budget's 6th and
    last learner-step (learner 0's at 4 s comes after it); nothing to flush (both applied
    since their last step); the last evaluation. The simulated clock books exactly this; so
    do the actors' books, fed the same events in another order (the learners' reports and the
    syncer's own events)."""
    want = [("step", 0, 0, 1.0), ("step", 1, 0, 1.25), ("step", 0, 1, 2.0),
            ("step", 1, 1, 2.5), ("send", 0, [1], 2.5), ("eval", 2, 2.5),
            ("closing", 0, {1: 2.0}),
            ("step", 0, 2, 3.0), ("send", 0, [0], 3.0), ("drop", 0, 0),
            ("close", 0, {1: 2.0}, 3.0, ("receivers", (0, 1)), ("wait_s", 0.5)),
            ("arrive", 0, [0], 3.0),
            ("step", 1, 2, 3.75), ("arrive", 0, [1], 3.75),
            ("eval", 3, 3.75, ("complete", True), ("last", True))]
    algo = dl.DecoupledDiLoCo(inner_steps=2, fragments=1, overlap=0, quorum=1,
                              grace_safety=0.0, bits=32)
    timeline = Timeline(Cluster(step_time_s=(1.0, 1.25), link=Link(latency_s=0.25)), 2)

    def recorder():
        return CallLog(timeline, up_nbytes=[100], down_nbytes=[10], sizes=[1])

    rec = recorder()
    plan_decoupled(rec, Schedule.of(algo), timeline, algo, steps=3, eval_at={2},
                   tokens_per_step=1)
    assert rec.calls == want

    books = Books(recorder, 2, 3, eval_at=[2], theta0=[["theta0"]])
    books.syncer(3.0, PUBLISH, "publish", 0, {1: 2.0}, (0, 1), 0.5, ["theta1"], None)
    books.learner(0, [("step", 1.0, 1, 1.0, [], []), ("step", 2.0, 2, 1.0, [], []),
                      ("step", 3.0, 3, 1.0, [(0, 0)], [0]), ("step", 4.0, 4, 1.0, [], [])])
    books.syncer(2.75, RESPONSE, "close", 0, 0, {1: 2.0})
    books.learner(1, [("step", 1.25, 1, 1.0, [], []), ("step", 2.5, 2, 1.0, [(0, 0)], []),
                      ("step", 3.75, 3, 1.0, [], [0])])
    books.syncer(2.25, ASK, "ask", 0)
    rec, *_ = books.book(end=3.75)
    books.last_row(rec, 3.75, flushed=[])
    assert rec.calls == want
