"""The syncer's state machine on its own (`clock.syncer_state`): hand-built events, and the
exact actions it must return, worked out by hand from its rules. No clock, no learners, no
device: what a real runtime would see. (tests/test_syncer_golden.py checks that the simulated
clock driving it plans every run as before, bit for bit.)"""

import pytest

import diloco_lite as dl
from diloco_lite.clock.syncer_state import (
    Ask,
    AskAt,
    Close,
    Flush,
    SetDeadline,
    SyncerState,
    token_weight,
)


def syncer(learners=3, t_ref=1.0, reply_s=None, **algo):
    algo = dl.DecoupledDiLoCo(**{**dict(inner_steps=4, fragments=1, overlap=0, quorum=1),
                                 **algo})
    return SyncerState(algo, learners, t_ref, reply_s)


def answer(s, p, m, sync, steps, t):
    """Learner m's answer of `steps` steps (2 tokens a step: weight 4 · steps) leaves and arrives
    at time t."""
    assert s.sent(p, m, sync, 2 * steps, steps, t) == []
    return s.arrived(p, m, sync, t)


def test_token_weight_is_tokens_times_tokens_per_step():
    assert token_weight(6, 3) == 12.0  # 6 tokens · (6 tokens / 3 steps)
    assert token_weight(2 * 4, 4) == 4.0 * 4
    # equal batches: proportional to the steps (a constant, the tokens per step², times steps)
    assert token_weight(5 * 4, 5) / token_weight(2 * 4, 2) == 5 / 2


def test_start_asks_each_fragment_at_its_offset_of_the_reference_steps():
    """P = 4, H = 8: offsets 2, 4, 6, 8 reference steps of 0.5 s."""
    s = syncer(t_ref=0.5, fragments=4, inner_steps=8)
    assert s.start() == [AskAt(0, 1.0), AskAt(1, 2.0), AskAt(2, 3.0), AskAt(3, 4.0)]


def test_the_quorum_sets_the_deadline_and_the_deadline_closes():
    """M = 3, K = 2, τ = 2, safety 0.5, t_ref 1 s, the reply takes t_reply = 0.25 s. Asked at 4 s;
    the quorum comes with the second answer at 5 s: slack = 2 − (1 + 0.25) = 0.75, the grace
    0.375 s, so the deadline is 5.375 s. Learner 2 has not answered then: the close merges
    learners 0 and 1 (weights 4 · 4 and 4 · 3) and waited 1 s for its quorum."""
    s = syncer(reply_s=lambda p, t: 0.25, quorum=2, overlap=2, grace_safety=0.5)
    assert s.start() == [AskAt(0, 4.0)]
    assert s.ask(0, 4.0) == [Ask(0, 0, (0, 1, 2))]
    assert answer(s, 0, 0, 0, 4, 4.5) == []  # one answer: no quorum yet
    assert answer(s, 0, 1, 0, 3, 5.0) == [SetDeadline(0, 0, 5.375)]
    assert s.deadline(0, 0, 5.375) == [Close(0, 0, {0: 16.0, 1: 12.0}, (), 3, 1.0)]
    # the result is published at 6 s: the next ask is at reference step 8
    assert s.published(0, 6.0) == [AskAt(0, 8.0)]
    assert s.ask(0, 8.0) == [Ask(0, 1, (0, 1, 2))]


def test_the_grace_window_closes_early_when_every_learner_up_has_answered():
    """M = 2, K = 1, τ = 2, safety 1, a free link: the quorum at the ask (4 s) gives a grace of
    2 s; learner 1 answers at 4.5 s, the last one awaited: the sync closes then, and the
    deadline at 6 s finds it closed."""
    s = syncer(learners=2, overlap=2, grace_safety=1.0)
    assert s.ask(0, 4.0) == [Ask(0, 0, (0, 1))]
    assert answer(s, 0, 0, 0, 4, 4.0) == [SetDeadline(0, 0, 6.0)]
    assert answer(s, 0, 1, 0, 3, 4.5) == [Close(0, 0, {0: 16.0, 1: 12.0}, (), 2, 0.0)]
    assert s.deadline(0, 0, 6.0) == []


def test_without_grace_the_deadline_is_the_quorum_and_an_answer_on_the_wire_is_dropped():
    """Same with safety 0: the deadline is the quorum's instant. Learner 1's answer has left
    (it is awaited, so nothing closes before the deadline) but not arrived: the close leaves
    it out (`dropped`), and its late arrival changes nothing."""
    s = syncer(learners=2, overlap=2, grace_safety=0.0)
    s.ask(0, 4.0)
    assert answer(s, 0, 0, 0, 4, 4.0) == [SetDeadline(0, 0, 4.0)]
    assert s.sent(0, 1, 0, 6, 3, 4.0) == []
    assert s.deadline(0, 0, 4.0) == [Close(0, 0, {0: 16.0}, (1,), 2, 0.0)]
    assert s.arrived(0, 1, 0, 4.3) == []


def test_a_failed_learner_is_dropped_leaves_the_quorum_and_is_asked_again_when_back():
    """M = 4, K = 2, τ = 1, safety 0.5. Asked at 4 s. Learner 3 fails at 4.1 s before
    answering; learner 0 answers at 4 s, learner 1 at 4.2 s: the quorum (slack 1 − 0.2 = 0.8,
    deadline 4.6 s). Learner 1 fails at 4.3 s: its answer is out, the quorum lost, the deadline
    void. Learner 2's answer leaves at 4.5 s, it fails at 4.7 s: its arrival at 4.8 s is
    dropped. Learner 3 is back at 5 s and asked again (learner 2, back too, had answered: it is
    not). Learner 3 answers at 6 s: the quorum (0 and 3), no grace (slack < 0), and nobody up
    is awaited (learner 2 answered in its earlier life): the close merges 0 and 3, sends to the
    3 learners up, and waited 2 s."""
    s = syncer(learners=4, quorum=2, overlap=1, grace_safety=0.5)
    assert s.ask(0, 4.0) == [Ask(0, 0, (0, 1, 2, 3))]
    assert s.failed(3, 4.1) == []
    assert answer(s, 0, 0, 0, 4, 4.0) == []
    assert answer(s, 0, 1, 0, 4, 4.2) == [SetDeadline(0, 0, 4.6)]
    assert s.failed(1, 4.3) == []  # quorum lost: nothing to close
    assert s.deadline(0, 0, 4.6) == []  # the quorum it timed is gone
    assert s.sent(0, 2, 0, 2, 1, 4.5) == []
    assert s.failed(2, 4.7) == []
    assert s.arrived(0, 2, 0, 4.8) == []  # sent before its failure: weight 0
    assert s.back(3, 5.0) == [Ask(0, 0, (3,))]
    assert s.back(2, 5.0) == []
    assert answer(s, 0, 3, 0, 1, 6.0) == [SetDeadline(0, 0, 6.0),
                                          Close(0, 0, {0: 16.0, 3: 4.0}, (), 3, 2.0)]


def test_the_failure_of_the_last_learner_awaited_closes_the_sync():
    s = syncer(learners=2, overlap=2, grace_safety=1.0)
    s.ask(0, 4.0)
    assert answer(s, 0, 0, 0, 4, 4.0) == [SetDeadline(0, 0, 6.0)]
    assert s.failed(1, 4.5) == [Close(0, 0, {0: 16.0}, (), 1, 0.0)]


def test_stale_events_are_ignored():
    """An answer or a deadline of another sync id, or of a sync that closed, does nothing."""
    s = syncer(learners=2)
    s.ask(0, 4.0)
    assert answer(s, 0, 0, 7, 4, 4.0) == []  # no sync 7
    assert s.deadline(0, 7, 4.0) == []
    assert answer(s, 0, 0, 0, 4, 4.0) == [SetDeadline(0, 0, 4.0)]
    assert answer(s, 0, 1, 0, 4, 4.0) == [Close(0, 0, {0: 16.0, 1: 16.0}, (), 2, 0.0)]
    assert s.deadline(0, 0, 4.0) == [] and answer(s, 0, 1, 0, 1, 4.5) == []


def test_one_version_of_a_fragment_in_flight():
    """No ask of p while its sync is open or its result is on the way; once published (at
    9.5 s), the next ask is the first of its reference steps after that: 12, not 8."""
    s = syncer(learners=1)
    s.ask(0, 4.0)
    with pytest.raises(RuntimeError, match="in flight"):
        s.ask(0, 5.0)  # open
    assert answer(s, 0, 0, 0, 4, 4.0) == [SetDeadline(0, 0, 4.0),
                                          Close(0, 0, {0: 16.0}, (), 1, 0.0)]
    with pytest.raises(RuntimeError, match="in flight"):
        s.ask(0, 8.0)  # closed, not published
    assert s.published(0, 9.5) == [AskAt(0, 12.0)]
    assert s.ask(0, 12.0) == [Ask(0, 1, (0,))]


def test_the_flush_takes_only_the_learners_up_holding_the_newest_version():
    """M = 3, P = 2 (asks of fragment 0 at 2 s, of fragment 1 at 4 s), K = 1, τ = 0. Fragment
    0's version 1 is published at 2.5 s; learners 0 and 1 apply it, learner 2 not yet. Fragment
    1 closes at 4 s and is in flight. Learner 1 fails at 5 s: the flush of fragment 0 takes
    learner 0 only, and none of fragment 1 (in flight). Learner 2 fails and is back (it loads
    every newest version), and fragment 1 is published: fragment 0 flushes learners 0 and 2;
    fragment 1's new version is held by nobody, so it is not flushed."""
    s = syncer(fragments=2)
    assert s.start() == [AskAt(0, 2.0), AskAt(1, 4.0)]
    assert s.ask(0, 2.0) == [Ask(0, 0, (0, 1, 2))]
    assert answer(s, 0, 0, 0, 2, 2.0) == [SetDeadline(0, 0, 2.0)]
    assert answer(s, 0, 1, 0, 2, 2.0) == []
    assert answer(s, 0, 2, 0, 2, 2.0) == [Close(0, 0, {0: 8.0, 1: 8.0, 2: 8.0}, (), 3, 0.0)]
    assert s.published(0, 2.5) == [AskAt(0, 6.0)]
    assert s.applied(0, 0, 3.0) == [] and s.applied(1, 0, 3.0) == []
    assert s.ask(1, 4.0) == [Ask(1, 1, (0, 1, 2))]
    assert answer(s, 1, 0, 1, 4, 4.0) == [SetDeadline(1, 1, 4.0)]
    assert s.deadline(1, 1, 4.0) == [Close(1, 1, {0: 16.0}, (), 3, 0.0)]
    assert s.failed(1, 5.0) == []
    assert s.end(5.0) == [Flush(0, (0,))]
    assert s.failed(2, 5.2) == [] and s.back(2, 5.5) == []
    assert s.published(1, 6.0) == [AskAt(1, 8.0)]
    assert s.end(6.0) == [Flush(0, (0, 2))]
