"""The wall-clock syncer (`actors.syncer.SyncerRuntime`) and the learners' agents
(`actors.agent.LearnerAgent`) driven by hand, no Ray.

`by_hand` plays what the actor runtime does, on the simulated clock's times: each learner a
real `LearnerProgram` stepping at its `Timeline` times and running its own rules on what it has
heard (a call only where a notice not heard yet could change what it does: its notices can
be made to come late, `lag`), answering with its real Δ bytes and its report; its
answers cross the hosts' links (`clock.Links`), the syncer's replies carry the time the same
links deliver them; a failure window kills the learner (its state is lost, and what it did
since its last report the syncer books from its rules and step times) and it rejoins at the
window's end (from a peer's state, or fresh). The plan the runtime books must be the simulated
clock's (`make_plan`) event for event, its counters the same, and its parameters those of
`train(config)`: the two drivers apply the same rules, with payloads, failures and finite
links.

The last tests check the runtime's edges by hand: the end of a run (an answer after the
budget's last step, a merge still being computed), an answer after a grace deadline, a
learner killed while waiting to rejoin, a failure window of a learner still down
(`SyncerActor.window`, the actor driven by hand), and a restarted learner's flush payload.
"""

import functools
import heapq
import itertools
import math
import operator
import threading
import time
from types import SimpleNamespace

import jax
import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite.actors import syncer_actor
from diloco_lite.actors.agent import LearnerAgent
from diloco_lite.actors.learner import LearnerProgram
from diloco_lite.actors.syncer import SyncerRuntime
from diloco_lite.algorithms import make_driver
from diloco_lite.clock import Cluster, Link, Links, Timeline
from diloco_lite.clock.plan import make_plan
from diloco_lite.clock.recorder import FRESH
from diloco_lite.clock.syncer import BOUNDARY, END, FAIL, PUBLISH, REJOIN, RESPONSE
from diloco_lite.training import eval_points, setup
from tests.helpers import max_abs_diff, tiny_run

MOMENTUM = optax.sgd(0.2, momentum=0.5)  # an inner optimizer with a state (a rejoin loads it)
STOPPED = END + 1  # (the by-hand driver's) a learner at its stop reports, after its answers
# 22 steps of 0.2 s end at this float (4.400000000000001), added one after the other as the
# clock does (Python 3.12's `sum` compensates and gives 4.4)
END_22 = functools.reduce(operator.add, [0.2] * 22)


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


def by_hand(cfg, hold_s: float = 0.0, peer_at_once: bool = True, lag: float = 0.0) -> dict:
    """Drive `SyncerRuntime` and the learners' agents as the actors do (module docstring);
    returns its `result()`. `lag`: the asks and publish notices reach a learner that long
    after the syncer sent them, unless it asks for everything up to its step boundary
    (`LearnerAgent.unsure`: here the syncer has handled every event before it)."""
    _, model, _, _ = setup(cfg, workers=1)
    params = model.init(cfg.seed)
    rt = SyncerRuntime(cfg, params, hold_s=hold_s)
    M, P, tau = cfg.workers, cfg.algorithm.fragments, cfg.algorithm.overlap
    timeline = Timeline(cfg.cluster, M)
    period = cfg.algorithm.inner_steps * timeline.t_ref
    progs = [LearnerProgram(cfg, m, params) for m in range(M)]
    agents = [LearnerAgent(m, P, tau, period_s=period) for m in range(M)]
    life = [0] * M
    mail = [[] for _ in range(M)]  # the notices on their way to each learner: (arrival, message)
    links = Links(timeline.cluster.link, M)  # the answers' (the syncer models its replies)
    heap, seq, wi, uploads = [], itertools.count(), [0] * M, set()
    arrival = [0.0] * M  # when each learner's last answer arrives

    def push(t, kind, *data):
        heapq.heappush(heap, (t, kind, next(seq), data))

    def start_step(m, t):  # its next step ends, unless its failure window begins first
        end = t + timeline.duration(m, agents[m].k)
        w = timeline.window(m, wi[m])
        failing = w is not None and w[0] < end
        if agents[m].stopped:  # it reports once its answers are in; killed all the same in
            push(max(t, arrival[m]), STOPPED, m)  # the step the simulated clock starts
            if failing:
                push(w[0], FAIL, m)
            return
        push(*((w[0], FAIL) if failing else (end, BOUNDARY)), m)

    def deliver(t):  # the syncer's messages: at once (each counts from its own time), the
        for m, message, reply, *_ in rt.outbox:  # notices `lag` later
            if message[0] == "upload":
                uploads.add(m)
                continue
            if message[0] == "reply":
                progs[m].receive(message[1], message[2], reply)
                continue
            if lag and message[0] in ("ask", "publish"):
                mail[m].append((t + lag, message))
                continue
            stopped = agents[m].stopped
            agents[m].hear(message)
            if stopped and not agents[m].stopped:  # a new stop: it goes on
                start_step(m, t)
        rt.outbox.clear()

    def merges(t):  # the syncer's merge thread: computed at once
        while (job := rt.next_merge()) is not None:
            rt.merged(job, rt.merge(job))
        deliver(t)

    def due(queue):  # its next entry (time, kind)
        return queue[0][:2] if queue else None

    def read_mail(m, t, everything=False):  # the notices it has by t (or all of them)
        for message in [x for at, x in mail[m] if everything or at <= t]:
            agents[m].hear(message)
        mail[m] = [(at, x) for at, x in mail[m] if not (everything or at <= t)]

    for m, messages in enumerate(rt.start()):
        progs[m].begin()
        for message in messages:
            agents[m].hear(message)
        start_step(m, 0.0)
    while True:
        timer, event = due(rt.timers), due(heap)
        predicted = rt.roster.predicted_end  # (the syncer waits for the learners after it)
        held = timer is not None and timer[1] != PUBLISH and rt.end is None \
            and predicted is not None and timer[0] > max(predicted, rt.reached)
        if event is None and (timer is None or held):
            break
        if event is None or (timer is not None and timer < event and not held):
            rt.advance(timer[0], timer[1] + 1)  # the syncer's own timer
            merges(timer[0])
            continue
        t, kind, _, data = heapq.heappop(heap)
        if rt.end is not None and t > rt.end:
            continue  # the run is over (a learner back after it does not rejoin)
        if kind == BOUNDARY:
            (m,) = data
            a = agents[m]
            loss = progs[m].step(a.k)
            read_mail(m, t)
            if a.unsure(t):  # the syncer's word: every message sent to it so far
                read_mail(m, t, everything=True)
            answers, applies = a.boundary(t, loss)
            for p, n, since in answers:
                payload = progs[m].answer(p)
                arrival[m] = links.send(m + 1, 0, rt.theta.nbytes(p), t)
                push(arrival[m], RESPONSE, m, p, n, since, payload, t, a.take_report())
            for p, version in applies:
                progs[m].apply(p, version)
            if m in uploads:
                uploads.discard(m)
                rt.peer_state(m, progs[m].inner_state(), t)
                a.uploaded(t)
            start_step(m, t)
        elif kind == RESPONSE:
            m, p, n, since, payload, sent_at, report = data
            rt.answered(m, life[m], p, n, payload, since, sent_at, report, t)
        elif kind == STOPPED:
            (m,) = data
            if agents[m].stopped:
                rt.reported(m, life[m], agents[m].take_report(), final=(agents[m].k,
                                                                        agents[m].held))
        elif kind == FAIL:
            (m,) = data
            back = timeline.window(m, wi[m])[1]
            wi[m] += 1
            rt.killed(m, t)
            rt.failed(m, t)  # heard of at once, as on the simulated clock
            life[m] += 1
            mail[m] = []
            if math.isfinite(back):
                push(back, REJOIN, m)
        elif kind == REJOIN:
            (m,) = data
            ticket = rt.rejoin(m, t)
            if m in rt.peer_of and peer_at_once:  # its peer uploads now (the clock's rule)
                q = rt.peer_of[m]
                rt.peer_state(q, progs[q].inner_state(), t)
                rt.outbox[:] = [o for o in rt.outbox if o[1][0] != "upload"]
            state, got = rt.take_rejoin(m, ticket)
            assert state == "ready", state
            progs[m].reload(got["leaves"], got["inner"], got["versions"])
            agents[m] = LearnerAgent(m, P, tau, k=got["k"], versions=got["versions"],
                                     period_s=period)
            for message in got["messages"]:
                agents[m].hear(message)
            start_step(m, t)
        merges(t)
    jobs = rt.flushes()
    assert jobs is not None
    for job in jobs:
        job.payloads = {m: progs[m].flush_answer(job.p) for m in job.weights}
        rt.flush(job)
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
    # the same, learner 1 back at 7.5 s, before the publish: its new process hears of the
    # merge in flight with its rejoin (so it applies it, and answers the ask at 12 s)
    "back_before_the_publish": dict(
        cluster=Cluster(step_time_s=1.0, link=Link(latency_s=2.05),
                        failures=((1, 6.5, 7.5),)),
        workers=2, steps=20, fragments=1, overlap=0, quorum=2),
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
    "back_before_the_publish": dict(reloads=[(1, 0)], outer_steps=2),
    "rejoin_alone_fresh": dict(reloads=[(1, FRESH), (0, 1)]),
    "failure_at_the_end": dict(reloads=[], at_the_end=[(0, False)]),
}


@pytest.mark.slow  # real time: about 80 s in all (make test runs them, the Colab lane not)
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


@pytest.mark.parametrize("name", ["synchronous", "jitter_k2_grace", "failure_k2"])
def test_a_notice_that_comes_late_changes_nothing(name):
    """The timing race of the actors: the asks and publish notices reach each learner 70 ms
    after the syncer sent them (`hold_s` and a message's latency; a close just before a
    learner's step boundary lands after it). Where that could change what a learner does at a
    boundary, it asks the syncer for everything up to then (`LearnerAgent.unsure`), so the
    decisions are still the simulated clock's, event for event (without that call, the last
    two scenarios answer or apply a step late)."""
    cfg = decoupled(**SCENARIOS[name])
    plan = by_hand(cfg, lag=0.07)["plan"]
    want = simulated_plan(cfg)
    assert events(plan) == events(want)
    for key in ("processed", "useful", "lost", "outer_steps"):
        assert plan.final[key] == pytest.approx(want.final[key], rel=1e-9), key


# ---- the runtime's edges, by hand -----------------------------------------------------------


def runtime(cfg, hold_s=0.0):
    """The syncer of `cfg` and its learners' agents, started."""
    _, model, _, _ = setup(cfg, workers=1)
    rt = SyncerRuntime(cfg, model.init(cfg.seed), hold_s=hold_s)
    agents = [LearnerAgent(m, cfg.algorithm.fragments, cfg.algorithm.overlap)
              for m in range(cfg.workers)]
    for a, messages in zip(agents, rt.start(), strict=True):
        for message in messages:
            a.hear(message)
    return rt, agents


def answers_at(rt, agents, m, t):
    """Learner m's step boundary at t: its answers [(p, n, since, t, report)]."""
    answers, _ = agents[m].boundary(t, 0.0)
    return [(m, p, n, since, t, agents[m].take_report()) for p, n, since in answers]


def arrive(rt, answer, at):
    """An answer reaches the syncer at `at` (a payload of its fragment: zeros)."""
    m, p, n, since, t, report = answer
    rt.answered(m, 0, p, n, np.zeros(rt.theta.nbytes(p), np.uint8), since, t, report, at)


def to_the_end(rt, agents, step=0.2):
    """Every learner's boundaries at step, 2·step, … to its stop, each answer in at once, each
    merge published at once, but for the answers sent at the last boundary: returns those."""
    k = 0
    while not all(a.stopped for a in agents):
        k += 1
        sent = [x for m, a in enumerate(agents) if not a.stopped
                for x in answers_at(rt, agents, m, k * step)]
        if all(a.stopped for a in agents):
            return sent
        for x in sent:
            arrive(rt, x, k * step)
        while (job := rt.next_merge()) is not None:
            rt.merged(job, rt.merge(job))
        for m, message, *_ in rt.outbox:
            agents[m].hear(message)
        rt.outbox.clear()


def stopped(rt, agents):
    """Every learner reports its stop (after its answers are in)."""
    for m, a in enumerate(agents):
        rt.reported(m, 0, a.take_report(), final=(a.k, a.held))


@pytest.mark.parametrize("latency", [0.0, 0.05])
def test_an_answer_sent_at_the_end(latency):
    """Issue 30 defect 1, and the end's rule. K = M = 2, one fragment: both learners answer the
    ask at 1.6 s, their last step (the budget's last); their answers reach the syncer after it
    (1.7 s). As on the simulated clock, nothing is handled after the end but the publishes: on
    a free link an answer sent by the end has arrived by then (it closes the sync, an outer
    step); with 50 ms of latency it has not: the flush takes their Δ, and no merge of the same
    fragment starts beside it."""
    cfg = decoupled(workers=2, steps=8, fragments=1, overlap=0,
                    cluster=Cluster(step_time_s=0.2, link=Link(latency_s=latency)))
    rt, agents = runtime(cfg)
    late = to_the_end(rt, agents)
    assert sorted(x[0] for x in late) == [0, 1] and rt.roster.stop == [8, 8]
    for x in late:
        arrive(rt, x, 1.7)
    assert rt.end is None and rt.flushes() is None  # the learners have not said they stopped
    stopped(rt, agents)
    assert rt.end == pytest.approx(1.6)
    rt.advance(1.7)  # the timers' thread
    if latency == 0:
        job = rt.next_merge()
        assert (job.p, sorted(job.weights), job.closed_at) == (0, [0, 1], pytest.approx(1.6))
        rt.merged(job, rt.merge(job))
        assert rt.flushes() == []  # (they have not applied it: nothing to flush)
        return
    [flush] = rt.flushes()
    assert flush.p == 0 and sorted(flush.weights) == [0, 1]
    assert rt.next_merge() is None and not rt.busy


def test_the_flush_waits_for_the_merges_in_progress():
    """The same run, the answers in on time: they close the sync (a merge to compute). Until it
    is published, `flushes()` plans nothing (None) and `result()` refuses; then the learners,
    who have not applied the new fragment, leave nothing to flush."""
    cfg = decoupled(workers=2, steps=8, fragments=1, overlap=0)
    rt, agents = runtime(cfg)
    for x in to_the_end(rt, agents):
        arrive(rt, x, 1.6)
    stopped(rt, agents)
    assert rt.busy and rt.flushes() is None
    job = rt.next_merge()
    assert job.p == 0 and sorted(job.weights) == [0, 1]
    assert rt.flushes() is None  # being computed
    with pytest.raises(RuntimeError, match="merge"):
        rt.result()
    rt.merged(job, rt.merge(job))
    assert rt.flushes() == [] and rt.result()["plan"].final["outer_steps"] == 2


@pytest.mark.parametrize("arrives, merged", [(0.497, True), (0.505, False)])
def test_an_answer_after_the_grace_deadline_is_too_late(arrives, merged):
    """Issue 30 defect 5. K = 2 of 3, τ = 1, grace safety 0.5, hold 10 ms: learners 0 and 1
    answer the ask at 0.4 s (quorum at 0.4 s; slack τ·t_ref = 0.2 s, so the deadline is at
    0.5 s); learner 2 answers at its boundary at 0.49 s. Arriving at 0.497 s it is merged;
    at 0.505 s it is too late, as on the simulated clock — even though the syncer's timers,
    held back 10 ms, have not fired the deadline when it arrives."""
    cfg = decoupled(quorum=2, grace_safety=0.5)
    rt, agents = runtime(cfg, hold_s=0.01)
    for m in (0, 1):
        answers_at(rt, agents, m, 0.2)
    answers_at(rt, agents, 2, 0.3)
    for m in (0, 1):
        [x] = answers_at(rt, agents, m, 0.4)
        arrive(rt, x, 0.4)
    rt.advance(0.41 - 0.01)  # the timers' thread: the two arrivals, the quorum
    assert rt.next_merge() is None
    [x] = answers_at(rt, agents, 2, 0.49)
    arrive(rt, x, arrives)
    rt.advance(0.512 - 0.01)
    job = rt.next_merge()
    assert job.p == 0 and sorted(job.weights) == ([0, 1, 2] if merged else [0, 1])


def test_a_learner_unsure_at_its_boundary_hears_everything_up_to_it():
    """The race, by hand. K = M = 3, τ = 1, hold 10 ms: fragment 0 asked at 0.4 s; learners 0
    and 1 answer then, learner 2's answer reaches the syncer at 0.59 s and closes the sync.
    Learner 0, at its boundary at 0.6 s, has not heard the notice (it is sent when the syncer
    handles that arrival, 10 ms later, and takes time to travel), but a publish by then would
    be applied there: it asks (`until`). The syncer answers once it has handled every event up
    to 0.6 s (at 0.61 s, once the merge is computed), with how many messages it has sent that
    learner, the notice among them: learner 0 applies at 0.6 s, as on the simulated clock."""
    cfg = decoupled()
    rt, agents = runtime(cfg, hold_s=0.01)
    for m in range(3):
        answers_at(rt, agents, m, 0.2)
    sent = [x for m in range(3) for x in answers_at(rt, agents, m, 0.4)]
    for x in sent[:2]:
        arrive(rt, x, 0.4)
    arrive(rt, sent[2], 0.59)
    rt.advance(0.59 - 0.01)  # the timers' thread at 0.59 s: the arrival waits out hold_s
    assert agents[0].unsure(0.6) and rt.until(0, 0, 0.6) is None
    rt.advance(0.6 - 0.01)  # at 0.6 s: the sync closes (0.59 s), not everything up to 0.6 s
    assert rt.until(0, 0, 0.6) is None
    rt.advance(0.61 - 0.01)  # (its publish waits for the merge)
    assert rt.until(0, 0, 0.6) is None
    job = rt.next_merge()  # the merge thread
    rt.merged(job, rt.merge(job))
    rt.advance(0.61 - 0.01)
    count = rt.until(0, 0, 0.6)
    assert count == len(rt.roster.heard[0])
    notices = [(message, n) for m, message, _, _, n in rt.outbox if m == 0]
    assert [n for _, n in notices] == list(range(count - len(notices) + 1, count + 1))
    for message, _ in notices:
        agents[0].hear(message)
    assert agents[0].boundary(0.6, 0.0)[1] == [(0, 1)]


def test_a_learner_killed_while_waiting_to_rejoin_never_takes_the_next_ones_state():
    """Issue 30 defect 3. Learner 1 fails and its new process asks to rejoin (peer: learner 0,
    asked to upload its state at its next boundary); killed again while waiting, a newer
    process asks too. When the peer uploads, the state goes to the newer ticket; the first
    one's is void."""
    cfg = decoupled(quorum=1)
    rt, agents = runtime(cfg)
    for m in range(3):
        answers_at(rt, agents, m, 0.2)
        rt.reported(m, 0, agents[m].take_report())
    rt.failed(1, 0.3)
    first = rt.rejoin(1, 0.5)
    assert (0, ("upload", 1), None, 0, None) in rt.outbox
    assert rt.take_rejoin(1, first) == ("wait", None)
    rt.failed(1, 0.6)  # killed while waiting: already down
    assert rt.take_rejoin(1, first) == ("gone", None)
    second = rt.rejoin(1, 0.9)
    rt.peer_state(0, "learner 0's state", 1.0)
    assert rt.take_rejoin(1, first) == ("gone", None)
    state, got = rt.take_rejoin(1, second)
    assert (state, got["inner"], got["k"], got["t"]) == ("ready", "learner 0's state", 1, 1.0)
    assert [(what, data[0]) for _, _, _, what, data in rt.books.items
            if what in ("fail", "reload")] == [("fail", 1), ("reload", 1)]


def test_a_window_of_a_learner_still_down_extends_its_downtime_and_delays_its_rejoin(
        monkeypatch):
    """`SyncerActor.window` driven by hand (no Ray: its learners' handles record what they are
    sent; its clock is set by hand). Learner 1 up: "kill", and nothing changes. Once it has
    failed: "extended", the kill logged, down until the window's end (the later one of two
    windows); its rejoin waits for that end before it asks a peer for its state."""
    monkeypatch.setattr(syncer_actor, "setup_process", lambda cache_dir: None)  # (no JAX set-up)
    cfg = decoupled(quorum=1)
    _, model, _, _ = setup(cfg, workers=1)
    actor = syncer_actor.SyncerActor(cfg, model.init(cfg.seed), 0.0, None)
    heard = []
    actor.learners = [SimpleNamespace(hear=SimpleNamespace(
        remote=lambda *message, m=m: heard.append((m, message)))) for m in range(cfg.workers)]
    now = [0.3]
    actor._now = lambda: now[0]  # the run's clock, by hand (no timer thread runs)
    rt = actor.rt
    agents = [LearnerAgent(m, cfg.algorithm.fragments, cfg.algorithm.overlap)
              for m in range(cfg.workers)]
    for a, messages in zip(agents, rt.start(), strict=True):
        for message in messages:
            a.hear(message)
    for m in range(3):
        answers_at(rt, agents, m, 0.2)
        rt.reported(m, 0, agents[m].take_report())

    def kills():
        return [data[0] for _, _, _, what, data in rt.books.items if what == "kill"]

    version, items = actor.version, len(rt.books.items)
    assert actor.window(1, 0.8) == "kill"  # up: the driver kills it
    assert (actor.down_until, actor.version, len(rt.books.items), heard, rt.up) == (
        {}, version, items, [], [True, True, True])
    actor.failed(1)  # its death heard of at 0.3 s
    assert rt.up == [True, False, True] and kills() == []
    assert actor.window(1, 0.8, for_good=True) == "kill" and actor.down_until == {}
    assert actor.window(1, 0.8) == "extended"
    assert actor.down_until == {1: 0.8} and kills() == [1] and actor.version > version
    now[0] = 0.4
    assert actor.window(1, 0.6) == "extended"  # a shorter window: down until the later end
    assert actor.down_until == {1: 0.8} and kills() == [1, 1]

    got = []
    rejoin = threading.Thread(target=lambda: got.append(actor.rejoin(1)), daemon=True)
    now[0] = 0.5
    heard.clear()
    rejoin.start()
    rejoin.join(0.2)
    assert rejoin.is_alive() and rt.peer_of == {} and heard == []  # 0.5 s: before 0.8 s
    with actor.cv:
        now[0] = 0.8  # the window's end
        actor._changed()
    deadline = time.monotonic() + 10.0
    while 1 not in rt.peer_of and time.monotonic() < deadline:
        time.sleep(0.01)
    peer = rt.peer_of[1]  # asked to upload its state at its next boundary
    assert [(m, message[0]) for m, message in heard] == [(peer, ("upload", 1))]
    assert got == [] and rejoin.is_alive()
    now[0] = 0.9
    actor.peer_state(peer, 5_000, 0.9)  # it holds its state as of 0.9 s (5,000 bytes)
    rejoin.join(10.0)
    assert not rejoin.is_alive()
    # learner 1 fetches it from the peer's process, host to host, not through the syncer's
    assert (got[0]["inner"], got[0]["t"]) == ((peer, actor.learners[peer], 0.9), 0.9)
    assert actor.direct == {(peer, "up"): 5_000, (1, "down"): 5_000}
    # the peer died before learner 1 fetched it: another learner up is named, counted (the
    # syncer may not know of the death yet: the learners tried are left out)
    other = 2 - peer  # (learners 0 and 2 are up)
    assert actor.refetch(1, [peer]) == (other, actor.learners[other], None)
    assert actor.refetch(1, [peer, other]) is None and actor.refetched == {1: 2}


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
    restarted.reload(jax.tree.leaves(params), None, [0, 0])
    restarted.step(0)
    assert np.array_equal(restarted.flush_answer(0), restarted.answer(0))
    first = LearnerProgram(cfg, 0, params)
    first.begin()
    first.step(0)
    assert first.flush_answer(1).any()


def test_the_publish_notice_goes_at_the_close_and_the_reply_once_merged():
    """K = M = 2, one fragment, asked at 0.8 s: both answers in at 0.8 s close the sync. Each
    learner is told at once when the merge counts from (0.8 s: a free link), that its answer
    is in it and when the next ask comes, before the merge is computed (however long it takes,
    a learner knows at its boundary whether it applies there); the reply's bytes follow once
    merged. Learner 1 fails at 0.9 s and is back at 1.0 s: what the syncer says to it from then
    on (the notice of the sync asked at 1.6 s) is for its new process."""
    cfg = decoupled(workers=2, steps=8, fragments=1, overlap=1, inner_optimizer=MOMENTUM)
    rt, agents = runtime(cfg)
    for k in range(1, 5):
        for x in [x for m in (0, 1) for x in answers_at(rt, agents, m, 0.2 * k)]:
            arrive(rt, x, 0.2 * k)
    assert rt.busy and sorted(rt.outbox) == [
        (m, ("publish", pytest.approx(0.8), 0, 0, True, pytest.approx(1.6)), None, 0, 3)
        for m in (0, 1)]  # (its 3rd message: the first ask and its stop came at the start)
    for m, message, *_ in rt.outbox:
        agents[m].hear(message)
    rt.outbox.clear()
    job = rt.next_merge()
    rt.merged(job, rt.merge(job))
    assert [(m, message, len(reply), life, n) for m, message, reply, life, n in rt.outbox] == [
        (m, ("reply", 0, 0), rt.down_nbytes[0], 0, 4) for m in (0, 1)]
    rt.outbox.clear()
    rt.failed(1, 0.9)
    rt.rejoin(1, 1.0)
    rt.peer_state(0, "learner 0's state", 1.0)
    assert rt.take_rejoin(1, 2)[1]["life"] == 1
    for m, message, *_ in rt.outbox:
        if m == 0 and message[0] != "upload":
            agents[0].hear(message)
    rt.outbox.clear()
    for k in range(5, 9):
        for x in answers_at(rt, agents, 0, 0.2 * k):
            arrive(rt, x, 0.2 * k)
    rt.answered(1, 1, 0, 1, np.zeros(rt.theta.nbytes(0), np.uint8), 3, 1.6, [], 1.6)
    notices = [(m, life) for m, message, _, life, _ in rt.outbox if message[0] == "publish"]
    assert sorted(notices) == [(0, 0), (1, 1)]


@pytest.mark.parametrize("late", [False, True])
def test_an_answer_held_past_hold_s_is_restamped_and_counted(late):
    """K = M = 2, one fragment, hold 10 ms: both learners answer the ask at 0.8 s; learner 0's
    answer reaches the syncer at 0.81 s, learner 1's at 0.805 s. In order, the syncer handles
    0.805 s then 0.81 s: nothing is re-stamped. Late, learner 1's answer is handed to the
    syncer only after its timers have handled learner 0's at 0.81 s (its call waited past
    `hold_s`): it is handled at the syncer's clock, 0.81 s, re-stamped, and counted once, by
    `status()` and by `result()`. Either way the sync closes at 0.81 s with both."""
    cfg = decoupled(workers=2, steps=8, fragments=1, overlap=0)
    rt, agents = runtime(cfg, hold_s=0.01)
    for k in range(1, 9):
        sent = [x for m in (0, 1) for x in answers_at(rt, agents, m, 0.2 * k)]
        if k == 4:
            first, second = sent
            arrive(rt, first, 0.81)
            if not late:
                arrive(rt, second, 0.805)
            rt.advance(0.815)  # the timers' thread, at 0.825 s: learner 0's answer handled
            if late:
                arrive(rt, second, 0.805)
            assert rt.status()["restamped"] == 0
            rt.advance(0.825)  # at 0.835 s
            assert rt.status()["restamped"] == (1 if late else 0)
            job = rt.next_merge()
            assert (sorted(job.weights), job.closed_at) == ([0, 1], pytest.approx(0.81))
            rt.merged(job, rt.merge(job))
        else:
            for x in sent:
                arrive(rt, x, 0.2 * k)
            while (job := rt.next_merge()) is not None:
                rt.merged(job, rt.merge(job))
        for m, message, *_ in rt.outbox:
            agents[m].hear(message)
        rt.outbox.clear()
    stopped(rt, agents)
    while (jobs := rt.flushes()) is None:  # the last answers close a sync: its merge first
        job = rt.next_merge()
        rt.merged(job, rt.merge(job))
    assert jobs == []
    out = rt.result()
    assert out["restamped"] == (1 if late else 0)
    assert out["restamped_kinds"] == ({"answer": 1} if late else {})
    assert out["plan"].final["outer_steps"] == 2
