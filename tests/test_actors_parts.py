"""The actor runtime's parts that decide without Ray or JAX, each against a plain loop written
here: where each learner stops (`actors.budget`), what a learner does at its step boundaries
from the syncer's messages (`actors.agent`), and in which order the run is booked
(`actors.booking`). (The whole runtime driven by hand against the simulated clock:
tests/test_syncer_runtime.py.)"""

import itertools
import math
import random
from types import SimpleNamespace

import pytest

from diloco_lite.actors.agent import LearnerAgent
from diloco_lite.actors.booking import Books, late_s
from diloco_lite.actors.budget import shares, steps_until, stops
from diloco_lite.clock import Cluster, Timeline
from diloco_lite.clock.syncer import ASK, DEADLINE, FAIL, PUBLISH, REJOIN

# ---- actors.budget ------------------------------------------------------------------------------


def budget_by_hand(timeline, anchors, budget):
    """Every step boundary of every learner up to the budget, each learner's times added one
    step after the other from its anchor; the budget's steps are the first ones in order of
    (time, learner). Returns (stops, the time of the last)."""
    pos = [k for k, _ in anchors]
    left = budget - sum(pos)
    ends = []
    for m, (k, t) in enumerate(anchors):
        if t is None:
            continue  # down: no more steps
        for j in range(k, k + max(left, 0)):
            t += timeline.duration(m, j)
            ends.append((t, m))
    ends.sort()
    last = None
    for t, m in ends[:max(left, 0)]:
        pos[m] += 1
        last = t
    return pos, last


@pytest.mark.parametrize("seed", range(6))
def test_the_budget_goes_to_the_first_steps_to_finish(seed):
    rng = random.Random(seed)
    M = rng.randint(1, 4)
    steps = tuple(rng.choice((0.2, 0.25, 0.3, 0.5)) for _ in range(M))
    timeline = Timeline(Cluster(step_time_s=steps, jitter=rng.choice((0.0, 0.3)), seed=seed), M)
    anchors = [(rng.randint(0, 5), rng.choice((None, 0.0, rng.uniform(0, 2))))
               for _ in range(M)]
    if all(t is None for _, t in anchors):
        anchors[0] = (anchors[0][0], 0.0)
    budget = rng.randint(sum(k for k, _ in anchors), 40)
    want = budget_by_hand(timeline, anchors, budget)
    assert shares(timeline, anchors, budget) == want
    assert stops(timeline, anchors, budget) == want[0]
    assert sum(want[0]) == budget  # a learner up can always take more
    floor = [k + 3 for k, _ in anchors]
    assert stops(timeline, anchors, budget, floor) == [max(a, b) for a, b in
                                                       zip(want[0], floor, strict=True)]


def test_a_learner_down_takes_no_more_and_the_budget_may_be_left():
    timeline = Timeline(Cluster(step_time_s=0.2), 2)
    assert shares(timeline, [(3, None), (2, 0.4)], 10) == ([3, 7], pytest.approx(0.4 + 5 * 0.2))
    assert shares(timeline, [(3, None), (2, None)], 10) == ([3, 2], None)  # none up: left


def test_the_steps_until_a_time_include_one_that_ends_then():
    timeline = Timeline(Cluster(step_time_s=(0.25, 0.3), jitter=0.2, seed=1), 2)
    t, want = 1.0, []
    for k in range(4, 20):
        t += timeline.duration(1, k)
        if t > 3.1:
            break
        want.append((k + 1, t))
    assert steps_until(timeline, 1, (4, 1.0), want[-1][1]) == want
    assert steps_until(timeline, 1, (4, 1.0), 3.1) == want
    assert steps_until(timeline, 1, (4, None), 3.1) == []


# ---- actors.agent -------------------------------------------------------------------------------


def agent_by_hand(times, syncs, tau):
    """One fragment: sync n asked at `ask`, published at `pub` (never with the learner's answer
    merged). Its rules, from `clock.learner_side`'s docstring: it answers at its first boundary
    at or after the ask (an ask at a boundary's instant comes first), unless the publish came
    before that boundary; it applies at its first boundary at or after the publish (a publish
    at a boundary's instant comes after its answers, before its applies) whose position is at
    least τ past its first boundary after the ask (none before the publish: the one after it).
    Returns ([(position, n)] answered, [(position, version)] applied)."""
    answers, applies = [], []
    for n, (ask, pub) in enumerate(syncs):
        first = next(j for j, b in enumerate(times, 1) if b >= ask)
        if times[first - 1] <= pub:
            answers.append((first, n))
            pos = first
        else:
            pos = sum(1 for b in times if b <= pub) + 1
        at = next(j for j, b in enumerate(times, 1) if j >= pos + tau and b >= pub)
        applies.append((at, n + 1))
    return answers, applies


def run_agent(agent, times, hear=lambda j: None):
    answers, applies = [], []
    for j, t in enumerate(times, 1):
        hear(j)
        sent, applied = agent.boundary(t, 0.0)
        answers += [(j, n) for _, n, _ in sent]
        applies += [(j, v) for _, v in applied]
    return answers, applies


def syncs_at_random(rng, times, tau):
    """Asks on a reference clock of their own, each published some time after it (the next ask
    after the publish, and after the step where the previous version is applied: so that each
    version is applied on its own)."""
    out, t = [], rng.uniform(0.0, 1.0)
    while True:
        pub = t + rng.choice((0.0, rng.uniform(0.0, 1.5), times[2] - times[1]))
        if pub > times[-1] - (tau + 2) * 0.6:
            return out
        out.append((t, pub))
        t = pub + rng.uniform(0.0, 1.0)
        t = max(t, times[agent_by_hand(times, out, tau)[1][-1][0]])  # (an ask may come at a
        # step boundary's very instant)


@pytest.mark.parametrize("seed", range(12))
def test_the_agent_answers_and_applies_as_a_plain_loop_says(seed):
    rng = random.Random(seed)
    tau = rng.randint(0, 2)
    times = list(itertools.accumulate(rng.choice((0.2, 0.3, 0.5)) for _ in range(60)))
    syncs = syncs_at_random(rng, times, tau)
    assert len(syncs) >= 3
    want = agent_by_hand(times, syncs, tau)
    messages = [("ask", syncs[0][0], 0, 0)] + [
        ("publish", pub, 0, n, False, syncs[n + 1][0] if n + 1 < len(syncs) else math.inf)
        for n, (_, pub) in enumerate(syncs)]
    agent = LearnerAgent(0, 1, tau)
    for message in rng.sample(messages, len(messages)):  # in any order: each at its time
        agent.hear(message)
    assert run_agent(agent, times) == want
    assert agent.held == [len(syncs)]
    # a publish heard late (after its time, just before the boundary where it applies: a slow
    # reply) is taken as of its time: it applies at the same steps
    late = LearnerAgent(0, 1, tau)
    late.hear(messages[0])
    got = run_agent(late, times, lambda j: [late.hear(messages[n + 1])
                                            for n, (at, _) in enumerate(want[1]) if at == j])
    assert got[1] == want[1]


@pytest.mark.parametrize("tau", [0, 1, 3])
def test_an_ask_and_its_publish_heard_steps_late_count_as_of_their_time(tau):
    """Asked at 1.05 s and published at 1.1 s, between its boundaries at 1.0 s (its 5th) and
    1.2 s, but heard only before its boundary at 1.6 s (its 8th): it had no boundary between
    the ask and the publish, so it applies at its first boundary from position 5 + 1 + τ on
    (not from its position when it heard them), and never answers."""
    times = [round(0.2 * j, 9) for j in range(1, 16)]
    agent = LearnerAgent(0, 1, tau)
    messages = [("ask", 1.05, 0, 0), ("publish", 1.1, 0, 0, False, math.inf)]
    got = run_agent(agent, times, lambda j: [agent.hear(x) for x in messages] if j == 8 else 0)
    assert got == ([], [(max(8, 5 + 1 + tau), 1)])


def test_the_agent_asks_the_syncer_only_where_a_late_notice_could_change_its_boundary():
    """One fragment, τ = 3, steps of 0.3 s against a reference period of 0.8 s, asked at 1.0 s.
    Before the ask nothing can be due. At its 4th boundary (1.2 s) it answers, unless a publish
    came before: it asks the syncer. At 1.5 s nothing can be due. From 1.8 s the next ask could
    be due (one period after this one; its answer may have been left out of the merge, and then
    it would answer it), and from its 7th boundary (4 + τ) a publish by then would be applied
    (with a period of 1.2 s, only from there). Having heard the notice (published at 1.1 s,
    before its 4th boundary: it does not answer; the next ask at 1.8 s), it asks only where it
    answers that next ask (1.8 s) and where a publish of it would be applied (its 6th boundary
    + τ)."""
    times = [round(0.3 * j, 9) for j in range(1, 11)]

    def calls(messages, period=0.8):
        agent = LearnerAgent(0, 1, 3, period_s=period)
        for message in messages:
            agent.hear(message)
        out = []
        for j, t in enumerate(times, 1):
            if agent.unsure(t):
                out.append(j)
            agent.boundary(t, 0.0)
        return out

    assert calls([("ask", 1.0, 0, 0)]) == [4, 6, 7, 8, 9, 10]
    assert calls([("ask", 1.0, 0, 0)], period=1.2) == [4, 7, 8, 9, 10]  # next ask from 2.2 s
    assert calls([("ask", 1.0, 0, 0), ("publish", 1.1, 0, 0, False, 1.8)]) == [6, 9, 10]


def test_the_agent_stops_where_it_is_told_and_reports_each_step():
    agent = LearnerAgent(1, 2, 1, k=3)
    agent.hear(("stop", 5))
    assert not agent.stopped
    agent.boundary(1.0, 0.5)
    agent.uploaded(1.0)
    agent.boundary(1.2, 0.25)
    assert agent.stopped and agent.k == 5
    assert agent.take_report() == [("step", 1.0, 4, 0.5, [], []), ("upload", 1.0, 4),
                                   ("step", 1.2, 5, 0.25, [], [])]
    assert agent.take_report() == []
    assert [agent.position_at(t) for t in (0.9, 1.0, 1.1, 1.2, 9.0)] == [3, 4, 4, 5, 5]
    with pytest.raises(ValueError, match="unknown message"):
        agent.hear(("merge", 1.0))


# ---- actors.booking -----------------------------------------------------------------------------


class CallLog:
    """A recorder that writes down the calls `Books.book` makes."""

    def __init__(self):
        self.calls, self.events = [], []

    def __getattr__(self, name):
        def call(*args, **kw):
            self.calls.append((name, *args))
            if name == "eval":
                self.events.append(SimpleNamespace(stats={"at": args}))
        return call


def test_the_books_follow_the_simulated_clocks_order_whatever_order_they_came_in():
    """Two learners, one fragment, asked at 0.4 s. Learner 0 answers at 0.4 s, learner 1 at
    0.5 s; the sync closes at 0.45 s with learner 0 only (learner 1's answer, sent after the
    close, is too late), is published at 0.6 s, applied at 0.6 s (learner 0) and 0.7 s
    (learner 1). Learner 1 fails at 0.7 s, after its step and apply of that instant, and
    reloads from learner 0 at 0.9 s. The plain loop: every event sorted by (time, the clock's
    order of kinds, learner)."""
    books = Books(CallLog, 2, 4, eval_at=[3], theta0=[["theta0"]])
    reports = {0: [("step", 0.2, 1, 1.0, [], []), ("step", 0.4, 2, 0.9, [(0, 0)], []),
                   ("step", 0.6, 3, 0.8, [], [0])],
               1: [("step", 0.25, 1, 1.1, [], []), ("step", 0.5, 2, 1.0, [(0, 0)], []),
                   ("step", 0.7, 3, 0.95, [], [0])]}
    syncer = [(0.4, ASK, "ask", 0), (0.45, DEADLINE, "close", 0, 0, {0: 1.0}),
              (0.6, PUBLISH, "publish", 0, {0: 1.0}, (0, 1), 0.05, ["theta1"], "diag"),
              (0.7, FAIL, "fail", 1), (0.9, REJOIN, "reload", 1, 0)]
    for what in random.Random(0).sample(["r0", "r1"] + syncer, 2 + len(syncer)):
        if isinstance(what, str):
            books.learner(int(what[1]), reports[int(what[1])])
        else:
            books.syncer(*what)
    rec, rows, losses, log = books.book(end=None)
    want = [("step", 0, 0, 0.2), ("step", 1, 0, 0.25), ("step", 0, 1, 0.4), ("send", 0, [0], 0.4),
            ("closing", 0, {0: 1.0}),
            ("step", 1, 1, 0.5), ("send", 0, [1], 0.5), ("drop", 0, 1),  # after the close
            ("step", 0, 2, 0.6),
            ("close", 0, {0: 1.0}, 0.6),
            ("arrive", 0, [0], 0.6),
            ("step", 1, 2, 0.7), ("arrive", 0, [1], 0.7), ("eval", 3, 0.7), ("fail", 1),
            ("reload", 1, 0, 0.9)]
    assert rec.calls == want
    assert [(m, t, x) for m, t, x in losses] == [(0, 0.2, 1.0), (1, 0.25, 1.1), (0, 0.4, 0.9),
                                                (1, 0.5, 1.0), (0, 0.6, 0.8), (1, 0.7, 0.95)]
    assert rows[0]["fragments"] == [["theta1"]] and rows[0]["diags"] == [(0, False, "diag")]
    assert [e[1] for e in log] == ["ask", "answer", "close", "answer", "merge", "apply",
                                   "apply", "fail", "rejoin"]


def test_an_answer_on_the_wire_at_the_close_is_left_out_and_nothing_after_the_end_counts():
    """Learner 1's answer left at 0.4 s, the close at 0.45 s took learner 0's only: learner 1's
    is dropped at the close. The budget's last step at 0.6 s: a step after it is not booked,
    a publish after it is."""
    books = Books(CallLog, 2, 3, eval_at=[], theta0=[["theta0"]])
    books.learner(0, [("step", 0.4, 1, 1.0, [(0, 0)], []), ("step", 0.6, 2, 1.0, [], []),
                      ("step", 0.8, 3, 1.0, [], [])])
    books.learner(1, [("step", 0.4, 1, 1.0, [(0, 0)], [])])
    books.syncer(0.45, DEADLINE, "close", 0, 0, {0: 1.0})
    books.syncer(0.7, PUBLISH, "publish", 0, {0: 1.0}, (0, 1), 0.0, ["theta1"], None)
    rec, *_ = books.book(end=0.6)
    assert rec.calls == [("step", 0, 0, 0.4), ("send", 0, [0], 0.4), ("step", 1, 0, 0.4),
                         ("send", 0, [1], 0.4), ("closing", 0, {0: 1.0}), ("drop", 0, 1),
                         ("step", 0, 1, 0.6), ("close", 0, {0: 1.0}, 0.7)]
    assert books.state["processed"] == 3


def test_how_late_a_learner_came_is_a_plain_sum():
    timeline = Timeline(Cluster(step_time_s=0.2, jitter=0.3, seed=3), 2)
    planned = 1.0 + sum(timeline.duration(1, k) for k in range(5, 8))
    assert late_s([1.3, 1.5, planned + 0.25], timeline, 1, first=5, start=1.0) == \
        pytest.approx(0.25)
    early = 2.0 + timeline.duration(1, 7) - 0.05
    assert late_s([early], timeline, 1, first=7, start=2.0) == 0.0
    assert late_s([], timeline, 1) == 0.0


# ---- actors.roster ------------------------------------------------------------------------------


def test_a_learner_killed_twice_before_its_death_is_heard_stopped_at_the_first_kill():
    """Issue 30: learner 1 is killed at 0.62 s, and again at 1.617 s (its next failure window
    began while its new process was still starting); the syncer hears of the death only at
    2.06 s. What it did after its last report ends at the first kill: its steps at 0.2, 0.4 and
    0.6 s, not those up to the second (the answers they would carry were never sent). A kill
    while it is down (4 s) moves no budget share. Its next process, back at position 3 at 10 s
    and killed at 12.05 s, is booked to the kill of its own life, not to an earlier one's."""
    from diloco_lite.actors.roster import Roster

    timeline = Timeline(Cluster(step_time_s=0.2), 2)
    roster = Roster(timeline, fragments=1, tau=0, budget=200, outbox=[])
    roster.started(1, [])
    roster.killed(1, 0.62, now=0.62, for_good=False)
    roster.killed(1, 1.617, now=1.617, for_good=False)
    lost = roster.failed(1, 2.06, now=2.06, reported=[])
    by_hand = [0.2 * (j + 1) for j in range(3)]  # every step that ended by 0.62 s
    assert [e[1] for e in lost] == pytest.approx(by_hand)
    assert [e[2] for e in lost] == [1, 2, 3]
    assert roster.last[1] == (3, pytest.approx(0.6))
    stops = list(roster.stop)
    roster.killed(1, 4.0, now=4.0, for_good=False)  # its next window, while it is down
    assert roster.stop == stops and roster.last[1] == (3, pytest.approx(0.6))
    roster.started(1, [], k=3, t=10.0, now=10.0)
    roster.killed(1, 12.05, now=12.05, for_good=False)
    lost = roster.failed(1, 13.0, now=13.0, reported=[])
    by_hand = [10.0 + 0.2 * (j + 1) for j in range(10)]  # 10.2 ... 12.0 s
    assert [e[1] for e in lost] == pytest.approx(by_hand)
    assert roster.last[1] == (13, pytest.approx(12.0))
