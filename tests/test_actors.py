"""Decoupled DiLoCo on real actors (`diloco_lite.actors`).

The first tests need no Ray: they drive the wall-clock syncer (`SyncerRuntime`) by hand, with
learners that report on a free link at once, and require the plan it records to be the
simulated clock's plan (`make_plan`), event for event: the two drivers of `SyncerState` apply
the same rules. The last ones start Ray (skipped where it is not installed: the `cluster`
extra): the synchronous limit gives the simulated run's parameters, a learner really killed
comes back, and the recorded run replays to its own parameters on the emulated mesh.
"""

import heapq
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import diloco_lite as dl
from diloco_lite.actors.syncer import SyncerRuntime
from diloco_lite.algorithms import make_driver
from diloco_lite.clock import Cluster, Timeline
from diloco_lite.clock.plan import make_plan
from diloco_lite.clock.syncer import BOUNDARY, DEADLINE
from diloco_lite.training import COLUMNS, eval_points, setup
from tests.helpers import max_abs_diff, tiny_run


def decoupled(workers=3, steps=24, cluster=None, **algo):
    algo = dl.DecoupledDiLoCo(**{**dict(inner_steps=4, fragments=2, overlap=1, quorum=workers,
                                        grace_safety=0.0, bits=32), **algo})
    return tiny_run(algo, workers=workers, steps=steps, eval_every=8,
                    cluster=cluster or Cluster(step_time_s=0.2))


def simulated_plan(cfg):
    _, model, mesh, opt = setup(cfg)
    d = make_driver(cfg, model, mesh, opt, model.init(cfg.seed))
    return make_plan(cfg, up_nbytes=d.up_nbytes, down_nbytes=d.down_nbytes, sizes=d.sizes,
                     rejoin_nbytes=d.rejoin_nbytes, eval_at=eval_points(cfg))


def by_hand(cfg):
    """Drive `SyncerRuntime` as the actors do, on a free link with instant merges: every
    learner's boundaries at its `Timeline` times; the answers of an instant arrive after every
    boundary of that instant (the simulated clock's order), merges are published at once."""
    _, model, _, _ = setup(cfg, workers=1)
    rt = SyncerRuntime(cfg, model.init(cfg.seed), hold_s=0.0)
    timeline = Timeline(cfg.cluster, cfg.workers)
    nbytes = {p: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(rt.like[p]))
              for p in range(rt.P)}
    rt.start()
    heap = [(timeline.duration(m, 0), m, m) for m in range(cfg.workers)]  # (T, order, m)
    heapq.heapify(heap)
    k, order = [0] * cfg.workers, cfg.workers

    def timers(to, before):  # what the syncer's own thread does: timers, then merges at once
        rt.advance(to, before)
        while (job := rt.next_merge()) is not None:
            rt.publish(job, rt.merge(job), rt.clock)
            rt.advance(to, before)

    while heap and rt.ending is None:
        T = heap[0][0]
        timers(T, BOUNDARY)
        answers = []
        while heap and heap[0][0] == T:
            _, _, m = heapq.heappop(heap)
            reply = rt.boundary(m, T, 0.0)
            if reply.stop:
                continue
            answers += [(m, p, sync) for p, sync in reply.answer]
            k[m] += 1
            heapq.heappush(heap, (T + timeline.duration(m, k[m]), order, m))
            order += 1
        for m, p, sync in answers:
            rt.answered(m, p, sync, np.zeros(nbytes[p], np.uint8), T, T)
        timers(T, DEADLINE + 1)
    for job in rt.flushes():
        job.payloads = {m: np.zeros(nbytes[job.p], np.uint8) for m in job.weights}
        rt.publish(job, rt.merge(job), rt.clock)
    return rt.result()


def events(plan):
    """The plan's decisions, one per learner and event, sorted: who sends, applies or reloads
    which fragment at which of its own steps; each close's time and weights. (How events are
    grouped may differ, and a group carries its first event's time; an evaluation's place among
    the events of its instant may differ.)"""
    out = []
    for b in plan.blocks:
        for e in b.events:
            t = round(e.time_s, 9)
            if e.kind == "close":
                out.append((t, "close", e.fragment, -1, -1, tuple(e.weights.tolist()), e.flush))
            elif e.kind != "eval":
                out += [(-1, e.kind, e.fragment, m, pos, (), e.flush) for m, pos in e.at.items()]
    return sorted(out)


@pytest.mark.parametrize("cluster,algo", [
    (Cluster(step_time_s=0.2), dict()),  # the synchronous limit
    (Cluster(step_time_s=(0.2, 0.2, 0.5)), dict(quorum=1, grace_safety=0.5, overlap=2)),
    (Cluster(step_time_s=(0.2, 0.3, 0.2), jitter=0.3), dict(quorum=2, grace_safety=1.0)),
])
def test_the_wall_clock_syncer_records_the_simulated_plan(cluster, algo):
    """Slow learners, a quorum, the grace window, token weights, the end-of-run flush: driven by
    hand on a free link, the runtime's syncer takes every decision the simulated clock takes."""
    cfg = decoupled(cluster=cluster, **algo)
    out = by_hand(cfg)
    want = simulated_plan(cfg)
    assert events(out["plan"]) == events(want)
    for key in ("processed", "useful", "lost", "up", "down", "outer_steps"):
        assert out["plan"].final[key] == pytest.approx(want.final[key], rel=1e-9), key
    last = out["rows"][-1]["stats"]
    assert last["step"] == cfg.steps and last["learner_steps"] == cfg.workers * cfg.steps


def test_an_answer_sent_after_the_budget_is_left_out():
    """The learner that finishes after the budget ran out is told to stop, and an answer sent
    later than the end is not merged (the simulated clock stops there too)."""
    cfg = decoupled(steps=8)
    _, model, _, _ = setup(cfg, workers=1)
    rt = SyncerRuntime(cfg, model.init(0), hold_s=0.0)
    rt.start()
    for T in np.arange(1, 9) * 0.2:
        for m in range(3):
            assert not rt.boundary(m, float(T), 0.0).stop
    assert rt.ending == pytest.approx(1.6)
    assert rt.boundary(0, 1.8, 0.0).stop
    rt.answered(1, 0, 99, np.zeros(4, np.uint8), 1.8, 1.8)
    assert not rt.payloads[0]


# ---- on Ray --------------------------------------------------------------------------------------

ray = pytest.importorskip("ray", reason="the actor runtime's tests need Ray (the cluster extra)")


def ray_processes(wait_s: float = 20.0) -> list:
    """Ray's processes still running (its daemons and its workers, `ray::…`; zombies aside),
    after waiting up to `wait_s` for killed ones to go."""
    import time

    deadline = time.time() + wait_s
    while True:
        out = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout
        alive = [line for line in out.splitlines()
                 if any(k in line for k in ("raylet", "gcs_server", "ray::"))
                 and not line.startswith("Z") and "ps -eo" not in line]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.5)


def test_actors_in_the_synchronous_limit_are_the_simulated_run():
    """Equal speeds, K = M, no grace, no failure: each learner its own process, the syncer an
    actor, real messages and real waits, and the parameters are the simulated run's."""
    from diloco_lite.actors import train_actors

    cfg = decoupled(steps=16, cluster=Cluster(step_time_s=0.25))
    real = train_actors(cfg, progress=False)
    sim = dl.train(cfg, progress=False)
    assert max_abs_diff(real.params, sim.params) < 1e-5
    assert list(real.history.columns[:len(COLUMNS)]) == COLUMNS
    assert real.history["step"].tolist() == sim.history["step"].tolist()
    assert real.final["comm_bytes"] == sim.final["comm_bytes"]
    assert real.final["learner_steps"] == cfg.workers * cfg.steps
    assert real.final["sim_time_s"] == pytest.approx(sim.final["sim_time_s"], abs=0.2)
    assert ray_processes() == []


def test_a_killed_learner_comes_back_and_the_run_replays():
    """Learner 1's process gets SIGKILL at 0.6 s; Ray restarts it, it reloads Θ and a peer's
    state and answers again. What happened (`result.plan`) replays on the emulated mesh to the
    same parameters."""
    from diloco_lite.actors import train_actors

    # long enough that a slow restart (a new process: Python, JAX, the compiled programs from
    # the disk cache; up to ~12 s on 2 busy cores) still rejoins and answers before the end
    cfg = decoupled(steps=48, quorum=2, grace_safety=0.5,
                    cluster=Cluster(step_time_s=0.2, failures=((1, 0.6, 1.5),)))
    real = train_actors(cfg, progress=False)
    kinds = [(kind, m) for _, kind, m, _ in real.log if kind in ("fail", "rejoin")]
    assert kinds == [("fail", 1), ("rejoin", 1)]
    assert real.final["failures"] == 1 and real.final["lost_steps"] > 0
    assert real.final["learner_steps"] == cfg.workers * cfg.steps
    steps = [len(t) for t in real.plan.step_time]
    assert steps[1] < steps[0] and sum(steps) == cfg.workers * cfg.steps
    back = [t for t, kind, m, _ in real.log if kind == "rejoin"][0]
    assert any(m == 1 and kind == "answer" and t > back for t, kind, m, _ in real.log)
    replay = dl.train(cfg, progress=False, plan=real.plan)
    assert max_abs_diff(real.params, replay.params) < 1e-5
    assert np.isfinite(real.final["val_loss"])
    assert ray_processes() == []


def test_the_actor_runtime_refuses_other_methods_and_says_what_it_needs(monkeypatch):
    from diloco_lite.actors import train_actors

    with pytest.raises(ValueError, match="RunConfig.algorithm"):
        train_actors(tiny_run(dl.DiLoCo(inner_steps=2)))
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"diloco_lite\[cluster\]"):
        train_actors(decoupled())


def test_importing_the_actor_runtime_imports_no_ray():
    code = ("import sys, diloco_lite.actors, diloco_lite.actors.runtime; "
            "assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_killing_the_syncer_ends_the_run_with_a_message():
    """The syncer held Θ: when its process dies the run stops at once, says why, and leaves no
    Ray process behind (no hang)."""
    import threading
    import time

    from diloco_lite.actors import train_actors

    cfg = decoupled(steps=400, cluster=Cluster(step_time_s=0.05))
    out = {}

    def run():
        try:
            train_actors(cfg, progress=False)
        except RuntimeError as e:
            out["error"] = str(e)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.time() + 120
    while time.time() < deadline and not out:
        titles = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True,
                                text=True).stdout.splitlines()
        if any("ray::Learner.run" in t for t in titles):  # the learners are training
            pid = next(int(t.split()[0]) for t in titles if "ray::Syncer" in t)
            os.kill(pid, 9)
            break
        time.sleep(0.2)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "syncer" in out.get("error", "") and "cannot go on" in out["error"]
    assert ray_processes() == []


def test_ctrl_c_leaves_no_ray_process_behind(tmp_path):
    """A user who stops a run (Ctrl-C: SIGINT) gets their prompt back, and every Ray process the
    run started is gone."""
    import signal
    import time

    script = tmp_path / "run.py"
    script.write_text(
        "import signal\n"  # as in a terminal, even when this test runs as a background job
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import diloco_lite as dl\n"
        "dl.emulate_devices(1)\n"
        "from diloco_lite.actors import train_actors\n"
        "from tests.test_actors import decoupled\n"
        "from diloco_lite.clock import Cluster\n"
        "train_actors(decoupled(steps=2000, cluster=Cluster(step_time_s=0.05)), progress=False)\n")
    assert ray_processes() == []  # none left by an earlier test: the ones below are its own
    proc = subprocess.Popen([sys.executable, str(script)], cwd=os.getcwd(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.time() + 120
    while time.time() < deadline:
        titles = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        if "ray::Learner.run" in titles:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    time.sleep(1.0)
    assert ray_processes() == []


@pytest.mark.skipif(bool(__import__("diloco_lite.distributed.testbed", fromlist=["x"])
                         ._unavailable()), reason="the testbed needs root and iproute2")
def test_on_the_testbed_the_answers_and_fragments_cross_each_learners_link():
    """One Ray node per testbed host: each learner's answers leave its host's interface and the
    fragments it applies arrive through it (the wire format's bytes, and Θ_p in fp32), beside
    Ray's own traffic; every node is stopped afterwards."""
    from diloco_lite.actors.hosts import train_on_testbed
    from diloco_lite.clock import Link
    from diloco_lite.distributed.testbed import Testbed

    cfg = decoupled(workers=2, steps=12, quorum=1, grace_safety=0.5, bits=4)
    with Testbed(3, Link(gbit_per_s=0.1), quiet=True) as bed:
        real = train_on_testbed(cfg, bed, progress=False)
    up = real.final["comm_bytes"] / 2
    _, model, _, _ = setup(cfg, workers=1)
    n = [sum(x.size for x in jax.tree.leaves(model.init(0)))]
    applied = [sum(1 for _, kind, q, _ in real.log if kind == "apply" and q == m) for m in (0, 1)]
    for m in (0, 1):
        host = real.wire[m + 1]
        assert host["tx_bytes"] > up  # its answers (and Ray's calls) left through its link
        # each fragment it applied came down in fp32 (P = 2 fragments of about half the model)
        assert host["rx_bytes"] > 0.4 * applied[m] * 4 * n[0] / 2
    assert real.final["learner_steps"] == 24
    assert ray_processes() == []


def test_a_learner_killed_just_before_the_end_is_left_out_of_the_flush():
    """Killed 0.3 s before the budget runs out, its death is reported after the end: the flush
    must not take a Δ from it (dead, or a new process that never rejoined), and the run ends
    with the replay's parameters."""
    from diloco_lite.actors import train_actors

    cfg = decoupled(steps=16, quorum=2, grace_safety=0.5,
                    cluster=Cluster(step_time_s=0.25, failures=((1, 3.3, 60.0),)))
    real = train_actors(cfg, progress=False)
    assert real.final["failures"] == 1
    flushed = [e for b in real.plan.blocks for e in b.events if e.kind == "close" and e.flush]
    assert flushed and all(e.weights[1] == 0 for e in flushed)
    replay = dl.train(cfg, progress=False, plan=real.plan)
    assert max_abs_diff(real.params, replay.params) < 1e-5
    assert ray_processes() == []
