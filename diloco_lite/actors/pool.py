"""The actor runtime's processes: the syncer, one learner per slot, and warm spares per slot.

A learner's process that dies is not restarted: a new one would import JAX, build the model
and compile (tens of seconds on a busy machine), while the run goes on without it. Each slot
m instead has `DEPTH` spares: processes built for learner m (its data shard is m's:
`LearnerProgram` reads rows [m]) and warmed up (compiled) before the clock starts, on the same
host as the learner it backs. When learner m's process dies (killed by the driver at a failure
window, or anything else), `promote(m)` makes the oldest of its spares slot m's process (the
syncer is told its handle: `Syncer.replace`), and a new spare is built behind them, in the
background. The promoted spare waits out the window and rejoins as any returning learner (Θ
and a peer's inner state). Two a slot, not one: a refill takes 20–30 s on two cores busy with
the learners' steps, and a slot killed again within that time found its one spare still
being built (the `actors` job's failures scenario, from a kill to a running process: 7.3 s on
average and up to 30 s with one spare a slot; 2.5 s and up to 10.5 s with two).

Without spares (`spares=False`, the default where the `Cluster` has no failures) a process is
built on demand, cold. `clock_offsets` measures each learner's clock against the syncer's.
Nothing here imports Ray at import time.
"""

from __future__ import annotations

import warnings

from .ray_actors import actor_classes

DEPTH = 2  # warm spares per slot (module docstring)


class Pool:
    """The processes of one run of `config` (module docstring). `placement`: the syncer on the
    node with resource `host0`, learner m and its spare on `host<m+1>`."""

    def __init__(self, ray, config, placement: bool, spares: bool | None):
        self.ray, self.config, self.M = ray, config, config.workers
        self.warm = bool(config.cluster.failures) if spares is None else bool(spares)
        # pinned by a sliver of the host's resource (`host<k>`: 1 a node), so that a learner
        # and its spare (and the spares built later) fit on the same host
        self.where = (lambda k: dict(resources={f"host{k}": 0.01})) if placement else (  # noqa: E731
            lambda k: {})
        self.depth = DEPTH if self.warm else 0
        self.syncer, self.learners = None, []
        self.spares: list[list] = [[] for _ in range(self.M)]  # slot m's, the oldest first
        self.gone: list = []  # processes killed or dead (killed again at the end, to be sure)

    def build(self, params, hold_s: float, cache_dir: str, drop=None, resend_s=None) -> None:
        """The syncer, the learners and their spares (`depth` a slot), built and ready
        (compiled), each learner holding the syncer's class (`Learner.ready`)."""
        _, Syncer = actor_classes()
        self.args = (params, cache_dir, resend_s)
        self.syncer = Syncer.options(num_cpus=0, max_restarts=0, **self.where(0)).remote(
            self.config, params, hold_s, cache_dir, drop)
        self.learners = [self._new(m) for m in range(self.M)]
        self.spares = [[self._new(m) for _ in range(self.depth)] for m in range(self.M)]
        every = self.learners + [s for queue in self.spares for s in queue]
        self.ray.get([a.ready.remote(self.syncer) for a in every] + [self.syncer.status.remote()])

    def kill(self, m: int) -> None:
        """Learner m's process, killed for good (no restart by Ray: a spare takes its place)."""
        self.ray.kill(self.learners[m], no_restart=True)
        self.gone.append(self.learners[m])

    def promote(self, m: int):
        """Slot m's process is gone: its oldest spare serves slot m (without one: a new
        process, cold), and a new spare is built behind the others. Returns slot m's new
        process."""
        queue = self.spares[m]
        new = queue.pop(0) if queue else self._new(m)
        self.gone.append(self.learners[m])  # (killed, or dead: killed again at the end)
        self.learners[m] = new
        while len(queue) < self.depth:  # in the background; `ready` loads the syncer's class
            queue.append(self._new(m))  # now, not at its turn
            queue[-1].ready.remote(self.syncer)
        self.ray.get(self.syncer.replace.remote(m, new))
        return new

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
        """Every process of the run, killed (on every way out)."""
        every = self.learners + self.gone + [s for queue in self.spares for s in queue]
        for a in every + ([self.syncer] if self.syncer is not None else []):
            self.ray.kill(a, no_restart=True)

    def _new(self, m: int):
        Learner, _ = actor_classes()
        return Learner.options(num_cpus=0, max_restarts=0, max_task_retries=0,
                               **self.where(m + 1)).remote(self.config, m, *self.args)
