"""The wall-clock syncer (`actors.syncer.SyncerRuntime`) driven by hand, no Ray.

`by_hand` plays what the actor runtime does, on the simulated clock's times: each learner a
real `LearnerProgram` stepping at its `Timeline` times and answering with its real Δ bytes;
its answers cross its own FIFO link, and a closed sync's fragment the syncer's (the `Cluster`'s
`Link`); a failure window kills the learner (its state is lost) and it rejoins at the window's
end (from a peer's state, or fresh). The plan the runtime records must be the simulated
clock's (`make_plan`) event for event, its counters the same, and its parameters those of
`train(config)`: the two drivers apply the same rules, with payloads, failures and finite
links. (At equal times the runtime's learner applies at its step boundary, before a publish of
that very instant; the simulated clock applies after it: the scenarios avoid such ties.)

The last tests check the runtime's edges by hand: the end of a run (a late answer, a merge
still being computed), an answer after a grace deadline, a learner killed while waiting to
rejoin, and a restarted learner's flush payload.
"""

import functools
import heapq
import itertools
import math
import operator

import jax
import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite.actors.learner import LearnerProgram
from diloco_lite.actors.syncer import SyncerRuntime
from diloco_lite.algorithms import make_driver
from diloco_lite.clock import Cluster, Link, Links, Timeline
from diloco_lite.clock.plan import make_plan
from diloco_lite.clock.recorder import FRESH
from diloco_lite.clock.syncer import BOUNDARY, FAIL, PUBLISH, REJOIN, RESPONSE
from diloco_lite.training import eval_points, setup
from tests.helpers import max_abs_diff, tiny_run

MOMENTUM = optax.sgd(0.2, momentum=0.5)  # an inner optimizer with a state (a rejoin loads it)
END_22 = functools.reduce(operator.add, [0.2] * 22)  # 22 steps of 0.2 s end at this float,
# 4.400000000000001, added one step at a time as the clock does (Python 3.12's sum() would
# compensate the rounding and give 4.4)


def decoupled(workers=3, steps=24, cluster=None, **kw):
    opt = kw.pop("inner_optimizer", optax.sgd(0.5))
    algo = dl.DecoupledDiLoCo(**{**dict(inner_steps=4, fragments=2, overlap=1, quorum=workers,
                                        grace_safety=0.0, bits=32), **kw})
    return tiny_run(algo, workers=workers, steps=steps, eval_every=8, inner_optimizer=opt,
                    cluster=cluster or Cluster(step_time_s=0.2))


def simulated_plan(cfg):
    _, model, mesh, opt = setup(cfg)
    d = make_driver(cfg, model, mesh, opt, model.init(cfg.seed))
    return make_plan(cfg, up_nbytes=d.up_nbytes, down_nbytes=d.down_nbytes, sizes=d.sizes,
                     rejoin_nbytes=d.rejoin_nbytes, eval_at=eval_points(cfg))


def by_hand(cfg, hold_s: float = 0.0) -> dict:
    """Drive `SyncerRuntime` as the actors do (module docstring); returns its `result()`."""
    _, model, _, _ = setup(cfg, workers=1)
    params = model.init(cfg.seed)
    rt = SyncerRuntime(cfg, params, hold_s=hold_s)
    M = cfg.workers
    progs = [LearnerProgram(cfg, m, params) for m in range(M)]
    timeline = Timeline(cfg.cluster, M)
    link = timeline.cluster.link
    heap, seq = [], itertools.count()
    wi, links = [0] * M, Links(link, M)

    def push(t, kind, *data):
        heapq.heappush(heap, (t, kind, next(seq), data))

    def start_step(m, t):  # its next step ends, unless its failure window begins first
        end = t + timeline.duration(m, rt.rules.k[m])
        w = timeline.window(m, wi[m])
        push(*((w[0], FAIL) if w is not None and w[0] < end else (end, BOUNDARY)), m)

    def merges():  # the syncer's merge thread: computed at once, published once sent down
        while (job := rt.next_merge()) is not None:
            at = links.fan_out(job.receivers, rt.rec.down_nbytes[job.p], job.closed_at)
            push(max(at, default=job.closed_at), PUBLISH, job, rt.merge(job))

    def due(queue):  # its next entry (time, kind), None after the end
        if queue and (rt.ending is None or queue[0][0] <= rt.ending):
            return queue[0][:2]
        return None

    for m in range(M):
        progs[m].begin()
        start_step(m, 0.0)
    rt.start()
    while True:
        timer, event = due(rt.timers), due(heap)
        if timer is None and event is None:
            break
        if event is None or (timer is not None and timer < event):
            rt.advance(timer[0], timer[1] + 1)  # the syncer's own timer
            merges()
            continue
        t, kind, _, data = heapq.heappop(heap)
        if kind == BOUNDARY:
            (m,) = data
            loss = progs[m].step(rt.rules.k[m])
            reply = rt.boundary(m, t, loss)
            if reply.stop:
                progs[m].undo()
                continue
            for p, sync in reply.answer:
                push(links.send(m + 1, 0, rt.rec.up_nbytes[p], t), RESPONSE, m, p, sync,
                     progs[m].answer(p), t)
            for p, theta in reply.apply:
                progs[m].apply(p, theta)
            start_step(m, t)
        elif kind == RESPONSE:
            m, p, sync, payload, sent_at = data
            rt.answered(m, p, sync, payload, sent_at, t)
        elif kind == PUBLISH:
            rt.publish(*data, t)
        elif kind == FAIL:
            (m,) = data
            back = timeline.window(m, wi[m])[1]
            wi[m] += 1
            rt.failed(m, t)
            if math.isfinite(back):
                push(back, REJOIN, m)
        elif kind == REJOIN:
            (m,) = data
            ticket = rt.rejoin(m, t)
            if m in rt.peer_of:  # its peer uploads its inner optimizer state at once
                q = rt.peer_of[m]
                rt.peer_state(q, progs[q].inner_state(), t)
            state, got = rt.take_rejoin(m, ticket)
            assert state == "ready", state
            progs[m].reload(got[0], got[1])
            start_step(m, t)
        merges()
    for t, kind, _, data in sorted(heap):  # in flight at the end: published
        if kind == PUBLISH:
            rt.publish(*data, t)
    jobs = rt.flushes()
    assert jobs is not None
    for job in jobs:
        job.payloads = {m: progs[m].flush_answer(job.p) for m in job.weights}
        rt.publish(job, rt.merge(job), rt.clock)
    return rt.result()


def events(plan):
    """The plan's decisions, one per learner and event, sorted: who sends, applies or reloads
    which fragment at which of its own steps (a reload: from whom); each close's time and
    weights. (How events are grouped may differ, and a group carries its first event's time; an
    evaluation's place among the events of its instant may differ.)"""
    out = []
    for b in plan.blocks:
        for e in b.events:
            t = round(e.time_s, 9)
            if e.kind == "close":
                out.append((t, "close", e.fragment, -1, -1, tuple(e.weights.tolist()), e.flush))
            elif e.kind == "reload":
                out += [(t, "reload", -1, int(m), e.at[m], (int(e.peer[m]),), False)
                        for m in np.flatnonzero(e.mask)]
            elif e.kind != "eval":
                out += [(-1, e.kind, e.fragment, m, pos, (), e.flush) for m, pos in e.at.items()]
    return sorted(out)


# 3 learners, H = 4, P = 2, τ = 1 (`decoupled`); each scenario: what it exercises
SCENARIOS = {
    "synchronous": dict(),
    "slow_k1_grace": dict(cluster=Cluster(step_time_s=(0.2, 0.2, 0.5)), quorum=1,
                          grace_safety=0.5, overlap=2),
    "jitter_k2_grace": dict(cluster=Cluster(step_time_s=(0.2, 0.3, 0.2), jitter=0.3),
                            quorum=2, grace_safety=1.0),
    # a failure: the learner's work is lost, it rejoins from a peer's momentum
    "failure_k2": dict(cluster=Cluster(step_time_s=(0.25, 0.2, 0.2),
                                       failures=((1, 1.13, 2.07),)),
                       quorum=2, steps=30, inner_optimizer=MOMENTUM),
    # a finite link (answers and fragments take time) with a failure, K = M waits for it
    "link_failure_kM": dict(cluster=Cluster(step_time_s=(0.2, 0.25, 0.3),
                                            link=Link(gbit_per_s=4e-3, latency_s=0.031),
                                            failures=((2, 1.61, 2.33),)),
                            steps=30, inner_optimizer=MOMENTUM),
    # issue 30 defect 2: K = M = 2, P = 1, τ = 0, answers take 2.05 s: the ask at 4 s closes
    # at 6.05 s and is published at 8.1 s; learner 1 down from 7 s to 10 s, between the two
    "fail_between_close_and_publish": dict(
        cluster=Cluster(step_time_s=1.0, link=Link(latency_s=2.05),
                        failures=((1, 7.0, 10.0),)),
        workers=2, steps=40, fragments=1, overlap=0, quorum=2),
    # no peer up when learner 1 is back (2.5 s): a fresh inner optimizer state; learner 0
    # back at 3 s loads learner 1's
    "rejoin_alone_fresh": dict(cluster=Cluster(step_time_s=0.2,
                                               failures=((0, 1.01, 3.03), (1, 1.51, 2.53))),
                               workers=2, quorum=1, overlap=2, steps=30,
                               inner_optimizer=MOMENTUM),
    # learners 0 and 1 (0.2 s a step) spend the budget at 4.4 s, their 22nd step; learner 2
    # (0.27 s) fails at that very instant, heard of after the budget ran out, while a sync
    # (K = 2, a grace window) still waits for it: it closes then (an outer step), as on the
    # simulated clock, instead of being flushed
    "failure_at_the_end": dict(cluster=Cluster(step_time_s=(0.2, 0.2, 0.27),
                                               failures=((2, END_22, 9.0),)),
                               quorum=2, grace_safety=0.8, overlap=2, steps=20),
}


# what some scenarios must show whatever both clocks do (the rules, worked out by hand):
# (learner, peer) of each reload; the outer steps; the closes at the end's instant
EXPECT = {
    "failure_k2": dict(reloads=[(1, 0)]),
    "link_failure_kM": dict(reloads=[(2, 0)]),
    # every ask (4, 12, 20, 28, 36 s) gets its outer step; the run ends at 42 s
    "fail_between_close_and_publish": dict(reloads=[(1, 0)], outer_steps=5),
    "rejoin_alone_fresh": dict(reloads=[(1, FRESH), (0, 1)]),
    "failure_at_the_end": dict(reloads=[], at_the_end=[(0, False)]),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_wall_clock_syncer_is_the_simulated_run(name):
    """Driven by hand (module docstring), the runtime takes every decision the simulated clock
    takes, books the same counters and ends with `train`'s parameters."""
    cfg = decoupled(**SCENARIOS[name])
    out = by_hand(cfg)
    want = simulated_plan(cfg)
    got = [e for b in out["plan"].blocks for e in b.events]
    expect = EXPECT.get(name, {})
    if "reloads" in expect:
        assert [(int(m), int(e.peer[m])) for e in got if e.kind == "reload"
                for m in np.flatnonzero(e.mask)] == expect["reloads"]
    if "outer_steps" in expect:
        assert out["plan"].final["outer_steps"] == expect["outer_steps"]
    if "at_the_end" in expect:
        assert [(e.fragment, e.flush) for e in got
                if e.kind == "close" and e.time_s == END_22] == expect["at_the_end"]
    assert events(out["plan"]) == events(want)
    for key in ("processed", "useful", "lost", "up", "down", "outer_steps", "failures"):
        assert out["plan"].final[key] == pytest.approx(want.final[key], rel=1e-9), key
    last = out["rows"][-1]["stats"]
    assert last["step"] == cfg.steps and last["learner_steps"] == cfg.workers * cfg.steps
    assert max_abs_diff(out["params"], dl.train(cfg, progress=False).params) < 1e-5


# ---- the runtime's edges, by hand -----------------------------------------------------------


def runtime(cfg, hold_s=0.0):
    _, model, _, _ = setup(cfg, workers=1)
    rt = SyncerRuntime(cfg, model.init(cfg.seed), hold_s=hold_s)
    rt.start()
    return rt


def zeros(rt, p):
    """A payload of fragment p (its bytes; the values do not matter here)."""
    return np.zeros(rt.theta.nbytes(p), np.uint8)


def to_the_end(rt, learners=2, step=0.2, steps=8):
    """Every learner's boundaries at step, 2·step, … until the budget runs out, each answer in
    at once and each merge published at once, but for the answers sent at the last boundary:
    returns those, [(m, p, sync)]."""
    for k in range(1, steps + 1):
        sent = []
        for m in range(learners):
            sent += [(m, p, sync) for p, sync in rt.boundary(m, k * step, 0.0).answer]
        if k == steps:
            return sent
        for m, p, sync in sent:
            rt.answered(m, p, sync, zeros(rt, p), k * step, k * step)
        while (job := rt.next_merge()) is not None:
            rt.publish(job, rt.merge(job), k * step)


def test_an_answer_sent_after_the_budget_is_left_out():
    """The learner that finishes after the budget ran out is told to stop, and an answer sent
    later than the end is not merged (the simulated clock stops there too)."""
    rt = runtime(decoupled(steps=8))
    for T in np.arange(1, 9) * 0.2:
        for m in range(3):
            assert not rt.boundary(m, float(T), 0.0).stop
    assert rt.ending == pytest.approx(1.6)
    assert rt.boundary(0, 1.8, 0.0).stop
    rt.answered(1, 0, 99, zeros(rt, 0), 1.8, 1.8)
    assert not rt.payloads[0] and all(kind != RESPONSE for _, kind, *_ in rt.timers)


def test_an_answer_late_at_the_end_is_never_merged_beside_the_flush():
    """Issue 30 defect 1. K = M = 2, one fragment: both learners answer the ask at 1.6 s, the
    instant the budget runs out. If their answers are not in when the flush is planned, the
    flush takes their Δ; when they come in later they must not start a merge of the same
    fragment beside it (it would be merged twice, off the lock)."""
    cfg = decoupled(workers=2, steps=8, fragments=1, overlap=0)
    rt = runtime(cfg)
    late = to_the_end(rt)
    assert rt.ending == pytest.approx(1.6) and sorted(m for m, _, _ in late) == [0, 1]
    [flush] = rt.flushes()
    assert flush.p == 0 and sorted(flush.weights) == [0, 1]
    for m, p, sync in late:
        rt.answered(m, p, sync, zeros(rt, p), 1.6, 1.7)
    assert rt.next_merge() is None and not rt.busy


def test_the_flush_waits_for_the_merges_in_progress():
    """The same run, the answers in on time: they close the sync (a merge to compute). Until it
    is published, `flushes()` plans nothing (None) and `result()` refuses; then the learners,
    who have not applied the new fragment, leave nothing to flush."""
    cfg = decoupled(workers=2, steps=8, fragments=1, overlap=0)
    rt = runtime(cfg)
    for m, p, sync in to_the_end(rt):
        rt.answered(m, p, sync, zeros(rt, p), 1.6, 1.6)
    assert rt.busy and rt.flushes() is None
    job = rt.next_merge()
    assert job.p == 0 and sorted(job.weights) == [0, 1]
    assert rt.flushes() is None  # being computed
    with pytest.raises(RuntimeError, match="merge"):
        rt.result()
    rt.publish(job, rt.merge(job), 1.6)
    assert rt.flushes() == [] and rt.result()["plan"].final["outer_steps"] == 2


@pytest.mark.parametrize("arrives, merged", [(0.497, True), (0.505, False)])
def test_an_answer_after_the_grace_deadline_is_too_late(arrives, merged):
    """Issue 30 defect 5. K = 2 of 3, τ = 1, grace safety 0.5, hold 10 ms: learners 0 and 1
    answer the ask at 0.4 s (quorum at 0.4 s; slack τ·t_ref = 0.2 s, so the deadline is at
    0.5 s); learner 2 answers at its boundary at 0.49 s. Arriving at 0.497 s it is merged;
    at 0.505 s it is too late, as on the simulated clock — even though the syncer's timers,
    held back 10 ms, have not fired the deadline when it arrives."""
    cfg = decoupled(quorum=2, grace_safety=0.5)
    rt = runtime(cfg, hold_s=0.01)
    for m in (0, 1):
        rt.boundary(m, 0.2, 0.0)
    rt.boundary(2, 0.3, 0.0)
    for m in (0, 1):
        [(p, sync)] = rt.boundary(m, 0.4, 0.0).answer
        rt.answered(m, p, sync, zeros(rt, p), 0.4, 0.4)
    rt.advance(0.41 - 0.01)  # the timers' thread: the two arrivals, the quorum
    assert rt.next_merge() is None
    [(p, sync)] = rt.boundary(2, 0.49, 0.0).answer
    rt.answered(2, p, sync, zeros(rt, p), 0.49, arrives)
    rt.advance(0.512 - 0.01)
    job = rt.next_merge()
    assert job.p == 0 and sorted(job.weights) == ([0, 1, 2] if merged else [0, 1])


def test_a_learner_killed_while_waiting_to_rejoin_never_takes_the_next_ones_state():
    """Issue 30 defect 3. Learner 1 fails and its new process asks to rejoin (peer: learner 0,
    at its next boundary); killed again while waiting, a newer process asks too. When the peer
    uploads, the state goes to the newer ticket; the first one's is void."""
    cfg = decoupled(quorum=1)
    rt = runtime(cfg)
    for m in range(3):
        rt.boundary(m, 0.2, 0.0)
    rt.failed(1, 0.3)
    first = rt.rejoin(1, 0.5)
    assert rt.take_rejoin(1, first) == ("wait", None)
    rt.failed(1, 0.6)  # killed while waiting: already down
    assert rt.take_rejoin(1, first) == ("gone", None)
    second = rt.rejoin(1, 0.9)
    assert rt.boundary(0, 1.0, 0.0).upload
    rt.peer_state(0, "learner 0's state", 1.0)
    assert rt.take_rejoin(1, first) == ("gone", None)
    state, (_, inner, k, t) = rt.take_rejoin(1, second)
    assert (state, inner, k, t) == ("ready", "learner 0's state", 1, 1.0)
    assert [kind for _, kind, m, _ in rt.log if m == 1] == ["fail", "rejoin"]


def test_a_restarted_learner_that_has_not_rejoined_gives_no_flush_payload():
    """Issue 30 defect 8: the check the flush relies on, without Ray. A new process (a restart)
    holds no learner's state: its flush payload is refused; once it began the run, or
    reloaded, it answers with its Δ."""
    cfg = decoupled()
    _, model, _, _ = setup(cfg, workers=1)
    params = model.init(cfg.seed)
    restarted = LearnerProgram(cfg, 1, params)
    with pytest.raises(RuntimeError, match="holds no"):
        restarted.flush_answer(0)
    restarted.reload(jax.tree.leaves(params), None)
    restarted.step(0)
    assert np.array_equal(restarted.flush_answer(0), restarted.answer(0))
    first = LearnerProgram(cfg, 0, params)
    first.begin()
    first.step(0)
    assert first.flush_answer(1).any()
