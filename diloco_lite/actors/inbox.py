"""The numbered messages between the syncer and a learner's process, and how a lost one is
recovered.

The syncer numbers every message it sends a learner's process (`Roster.send`: 1, 2, … in the
order sent, its first messages, handed over when the process began, counting first) and sends
them fire-and-forget (`Learner.hear`). Ray delivers them, but not necessarily in order, and a
call can be lost (its process restarted, a dropped connection). So:

- `Inbox` (in the learner's process) takes them in order: one ahead of its turn waits in
  `early`, one already taken (a resent copy) is dropped;
- `Sent` (in the syncer's process) keeps every numbered message (and its reply bytes) sent to
  each learner's current process;
- a learner that waits for a message it knows is due (after `until` said how many were sent,
  a reply it must apply, or one sent before a message that came: a gap, which it fills at
  its next step boundary before it acts) and has taken nothing new for `RESEND_S` asks the
  syncer for what came after the last one it took (`Syncer.resend`); after `RESENDS` resends
  that brought nothing it stops with `MessageLost`, naming what was missing: a bounded wait,
  never a hang. (A lost message that is the last sent and never waited for stays unknown
  until the learner next asks `until`.)

Nothing here imports Ray or JAX.
"""

from __future__ import annotations

import queue
import time

RESEND_S = 2.0  # taken nothing new for this long while waiting: ask the syncer to resend
RESENDS = 30  # resends that bring nothing before `MessageLost` (≈ 60 s: a merge that late)


class MessageLost(RuntimeError):
    """A learner waited for a message it knew was due, and neither it nor a resend came."""


class Inbox:
    """Learner m's numbered messages, taken in order (module docstring). `life`: the process
    of the learner the messages are for (one for an earlier process is dropped)."""

    def __init__(self, m: int, resend_s: float = RESEND_S):
        self.m, self.life, self.taken, self.resend_s = m, 0, 0, resend_s
        self.queue: queue.Queue = queue.Queue()
        self.early: dict = {}  # number -> (message, reply): arrived ahead of its turn
        self.upload = False  # a peer's "upload" request (unnumbered) came

    def put(self, message, reply, life: int, number: int | None) -> None:
        """From any thread (Ray's): the `number`-th message to process `life` (None: an
        "upload")."""
        self.queue.put((message, reply, life, number))

    def begin(self, life: int, taken: int) -> None:
        """A run of process `life` begins, its first `taken` messages handed over already."""
        self.life, self.taken, self.early = life, taken, {}

    def take(self, deliver, block_s: float | None = 0.0) -> bool:
        """Pass on, in order, what has come (`deliver(message, reply)`); `block_s`: wait up to
        that long for a message first (None: as long as it takes). Whether one was taken."""
        before = self.taken
        try:
            item = self.queue.get(timeout=block_s) if block_s != 0.0 else \
                self.queue.get_nowait()
        except queue.Empty:
            return False
        while True:
            message, reply, life, number = item
            if life != self.life:
                pass  # for an earlier process of this learner
            elif number is None:
                self.upload = True
            elif number > self.taken:  # (≤ taken: a copy of one taken already)
                self.early[number] = (message, reply)
                while self.taken + 1 in self.early:
                    self.taken += 1
                    deliver(*self.early.pop(self.taken))
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return self.taken > before

    def wait(self, done, take, resend, what) -> None:
        """Take messages (`take(block_s)`) until `done()`. With nothing new taken for
        `resend_s` (`RESEND_S`), ask for what came after the last one taken (`resend(taken)`:
        [(number, message, reply)]); after `RESENDS` such resends, `MessageLost` (`what()`:
        what it waited for)."""
        tries, since, taken = 0, time.monotonic(), self.taken
        while not done():
            left = since + self.resend_s - time.monotonic()
            if left > 0:
                take(left)
                if self.taken != taken:
                    tries, since, taken = 0, time.monotonic(), self.taken
                continue
            if tries == RESENDS:
                raise MessageLost(f"learner {self.m}: waited for {what()}; nothing after its "
                                  f"message {self.taken} came in {RESENDS} resends "
                                  f"({RESENDS * self.resend_s:g} s)")
            tries, since = tries + 1, time.monotonic()
            for number, message, reply in resend(self.taken):
                self.put(message, reply, self.life, number)


class Sent:
    """The syncer's log of the numbered messages sent to each learner's current process
    (module docstring): what a resend sends again."""

    def __init__(self, M: int):
        self.log: list[tuple[int, list]] = [(0, []) for _ in range(M)]  # (life, [(n, msg, reply)])

    def add(self, m: int, life: int, number: int, message, reply) -> None:
        if self.log[m][0] != life:  # a new process: the earlier one's messages are void
            self.log[m] = (life, [])
        self.log[m][1].append((number, message, reply))

    def after(self, m: int, life: int, taken: int) -> list:
        """What process `life` of learner m was sent after its `taken`-th message; the ones up
        to it are forgotten (taken)."""
        have, entries = self.log[m]
        if have != life:
            return []
        keep = [e for e in entries if e[0] > taken]
        self.log[m] = (life, keep)
        return list(keep)
