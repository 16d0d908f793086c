"""Rejoins in the actor runtime's syncer: tickets, the peers asked, what each returning learner
loads.

A returning learner's new process asks to rejoin (`rejoin`) and gets a ticket; a later failure
of the same learner voids it (`void`). It reloads Θ as published and a healthy peer's inner
optimizer state: the first other learner up is asked (an "upload" message, through the
`Mailbox`) and uploads it at its next step boundary (`peer_state`); with no peer up, it
reloads at once with a fresh one. If the peer fails first, another one is asked
(`waiting_on`, then `reload`). What it loads (Θ, the state, its messages: the open syncs it had
not answered, the asks to come, the publish notice of each merge in flight, its stop) is the
syncer's to say: `load(m, peer, inner_state, t)`, given to the constructor
(`SyncerRuntime`). The process takes it with its ticket (`take`). Nothing here imports Ray.
"""

from __future__ import annotations

from ..clock.learner_rules import FRESH, peer_of

__all__ = ["Rejoins"]


class Rejoins:
    """The rejoins of M learners (module docstring): `mail`, the syncer's `Mailbox`; `load`,
    what a returning learner loads."""

    def __init__(self, M: int, mail, load):
        self.mail, self.load = mail, load
        self.tickets = [0] * M
        self.peer_of: dict = {}  # returning learner -> the peer asked for its inner state
        self.rejoined: dict = {}  # returning learner -> what it loads

    def void(self, m: int) -> None:
        """Learner m's process died: a rejoin it was waiting for is void."""
        self.tickets[m] += 1
        self.peer_of.pop(m, None)
        self.rejoined.pop(m, None)

    def rejoin(self, m: int, now: float, up: list) -> int:
        """Learner m is back at `now` (`up`: the learners up): it reloads at the next step
        boundary of a healthy peer, or at once with no peer up. Returns its ticket."""
        self.tickets[m] += 1
        self.rejoined.pop(m, None)
        self.reload(m, now, up)
        return self.tickets[m]

    def reload(self, m: int, now: float, up: list) -> None:
        """Returning learner m reloads: from a peer's next step boundary, or at once (fresh)."""
        peer = peer_of(up, m)
        if peer == FRESH:  # no peer up: a fresh inner optimizer state (its own was lost)
            self.rejoined[m] = self.load(m, FRESH, None, now)
        else:
            self.peer_of[m] = peer
            self.mail.ask_upload(peer, m)

    def waiting_on(self, q: int) -> list[int]:
        """The returning learners that were waiting for peer q's state (q failed): no longer
        (ask another peer: `reload`)."""
        out = [r for r, peer in self.peer_of.items() if peer == q]
        for r in out:
            del self.peer_of[r]
        return out

    def peer_state(self, q: int, inner_state, t: float) -> None:
        """Peer q's inner optimizer state, uploaded at its step boundary t: the learners waiting
        for it load it."""
        for m in self.waiting_on(q):
            self.rejoined[m] = self.load(m, q, inner_state, t)

    def take(self, m: int, ticket: int, ended: bool) -> tuple[str, dict | None]:
        """("ready", what it loads) once learner m's rejoin `ticket` has it, ("wait", None)
        before, ("gone", None) when the ticket is void or the run has `ended`."""
        if ticket != self.tickets[m]:
            return "gone", None
        if m in self.rejoined:
            return "ready", self.rejoined.pop(m)
        if ended:
            self.peer_of.pop(m, None)
            return "gone", None
        return "wait", None
