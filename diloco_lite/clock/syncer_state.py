"""Decoupled DiLoCo's syncer as a state machine: events in, actions out, no clock of its own.

The syncer's decisions (docs/algorithms.md §4) live here and nowhere else. A *driver* tells the
`SyncerState` what happened and when, and carries out the actions it returns. Two drivers can
run it: the simulated clock (`clock.syncer`: an event queue, the learners' step times, FIFO
links, a `Recorder`), and a real runtime (actors, real messages, wall-clock times). It never
sleeps and never reads a clock: every time comes in with an event, in seconds since the run
began. A timer it needs is an action (`AskAt`, `SetDeadline`) that the driver turns back into
an event at that time: the simulated clock pushes it on its queue, a real runtime sets a timer.

Events (methods; each returns the list of actions to carry out, in order, often empty):

    start()                            the run begins
    ask(p, t)                          the time of an `AskAt` came
    sent(p, m, sync, tokens, steps, t) learner m's answer left: its Δ of `steps` steps, `tokens`
    arrived(p, m, sync, t)             learner m's answer reached the syncer
    deadline(p, sync, t)               the time of a `SetDeadline` came
    published(p, t)                    the merged fragment p has reached the learners
    applied(m, p, t)                   learner m took the newest published fragment p
    failed(m, t)                       learner m went down (its state is lost)
    back(m, t)                         learner m is back, holding every newest Θ_p
    end(t)                             the learners stopped (call it after the last `published`)

Actions (dataclasses), and what the driver does with each:

    AskAt(p, t)                        call `ask(p, t)` at time t
    Ask(p, sync, learners)             ask these learners for fragment p (sync: the sync's id)
    SetDeadline(p, sync, t)            call `deadline(p, sync, t)` at time t
    Close(p, sync, weights, dropped,   merge the answers in `weights` (learner -> weight), take
          receivers, wait_s)           the outer step, send Θ_p down to the `receivers` learners
                                       up, call `published` when it has arrived; the learners
                                       stop answering this sync, the answers in `dropped` (on
                                       the wire) are left out; `wait_s`: from the ask to quorum
    Flush(p, learners)                 the end-of-run plain weighted mean of these learners' Δ

The rules:

1. the syncer asks for fragment p at reference steps offset(p), offset(p) + H, … of `Schedule`
   (reference step k ends at k · t_ref); one version of p is in flight at a time: the next ask
   is at the first of those steps after the previous version is published;
2. quorum: it waits for K answers (arrived) of learners that are up;
3. grace: then it waits up to g = safety · slack longer,
   slack = τ·t_ref − ((t_quorum − t_ask) + t_reply) (t_ask: the instant it asked; t_quorum: the
   instant the K-th answer arrived; t_reply: the seconds its reply, the merged fragment Θ_p,
   takes to reach the learners, which the driver estimates: `reply_s`), and closes as soon as
   no up learner is awaited (each one asked has answered, and each answer sent has arrived);
4. it merges with weights w = tokens · (tokens / steps): tokens times tokens per step (with
   equal batches, proportional to the steps; tokens per step is larger only with larger batches);
5. a failed learner has weight 0: its answers, even one already sent, are left out, and it
   leaves the quorum. Back, it holds every newest Θ_p and is asked again by the open syncs it
   had not answered;
6. at the end, every fragment not in flight is flushed from the up learners that hold its
   newest version (the driver leaves out those with no step since).

The learners' rules are not here but in `learner_rules.LearnerRules`, which both drivers call
(a learner answers an `Ask` at its next step boundary, but not while its previous answer of p
was merged and the result not applied yet; it applies the newest published fragment τ of its
own steps after the ask, never waiting, and reports `applied`). A runtime that cannot see an
answer leave may call `sent` and `arrived` together when it arrives.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

from ..config import DecoupledDiLoCo
from .schedule import Schedule


@dataclasses.dataclass(frozen=True)
class AskAt:
    p: int
    t: float


@dataclasses.dataclass(frozen=True)
class Ask:
    p: int
    sync: int
    learners: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SetDeadline:
    p: int
    sync: int
    t: float


@dataclasses.dataclass(frozen=True)
class Close:
    p: int
    sync: int
    weights: dict  # learner -> merge weight, the answers that arrived
    dropped: tuple[int, ...]  # answers still on the wire: left out
    receivers: int  # learners up, who get the new fragment
    wait_s: float  # from the ask to the quorum


@dataclasses.dataclass(frozen=True)
class Flush:
    p: int
    learners: tuple[int, ...]


def token_weight(tokens: float, steps: int) -> float:
    """A learner's merge weight: tokens · (tokens / steps), counted since its base: its tokens
    times its tokens per step (with equal batches, a constant times its steps)."""
    return tokens * (tokens / steps)


@dataclasses.dataclass
class _Sync:
    """One open sync of one fragment."""

    id: int
    asked_t: float
    unanswered: set  # learners asked whose answer has not left
    sent: dict = dataclasses.field(default_factory=dict)  # learner -> weight (answer left)
    arrived: set = dataclasses.field(default_factory=set)
    quorum_t: float | None = None
    deadline: float = math.inf


class SyncerState:
    """The syncer of Decoupled DiLoCo (`algo`) over `learners` learners (module docstring).

    `t_ref`: the reference step time; `reply_s(p, t)`: t_reply, the seconds the merged fragment
    p takes to reach the learners if sent at time t (None: 0, a free link)."""

    def __init__(self, algo: DecoupledDiLoCo, learners: int, t_ref: float,
                 reply_s: Callable[[int, float], float] | None = None):
        schedule = Schedule.of(algo)
        self.M, self.P, self.H = learners, schedule.fragments, schedule.inner_steps
        self.K, self.safety = algo.quorum, algo.grace_safety
        self.tau, self.t_ref = schedule.overlap, t_ref
        self.reply_s = reply_s or (lambda p, t: 0.0)
        self.up = [True] * learners
        self.version = [0] * self.P  # versions of each fragment published
        self.held = [[0] * self.P for _ in range(learners)]  # the version each learner holds
        self.step = [schedule.offset(p) for p in range(self.P)]  # reference step of p's ask
        self.syncs: list[_Sync | None] = [None] * self.P
        self.in_flight: set[int] = set()  # closed, not published yet
        self._ids = itertools.count()
        self._grid = [0.0]  # reference step k ends at _grid[k] (sums of t_ref)

    # ---- events ---------------------------------------------------------------------------------
    def start(self) -> list:
        return [AskAt(p, self._at_step(self.step[p])) for p in range(self.P)]

    def ask(self, p: int, t: float) -> list:
        if self.syncs[p] is not None or p in self.in_flight:
            raise RuntimeError(f"fragment {p}: asked while a version of it is in flight")
        s = self.syncs[p] = _Sync(next(self._ids), t, set(range(self.M)))
        return [Ask(p, s.id, tuple(m for m in range(self.M) if self.up[m]))]

    def sent(self, p: int, m: int, sync: int, tokens: float, steps: int, t: float) -> list:
        s = self._open(p, sync)
        if s is not None and m in s.unanswered:  # else: stale, or a second answer (ignored)
            s.unanswered.discard(m)
            s.sent[m] = token_weight(tokens, steps)
        return []

    def arrived(self, p: int, m: int, sync: int, t: float) -> list:
        s = self._open(p, sync)
        if s is None or m not in s.sent:
            return []  # closed without it, or m failed since it sent it
        s.arrived.add(m)
        actions = []
        if s.quorum_t is None and len(s.arrived) >= self.K:
            s.quorum_t = t
            # t_quorum = t, t_ask = s.asked_t
            slack = self.tau * self.t_ref - ((t - s.asked_t) + self.reply_s(p, t))
            s.deadline = t + (self.safety * slack if slack > 0 else 0.0)
            actions.append(SetDeadline(p, s.id, s.deadline))
        return actions + self._close_if_done(p, t)

    def deadline(self, p: int, sync: int, t: float) -> list:
        s = self._open(p, sync)
        if s is None or t < s.deadline:
            return []  # closed already, or a later deadline replaced this one
        return self._close_if_done(p, t, deadline=True)

    def published(self, p: int, t: float) -> list:
        self.in_flight.remove(p)
        self.version[p] += 1
        self.step[p] = self._next_step(p, t)
        return [AskAt(p, self._at_step(self.step[p]))]

    def applied(self, m: int, p: int, t: float) -> list:
        self.held[m][p] = self.version[p]
        return []

    def failed(self, m: int, t: float) -> list:
        self.up[m] = False
        actions = []
        for p, s in enumerate(self.syncs):
            if s is not None:  # weight 0: out of the merge and of the quorum
                s.sent.pop(m, None)
                s.arrived.discard(m)
                if s.quorum_t is not None and len(s.arrived) < self.K:
                    s.quorum_t, s.deadline = None, math.inf
                actions += self._close_if_done(p, t)  # it may have been the last one awaited
        return actions

    def back(self, m: int, t: float) -> list:
        self.up[m] = True
        self.held[m] = list(self.version)
        return [Ask(p, s.id, (m,)) for p, s in enumerate(self.syncs)
                if s is not None and m in s.unanswered]

    def end(self, t: float) -> list:
        actions = []
        for p in range(self.P):
            who = tuple(m for m in range(self.M)
                        if self.up[m] and self.held[m][p] == self.version[p])
            if p not in self.in_flight and who:
                actions.append(Flush(p, who))
        return actions

    # ---- questions ------------------------------------------------------------------------------
    def holds(self, p: int, m: int, sync: int) -> bool:
        """Whether p's open sync is `sync` and holds learner m's answer (sent, up)."""
        s = self._open(p, sync)
        return s is not None and m in s.sent

    def next_ask(self, p: int, t: float) -> float:
        """When fragment p would be asked next if its version in flight were published at t
        (what `published(p, t)` will say: the runtime announces it with the publish)."""
        return self._at_step(self._next_step(p, t))

    # ---- helpers --------------------------------------------------------------------------------
    def _open(self, p: int, sync: int) -> _Sync | None:
        s = self.syncs[p]
        return s if s is not None and s.id == sync else None

    def _close_if_done(self, p: int, t: float, deadline: bool = False) -> list:
        """Close p's sync if it has its quorum and either no up learner is still awaited or the
        grace window is over (`deadline`: the answers of that very instant are in)."""
        s = self.syncs[p]
        if s is None or s.quorum_t is None:
            return []
        awaited = [m for m in range(self.M) if self.up[m] and (
            m in s.unanswered or (m in s.sent and m not in s.arrived))]
        if awaited and not deadline:
            return []
        self.syncs[p] = None
        self.in_flight.add(p)
        return [Close(p, s.id, {m: s.sent[m] for m in sorted(s.arrived)},
                      tuple(sorted(set(s.sent) - s.arrived)), sum(self.up),
                      s.quorum_t - s.asked_t)]

    def _next_step(self, p: int, t: float) -> int:
        """The first of p's reference steps offset(p) + n·H after its current ask that ends
        after t."""
        nxt = self.step[p] + self.H
        while self._at_step(nxt) <= t:
            nxt += self.H
        return nxt

    def _at_step(self, k: int) -> float:
        while len(self._grid) <= k:
            self._grid.append(self._grid[-1] + self.t_ref)
        return self._grid[k]
