"""The actor runtime's two Ray actors (`actors.runtime` starts and watches them).

- `Learner`: one learner's process. It runs `LearnerProgram` at the `Cluster`'s step times and
  makes one short call to the syncer at each step boundary (`SyncerRuntime.boundary`), doing
  what the reply says: answer (the wire format's bytes, sent without waiting; before it stops
  it waits until the syncer has every answer it sent), fetch and apply published fragments,
  upload its inner optimizer state for a returning peer, or stop. A new process after a kill
  waits out the window, then rejoins (`Syncer.rejoin`).
- `Syncer`: `SyncerRuntime` under a lock, called from Ray's threads, with a thread of its own
  for the timers and the merges (computed off the lock). Θ_p travels through Ray's object
  store. `flushes` and `result` wait until no merge is queued or being computed.

Importing this module imports no Ray: `actor_classes()` does.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time

import numpy as np


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

    def _process(cache_dir):
        from ..devices import emulate_devices, enable_compilation_cache

        emulate_devices(1)
        enable_compilation_cache(cache_dir)

    @ray.remote(max_concurrency=2)
    class Learner:
        def __init__(self, config, m, params, cache_dir):
            _process(cache_dir)
            from ..clock import Timeline
            from .learner import LearnerProgram

            self.m, self.timeline = m, Timeline(config.cluster, config.workers)
            self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
            self.program = LearnerProgram(config, m, params)
            self.program.warm_up()

        def ready(self):
            return True

        def _fetch(self, p, ref):
            """Θ_p of a published fragment: fetched in the background since it was announced
            (over a real link it takes time: the learner should not wait for it when due)."""
            announced, future = self.fetching.pop(p, (None, None))
            return future.result() if announced == ref else ray.get(ref)

        def run(self, syncer, t0, back_at=None):
            prog, m = self.program, self.m
            self.fetching, sent = {}, []
            k, T = 0, 0.0
            if back_at is not None:  # a new process after a failure: wait out the window
                time.sleep(max(0.0, t0 + back_at - time.time()))
                got = ray.get(syncer.rejoin.remote(m))
                if got is None:
                    return "ended"
                leaves, inner, k, T = got
                prog.reload(leaves, inner)
            else:
                prog.begin()
            while True:
                loss = prog.step(k)
                T = max(T + self.timeline.duration(m, k), time.time() - t0)
                time.sleep(max(0.0, t0 + T - time.time()))
                reply = ray.get(syncer.boundary.remote(m, T, loss))
                if reply.stop:
                    prog.undo()
                    ray.get(sent)  # every answer it sent has reached the syncer
                    return "done"
                if sent:  # the answers the syncer has taken (an error there surfaces here)
                    done, sent = ray.wait(sent, num_returns=len(sent), timeout=0)
                    ray.get(done)
                for p, sync in reply.answer:
                    sent.append(syncer.answered.remote(m, p, sync, prog.answer(p), T))
                for p, ref in reply.fetch:  # the newest version of p replaces an older one
                    self.fetching[p] = (ref, self.pool.submit(ray.get, ref))
                for p, ref in reply.apply:
                    prog.apply(p, self._fetch(p, ref))
                if reply.upload:
                    ray.get(syncer.peer_state.remote(m, prog.inner_state()))
                k += 1

        def flush_payload(self, p):
            return self.program.flush_answer(p)  # refused by a process that holds no state

    @ray.remote(max_concurrency=64)
    class Syncer:
        def __init__(self, config, params, hold_s, cache_dir):
            _process(cache_dir)
            from .syncer import SyncerRuntime

            self.rt, self.lock = SyncerRuntime(config, params, hold_s), threading.Lock()
            self.refs = {}  # fragment -> its newest Θ_p in the object store (what learners take)
            self.t0, self.error = None, None

        def start(self, t0):
            self.t0 = t0
            with self.lock:
                self.rt.start()
            threading.Thread(target=self._loop, daemon=True).start()

        def _now(self):
            return time.time() - self.t0 if self.t0 is not None else 0.0

        def _loop(self):  # the timers and the merges
            try:
                while True:
                    with self.lock:
                        self.rt.advance(self._now() - self.rt.hold)
                        job = self.rt.next_merge()
                    if job is None:
                        time.sleep(0.002)
                        continue
                    result = self.rt.merge(job)
                    ref = ray.put([np.asarray(x) for x in result[0]])
                    with self.lock:
                        self.rt.publish(job, result, self._now())
                        self.refs[job.p] = ref
            except Exception as e:  # noqa: BLE001 - reported by status()
                self.error = repr(e)

        def boundary(self, m, T, loss):
            with self.lock:
                reply = self.rt.boundary(m, T, loss)
                # Θ_p travels through the object store: the newest published version of p is
                # the syncer's current one (a fragment changes only when it is published)
                reply.apply = [(p, self.refs[p]) for p, _ in reply.apply]
                reply.fetch = [(p, self.refs[p]) for p in reply.fetch]
                return reply

        def answered(self, m, p, sync, payload, sent_at):
            now = self._now()  # when it arrived, not when the lock was free
            with self.lock:
                self.rt.answered(m, p, sync, payload, sent_at, now)

        def failed(self, m):
            with self.lock:
                self.rt.failed(m, self._now())

        def killed(self, m):
            with self.lock:
                self.rt.killed(m, self._now())

        def rejoin(self, m):
            with self.lock:
                ticket = self.rt.rejoin(m, self._now())
            while True:  # until its peer uploads; a later failure of m voids the ticket
                with self.lock:
                    state, got = self.rt.take_rejoin(m, ticket)
                if state != "wait":
                    return got
                time.sleep(0.002)

        def peer_state(self, q, inner_state):
            with self.lock:
                self.rt.peer_state(q, inner_state, self._now())

        def status(self):
            with self.lock:
                return {**self.rt.status(), "error": self.error, "now": self._now()}

        def end_now(self):
            with self.lock:
                self.rt.ending = self.rt.clock

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
            result = self.rt.merge(job)
            with self.lock:
                self.rt.publish(job, result, self._now())

        def result(self):
            return self._when_idle(self.rt.result)

    return Learner, Syncer
