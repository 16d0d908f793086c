"""The syncer's process (the `Syncer` Ray actor, made by `ray_actors.actor_classes`).

`SyncerRuntime` under one lock, called from Ray's threads, with a thread of its own for the
timers and the merges (computed off the lock). Nothing here polls: every state change
notifies one condition over that lock (`_changed`), and each wait is on it:

- the timer thread sleeps until its earliest timer is due (`hold_s` after its time), or until
  a learner's `until` needs the events up to its boundary handled, or until notified (an
  answer, a report, a failure, a rejoin); a timer that is due but waits on something else (a
  merge, the learners' reports) is taken up when that comes, which notifies;
- `until`, `rejoin`, `flushes` wait on the condition, each for at most `WAIT_S` (then
  `SyncerTimeout`, naming what it waited for);
- the driver long-polls `changed(seen, timeout)`: the status, once it differs from version
  `seen`.

A waiter's re-check never notifies (only a change does), so two waiters cannot wake each
other in turn.

It sends its messages (`outbox`) as they come, fire-and-forget, and keeps each numbered one
(`inbox.Sent`) for a learner that asks for it again (`resend`). It measures its own process's
CPU time (`time.process_time`) while the learners step, and while idle (`idle`).
Importing this module imports no Ray.
"""

from __future__ import annotations

import collections
import heapq
import threading
import time

from .inbox import Sent

IDLE_S = 1.0  # the longest the timer thread sleeps with nothing due (it is woken on a change)
WAIT_S = 60.0  # the longest a call waits on the syncer's state (`until`, `rejoin`, `flushes`)


def setup_process(cache_dir):
    """An actor's process: one CPU device, the run's compilation cache."""
    from ..devices import emulate_devices, enable_compilation_cache

    emulate_devices(1)
    enable_compilation_cache(cache_dir)


def unbooked_bytes(args: tuple, *booked) -> int:
    """What a call's arguments pickle to, less the arrays among them that the run books (an
    answer's or a reply's wire-format bytes, a peer's inner state): the bytes it carries beyond
    its booked ones (message tuples, reports, arrays' headers)."""
    import pickle

    import numpy as np

    size = len(pickle.dumps(args, protocol=5))
    return size - sum(np.asarray(b).nbytes for b in booked if b is not None)


class SyncerTimeout(RuntimeError):
    """A call waited `WAIT_S` on the syncer's state, and it never came."""


class SyncerActor:
    """The syncer's process (module docstring): `config`, the initial `params` (None: from the
    seed), `hold_s`; `drop` (tests only): (m, k) drops the k-th numbered message to learner m
    (it stays in the log, for a resend)."""

    def __init__(self, config, params, hold_s, cache_dir, drop=None):
        from .syncer import SyncerRuntime

        setup_process(cache_dir)
        self.rt = SyncerRuntime(config, params, hold_s)
        self.cv = threading.Condition()  # over the one lock: every state change notifies it
        self.version = 0  # bumped at each change (`changed`)
        self.t0, self.error, self.learners = None, None, []
        self.wakes: list[float] = []  # step boundaries a learner's `until` waits on (a heap)
        self.sent, self.drop, self.numbered = Sent(config.workers), drop, collections.Counter()
        self.resent = collections.Counter()  # learner -> messages sent again (`resend`)
        self.down_until: dict = {}  # learner -> no rejoin before this time (`window`)
        # (learner, "up" | "down"): Ray calls each way, and the bytes their arguments
        # carry beyond the booked ones (`unbooked_bytes`)
        self.calls, self.unbooked = collections.Counter(), collections.Counter()
        # (learner, "up"/"down") -> bytes of peers' inner states it sent / fetched host to host
        # (counted when fetched: one a returning learner never took crossed no link)
        self.direct = collections.Counter()
        self.refetched = collections.Counter()  # learner -> its peer died before it fetched
        self.cpu: dict = {}
        self.firsts: list = []  # (learner, its process, running since, its first step)

    # ---- the run ------------------------------------------------------------------------------
    def start(self, t0, learners):
        self.t0, self.learners = t0, list(learners)
        with self.cv:
            first = self.rt.start()
            self.cpu = dict(start=time.process_time(), at=time.time())
        threading.Thread(target=self._loop, daemon=True).start()
        return first

    def replace(self, m, learner):
        """Learner m's slot is served by another process from now on (a spare promoted)."""
        with self.cv:
            self.learners[m] = learner

    def answered(self, m, life, p, n, payload, since, sent_at, report):
        now = self._now()  # when it arrived, not when the lock was free
        extra = unbooked_bytes((m, life, p, n, payload, since, sent_at, report), payload)
        with self.cv:
            self._count(m, "up", extra)
            self.rt.answered(m, life, p, n, payload, since, sent_at, report, now)
            self._deliver()

    def reported(self, m, life, report, final=None):
        with self.cv:
            self._count(m, "up", unbooked_bytes((m, life, report, final)))
            self.rt.reported(m, life, report, final)
            self._changed()

    def failed(self, m):
        with self.cv:
            self.rt.failed(m, self._now())
            self._deliver()

    def killed(self, m, for_good=False):
        with self.cv:
            self.rt.killed(m, self._now(), for_good)
            self._deliver()

    def window(self, m, end_s, for_good=False):
        """A failure window of learner m begins now. If m is up: "kill" (the driver kills its
        process and puts a spare in its place). If it is still down (its replacement not back
        yet: still starting, or waiting out an earlier window; a process cannot be killed
        before it runs): the kill is logged, m stays down until `end_s` (its replacement
        rejoins no earlier: `rejoin`), "extended"."""
        with self.cv:
            if self.rt.up[m] or for_good:
                return "kill"
            self.down_until[m] = max(self.down_until.get(m, 0.0), end_s)
            self.rt.killed(m, self._now(), False)
            self._deliver()
            return "extended"

    def rejoin(self, m):
        """What returning learner m loads (None: the run ended, or it failed again), once its
        window is over (`window`) and its peer has uploaded its state."""
        with self.cv:
            while (left := self.down_until.get(m, 0.0) - self._now()) > 0:
                self.cv.wait(left)  # (a timed wait on the condition: woken early, it waits on)
            ticket = self.rt.rejoin(m, self._now())
            self._deliver()

            def ready():
                state, got = self.rt.take_rejoin(m, ticket)
                self._send()  # (a waiter's check notifies no one: no ping-pong)
                return None if state == "wait" else (got,)

            got = self._wait(ready, f"learner {m}'s rejoin (its peer's state)")[0]
            if got is not None and got["inner"] is not None:  # a peer's, to fetch from its host
                q, nbytes, t = got["inner"]
                got["inner"] = (q, self.learners[q], t)
                self.direct[m, "down"] += nbytes
                self.direct[q, "up"] += nbytes
            return got

    def refetch(self, m, tried):
        """Returning learner m's peer died before m fetched its state: (another learner up,
        not among the learners `tried`, its handle, None: its state as of its last step), or
        None (none left: a fresh one). Counted."""
        with self.cv:
            self._count(m, "up", 0)
            self.refetched[m] += 1
            up = [q for q in range(len(self.learners))
                  if q != m and q not in tried and self.rt.up[q]]
            return (up[0], self.learners[up[0]], None) if up else None

    def until(self, m, life, t):
        """How many messages learner m's process has been sent, once every event up to its
        step boundary at t is handled (`SyncerRuntime.until`)."""
        with self.cv:
            self._count(m, "up", unbooked_bytes((m, life, t)))
            sent = self.rt.until(m, life, t)
            if sent is not None:
                return sent
            heapq.heappush(self.wakes, t)  # the timer thread handles up to t at t + hold_s
            self._changed()
            return self._wait(lambda: self.rt.until(m, life, t),
                              f"the events up to learner {m}'s step boundary at {t:.3f} s")

    def resend(self, m, life, after):
        """Learner m's process `life` took messages up to number `after` and waits: what it was
        sent after that (`inbox.Sent`)."""
        with self.cv:
            self._count(m, "up", 0)
            again = self.sent.after(m, life, after)
            self.resent[m] += len(again)
            return again

    def first_step(self, m, life, ready, t):
        """Learner m's process `life`, running since `ready`, finished its first step at t (a
        rejoined one: how long after its window's end it was training again)."""
        with self.cv:
            self.firsts.append((m, life, ready, t))

    def peer_state(self, q, nbytes, t):
        """Peer q holds its inner optimizer state as of its step boundary t (`nbytes`); the
        returning learner fetches it from q's process (`rejoin`), so its bytes cross q's link
        and the learner's, not the syncer's (`direct`)."""
        with self.cv:
            self._count(q, "up", unbooked_bytes((q, nbytes, t)))
            self.rt.peer_state(q, (q, nbytes, t), t)
            self._deliver()

    # ---- the driver's view ----------------------------------------------------------------------
    def status(self):
        with self.cv:
            return self._status()

    def changed(self, seen, timeout):
        """(version, status) once the state differs from version `seen`, or after `timeout`
        seconds (the driver's long poll)."""
        with self.cv:
            self.cv.wait_for(lambda: self.version != seen or self.error, timeout)
            return self.version, self._status()

    def clock(self):
        """This process's clock (`time.time()`): a learner measures its offset against it."""
        return time.time()

    def flushes(self):
        with self.cv:
            if "run_s" not in self.cpu and "start" in self.cpu:  # the learners have stopped
                self.cpu.update(run_s=time.time() - self.cpu["at"],
                                run_cpu_s=time.process_time() - self.cpu["start"])
            return self._wait(lambda: None if self.rt.busy else self.rt.flushes(),
                              "the merges before the flush")

    def flush(self, job):
        with self.cv:
            self.rt.flush(job)
            self._changed()

    def idle(self, seconds):
        """This process's CPU seconds over `seconds` of wall clock with nothing to do (after
        the run: its timer thread still waits)."""
        before = time.process_time()
        time.sleep(seconds)  # one wait, not a loop: the CPU spent meanwhile is what it costs
        with self.cv:
            self.cpu.update(idle_s=seconds, idle_cpu_s=time.process_time() - before)
            return self._cpu()

    def result(self):
        with self.cv:
            return {**self.rt.result(), "calls": dict(self.calls), "unbooked": dict(self.unbooked),
                    "direct": dict(self.direct), "refetched": dict(self.refetched),
                    "resent": dict(self.resent), "cpu": self._cpu(), "firsts": list(self.firsts)}

    def _cpu(self):
        return {k: v for k, v in self.cpu.items() if k not in ("start", "at")}

    # ---- helpers --------------------------------------------------------------------------------
    def _loop(self):  # the timers and the merges
        try:
            while True:
                with self.cv:
                    to = self._now() - self.rt.hold
                    self.rt.advance(to)
                    job = self.rt.next_merge()
                    self._deliver()
                    if job is None:
                        self.cv.wait(self._sleep_s(to))
                        continue
                result = self.rt.merge(job)
                with self.cv:
                    self.rt.merged(job, result)
                    self._deliver()
        except Exception as e:  # noqa: BLE001 - reported by status(), and to every waiter
            with self.cv:
                self.error = repr(e)
                self._changed()

    def _sleep_s(self, to):
        """How long the timer thread may sleep, having handled the events before `to`: until
        its earliest timer, or a waiting `until`'s boundary, is `hold_s` old (a timer before
        `to` still there waits on a merge or the learners: their news wakes it)."""
        while self.wakes and self.wakes[0] <= to:
            heapq.heappop(self.wakes)
        due = [t for t in (self.rt.timers[0][0] if self.rt.timers else None,
                           self.wakes[0] if self.wakes else None) if t is not None and t >= to]
        if not due:
            return IDLE_S
        return min(IDLE_S, max(0.0, min(due) + self.rt.hold - self._now()))

    def _wait(self, ready, what):
        """`ready()` (under the lock) once it is not None, waiting on the condition; at most
        `WAIT_S`, then `SyncerTimeout`."""
        deadline = time.monotonic() + WAIT_S
        while True:
            if self.error:
                raise RuntimeError(f"the syncer failed: {self.error}")
            out = ready()
            if out is not None:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise SyncerTimeout(f"waited {WAIT_S:g} s for {what} (syncer: {self._status()})")
            self.cv.wait(left)

    def _deliver(self):
        """After a change: send what the syncer has to say, and notify every waiter."""
        self._send()
        self._changed()

    def _send(self):
        """Send what the syncer has to say (under the lock: in order)."""
        for m, message, reply, life, number in self.rt.outbox:
            if number is not None:
                self.sent.add(m, life, number, message, reply)
                self.numbered[m] += 1
                if self.drop == (m, self.numbered[m]):
                    continue  # (tests: lost on the way; a resend brings it)
            self.learners[m].hear.remote(message, reply, life, number)
            self._count(m, "down", unbooked_bytes((message, reply, life, number), reply))
        self.rt.outbox.clear()

    def _changed(self):
        self.version += 1
        self.cv.notify_all()

    def _count(self, m, way, unbooked):
        self.calls[m, way] += 1
        self.unbooked[m, way] += unbooked

    def _now(self):
        return time.time() - self.t0 if self.t0 is not None else 0.0

    def _status(self):
        return {**self.rt.status(), "error": self.error, "now": self._now(),
                "version": self.version}
