"""The actor runtime's two Ray actors (`actors.runtime` starts and watches them).

- `Learner`: one learner's process. It runs `LearnerProgram` at the `Cluster`'s step times and
  its own rules (`actors.agent`) on what the syncer has told it, taking the syncer's messages in
  the order sent (each is numbered). It calls the syncer at a step boundary only where a
  message not heard yet could change what it does there (`LearnerAgent.unsure`): `until` says,
  once the syncer has handled every event up to the boundary's time, how many messages it has
  been sent, and it waits for them. An answer is sent without waiting (the wire format's
  bytes, with the learner's report); a publish notice (`hear`, from the syncer, sent at the
  close) says when the next version of a fragment counts from, and its reply brings the
  bytes, taken when its rules say (waiting for them only if the merge is late); an "upload"
  asks for its inner optimizer state at its next step boundary (for a returning peer). At its
  stop position it waits until the syncer has every answer it sent, reports, and waits for a
  new stop (a learner went down) or the end. A new process after a kill waits out the
  window, then rejoins (`Syncer.rejoin`).
- `Syncer`: `SyncerRuntime` under a lock, called from Ray's threads, with a thread of its own
  for the timers and the merges (computed off the lock); it sends its messages (`outbox`) as
  they come. `flushes` and `result` wait until no merge is queued or being computed.

Importing this module imports no Ray: `actor_classes()` does.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
import time

WAIT_S = 60.0  # the longest a learner waits for a reply that is due (then it fails, loudly)


def import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("the actor runtime needs Ray: pip install 'diloco_lite[cluster]' "
                          "(or pip install ray)") from None
    return ray


def unbooked_bytes(args: tuple, *booked) -> int:
    """What a call's arguments pickle to, less the arrays among them that the run books (an
    answer's or a reply's wire-format bytes, a peer's inner state): the bytes it carries beyond
    its booked ones (message tuples, reports, arrays' headers)."""
    import pickle

    import numpy as np

    size = len(pickle.dumps(args, protocol=5))
    return size - sum(np.asarray(b).nbytes for b in booked if b is not None)


@functools.cache
def actor_classes():
    """The `Learner` and `Syncer` actor classes (module docstring), made once Ray is imported."""
    ray = import_ray()

    def _process(cache_dir):
        from ..devices import emulate_devices, enable_compilation_cache

        emulate_devices(1)
        enable_compilation_cache(cache_dir)

    @ray.remote(max_concurrency=4)
    class Learner:
        def __init__(self, config, m, params, cache_dir):
            _process(cache_dir)
            from ..clock import Timeline
            from ..clock.schedule import Schedule
            from .learner import LearnerProgram

            self.m, self.timeline = m, Timeline(config.cluster, config.workers)
            self.schedule = Schedule.of(config.algorithm)
            self.program = LearnerProgram(config, m, params)
            self.program.warm_up()
            self.mail, self.replies, self.upload, self.life = queue.Queue(), {}, False, 0
            self.early, self.taken = {}, 0  # messages ahead of their turn; how many taken

        def ready(self, syncer=None):
            """Built; taking in the syncer's handle loads the Syncer class from Ray's GCS (some
            30 kB through this host's link) here, before the clock, not in `run`."""
            return True

        def hear(self, message, reply=None, life=0, number=None):
            """A message of the syncer (and a reply's bytes) for process `life` of this learner
            (one for an earlier process, queued while Ray restarted the actor, is dropped), the
            `number`-th sent to it (None: an "upload")."""
            self.mail.put((message, reply, life, number))

        def run(self, syncer, t0, messages=None, back_at=None):
            from .agent import LearnerAgent

            prog, m, P, tau = self.program, self.m, self.schedule.fragments, \
                self.schedule.overlap
            period = self.schedule.inner_steps * self.timeline.t_ref
            if back_at is not None:  # a new process after a failure: wait out the window
                time.sleep(max(0.0, t0 + back_at - time.time()))
                got = ray.get(syncer.rejoin.remote(m))
                if got is None:
                    return "ended"
                prog.reload(got["leaves"], got["inner"], got["versions"])
                agent = LearnerAgent(m, P, tau, k=got["k"], versions=got["versions"],
                                     period_s=period)
                messages, T, life = got["messages"], got["t"], got["life"]
                self.life = life
            else:
                prog.begin()
                agent, T, life = LearnerAgent(m, P, tau, period_s=period), 0.0, 0
            for message in messages:
                agent.hear(message)
            self.early, self.taken = {}, len(messages)
            sent = []
            while True:
                self._take(agent)
                if agent.stopped:
                    ray.get(sent)  # every answer it sent has reached the syncer
                    sent = []
                    ray.get(syncer.reported.remote(m, life, agent.take_report(),
                                                   (agent.k, agent.held)))
                    while agent.stopped:  # a new stop, or the end
                        self._take(agent, block=True)
                    continue
                loss = prog.step(agent.k)
                T = max(T + self.timeline.duration(m, agent.k), time.time() - t0)
                time.sleep(max(0.0, t0 + T - time.time()))
                self._take(agent)
                if agent.unsure(T):  # everything up to T first: the syncer's word, its messages
                    sent_to_it = ray.get(syncer.until.remote(m, life, T))
                    while self.taken < sent_to_it:
                        self._take(agent, block=True)
                answers, applies = agent.boundary(T, loss)
                for p, n, since in answers:
                    sent.append(syncer.answered.remote(m, life, p, n, prog.answer(p), since,
                                                       T, agent.take_report()))
                for p, version in applies:
                    deadline = time.time() + WAIT_S
                    while not prog.has(p, version):  # late: it waits for the reply
                        if time.time() > deadline:
                            raise RuntimeError(f"learner {m}: no reply of fragment {p} in "
                                               f"{WAIT_S:g} s")
                        self._take(agent, block=True)
                    prog.apply(p, version)
                if self.upload:
                    self.upload = False
                    ray.get(syncer.peer_state.remote(m, prog.inner_state(), T))
                    agent.uploaded(T)
                done, sent = ray.wait(sent, num_returns=len(sent), timeout=0) if sent else ([],
                                                                                        [])
                ray.get(done)  # (an error in the syncer's handling surfaces here)

        def _take(self, agent, block=False):
            """Pass on what the syncer said, in the order it was sent (`block`: wait for one
            message at least); replies' bytes to the program, in order."""
            while True:
                try:
                    message, reply, life, number = self.mail.get(
                        block=block, timeout=1.0 if block else None)
                except queue.Empty:
                    if block:
                        continue
                    break
                block = False
                if life != self.life:
                    continue  # for an earlier process of this learner
                if number is None:  # an "upload"
                    self.upload = True
                    continue
                self.early[number] = (message, reply)
                while self.taken + 1 in self.early:
                    self.taken += 1
                    message, reply = self.early.pop(self.taken)
                    if message[0] == "reply":
                        self.replies[message[1], message[2]] = reply
                    else:
                        agent.hear(message)
            for (p, n) in sorted(self.replies):
                if self.program.has(p, n):
                    self.program.receive(p, n, self.replies.pop((p, n)))
                elif n < min(self.program.versions[p]):
                    del self.replies[p, n]  # (it holds a newer version already)

        def flush_payload(self, p):
            return self.program.flush_answer(p)  # refused by a process that holds no state

    @ray.remote(max_concurrency=64)
    class Syncer:
        def __init__(self, config, params, hold_s, cache_dir):
            _process(cache_dir)
            from .syncer import SyncerRuntime

            self.rt, self.lock = SyncerRuntime(config, params, hold_s), threading.Lock()
            self.t0, self.error, self.learners = None, None, []
            # (learner, "up" | "down"): Ray calls each way, and the bytes their arguments
            # carry beyond the booked ones (`unbooked_bytes`)
            self.calls, self.unbooked = collections.Counter(), collections.Counter()

        def _count(self, m, way, unbooked):
            self.calls[m, way] += 1
            self.unbooked[m, way] += unbooked

        def start(self, t0, learners):
            self.t0, self.learners = t0, learners
            with self.lock:
                first = self.rt.start()
            threading.Thread(target=self._loop, daemon=True).start()
            return first

        def _now(self):
            return time.time() - self.t0 if self.t0 is not None else 0.0

        def _deliver(self):
            """Send what the syncer has to say (under the lock: in order)."""
            for m, message, reply, life, number in self.rt.outbox:
                self.learners[m].hear.remote(message, reply, life, number)
                self._count(m, "down", unbooked_bytes((message, reply, life, number), reply))
            self.rt.outbox.clear()

        def _loop(self):  # the timers and the merges
            try:
                while True:
                    with self.lock:
                        self.rt.advance(self._now() - self.rt.hold)
                        job = self.rt.next_merge()
                        self._deliver()
                    if job is None:
                        time.sleep(0.002)
                        continue
                    result = self.rt.merge(job)
                    with self.lock:
                        self.rt.merged(job, result)
                        self._deliver()
            except Exception as e:  # noqa: BLE001 - reported by status()
                self.error = repr(e)

        def answered(self, m, life, p, n, payload, since, sent_at, report):
            now = self._now()  # when it arrived, not when the lock was free
            extra = unbooked_bytes((m, life, p, n, payload, since, sent_at, report), payload)
            with self.lock:
                self._count(m, "up", extra)
                self.rt.answered(m, life, p, n, payload, since, sent_at, report, now)
                self._deliver()

        def reported(self, m, life, report, final=None):
            with self.lock:
                self._count(m, "up", unbooked_bytes((m, life, report, final)))
                self.rt.reported(m, life, report, final)

        def failed(self, m):
            with self.lock:
                self.rt.failed(m, self._now())
                self._deliver()

        def killed(self, m, for_good=False):
            with self.lock:
                self.rt.killed(m, self._now(), for_good)
                self._deliver()

        def rejoin(self, m):
            with self.lock:
                ticket = self.rt.rejoin(m, self._now())
                self._deliver()
            while True:  # until its peer uploads; a later failure of m voids the ticket
                with self.lock:
                    state, got = self.rt.take_rejoin(m, ticket)
                    self._deliver()
                if state != "wait":
                    return got
                time.sleep(0.002)

        def until(self, m, life, t):
            """How many messages learner m's process has been sent, once every event up to its
            step boundary at t is handled (`SyncerRuntime.until`)."""
            with self.lock:
                self._count(m, "up", unbooked_bytes((m, life, t)))
            while True:
                with self.lock:
                    if self.error:
                        raise RuntimeError(f"the syncer failed: {self.error}")
                    sent = self.rt.until(m, life, t)
                if sent is not None:
                    return sent
                time.sleep(0.002)

        def peer_state(self, q, inner_state, t):
            import jax

            extra = unbooked_bytes((q, inner_state, t), *jax.tree.leaves(inner_state))
            with self.lock:
                self._count(q, "up", extra)
                self.rt.peer_state(q, inner_state, t)
                self._deliver()

        def status(self):
            with self.lock:
                return {**self.rt.status(), "error": self.error, "now": self._now()}

        def _when_idle(self, what):
            """`what()` under the lock once no merge is queued or being computed."""
            while True:
                with self.lock:
                    if self.error:
                        raise RuntimeError(f"the syncer failed: {self.error}")
                    if not self.rt.busy:
                        out = what()
                        if out is not None:
                            return out
                time.sleep(0.002)

        def flushes(self):
            return self._when_idle(self.rt.flushes)

        def flush(self, job):
            with self.lock:
                self.rt.flush(job)

        def result(self):
            with self.lock:
                return {**self.rt.result(), "calls": dict(self.calls),
                        "unbooked": dict(self.unbooked)}

    return Learner, Syncer

