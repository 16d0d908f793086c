"""The actor runtime's processes: the syncer, one learner per slot, and warm spares per host.

A learner's process that dies is not restarted: a new one would import JAX, build the model
and compile (tens of seconds on a busy machine), while the run goes on without it. The pool
instead keeps warm spares: learner processes built and warmed up (compiled) before the clock
starts. A spare serves any slot of its host: it takes the slot's number (its data shard,
`LearnerProgram` reads rows [m]) when it starts to serve (`Learner.run`'s `slot`). On the
testbed each learner has a host of its own, so each host keeps one spare for its one slot (its
runs kill a learner once); on one machine (no placement) the spares are one queue of `DEPTH` ×
M for every slot, so a slot killed three times in a row is served as fast as three slots
killed once. When slot m's process dies (killed by the driver at a failure window, or anything
else), `promote(m)` makes the oldest spare of m's host slot m's process (the syncer is told its
handle: `Syncer.replace`), and the pool refills behind it: one new spare at a time (`pending`,
then `built`: the driver waits on the build as on its other calls), so that the builds take at
most one core from the learners' steps at any time. The promoted spare waits out the window
and rejoins as any returning learner (Θ and a peer's inner state).

Measured in the `actors` job's failures scenario (4 learners, 9–10 kills in 50 s, two cores),
from a kill to a running process: 7.3 s on average and up to 30 s with one spare a slot; with
two a slot, 2.5 s and up to 10.5 s (17 s in another run, where one slot was killed three times
within 16 s while four refills were built at once, slowing every learner's steps by 5%); with
one queue for every slot and one build at a time, 0.14 s and up to 0.34 s, the steps on pace.

Without spares (`spares=False`, the default where the `Cluster` has no failures) a process is
built on demand, cold. `clock_offsets` measures each learner's clock against the syncer's.
Nothing here imports Ray at import time.
"""

from __future__ import annotations

import warnings

from .ray_actors import actor_classes

DEPTH = 2  # warm spares per learner on one machine (module docstring)


class Pool:
    """The processes of one run of `config` (module docstring). `placement`: the syncer on the
    node with resource `host0`, learner m and the spares for it on `host<m+1>`."""

    def __init__(self, ray, config, placement: bool, spares: bool | None):
        self.ray, self.config, self.M = ray, config, config.workers
        self.warm = bool(config.cluster.failures) if spares is None else bool(spares)
        # pinned by a sliver of the host's resource (`host<k>`: 1 a node), so that a learner
        # and its spares (and the spares built later) fit on the same host
        self.where = (lambda k: dict(resources={f"host{k}": 0.01})) if placement else (  # noqa: E731
            lambda k: {})
        self.host = (lambda m: m + 1) if placement else (lambda m: 0)  # noqa: E731
        self.slots = {}  # host -> its slots, the first one's number given to a new spare
        for m in range(self.M):
            self.slots.setdefault(self.host(m), []).append(m)
        self.depth = (1 if placement else DEPTH * self.M) if self.warm else 0  # a host's
        self.syncer, self.learners = None, []
        self.spares: dict[int, list] = {h: [] for h in self.slots}  # a host's, the oldest first
        self.owed: list[int] = []  # hosts a spare is owed to, in the order of the promotions
        self.building = None  # (host, process, its `ready` call): the one spare being built
        self.gone: list = []  # processes killed or dead (killed again at the end, to be sure)

    def build(self, params, hold_s: float, cache_dir: str, drop=None, resend_s=None) -> None:
        """The syncer, the learners and the spares (`depth` a host), built and ready
        (compiled), each learner holding the syncer's class (`Learner.ready`)."""
        _, Syncer = actor_classes()
        self.args = (params, cache_dir, resend_s)
        self.syncer = Syncer.options(num_cpus=0, max_restarts=0, **self.where(0)).remote(
            self.config, params, hold_s, cache_dir, drop)
        self.learners = [self._new(m) for m in range(self.M)]
        self.spares = {h: [self._new(slots[0]) for _ in range(self.depth)]
                       for h, slots in self.slots.items()}
        every = self.learners + [s for queue in self.spares.values() for s in queue]
        self.ray.get([a.ready.remote(self.syncer) for a in every] + [self.syncer.status.remote()])

    def kill(self, m: int) -> None:
        """Learner m's process, killed for good (no restart by Ray: a spare takes its place)."""
        self.ray.kill(self.learners[m], no_restart=True)
        self.gone.append(self.learners[m])

    def promote(self, m: int):
        """Slot m's process is gone: the oldest spare of its host serves slot m (without one: a
        new process, cold), and a spare is owed to that host (built after those owed before:
        `pending`). Returns slot m's new process; its `run` must be given `slot=m`."""
        queue = self.spares[self.host(m)]
        new = queue.pop(0) if queue else self._new(m)
        self.gone.append(self.learners[m])  # (killed, or dead: killed again at the end)
        self.learners[m] = new
        if self.depth:
            self.owed.append(self.host(m))
            self._next()
        self.ray.get(self.syncer.replace.remote(m, new))
        return new

    def pending(self) -> list:
        """The `ready` call of the spare being built (none: []): `built(ref)` when it is done."""
        return [self.building[2]] if self.building is not None else []

    def built(self, ref) -> None:
        """The spare being built is ready (`ref`: its `ready` call, done; an error in it is
        raised here): it joins its host's queue, and the next owed spare is begun."""
        host, new, call = self.building
        assert ref == call, "not the spare being built"
        self.ray.get(ref)
        self.building = None
        self.spares[host].append(new)
        self._next()

    def clock_offsets(self, hold_s: float) -> dict:
        """Each learner's clock against the syncer's (`Learner.clock_offset`, Cristian's
        method): the offsets (s), their round trips (the error bound is half of one), and the
        largest |offset| with its round trip. Every process times its events against one t0
        set by the driver, so the offsets must be well below `hold_s`: a warning where one
        certainly exceeds hold_s / 2 (by more than its error bound)."""
        got = self.ray.get([a.clock_offset.remote(self.syncer) for a in self.learners])
        worst = max(range(self.M), key=lambda m: abs(got[m][0]))
        offset, rtt = got[worst]
        if abs(offset) - rtt / 2 > hold_s / 2:
            warnings.warn(f"learner {worst}'s clock is {offset * 1e3:+.1f} ms (± "
                          f"{rtt / 2 * 1e3:.1f} ms) off the syncer's, beyond hold_s / 2 = "
                          f"{hold_s / 2 * 1e3:.1f} ms: events may be handled out of order "
                          "(synchronize the hosts' clocks, or raise hold_s)", stacklevel=3)
        return dict(offsets_s=[o for o, _ in got], rtts_s=[r for _, r in got],
                    max_abs_offset_s=abs(offset), rtt_s=rtt)

    def close(self) -> None:
        """Every process of the run, killed (on every way out), the spare being built too."""
        every = self.learners + self.gone + [s for q in self.spares.values() for s in q]
        every += [self.building[1]] if self.building is not None else []
        for a in every + ([self.syncer] if self.syncer is not None else []):
            self.ray.kill(a, no_restart=True)

    def _next(self) -> None:
        """Begin building the next owed spare, unless one is being built (or none is owed)."""
        if self.building is None and self.owed:
            host = self.owed.pop(0)
            new = self._new(self.slots[host][0])  # `ready` loads the syncer's class now
            self.building = (host, new, new.ready.remote(self.syncer))

    def _new(self, m: int):
        Learner, _ = actor_classes()
        return Learner.options(num_cpus=0, max_restarts=0, max_task_retries=0,
                               **self.where(self.host(m))).remote(self.config, m, *self.args)
