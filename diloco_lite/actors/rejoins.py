"""Failures and rejoins in the actor runtime's syncer.

A learner's process dies (`failed`, when the driver hears of it): its unsynced work and its
answers on the wire are lost, the syncer's state takes it out of the merges and the quorum,
and what it did after its last report is booked from its rules and step times
(`Roster.failed`); the driver's kill (`killed`) is logged. A returning learner's `rejoin` gives
a ticket (a later failure of the same learner voids it: `take_rejoin`); it reloads Θ as
published and a healthy peer's inner optimizer state, uploaded at the peer's next step
boundary (an "upload" message; `peer_state`), or a fresh one with no peer up (`_back`). With
it come its messages: the open syncs it had not answered, the asks to come, the publish notice
of each merge in flight (its reply follows once merged) and its stop. Part of
`actors.syncer.SyncerRuntime` (a mixin: its state lives there). Nothing here imports Ray.
"""

from __future__ import annotations

from ..clock.learner_rules import FRESH, peer_of
from ..clock.syncer import ASK, FAIL, PUBLISH, REJOIN

__all__ = ["Rejoins"]


class Rejoins:
    """`SyncerRuntime`'s failures and rejoins (module docstring)."""

    def failed(self, m: int, now: float) -> None:
        """Learner m's process died: its unsynced work and its answers on the wire are lost; a
        rejoin it was waiting for is void. (Already down: only that.)"""
        self.tickets[m] += 1
        self.peer_of.pop(m, None)
        self.rejoined.pop(m, None)
        self.roster.final.pop(m, None)
        if not self.up[m]:
            return
        self.advance(now - self.hold, before=FAIL)
        t = self._now(now)
        began = self.roster.starts[m][2]
        self.books.learner(m, self.roster.failed(m, t, self.clock,
                                                 self.books.reported(m, after=began)))
        self.books.syncer(t, FAIL, "fail", m)
        self.kind = FAIL
        self._act(self.state.failed(m, t), t)
        self._check_end()
        for r, q in list(self.peer_of.items()):
            if q == m:  # it was to send its state to a returning learner: ask another one
                del self.peer_of[r]
                self._reload(r, now)

    def killed(self, m: int, now: float, for_good: bool = False) -> None:
        """The driver killed learner m's process (a failure window began; `for_good`: it never
        comes back): logged; it takes no more steps."""
        self.books.syncer(now, FAIL, "kill", m)
        self.roster.killed(m, now, self.clock, for_good)

    def rejoin(self, m: int, now: float) -> int:
        """Learner m is back: it reloads at the next step boundary of a healthy peer, which
        uploads its inner optimizer state (`peer_state`); with no peer up, at once, with a fresh
        one. Returns its ticket for `take_rejoin`."""
        self.tickets[m] += 1
        self.rejoined.pop(m, None)
        self._reload(m, now)
        return self.tickets[m]

    def take_rejoin(self, m: int, ticket: int) -> tuple[str, dict | None]:
        """("ready", what it loads) once learner m's rejoin `ticket` has it, ("wait", None)
        before, ("gone", None) when the ticket is void or the run has ended."""
        if ticket != self.tickets[m]:
            return "gone", None
        if m in self.rejoined:
            return "ready", self.rejoined.pop(m)
        if self.end is not None:
            self.peer_of.pop(m, None)
            return "gone", None
        return "wait", None

    def peer_state(self, q: int, inner_state, t: float) -> None:
        """Peer q's inner optimizer state, uploaded at its step boundary t."""
        for m in [r for r, peer in self.peer_of.items() if peer == q]:
            del self.peer_of[m]
            self._back(m, q, inner_state, t)

    # ---- helpers --------------------------------------------------------------------------------
    def _reload(self, m: int, now: float) -> None:
        """Returning learner m reloads: from a peer's next step boundary, or at once (fresh)."""
        peer = peer_of(self.up, m)
        if peer == FRESH:  # no peer up: a fresh inner optimizer state (its own was lost)
            self._back(m, FRESH, None, now)
        else:
            self.peer_of[m] = peer
            self.outbox.append((peer, ("upload", m), None, self.roster.life[peer], None))

    def _back(self, m: int, peer: int, inner_state, t: float) -> None:
        t = self._now(t)
        self.books.syncer(t, REJOIN, "reload", m, peer)
        asks = self._act(self.state.back(m, t), t)  # the open syncs it had not answered
        asks += [("ask", when, p, self.asked_n[p]) for when, kind, _, p, _ in self.timers
                 if kind == ASK]  # the asks to come (those after a merge in flight: with it)
        flying = [job for _, kind, _, _, job in sorted(self.timers) if kind == PUBLISH]
        held = [max(i for i, (at, _) in enumerate(v) if at <= t) for v in self.versions]
        fragments = [self.versions[p][i][1] for p, i in enumerate(held)]
        k = self.roster.last[m][0]
        messages = self.roster.started(m, asks + [self._notice(m, job) for job in flying], k,
                                       held, t, now=self.clock)
        for job in flying:  # a merge in flight: its notice now (above), its reply once merged
            job.told[m] = self.roster.life[m]
            if job.reply is not None:
                self.roster.send(m, ("reply", job.p, job.n), job.reply)
        self.rejoined[m] = dict(leaves=self._leaves(fragments), inner=inner_state, k=k, t=t,
                                messages=messages, versions=held, life=self.roster.life[m])
