"""Decoupled DiLoCo's learner-side rules, one copy for both clocks.

`SyncerState` (`syncer_state`) holds the syncer's decisions; `LearnerRules` holds the learners'
side of the protocol and books what happens on a `Recorder`. Two drivers run them: the
simulated clock (`clock.syncer.plan_decoupled`: an event queue, step times, FIFO links) and the
wall-clock runtime (`actors.syncer.SyncerRuntime`: real learners calling in at their step
boundaries). A driver tells `LearnerRules` what happened and when; `LearnerRules` updates the
learners' side, tells the `SyncerState`, and hands every action the syncer returns to the
driver's `on_action(action, t)` (the driver sets the timers, carries closes down its link or
queues their merges), after doing the learners' part of it (an `Ask` is noted, a `Close` stops
the learners answering that sync and drops the answers still on the wire).

The rules (docs/algorithms.md §4):

1. asked for fragment p, an up learner answers at its next step boundary with Δ = base − θ,
   every step since its base: `boundary` returns the answers it sends now. Not while its
   previous answer of p was merged and that merge's result is not applied yet (it would send
   merged steps again): it answers at its first boundary after applying;
2. every up learner applies the newest published fragment p once it has taken τ of its own
   steps since its first step boundary after the ask that came while the sync was open (else
   since its next one: a boundary between the close and the publish does not count); it never
   waits for it: `published` sets when, `apply` (at a step boundary) takes what is due;
3. a failed learner forgets what it was asked and was to apply, and loses its unsynced work
   (`failed`). Back (`back`), it loads every newest Θ_p and the inner optimizer state of a
   healthy peer, the first learner up (`peer`); with no learner up, a fresh inner optimizer
   state (`FRESH`: its own was lost with it);
4. the end-of-run flush (`flushes`) takes, of the learners the syncer names, those with a step
   since their base, each weighted by `token_weight` of its tokens since then.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .recorder import FRESH, Recorder
from .syncer_state import Ask, Close, SyncerState, token_weight

__all__ = ["FRESH", "LearnerRules"]


class LearnerRules:
    """The learners' side of `syncer` (a `SyncerState`), booked on `rec` (module docstring).

    `tau`: the overlap τ; `tokens_per_step`: one learner-step's tokens; `on_action(action, t)`:
    the driver's part of each action the syncer returns."""

    def __init__(self, syncer: SyncerState, rec: Recorder, *, tau: int, tokens_per_step: int,
                 on_action: Callable[[object, float], None]):
        M, P = syncer.M, syncer.P
        self.syncer, self.rec, self.M, self.P = syncer, rec, M, P
        self.tau, self.tokens, self.on_action = tau, tokens_per_step, on_action
        self.k = [0] * M  # each learner's own steps done: the data index of its next one
        self.asked = [{} for _ in range(M)]  # fragment -> sync asked of m, not answered yet
        self.ask_pos = [[None] * P for _ in range(M)]  # m's position at its first boundary
        # after the ask (while the sync was open)
        self.due = [{} for _ in range(M)]  # fragment -> the position from which m applies it

    @property
    def up(self) -> list[bool]:
        """Which learners are up (the syncer's own record: one truth)."""
        return self.syncer.up

    def act(self, actions: list, t: float) -> None:
        """The learners' part of the syncer's actions, then the driver's (`on_action`)."""
        for a in actions:
            if isinstance(a, Ask):
                for m in a.learners:
                    self.asked[m][a.p] = a.sync
            elif isinstance(a, Close):
                for m in range(self.M):
                    self.asked[m].pop(a.p, None)
                self.rec.closing(a.p, a.weights)  # its answers are in the merge from now on
                for m in a.dropped:
                    self.rec.drop(a.p, m)  # closed without it: its work stays unmerged in m
            self.on_action(a, t)

    # ---- the syncer's events, passed on ---------------------------------------------------------
    def start(self) -> None:
        self.act(self.syncer.start(), 0.0)

    def ask(self, p: int, t: float) -> None:
        self.act(self.syncer.ask(p, t), t)

    def arrived(self, p: int, m: int, sync: int, t: float) -> None:
        self.act(self.syncer.arrived(p, m, sync, t), t)

    def deadline(self, p: int, sync: int, t: float) -> None:
        self.act(self.syncer.deadline(p, sync, t), t)

    # ---- the learners ---------------------------------------------------------------------------
    def boundary(self, m: int, t: float) -> list[tuple[int, int]]:
        """Learner m finished its next step at t: booked; returns the answers it sends now,
        [(fragment, sync)] (rule 1; each told to the syncer and booked as sent)."""
        rec = self.rec
        rec.step(m, self.k[m], t)
        self.k[m] += 1
        answers = []
        for p in sorted(self.asked[m]):
            if self.ask_pos[m][p] is None:
                self.ask_pos[m][p] = rec.position(m)
            if rec.merged[m][p]:
                continue  # its last answer was merged and it has not applied the result
            sync, since = self.asked[m].pop(p), rec.since[m][p]  # >= 1: it has just stepped
            self.act(self.syncer.sent(p, m, sync, since * self.tokens, since, t), t)
            rec.send(p, [m], t)
            answers.append((p, sync))
        return answers

    def apply(self, m: int, t: float) -> list[int]:
        """At a step boundary of learner m: the fragments it applies now (rule 2), booked."""
        now = [p for p, pos in self.due[m].items() if self.rec.position(m) >= pos]
        for p in now:
            self.rec.arrive(p, [m], t)
            self.act(self.syncer.applied(m, p, t), t)
            del self.due[m][p]
        return now

    def published(self, p: int, weights: dict, t: float, *, receivers: int,
                  wait_s: float) -> list[int]:
        """Fragment p's merge (`weights`, from a `Close`) reached the learners at t: booked;
        each up learner is to apply it (rule 2). Returns those learners."""
        self.rec.close(p, weights, t, receivers=receivers, wait_s=wait_s)
        got = []
        for m in range(self.M):
            if self.up[m]:
                pos = self.ask_pos[m][p]
                pos = pos if pos is not None else self.rec.position(m) + 1
                self.due[m][p] = min(self.due[m].get(p, math.inf), pos + self.tau)
                got.append(m)
            self.ask_pos[m][p] = None
        self.act(self.syncer.published(p, t), t)
        return got

    def failed(self, m: int, t: float) -> None:
        """Learner m went down at t (rule 3): out of the merges and of the quorum."""
        self.asked[m], self.due[m], self.ask_pos[m] = {}, {}, [None] * self.P
        self.rec.fail(m)
        self.act(self.syncer.failed(m, t), t)

    def peer(self, m: int) -> int:
        """Whose inner optimizer state learner m loads when it comes back now: the first other
        learner up, or `FRESH` (none up: a fresh state)."""
        return next((q for q in range(self.M) if self.up[q] and q != m), FRESH)

    def back(self, m: int, peer: int, t: float) -> None:
        """Learner m is back at t, holding every newest Θ_p and `peer`'s inner optimizer state
        (`FRESH`: a fresh one); the open syncs it had not answered ask it again."""
        self.rec.reload(m, peer, t)
        self.act(self.syncer.back(m, t), t)

    # ---- the end --------------------------------------------------------------------------------
    def flushes(self, t: float) -> list[tuple[int, dict]]:
        """At the end (every merge published): [(fragment, {learner: weight})] to flush (rule
        4); book each with `flushed` once merged."""
        out = []
        for f in self.syncer.end(t):
            since = {m: self.rec.since[m][f.p] for m in f.learners}
            who = {m: token_weight(n * self.tokens, n) for m, n in since.items() if n >= 1}
            if who:
                out.append((f.p, who))
        return out

    def flushed(self, p: int, weights: dict, t: float) -> None:
        """The flush of fragment p from `weights`' learners is done: booked (bytes up, the
        plain weighted mean)."""
        self.rec.send(p, list(weights), t, flush=True)
        self.rec.close(p, weights, t, flush=True)
