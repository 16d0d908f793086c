"""What a planner records: the events of a run and its counters (bytes, steps, goodput).

The planners (`lockstep` for DDP, DiLoCo and Streaming DiLoCo, `syncer` for Decoupled DiLoCo)
walk the simulated clock and tell a `Recorder` what happens; `Recorder.finish()` cuts the events
into the `Block`s of a `Plan`, which the training loop replays on the device (`clock.plan`).

A plan is a list of `Block`s: each learner first runs `steps[m]` inner steps (its data indices
start at `first[m]`), then the block's `Event`s run in order:

| kind     | what the device does                                                   | reads       |
|----------|------------------------------------------------------------------------|-------------|
| `send`   | the learners in `mask` put Δ = base − θ through the wire format        | own state   |
| `close`  | the syncer merges the sent Δ with `weights` and takes an outer step    | sent Δ, Θ   |
| `arrive` | the learners in `mask` take the fragment: θ ← α·θ + (1−α)·Θ, base ← Θ  | Θ           |
| `reload` | returning learners load Θ and a healthy peer's inner optimizer state   | Θ, peer     |
|          | (`peer` = `FRESH`: none was up, a fresh one from Θ)                    |             |
| `eval`   | (the training loop) evaluates Θ and writes a history row from `stats`  | Θ           |

An event that touches a learner's state records the learner's position (`at`: steps done);
`Recorder.finish` cuts the blocks so that each learner has run exactly that many steps when the
event runs. Learners may run ahead of the simulated time of other learners' events (their states
are independent), which fills a block's slots: with equal speeds a block is a whole round.

**Goodput from a run.** A learner-step is *useful* when its work reaches the global model: it is
in a Δ that a merge used (an outer step, or the end-of-run flush). Its work on fragment p counts
for p's share of the parameters, so a step can be partly useful. Every other step is *lost*:

- a failed learner's work not yet merged (the syncer gives a failed learner weight 0, so an
  answer it had already sent is dropped too; one a sync closed with before the failure is in
  that merge, published or not: useful);
- work that an arriving fragment overwrites (θ ← α·θ + (1−α)·Θ replaces a share 1 − α of the
  learner's unmerged work): an answer the syncer closed without (too late for a quorum of K),
  and — the *overlap* loss, `overlap_lost_steps` — the steps a learner took between its merged
  answer and applying the result (τ > 0 with α < 1);
- a lock-step restart: every step since the checkpoint is done again;
- at the end of the run, work that no merge holds (steps after the last answer of a fragment
  still in flight, a learner not holding the newest fragment).

    goodput = useful learner-steps / learner-steps the cluster could have done at nominal speed
              in the elapsed time

(the share of the capacity offered that became committed progress, counted in learner-steps;
the chaos simulator counts the same share in chip-seconds: docs/algorithms.md §5)

so at the end of a run `learner_steps` = useful + lost exactly. At an earlier row, work not yet
merged is neither (it may still reach the model): the goodput of a row is what has reached it.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np

from . import Timeline

FLUSH_BIN = -1  # the end-of-run flush is booked in the bytes but not in the per-step peak
FRESH = -1  # a reload's peer when no learner was up: a fresh inner optimizer state


@dataclasses.dataclass
class Event:
    kind: str
    time_s: float
    fragment: int = -1
    mask: np.ndarray | None = None  # bool [M]: learners that send / receive / reload
    weights: np.ndarray | None = None  # close: merge weight of each learner (0: left out)
    flush: bool = False  # send/close: the end-of-run plain average (no outer momentum)
    peer: np.ndarray | None = None  # reload: whose inner optimizer state each learner copies
    # (FRESH: none, it starts a fresh one)
    at: dict = dataclasses.field(default_factory=dict)  # learner -> steps done at this event
    stats: dict | None = None  # eval: the history row's counters


@dataclasses.dataclass
class Block:
    steps: np.ndarray  # [M] inner steps each learner runs first
    first: np.ndarray  # [M] data index of each learner's first step
    events: list


@dataclasses.dataclass
class Plan:
    blocks: list
    learners: int
    t_ref: float
    step_time: list  # per learner: simulated completion time of each device step
    fragments: list  # per fragment: {"up_bytes", "down_bytes", "syncs"}
    final: dict  # the counters at the end of the run
    hosts: dict | None = None  # Decoupled DiLoCo: bytes each host sent ("tx") and received
    # ("rx"), host 0 the syncer's, host m + 1 learner m's (`Recorder`)


class Recorder:
    """Collects a planner's events and counters; `finish()` turns them into a `Plan`.

    Counters (host-side, exact): learner-steps processed (every step computed), useful and lost
    (module docstring), bytes up (learners → merge) and down (syncer → learners, and rejoin
    downloads), the per-step peaks of bytes up and down (bins of one reference step of
    simulated time, in Gbit/s), outer steps, quorum waits. Per host (`tx`, `rx`: host 0 the
    syncer's, host m + 1 learner m's), the bytes it sends and receives: an answer goes from its
    learner to the syncer, a reply from the syncer to each of its `receivers`, a rejoin's Θ
    (fp32) from the syncer to the learner, and the peer's inner optimizer state (the rest of
    `rejoin_nbytes`) from the peer through the syncer.

    Per learner m and fragment p it tracks the work not yet merged (`pending`, in steps; a float
    because an arrival keeps a share α of it), the part of it in an answer on the wire
    (`wire`), and the part in an answer a closed sync holds, whose merge is not published yet
    (`merging`), so that a merge books exactly the steps its Δ holds.
    """

    def __init__(self, timeline: Timeline, *, up_nbytes, down_nbytes, sizes, rejoin_nbytes=0,
                 tokens_per_step=1, mix: float = 0.0):
        m, p = timeline.learners, len(up_nbytes)
        self.timeline, self.M, self.P = timeline, m, p
        self.up_nbytes, self.down_nbytes = list(up_nbytes), list(down_nbytes)
        total = float(sum(sizes))
        self.share = [s / total for s in sizes]  # fraction of the values in each fragment
        self.rejoin_nbytes, self.tokens_per_step, self.mix = rejoin_nbytes, tokens_per_step, mix
        self.events: list[Event] = []
        self.index = [[] for _ in range(m)]  # data index of each recorded step
        self.times = [[] for _ in range(m)]
        self.since = [[0] * p for _ in range(m)]  # steps since the learner's base of fragment p
        self.pending = [[0.0] * p for _ in range(m)]  # work of fragment p not yet merged
        self.wire = [[0.0] * p for _ in range(m)]  # ... of which in an answer on the wire
        self.merging = [[0.0] * p for _ in range(m)]  # ... in a closed sync, not published
        self.merged = [[False] * p for _ in range(m)]  # last answer merged, result not applied
        self.c = dict(processed=0, useful=0.0, lost=0.0, overlap_lost=0.0, up=0, down=0,
                      outer_steps=0, syncer_wait_s=0.0, failures=0)
        self.bins: dict[int, int] = {}  # bytes up per reference step of simulated time
        self.down_bins: dict[int, int] = {}  # bytes down, likewise
        self.frag = [dict(up_bytes=0, down_bytes=0, syncs=0) for _ in range(p)]
        self.tx, self.rx = [0] * (m + 1), [0] * (m + 1)  # bytes per host (class docstring)
        self.theta_nbytes = 4 * int(total)  # Θ in fp32, as a rejoin downloads it

    # ---- learners -----------------------------------------------------------------------------
    def position(self, m: int) -> int:
        return len(self.index[m])

    def step(self, m: int, index: int, t: float) -> None:
        """Learner m finished the step on data index `index` at time t."""
        self.index[m].append(index)
        self.times[m].append(t)
        self.c["processed"] += 1
        for p in range(self.P):
            self.since[m][p] += 1
            self.pending[m][p] += 1.0

    def fail(self, m: int) -> None:
        """Learner m failed: its work not yet merged is lost, answers on the wire included (an
        answer a sync closed with is in that merge: it stays, to be booked when published)."""
        self.c["failures"] += 1
        self._lose(m, [a - b for a, b in zip(self.pending[m], self.merging[m], strict=True)])
        self.pending[m], self.wire[m] = list(self.merging[m]), [0.0] * self.P
        self.merged[m] = [False] * self.P

    # ---- events -------------------------------------------------------------------------------
    def send(self, p: int, learners, t: float, *, flush: bool = False) -> None:
        """The learners answer with their Δ of fragment p: all their unmerged work."""
        learners = list(learners)
        self._book_up(p, len(learners) * self.up_nbytes[p], t, flush)
        for m in learners:
            self.wire[m][p] = self.pending[m][p]
            self._host(m + 1, 0, self.up_nbytes[p])
        self._event("send", t, p, learners, flush=flush)

    def closing(self, p: int, learners) -> None:
        """The sync of fragment p closed with these learners' answers: their work is in the
        merge (booked as useful when it is published, `close`), a failure meanwhile or not."""
        for m in learners:
            self.merging[m][p] += self.wire[m][p]
            self.wire[m][p] = 0.0

    def drop(self, p: int, m: int) -> None:
        """The sync of fragment p closed without learner m's answer (it came too late): the work
        stays in the learner, unmerged, until an arrival overwrites it or it answers again."""
        self.wire[m][p] = 0.0

    def close(self, p: int, weights: dict, t: float, *, flush: bool = False, receivers=(),
              wait_s: float = 0.0, bytes_at: float | None = None, upload: bool = False) -> None:
        """The merge of fragment p from the learners in `weights` (learner -> weight), sent to
        the learners `receivers` (one reply each).

        `upload`: the close carries its own upload (DDP's all-reduce), booked at `bytes_at`."""
        if upload:
            self._book_up(p, len(weights) * self.up_nbytes[p], t if bytes_at is None else bytes_at,
                          flush)
        w = np.zeros(self.M, np.float32)
        for m, x in weights.items():
            w[m] = x
            merged = self.pending[m][p] if upload else self.merging[m][p] + self.wire[m][p]
            self.c["useful"] += self.share[p] * merged
            self.pending[m][p] -= merged
            self.wire[m][p] = self.merging[m][p] = 0.0
            self.merged[m][p] = not flush
        down = len(receivers) * self.down_nbytes[p]
        for m in receivers:
            self._host(0, m + 1, self.down_nbytes[p])
        self.c["down"] += down
        if down:
            k = _bin(t, self.timeline.t_ref)
            self.down_bins[k] = self.down_bins.get(k, 0) + down
        self.frag[p]["down_bytes"] += down
        self.frag[p]["syncs"] += 1
        self.c["outer_steps"] += 0 if flush else 1
        self.c["syncer_wait_s"] += wait_s
        at = {m: self.position(m) for m in weights} if upload else {}  # DDP: part of the step
        self.events.append(Event("close", t, p, weights=w, flush=flush, at=at))

    def arrive(self, p: int, learners, t: float) -> None:
        """The learners take fragment p: θ ← α·θ + (1−α)·Θ overwrites a share 1 − α of their
        unmerged work (an answer still on the wire stays: it may be merged yet; one in a closed
        sync's merge too)."""
        learners = list(learners)
        for m in learners:
            free = self.pending[m][p] - self.wire[m][p] - self.merging[m][p]
            lost = (1.0 - self.mix) * free * self.share[p]
            self.c["lost"] += lost
            if self.merged[m][p]:  # the steps after its merged answer: the overlap
                self.c["overlap_lost"] += lost
            self.pending[m][p] = self.wire[m][p] + self.merging[m][p] + self.mix * free
            self.since[m][p], self.merged[m][p] = 0, False
        self._event("arrive", t, p, learners)

    def reload(self, m: int, peer: int, t: float) -> None:
        """Learner m (back from a failure) loads Θ and learner `peer`'s inner state (`FRESH`:
        a fresh one, no learner being up): it holds the newest Θ_p of every fragment, so no
        answer of its own awaits a result (a close between its failure and the publish may
        have merged its last answer)."""
        self.since[m] = [0] * self.P
        self.merged[m] = [False] * self.P
        theta = min(self.rejoin_nbytes, self.theta_nbytes)
        state = self.rejoin_nbytes - theta if peer != FRESH else 0  # fresh: made where it is
        self.c["down"] += theta + state
        self._host(0, m + 1, theta + state)
        if state:
            self._host(peer + 1, 0, state)  # the peer's state, up to the syncer
        ev = self._event("reload", t, -1, [m])
        ev.peer = np.arange(self.M)
        ev.peer[m] = peer
        if peer != FRESH:
            ev.at[peer] = self.position(peer)

    def eval(self, progress: float, t: float, *, last: bool = False,
             complete: bool = True) -> None:
        """A history row at reference step `progress`, simulated time t. `last`: the end of the
        run, where the work no merge holds is lost; `complete`: the run did all its steps."""
        if last:
            for m in range(self.M):
                self._lose(m, self.pending[m])
                self.pending[m], self.wire[m] = [0.0] * self.P, [0.0] * self.P
                self.merging[m] = [0.0] * self.P
        peak = max((b for k, b in self.bins.items() if k != FLUSH_BIN), default=0)
        peak_down = max(self.down_bins.values(), default=0)
        offered = self.timeline.offered_steps(t)
        stats = dict(step=progress, sim_time_s=t,
                     tokens=self.c["processed"] * self.tokens_per_step,
                     comm_bytes=self.c["up"], down_bytes=self.c["down"], peak_step_bytes=peak,
                     peak_gbps=peak * 8 / self.timeline.t_ref / 1e9,
                     peak_down_gbps=peak_down * 8 / self.timeline.t_ref / 1e9,
                     outer_steps=self.c["outer_steps"], syncer_wait_s=self.c["syncer_wait_s"],
                     goodput=self.c["useful"] / offered if offered > 0 else math.nan,
                     learner_steps=self.c["processed"], useful_steps=self.c["useful"],
                     lost_steps=self.c["lost"], overlap_lost_steps=self.c["overlap_lost"],
                     failures=self.c["failures"], complete=complete)
        self.events.append(Event("eval", t, stats=stats))

    # ---- lock-step restarts -------------------------------------------------------------------
    def mark(self) -> dict:
        """A restore point (a lock-step checkpoint): everything a restart takes back."""
        keep = ("since", "pending", "wire", "merging", "merged")
        return dict(events=len(self.events), steps=[len(x) for x in self.index],
                    state={k: copy.deepcopy(getattr(self, k)) for k in keep},
                    c={k: self.c[k] for k in ("processed", "useful", "lost", "overlap_lost")})

    def wasted(self, n: int) -> None:
        """`n` learner-steps were computed and then thrown away (not recorded as steps)."""
        self.c["processed"] += n
        self.c["lost"] += n

    def rollback(self, mark: dict) -> None:
        """A failure stopped a lock-step job: undo everything since `mark` (every step since is
        lost, and will be done again)."""
        self.c["failures"] += 1
        del self.events[mark["events"]:]
        for m, n in enumerate(mark["steps"]):
            del self.index[m][n:], self.times[m][n:]
        for k, v in mark["state"].items():
            setattr(self, k, copy.deepcopy(v))
        redone = self.c["processed"] - mark["c"]["processed"]
        self.c.update(useful=mark["c"]["useful"], overlap_lost=mark["c"]["overlap_lost"],
                      lost=mark["c"]["lost"] + redone)
        mark["c"].update(processed=self.c["processed"], lost=self.c["lost"])  # a second restart

    # ---- the plan -----------------------------------------------------------------------------
    def finish(self) -> Plan:
        """Cut the events into blocks (see the module docstring)."""
        final = [len(x) for x in self.index]
        need, nxt = [None] * len(self.events), list(final)
        for i in range(len(self.events) - 1, -1, -1):
            for m, pos in self.events[i].at.items():
                nxt[m] = pos
            need[i] = list(nxt)
        blocks, pos, cur = [], [0] * self.M, None

        def open_block(target):
            steps = np.array(target) - np.array(pos)
            first = np.array([self.index[m][pos[m]] if steps[m] else 0 for m in range(self.M)])
            pos[:] = target
            blocks.append(Block(steps, first, []))
            return blocks[-1]

        for i, ev in enumerate(self.events):
            if cur is None or any(pos[m] < p for m, p in ev.at.items()):
                # The event's learners must reach their positions: n steps at most. Every other
                # learner fills the same n slots as far as its own next event allows.
                n = max([p - pos[m] for m, p in ev.at.items()] + [0])
                cur = open_block([min(need[i][m], pos[m] + n) for m in range(self.M)])
            cur.events.append(ev)
            if ev.kind == "eval":
                cur = None  # an evaluation ends its block
        if pos != final:
            open_block(final)
        return Plan(blocks, self.M, self.timeline.t_ref, [np.array(t) for t in self.times],
                    self.frag, dict(self.c), dict(tx=list(self.tx), rx=list(self.rx)))

    # ---- helpers ------------------------------------------------------------------------------
    def _lose(self, m: int, work: list) -> None:
        self.c["lost"] += sum(s * n for s, n in zip(self.share, work, strict=True))

    def _event(self, kind: str, t: float, p: int, learners: list, flush: bool = False) -> Event:
        at = {m: self.position(m) for m in learners}
        if kind in ("send", "arrive") and not flush:
            earlier = self._merge_target(kind, p, at)
            if earlier is not None:  # one device call for the learners of the same instant
                earlier.mask[learners] = True
                earlier.at.update(at)
                return earlier
        mask = np.zeros(self.M, bool)
        mask[learners] = True
        ev = Event(kind, t, p, mask=mask, at=at, flush=flush)
        self.events.append(ev)
        return ev

    def _merge_target(self, kind: str, p: int, at: dict, lookback: int = 64) -> Event | None:
        """An earlier send/arrive of fragment p to other learners that this one may join: every
        event in between must commute with it (another fragment, and the same positions of any
        learner they share)."""
        for ev in reversed(self.events[-lookback:]):
            if ev.kind not in ("send", "arrive"):
                return None
            shared = set(ev.at) & set(at)
            if ev.kind == kind and ev.fragment == p:
                return None if shared or ev.flush else ev
            if ev.fragment == p or any(ev.at[m] != at[m] for m in shared):
                return None
        return None

    def _host(self, a: int, b: int, nbytes: int) -> None:
        """A message of `nbytes` from host a to host b."""
        self.tx[a] += nbytes
        self.rx[b] += nbytes

    def _book_up(self, p: int, nbytes: int, t: float, flush: bool = False) -> None:
        self.c["up"] += nbytes
        self.frag[p]["up_bytes"] += nbytes
        k = FLUSH_BIN if flush else _bin(t, self.timeline.t_ref)
        self.bins[k] = self.bins.get(k, 0) + nbytes


def _bin(t: float, t_ref: float) -> int:
    """The reference step a time falls in: (k−1)·t_ref < t ≤ k·t_ref (sends after step k)."""
    return max(1, math.ceil(t / t_ref - 1e-9))
