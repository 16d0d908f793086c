"""Decoupled DiLoCo's learner-side rules on the simulated clock, booked on a `Recorder`.

`SyncerState` (`syncer_state`) holds the syncer's decisions and `LearnerSide` (`learner_side`)
one learner's: when it answers and applies (one copy for both clocks: on the actor runtime
each learner's process runs its own). `LearnerRules` holds the M learners' sides for the
simulated clock (`clock.syncer.plan_decoupled`), tells each one what it hears, tells the
`SyncerState` what the learners do, books all of it on the `Recorder`, and hands every action
the syncer returns to the driver's `on_action(action, t)` (the driver sets the timers and
carries closes down its links), after doing the learners' part of it (an `Ask` reaches the
learners it names; a `Close` puts its answers in the merge and leaves out those still on the
wire). Each event is booked by `clock.booking`, the one booking order, which the actor runtime
follows too when it books the same events from what its learners report (`actors.booking`).

Besides the learners' rules (`learner_side`): a learner hears of a close with its publish, so
an answer it sends in between is booked as sent and left out at once (`boundary`); a failed
learner loses its unsynced work (`failed`); back (`back`), it loads every newest Θ_p and the
inner optimizer state of a healthy peer, the first learner up (`peer`), or with no learner up a
fresh one (`FRESH`: its own was lost with it); the end-of-run flush (`flushes`) takes, of the
learners the syncer names, those with a step since their base, each weighted by
`token_weight` of its tokens since then.
"""

from __future__ import annotations

from collections.abc import Callable

from . import booking
from .learner_side import LearnerSide
from .recorder import FRESH, Recorder
from .syncer_state import Ask, Close, SyncerState, token_weight

__all__ = ["FRESH", "LearnerRules", "flush_weights", "peer_of"]


class LearnerRules:
    """The learners' side of `syncer` (a `SyncerState`), booked on `rec` (module docstring).

    `tau`: the overlap τ; `tokens_per_step`: one learner-step's tokens; `on_action(action, t)`:
    the driver's part of each action the syncer returns."""

    def __init__(self, syncer: SyncerState, rec: Recorder, *, tau: int, tokens_per_step: int,
                 on_action: Callable[[object, float], None]):
        M, P = syncer.M, syncer.P
        self.syncer, self.rec, self.M, self.P = syncer, rec, M, P
        self.tokens, self.on_action = tokens_per_step, on_action
        self.sides = [LearnerSide(P, tau) for _ in range(M)]

    @property
    def up(self) -> list[bool]:
        """Which learners are up (the syncer's own record: one truth)."""
        return self.syncer.up

    @property
    def k(self) -> list[int]:
        """Each learner's steps done: the data index of its next step."""
        return [side.k for side in self.sides]

    def act(self, actions: list, t: float) -> None:
        """The learners' part of the syncer's actions, then the driver's (`on_action`)."""
        for a in actions:
            if isinstance(a, Ask):
                for m in a.learners:
                    self.sides[m].ask(a.p, a.sync)
            elif isinstance(a, Close):  # its answers in the merge, those on the wire out
                booking.close(self.rec, a.p, a.weights, a.dropped)
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
        [(fragment, sync)] (each told to the syncer and booked as sent; one sent after its
        sync closed is left out at once: its work stays unmerged)."""
        k, answers, booked = self.sides[m].k, [], []
        for p, sync, since in self.sides[m].boundary():
            self.act(self.syncer.sent(p, m, sync, since * self.tokens, since, t), t)
            booked.append((p, not self.syncer.holds(p, m, sync)))  # too late: closed before
            answers.append((p, sync))
        booking.step(self.rec, m, k, t, booked)
        return answers

    def apply(self, m: int, t: float) -> list[int]:
        """At a step boundary of learner m: the fragments it applies now (rule 2), booked."""
        now = self.sides[m].apply()
        booking.apply(self.rec, m, now, t)
        for p in now:
            self.act(self.syncer.applied(m, p, t), t)
        return now

    def published(self, p: int, weights: dict, t: float, *, receivers, wait_s: float) -> list[int]:
        """Fragment p's merge (`weights`, from a `Close`) reached `receivers` (the learners up
        at the close) at t: booked; each learner up is to apply it (rule 2). Returns those
        learners."""
        booking.publish(self.rec, p, weights, t, receivers=receivers, wait_s=wait_s)
        got = [m for m in range(self.M) if self.up[m]]
        for m in got:
            self.sides[m].published(p, m in weights)
        self.act(self.syncer.published(p, t), t)
        return got

    def failed(self, m: int, t: float) -> None:
        """Learner m went down at t: out of the merges and of the quorum."""
        self.sides[m].failed()
        booking.fail(self.rec, m)
        self.act(self.syncer.failed(m, t), t)

    def peer(self, m: int) -> int:
        """Whose inner optimizer state learner m loads when it comes back now (`peer_of`)."""
        return peer_of(self.up, m)

    def back(self, m: int, peer: int, t: float) -> None:
        """Learner m is back at t, holding every newest Θ_p and `peer`'s inner optimizer state
        (`FRESH`: a fresh one); the open syncs it had not answered ask it again."""
        self.sides[m].back()
        booking.reload(self.rec, m, peer, t)
        self.act(self.syncer.back(m, t), t)

    # ---- the end --------------------------------------------------------------------------------
    def flushes(self, t: float) -> list[tuple[int, dict]]:
        """At the end (every merge published): [(fragment, {learner: weight})] to flush (rule
        4); book each with `flushed` once merged."""
        return flush_weights(self.syncer.end(t), self.rec.since, self.tokens)

    def flushed(self, p: int, weights: dict, t: float) -> None:
        """The flush of fragment p from `weights`' learners is done: booked (`booking.flush`)."""
        booking.flush(self.rec, p, weights, t)


def peer_of(up: list, m: int) -> int:
    """Whose inner optimizer state learner m loads when it comes back: the first other learner
    up, or `FRESH` (none up: a fresh state)."""
    return next((q for q, u in enumerate(up) if u and q != m), FRESH)


def flush_weights(flushes: list, since: list, tokens_per_step: int) -> list[tuple[int, dict]]:
    """[(fragment, {learner: weight})] of the syncer's `Flush` actions: of the learners each
    names, those with a step since their base (`since[m][p]`), weighted by `token_weight`."""
    out = []
    for f in flushes:
        steps = {m: since[m][f.p] for m in f.learners}
        who = {m: token_weight(n * tokens_per_step, n) for m, n in steps.items() if n >= 1}
        if who:
            out.append((f.p, who))
    return out
