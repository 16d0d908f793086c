"""The syncer's messages to its learners' processes: numbered, kept, and handed to the actor.

Each learner runs as a process that can die and be replaced; `life[m]` says which process of
learner m is the current one (a message or a report of an earlier one is void). Every message
the syncer sends a process is numbered in the order sent (its first messages, given when it
began, come first), so the process can tell it has them all (`SyncerRuntime.until` says how
many there are), and kept (`heard`): a learner killed after its last report is booked from its
rules replayed on them (`Roster.lost_report`). One message is not numbered: an "upload" asks a
healthy peer for its inner optimizer state (a rejoin's), and is not one of its rules' messages.

`Mailbox` is the only writer of `outbox`, the list of (learner, message, reply bytes or None,
its process: life, its number: None for an "upload") that the Ray actor sends, in order, and
clears. Nothing here imports Ray or JAX.
"""

from __future__ import annotations

__all__ = ["Mailbox"]


class Mailbox:
    """The messages to M learners' processes (module docstring); `outbox`: the list they are
    put on for delivery (a new one by default)."""

    def __init__(self, M: int, outbox: list | None = None):
        self.outbox: list = outbox if outbox is not None else []
        self.life = [0] * M  # which process of each learner is the current one
        self.heard: list = [[] for _ in range(M)]  # the messages sent to each current process

    def begin(self, m: int, messages: list) -> list:
        """Learner m's current process begins with `messages` (returned to go with its start or
        its rejoin); the messages sent to it later are numbered from there on."""
        self.heard[m] = list(messages)
        return list(messages)

    def send(self, m: int, message: tuple, reply=None) -> None:
        """A message to learner m's current process (with the reply's bytes, if any)."""
        self.heard[m].append(message)
        self.outbox.append((m, message, reply, self.life[m], len(self.heard[m])))

    def send_to(self, m: int, life: int, message: tuple, reply=None) -> bool:
        """`send`, if process `life` of learner m is still the current one (a merge's reply
        goes to each process told of it); returns whether it was sent."""
        if life != self.life[m]:
            return False
        self.send(m, message, reply)
        return True

    def ask_upload(self, peer: int, m: int) -> None:
        """Ask learner `peer`'s current process to upload its inner optimizer state (for
        returning learner m) at its next step boundary: an unnumbered message."""
        self.outbox.append((peer, ("upload", m), None, self.life[peer], None))

    def replace(self, m: int) -> None:
        """Learner m's process died: the next one is current (nothing of the dead one's counts)."""
        self.life[m] += 1

    def sent(self, m: int) -> int:
        """How many messages learner m's current process has been sent."""
        return len(self.heard[m])
