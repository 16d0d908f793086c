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
  asks for its inner optimizer state at its next step boundary (for a returning peer: it keeps
  the state and tells the syncer, which tells the returning learner where to fetch it,
  `held_state`: the bytes go from host to host, not through the syncer's). At its
  stop position it waits until the syncer has every answer it sent, reports, and waits for a
  new stop (a learner went down) or the end. A new process after a kill (a spare: it takes
  the slot's number, `slot`) waits out the window, then rejoins (`Syncer.rejoin`).
  Its messages come numbered, taken in order (`actors.inbox`); one it waits for that does
  not come is asked for again (`Syncer.resend`), and a bounded wait ends in `MessageLost`.
- `Syncer`: `actors.syncer_actor.SyncerActor` (`SyncerRuntime` under a lock, waiting on a
  condition, never polling).

Importing this module imports no Ray: `actor_classes()` does.
"""

from __future__ import annotations

import functools
import time

from .inbox import RESEND_S, Inbox
from .syncer_actor import SyncerActor, setup_process, unbooked_bytes  # noqa: F401

CLOCK_SAMPLES = 5  # round trips to the syncer's clock per offset measurement (the fastest wins)
UPLOADS_KEPT = 4  # a learner's last inner-state uploads it keeps for returning learners


def import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("the actor runtime needs Ray: pip install 'diloco_lite[cluster]' "
                          "(or pip install ray)") from None
    return ray


@functools.cache
def actor_classes():
    """The `Learner` and `Syncer` actor classes (module docstring), made once Ray is imported."""
    ray = import_ray()

    @ray.remote(max_concurrency=4)
    class Learner:
        def __init__(self, config, m, params, cache_dir, resend_s=None):
            setup_process(cache_dir)
            from ..clock import Timeline
            from ..clock.schedule import Schedule
            from .learner import LearnerProgram

            self.m, self.timeline = m, Timeline(config.cluster, config.workers)
            self.schedule = Schedule.of(config.algorithm)
            self.program = LearnerProgram(config, m, params)
            self.program.warm_up()
            self.mail, self.replies = Inbox(m, resend_s or RESEND_S), {}
            self.uploads = {}  # its step boundary -> its inner state uploaded there

        def ready(self, syncer=None):
            """Built; taking in the syncer's handle loads the Syncer class from Ray's GCS (some
            30 kB through this host's link) here, before the clock, not in `run`."""
            return True

        def clock_offset(self, syncer):
            """This process's clock against the syncer's (Cristian's method): (the syncer's
            time minus the midpoint of the call, the round trip: the offset's error bound is
            half of it), from the fastest of `CLOCK_SAMPLES` calls."""
            best = None
            for _ in range(CLOCK_SAMPLES):
                sent = time.time()
                theirs = ray.get(syncer.clock.remote())
                back = time.time()
                if best is None or back - sent < best[1]:
                    best = (theirs - (sent + back) / 2, back - sent)
            return best

        def hear(self, message, reply=None, life=0, number=None):
            """A message of the syncer (and a reply's bytes) for process `life` of this learner
            (one for an earlier process is dropped), the `number`-th sent to it (None: an
            "upload")."""
            self.mail.put(message, reply, life, number)

        def run(self, syncer, t0, messages=None, back_at=None, slot=None):
            import jax

            from .agent import LearnerAgent

            if slot is not None:  # a spare, built for another slot of its host, serves `slot`
                self.m = self.program.m = self.mail.m = slot

            prog, m, P, tau = self.program, self.m, self.schedule.fragments, \
                self.schedule.overlap
            period = self.schedule.inner_steps * self.timeline.t_ref
            ready = time.time() - t0  # this process is built and running
            if back_at is not None:  # a spare, or a new process, after a failure: wait it out
                time.sleep(max(0.0, t0 + back_at - time.time()))
                got = ray.get(syncer.rejoin.remote(m))
                if got is None:
                    return "ended"
                prog.reload(got["leaves"], self._peer_state(syncer, m, got["inner"]),
                            got["versions"])
                agent = LearnerAgent(m, P, tau, k=got["k"], versions=got["versions"],
                                     period_s=period)
                messages, T, life = got["messages"], got["t"], got["life"]
            else:
                prog.begin()
                agent, T, life = LearnerAgent(m, P, tau, period_s=period), 0.0, 0
            for message in messages:
                agent.hear(message)
            self.mail.begin(life, len(messages))
            first, sent = None, []

            def wait(done, what):  # for messages it knows are due (`Inbox.wait`)
                self.mail.wait(done, lambda s: self._take(agent, s),
                               lambda taken: ray.get(syncer.resend.remote(m, life, taken)), what)

            while True:
                self._take(agent)
                if agent.stopped:
                    ray.get(sent)  # every answer it sent has reached the syncer
                    sent = []
                    ray.get(syncer.reported.remote(m, life, agent.take_report(),
                                                   (agent.k, agent.held)))
                    while agent.stopped:  # a new stop, or the end
                        self._take(agent, None)
                    continue
                loss = prog.step(agent.k)
                if first is None:
                    first = time.time() - t0
                    syncer.first_step.remote(m, life, ready, first)
                T = max(T + self.timeline.duration(m, agent.k), time.time() - t0)
                time.sleep(max(0.0, t0 + T - time.time()))
                self._take(agent)
                if self.mail.early:  # a gap: one sent before a message that came is missing
                    wait(lambda: not self.mail.early,
                         lambda: f"message {self.mail.taken + 1} (a later one came)")
                if agent.unsure(T):  # everything up to T first: the syncer's word, its messages
                    due = ray.get(syncer.until.remote(m, life, T))
                    wait(lambda: self.mail.taken >= due,  # noqa: B023 - called here only
                         lambda: f"message {due} (the syncer's word up to {T:.3f} s)")  # noqa: B023
                answers, applies = agent.boundary(T, loss)
                for p, n, since in answers:
                    sent.append(syncer.answered.remote(m, life, p, n, prog.answer(p), since,
                                                       T, agent.take_report()))
                for p, version in applies:  # late: it waits for the reply
                    wait(lambda: prog.has(p, version),  # noqa: B023
                         lambda: f"the reply of fragment {p}, version {version}")  # noqa: B023
                    prog.apply(p, version)
                if self.mail.upload:  # its inner state, for a returning peer to fetch
                    self.mail.upload = False
                    state = self.uploads[T] = prog.inner_state()
                    while len(self.uploads) > UPLOADS_KEPT:
                        del self.uploads[min(self.uploads)]
                    nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
                    ray.get(syncer.peer_state.remote(m, nbytes, T))
                    agent.uploaded(T)
                done, sent = ray.wait(sent, num_returns=len(sent), timeout=0) if sent else ([],
                                                                                        [])
                ray.get(done)  # (an error in the syncer's handling surfaces here)

        def held_state(self, t=None):
            """Its inner optimizer state as uploaded at its step boundary t (a returning learner
            fetches it from this process, host to host); None: as of its last step."""
            return self.program.inner_state() if t is None else self.uploads[t]

        def _peer_state(self, syncer, m, inner):
            """The inner state a returning learner loads: `inner` None (a fresh one), or (the
            peer, its handle, its upload's time) to fetch from the peer. If the peer died since
            its upload, the syncer names another learner up that it has not tried
            (`Syncer.refetch`), whose state as of its last step it loads (None: a fresh one,
            none being left)."""
            tried = []
            while inner is not None:
                q, peer, t = inner
                tried.append(q)
                try:
                    return ray.get(peer.held_state.remote(t))
                except ray.exceptions.RayActorError:
                    inner = ray.get(syncer.refetch.remote(m, tried))
            return None

        def _take(self, agent, block_s=0.0):
            """Pass on what the syncer said, in the order it was sent (`block_s`: wait that
            long for a message first; None: until one comes); replies' bytes to the program,
            in order. Whether a message was taken."""
            def deliver(message, reply):
                if message[0] == "reply":
                    self.replies[message[1], message[2]] = reply
                else:
                    agent.hear(message)

            got = self.mail.take(deliver, block_s)
            for (p, n) in sorted(self.replies):
                if self.program.has(p, n):
                    self.program.receive(p, n, self.replies.pop((p, n)))
                elif n < min(self.program.versions[p]):
                    del self.replies[p, n]  # (it holds a newer version already)
            return got

        def flush_payload(self, p):
            return self.program.flush_answer(p)  # refused by a process that holds no state

    Syncer = ray.remote(max_concurrency=64)(SyncerActor)
    return Learner, Syncer
