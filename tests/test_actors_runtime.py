"""The actor runtime's machinery (`diloco_lite.actors.runtime`, `actors.ray_actors`): where its
local Ray instance listens, no spin loop, lost messages recovered, warm spares, clock offsets.

The tests that start Ray are `slow` and skipped where Ray is not installed (the `cluster`
extra); the source checks run anyway.
"""

import ast
from pathlib import Path

import pytest

from tests.test_actors import needs_ray, ray_processes

ACTORS = Path(__file__).resolve().parents[1] / "diloco_lite" / "actors"


@needs_ray
def test_the_local_ray_instance_listens_on_loopback_only():
    """Its node (daemons, workers) is 127.0.0.1, also as an actor sees it; and the cluster mode
    the call turned off is back on afterwards (a later `ray.init(address=...)` joins a cluster
    on the routable address)."""
    import os

    import ray
    from ray._private import ray_constants

    from diloco_lite.actors.runtime import start_local_ray

    was = ray_constants.ENABLE_RAY_CLUSTER
    start_local_ray(ray)
    try:
        @ray.remote(num_cpus=0)
        def where():
            return ray.util.get_node_ip_address()

        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        assert ray.get(where.remote()) == "127.0.0.1"
        assert ray_constants.ENABLE_RAY_CLUSTER == was
        assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    finally:
        ray.shutdown()
    assert ray_processes() == []


# ---- no spin loop ----------------------------------------------------------------------------

def spin_loops(source: str) -> list[int]:
    """Lines of `source` where a `while` loop sleeps a fixed short time (< 0.1 s) and goes
    round again: a poll, where a wait on a condition, a queue or a timer belongs."""
    found = []
    for loop in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.While)):
        for call in (n for n in ast.walk(loop) if isinstance(n, ast.Call)):
            f = call.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name == "sleep" and call.args and isinstance(call.args[0], ast.Constant) \
                    and isinstance(call.args[0].value, int | float) and call.args[0].value < 0.1:
                found.append(call.lineno)
    return found


def test_spin_loop_check_finds_a_poll():
    """The check itself, on the loop the syncer had (and on one that waits instead)."""
    poll = "while True:\n    with lock:\n        x = f()\n    if x is None:\n" \
           "        time.sleep(0.002)\n        continue\n"
    assert spin_loops(poll) == [5]
    assert spin_loops("while True:\n    cv.wait(timeout)\n    time.sleep(max(0.0, t))\n") == []


def test_no_spin_loop_is_left_in_the_actor_runtime():
    polls = {p.name: spin_loops(p.read_text()) for p in sorted(ACTORS.glob("*.py"))}
    assert {name: lines for name, lines in polls.items() if lines} == {}


# ---- numbered messages, lost ones recovered (no Ray) -----------------------------------------

def test_the_inbox_takes_messages_in_order_once_each():
    """Sent 1..5, arrived 2, 1, 4, 4 (twice), one for an earlier process, 3: taken in order
    1, 2, then (once 3 came) 3, 4; a copy of a taken one is dropped."""
    from diloco_lite.actors.inbox import Inbox

    box, got = Inbox(0), []
    box.begin(life=1, taken=0)
    for n in (2, 1, 4, 4):
        box.put(f"m{n}", None, 1, n)
    box.put("old", None, 0, 3)  # for process 0 of this learner: dropped
    assert box.take(lambda msg, reply: got.append(msg))
    assert got == ["m1", "m2"] and box.taken == 2
    box.put("m3", None, 1, 3)
    box.put("m1", None, 1, 1)  # a resent copy of one taken
    box.take(lambda msg, reply: got.append(msg))
    assert got == ["m1", "m2", "m3", "m4"] and box.taken == 4 and box.early == {}


def test_a_lost_message_is_resent_and_a_lasting_gap_ends_in_message_lost(monkeypatch):
    """Message 2 of 3 is lost: after `RESEND_S` with nothing new, the learner asks for what came
    after its last (1), gets 2 and 3 (3 twice: it had come), and takes them once each. When
    the resends bring nothing, `MessageLost` says what it waited for, after `RESENDS`."""
    import diloco_lite.actors.inbox as inbox

    monkeypatch.setattr(inbox, "RESEND_S", 0.01)
    monkeypatch.setattr(inbox, "RESENDS", 3)
    sent = [(1, "m1", None), (2, "m2", b"reply"), (3, "m3", None)]
    box, got, asked = inbox.Inbox(4), [], []
    box.begin(life=0, taken=0)
    for n, msg, reply in (sent[0], sent[2]):
        box.put(msg, reply, 0, n)

    def resend(taken):
        asked.append(taken)
        return [e for e in sent if e[0] > taken]

    def take(block_s):
        return box.take(lambda msg, reply: got.append((msg, reply)), block_s)

    box.wait(lambda: box.taken >= 3, take, resend, lambda: "message 3")
    assert got == [("m1", None), ("m2", b"reply"), ("m3", None)] and asked == [1]
    with pytest.raises(inbox.MessageLost, match="learner 4: waited for message 5.*3 resends"):
        box.wait(lambda: box.taken >= 5, take, resend, lambda: "message 5")
    assert asked == [1, 3, 3, 3]


def test_the_syncers_log_resends_what_came_after_and_forgets_the_rest():
    from diloco_lite.actors.inbox import Sent

    log = Sent(2)
    for n in (4, 5, 6):
        log.add(1, 0, n, f"m{n}", None)
    assert [e[0] for e in log.after(1, 0, 4)] == [5, 6]
    assert log.after(1, 1, 0) == [] and log.after(0, 0, 0) == []  # another process, learner
    log.add(1, 1, 1, "new", None)  # learner 1's next process: the earlier one's log is void
    assert log.after(1, 1, 0) == [(1, "new", None)] and log.after(1, 0, 0) == []


@needs_ray
def test_a_message_lost_on_the_way_is_resent_and_the_run_is_the_same():
    """The synchronous limit (tests/test_actors.py: the simulated run's parameters), with the
    2nd numbered message to learner 1 lost on the way: learner 1 waits for it, asks again
    (after 0.05 s here, well within a step: the synchronous limit holds), and the run ends with
    the simulated run's parameters, a message resent."""
    import diloco_lite as dl
    from diloco_lite.actors import train_actors
    from diloco_lite.clock import Cluster
    from tests.helpers import max_abs_diff
    from tests.test_actors import decoupled

    cfg = decoupled(steps=16, cluster=Cluster(step_time_s=0.25))
    real = train_actors(cfg, progress=False, drop=(1, 2), resend_s=0.05)
    sim = dl.train(cfg, progress=False)
    assert max_abs_diff(real.params, sim.params) < 1e-5
    assert real.final["learner_steps"] == cfg.workers * cfg.steps
    assert real.runtime["resent"] >= 1
    cpu = real.runtime["cpu"]
    assert 0 < cpu["run_cpu_s"] and 0 < cpu["run_s"]
    clock = real.runtime["clock"]
    assert len(clock["offsets_s"]) == cfg.workers and clock["rtt_s"] > 0
    assert ray_processes() == []


# ---- clock offsets (no Ray) --------------------------------------------------------------------

def test_the_clock_offsets_warn_only_beyond_half_of_hold_s_and_its_error_bound():
    """Offsets (s) and round trips of three learners: the largest |offset| is reported with its
    round trip; with hold_s = 10 ms a 4 ms offset is fine, and so is 6 ms ± 2 ms (it may be
    5 ms or less), but 8 ms ± 2 ms certainly exceeds 5 ms: a warning naming the learner."""
    import types
    import warnings

    from diloco_lite.actors.pool import Pool

    def pool_with(offsets):
        fake = types.SimpleNamespace(get=lambda refs: refs)
        pool = Pool.__new__(Pool)
        pool.ray, pool.M, pool.syncer = fake, len(offsets), None
        pool.learners = [types.SimpleNamespace(clock_offset=types.SimpleNamespace(
            remote=lambda syncer, o=o: o)) for o in offsets]
        return pool

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = pool_with([(0.001, 0.002), (-0.004, 0.001), (0.002, 0.003)]).clock_offsets(0.01)
        assert got["max_abs_offset_s"] == 0.004 and got["rtt_s"] == 0.001
        assert got["offsets_s"] == [0.001, -0.004, 0.002]
        pool_with([(0.006, 0.004)]).clock_offsets(0.01)
    with pytest.warns(UserWarning, match="learner 1's clock is -8.0 ms"):
        pool_with([(0.001, 0.001), (-0.008, 0.004)]).clock_offsets(0.01)


# ---- the warm spares (no Ray) ------------------------------------------------------------------

def test_a_killed_slot_gets_the_oldest_spare_and_the_pool_refills_one_at_a_time(monkeypatch):
    """Fake actor classes and a fake Ray record what the pool builds. Where the run has failures
    and one machine, the spares are one queue of two a learner, built (and made ready) before
    the clock; promoting slot 1 gives it the oldest, the syncer is told, and one spare is being
    built; promoting slot 1 again and slot 2 gives them the next two (built before the clock),
    and no second build begins until the first is done (`built`); then the next owed one
    begins. On the testbed (placement) each host keeps one of its own, built for its slot on
    its host. Without failures: no spare, and a dead learner's slot gets a new (cold) process.
    `close` kills every process once, the one being built too."""
    import types

    from diloco_lite.actors import pool as pool_module

    built, told, killed = [], [], []

    class Actor:
        def __init__(self, kind, args, where):
            self.kind, self.args, self.where, self.n = kind, args, where, len(built)
            built.append(self)
            self.ready = types.SimpleNamespace(remote=lambda syncer: ("ready", self.n))
            self.status = types.SimpleNamespace(remote=lambda: "status")
            self.replace = types.SimpleNamespace(
                remote=lambda m, new: told.append((m, new.n)))

    def actor_class(kind):
        return types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(
            remote=lambda *args: Actor(kind, args, kw.get("resources"))))

    monkeypatch.setattr(pool_module, "actor_classes",
                        lambda: (actor_class("learner"), actor_class("syncer")))
    fake_ray = types.SimpleNamespace(get=lambda refs: refs,
                                     kill=lambda a, no_restart: killed.append(a.n))
    M = 3  # a config: what the pool reads of one

    def config(failures):
        return types.SimpleNamespace(workers=M, cluster=types.SimpleNamespace(failures=failures))

    pool = pool_module.Pool(fake_ray, config(((1, 1.0, 2.0),)), placement=False, spares=None)
    pool.build("params", 0.01, "cache")
    # the syncer (0), the learners (1..M), then the shared queue: two spares a learner
    assert [a.kind for a in built] == ["syncer"] + ["learner"] * 3 * M
    slot = {a.n: a.args[1] for a in built[1:]}  # (config, m, params, cache, resend)
    assert [slot[a.n] for a in pool.learners] == list(range(M))
    queue = [a.n for a in pool.spares[0]]
    assert list(pool.spares) == [0] and queue == list(range(1 + M, 1 + 3 * M))
    assert pool.pending() == []
    assert pool.promote(1).n == queue[0] and pool.learners[1].n == queue[0]
    assert told == [(1, queue[0])]
    refill = built[-1]
    assert refill.n == 1 + 3 * M and pool.pending() == [("ready", refill.n)]
    assert pool.promote(1).n == queue[1] and pool.promote(2).n == queue[2]
    assert told[1:] == [(1, queue[1]), (2, queue[2])]
    assert len(built) == 2 + 3 * M  # one build at a time: two more owed
    pool.built(("ready", refill.n))
    assert [a.n for a in pool.spares[0]] == queue[3:] + [refill.n]
    assert len(built) == 3 + 3 * M and pool.pending() == [("ready", built[-1].n)]
    pool.close()
    assert sorted(killed) == sorted({a.n for a in built})  # every process, once

    built.clear(), killed.clear()
    bed = pool_module.Pool(fake_ray, config(((1, 1.0, 2.0),)), placement=True, spares=None)
    bed.build("params", 0.01, "cache")
    assert sorted(bed.spares) == [1, 2, 3]
    for m in range(M):  # its host's one, built for slot m on its host
        assert [(a.args[1], a.where) for a in bed.spares[m + 1]] == [
            (m, {f"host{m + 1}": 0.01})]
    mine = [a.n for a in bed.spares[3]]
    assert bed.promote(2).n == mine[0] and built[-1].args[1] == 2
    assert built[-1].where == {"host3": 0.01}
    bed.close()
    assert sorted(killed) == sorted({a.n for a in built})

    built.clear()
    calm = pool_module.Pool(fake_ray, config(()), placement=False, spares=None)
    calm.build("params", 0.01, "cache")
    assert len(built) == 1 + M and calm.spares == {0: []}
    cold = calm.promote(0)
    assert cold.n == len(built) - 1 and calm.spares == {0: []} and calm.pending() == []
