"""Decoupled DiLoCo on Ray actors: each learner its own process, a syncer actor, real failures.

    from diloco_lite.actors import train_actors
    result = train_actors(config)          # config.algorithm: a DecoupledDiLoCo

- Each learner is an actor (its own OS process, one CPU device here) running `LearnerProgram`
  at its own pace: its steps are padded to the `Cluster`'s step times (`Timeline.duration`),
  so the same `Cluster` runs on both clocks. It runs its own rules (`actors.agent`) on what the
  syncer told it in advance: no call at its step boundaries, but where a notice not heard yet
  could change what it does there (then it waits for the syncer to have handled every event up
  to that instant); it sends its answers (the wire format's bytes and its report) and never
  waits for a merge.
- The syncer is an actor holding Θ, the outer optimizer states and `SyncerRuntime`, with a
  thread of its own for the timers (asks, grace deadlines, publishes) and the merges. At each
  close it sends every learner up a publish notice, and its reply (Θ_p, or its `down_bits`
  update) once merged.
- Failures are real: at the start of each of the `Cluster`'s failure windows, the driver
  kills the learner's process through Ray (`ray.kill`, for good: on whichever node it runs,
  also a spare still starting after an earlier kill), logs the kill and tells the syncer of
  the failure at once (it need not wait for Ray to notice). A warm spare of its host (two a
  learner on one machine, one a host on the testbed: `actors.pool`), built and compiled
  before the clock started, takes its slot and waits out the window, then reloads Θ and a
  healthy peer's inner optimizer state at that peer's next step boundary, fetched from the
  peer's process (none up: a fresh one); the pool builds a new spare behind it, one at a
  time. A learner that dies of anything else is replaced the same way once Ray reports its
  death. If the syncer dies, the run stops with a message: Θ lived there (no checkpoint).
- Each learner stops at its share of the budget (`actors.budget`); once every learner up has
  stopped (each after the syncer has every answer it sent), the syncer books the run
  (`actors.booking`) and plans the flush.
- The run writes the history columns of `train` (`sim_time_s` holds the real seconds since the
  start), and `RunResult.plan` holds what really happened as a plan, which
  `training.train(config, plan=result.plan)` replays on the emulated mesh.

Nothing polls: the syncer's threads wait on a condition and its timers
(`actors.syncer_actor`), the driver on the learners' runs and a long poll of the syncer's
status, at most until the next failure window. A message lost on its way to a learner is
sent again when the learner finds it missing (`actors.inbox`).

One clock: every process times its events with its own `time.time()` against the one t0 the
driver sets. On one machine that is one clock; across hosts it assumes their clocks agree to
well below `hold_s` (the syncer handles each event `hold_s` after its time: an offset of that
size could reorder events). Each learner's offset against the syncer's clock is measured at
the start (Cristian's method, `Pool.clock_offsets`), reported in `RunResult.runtime`, and a
warning is given where one certainly exceeds hold_s / 2.

The local Ray instance it starts binds the loopback address only (`start_local_ray`).
Ray is an optional extra (`pip install "diloco_lite[cluster]"`); only this module and
`actors.ray_actors` (the two actor classes) import it.
Every actor and the local Ray instance this call started are gone when it returns, fails or
is interrupted.
"""

from __future__ import annotations

import math
import os
import time
import warnings

import numpy as np

from ..config import DecoupledDiLoCo, check
from ..validate import check_nonnegative, check_positive
from .pool import Pool
from .ray_actors import import_ray

LONG_POLL_S = 10.0  # the longest the driver's long poll of the syncer waits for a change


def train_actors(config, *, init_params=None, progress: bool = True, hold_s: float = 0.01,
                 stall_s: float = 120.0, start_in_s: float = 0.5, placement: bool = False,
                 meter=None, spares: bool | None = None, idle_s: float = 0.0, drop=None,
                 resend_s: float | None = None):
    """Run `config` (a Decoupled DiLoCo run) on Ray actors; returns a `RunResult` whose history
    has `train`'s columns on the wall clock, and whose `plan` is what really happened (module
    docstring). Starts a local Ray instance unless one is running (`ray.init` first to use a
    cluster), and stops what it started. `placement`: the syncer on the node with resource
    `host0`, learner m (and its host's spare) on `host<m+1>` (`actors.hosts`: one node per testbed
    host). `meter()`: per-host interface counters, read at the start of the clock and after the
    flush; their growth goes to `RunResult.wire`. `spares`: whether to keep warm spare processes
    (`actors.pool`; None: where the `Cluster` has failures). `idle_s`: after the run, the
    syncer's CPU over that many idle seconds is measured. `drop` (tests only): (m, k) loses
    the k-th numbered message to learner m on the way (a resend recovers it); `resend_s`: how
    long a learner waits for a message it knows is due before it asks again (None:
    `inbox.RESEND_S`).

    `RunResult.runtime` (an attribute beside the fields) holds what the runtime itself
    measured: the syncer's CPU (`cpu`: seconds of its process over the run and idle), the
    messages sent again (`resent`), answers re-stamped (`restamped`), the learners' clock
    offsets against the syncer's (`clock`), per kill the replacement's times (`kills`), and
    the returning learners whose peer died before they fetched its state (`refetched`)."""
    import jax

    from ..model import count_params
    from ..training import RunResult, make_evaluator, setup

    check(isinstance(config.algorithm, DecoupledDiLoCo), "RunConfig.algorithm",
          type(config.algorithm).__name__, "a DecoupledDiLoCo (the actor runtime runs "
          "Decoupled DiLoCo; the lock-step methods run on jax.distributed: diloco_lite.launch)")
    check_nonnegative("hold_s", hold_s)
    check_nonnegative("start_in_s", start_in_s)
    check_nonnegative("idle_s", idle_s)
    if resend_s is not None:
        check_positive("resend_s", resend_s)
    check_positive("stall_s", stall_s)
    ray = import_ray()
    corpus, model, _, _ = setup(config, workers=1)
    params = init_params if init_params is not None else model.init(config.seed)
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(params))
    from ..devices import enable_compilation_cache

    cache_dir = str(enable_compilation_cache())
    started = not ray.is_initialized()
    if started:
        start_local_ray(ray)
    pool = Pool(ray, config, placement, spares)
    try:
        # the initial parameters: each actor draws them from the seed, unless given (then they
        # are held here for the whole run: a spare is built from the same ones)
        shared = ray.put(params) if init_params is not None else None
        pool.build(shared, hold_s, cache_dir, drop, resend_s)
        clock = pool.clock_offsets(hold_s)
        t0 = time.time() + start_in_s
        first = ray.get(pool.syncer.start.remote(t0, pool.learners))
        start, metered = (meter(), time.time()) if meter is not None else (None, None)
        out = _drive(ray, config, pool, t0, first, progress, stall_s)
        if meter is not None:
            out["wire"] = [{**{k: b[k] - a[k] for k in b}, "s": time.time() - metered}
                           for a, b in zip(start, meter(), strict=True)]
            for m in range(config.workers):  # the Ray calls between learner m and the syncer
                out["wire"][m + 1].update({f"{what}_{way}": out[what].get((m, way), 0)
                                           for what in ("calls", "unbooked", "direct")
                                           for way in ("up", "down")})
        if idle_s:
            out["cpu"] = ray.get(pool.syncer.idle.remote(idle_s))
    finally:
        pool.close()
        if started:
            ray.shutdown()
    evaluate = make_evaluator(model, corpus, config)
    from ..training import _history

    rows = [{**r["stats"], **evaluate(jax.tree.unflatten(jax.tree.structure(params),
                                                         r["params"])),
             "wall_time_s": r["stats"]["sim_time_s"],
             "train_time_s": r["stats"]["sim_time_s"], "diags": r["diags"]} for r in out["rows"]]
    plan = out["plan"]
    history = _history(rows, [_losses(out["losses"], config.workers)], plan)
    import pandas as pd

    result = RunResult(config=config, history=history, params=out["params"],
                       n_params=count_params(params),
                       fragments=pd.DataFrame(plan.fragments).rename_axis("fragment")
                       .reset_index(), counters=plan.final, plan=plan, log=out["log"],
                       wire=out.get("wire"))
    result.runtime = dict(cpu=out["cpu"], resent=sum(out["resent"].values()),
                          restamped=out.get("restamped", 0), clock=clock, kills=out["kills"],
                          refetched=sum(out["refetched"].values()))
    return result


def start_local_ray(ray) -> None:
    """A new local Ray instance whose node binds the loopback address only (127.0.0.1): its
    daemons and workers take cloudpickled calls, so with authentication turned off they must not
    listen on the LAN. Ray 2.60 replaces a node address of 127.0.0.1 by the routable one unless
    its cluster mode is off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read when Ray is imported):
    it is turned off for this call only (and for the processes it starts, which inherit the
    variable), so a later `ray.init(address=...)` of this process joins a cluster as before."""
    from ray._private import ray_constants  # pinned Ray (the cluster extra): 2.60

    var, was = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER
    old = os.environ.get(var)
    os.environ[var], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        with warnings.catch_warnings():  # Ray starts its processes by fork + exec: harmless
            warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
            # address="local": a new instance, even where `ray start` left a cluster running
            ray.init(address="local", num_cpus=os.cpu_count() or 2, include_dashboard=False,
                     log_to_driver=True, logging_level="ERROR", configure_logging=True,
                     _node_ip_address="127.0.0.1")
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = was
        if old is None:
            del os.environ[var]
        else:
            os.environ[var] = old


def _drive(ray, config, pool, t0, first, progress, stall_s) -> dict:
    """Watch the learners until the budget is spent: kill them at the `Cluster`'s failure
    windows (each kill is a failure the syncer hears of at once), put a spare in a dead
    learner's place (it waits out the window); then flush and collect the result. `first`:
    each learner's first messages. It waits on the learners' runs and a long poll of the
    syncer's status (`Syncer.changed`), at most until the next failure window opens."""
    from ..clock import Timeline
    from ..training import _progress

    M, syncer = config.workers, pool.syncer
    timeline = Timeline(config.cluster, M)
    window = [0] * M
    back_at = [None] * M
    running = {pool.learners[m].run.remote(syncer, t0, first[m]): m for m in range(M)}
    kills = []  # (learner, kill time, the window's end)
    poll, st = syncer.changed.remote(-1, 0.0), dict(ending=None)
    last, seen = time.time(), -1

    def replace(m, back):  # slot m's process died: a spare takes slot m, waits out `back`,
        running[pool.promote(m).run.remote(syncer, t0, None, back, slot=m)] = m  # rejoins

    with _progress(config, progress) as bar:
        while True:
            ahead = [w[0] for w in (timeline.window(m, window[m]) for m in range(M))
                     if w is not None]
            timeout = max(0.0, min(ahead) - (time.time() - t0)) if ahead and \
                st["ending"] is None else None
            done, _ = ray.wait([poll, *running, *pool.pending()], num_returns=1,
                               timeout=timeout)
            for ref in [r for r in done if r in pool.pending()]:
                try:
                    pool.built(ref)  # a spare is ready: the next owed one is begun
                except ray.exceptions.RayActorError:
                    raise RuntimeError("a spare learner process died while it was being built "
                                       "(out of memory?): the pool cannot refill") from None
            if poll in done:
                version, st = _checked(ray, poll)
                poll = syncer.changed.remote(version, min(stall_s, LONG_POLL_S))
                if st["processed"] != seen:
                    seen, last = st["processed"], time.time()
                    bar.update(seen / M - bar.n)
                elif time.time() - last > stall_s:
                    raise RuntimeError(f"the actor run made no progress for {stall_s:g} s "
                                       f"(syncer: {st})")
                if st["ending"] is not None and not st["merging"]:
                    break  # every learner up has stopped at its share of the budget
            for ref in [r for r in done if r in running]:
                m = running.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:  # its process died (or the syncer did)
                    _status(ray, syncer)  # the syncer's death ends the run, with its message
                    ray.get(syncer.failed.remote(m))  # (down already: voids its rejoin only)
                    if st["ending"] is None and np.isfinite(back_at[m] or 0.0):
                        replace(m, back_at[m] or 0.0)
                except ray.exceptions.RayTaskError as e:
                    _status(ray, syncer)  # the syncer's death explains it, when it died
                    raise RuntimeError(f"learner {m} failed: {e}") from None
            now = time.time() - t0
            for m in range(M):
                w = timeline.window(m, window[m])
                if w is not None and now >= w[0] and st["ending"] is None:
                    window[m] += 1
                    if ray.get(syncer.window.remote(m, w[1], not np.isfinite(w[1]))) != "kill":
                        # still down from an earlier kill: down until w[1], no new kill
                        back_at[m] = max(back_at[m] or 0.0, w[1])
                        mine = [i for i, k in enumerate(kills) if k[0] == m]
                        if mine:  # (its kill's replacement is timed from the new end)
                            kills[mine[-1]] = (m, kills[mine[-1]][1], back_at[m])
                        continue
                    back_at[m] = w[1]
                    for ref in [r for r, q in running.items() if q == m]:
                        del running[ref]  # (its end is no news)
                    pool.kill(m)  # its process, wherever it runs, even one still starting
                    ray.get(syncer.killed.remote(m, not np.isfinite(w[1])))
                    ray.get(syncer.failed.remote(m))  # the driver knows: no wait for Ray
                    kills.append((m, now, w[1]))
                    if np.isfinite(w[1]):
                        replace(m, w[1])
    while True:  # the flush: every payload first (a learner may turn out to be dead)
        jobs, dead = ray.get(syncer.flushes.remote()), None
        for job in jobs:
            for m in job.weights:
                try:
                    job.payloads[m] = ray.get(pool.learners[m].flush_payload.remote(job.p))
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                    # it died before the end (heard of only now), or a spare never rejoined
                    dead = m
                    break
            if dead is not None:
                break
        if dead is None:
            break
        ray.get(syncer.failed.remote(dead))
    for job in jobs:
        ray.get(syncer.flush.remote(job))
    out = ray.get(syncer.result.remote())
    out["kills"] = _kills(kills, out["firsts"])
    return out


def _kills(kills: list, firsts: list) -> list[dict]:
    """Per kill (learner, kill time, the window's end), what its replacement took: `ready_s`,
    from the kill until the process that served next began its run (a warm spare: at once),
    and `first_step_s`, from the window's end until that process's first step (the delay the
    simulated clock does not know of); NaN when none did (killed again first, or the end)."""
    out = []
    for i, (m, kill, back) in enumerate(kills):
        nxt = next((k for q, k, _ in kills[i + 1:] if q == m), math.inf)
        run = next(((ready, step) for q, life, ready, step in sorted(firsts, key=lambda f: f[2])
                    if q == m and life > 0 and kill <= ready and step < nxt), None)
        ready, step = run if run is not None else (math.nan, math.nan)
        out.append(dict(learner=m, kill_s=kill, back_s=back, ready_s=ready - kill,
                        first_step_s=step - back))
    return out


def _checked(ray, ref) -> tuple:
    """The syncer's (version, status) from `ref` (`Syncer.changed`), or the run stops, saying
    why."""
    return _from_syncer(ray, ref, LONG_POLL_S + 30.0)


def _status(ray, syncer) -> dict:
    return _from_syncer(ray, syncer.status.remote(), 30.0)


def _from_syncer(ray, ref, timeout_s: float):
    """What the syncer answered on `ref` (its status, or (version, status)), or the run stops:
    the syncer died, stopped answering, or says it failed."""
    try:
        out = ray.get(ref, timeout=timeout_s)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
        raise RuntimeError("the syncer actor died or stopped answering: Θ and the outer "
                           "optimizer state lived there, so the run cannot go on "
                           f"({type(e).__name__})") from None
    st = out[1] if isinstance(out, tuple) else out
    if st["error"]:
        raise RuntimeError(f"the syncer failed: {st['error']}")
    return out


def _losses(losses: list, M: int):
    """The learners' step losses as `training._history` takes them: one [M, n] block."""
    per = [[x for m2, _, x in losses if m2 == m] for m in range(M)]
    n = max((len(x) for x in per), default=0)
    out = np.full((M, max(n, 1)), np.nan)
    for m, x in enumerate(per):
        out[m, :len(x)] = x
    return [out], np.array([len(x) for x in per])
