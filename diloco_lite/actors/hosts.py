"""Decoupled DiLoCo's actors on the testbed's hosts: every byte between a learner and the syncer
crosses a throttled link.

    from diloco_lite.distributed.testbed import Testbed
    with Testbed(hosts=config.workers + 1, link=Link(gbit_per_s=0.01)) as bed:
        result = train_on_testbed(config, bed)     # result.wire: bytes per host

One Ray node per host (`distributed.testbed`: a network namespace behind a `tc`-shaped link):
the head, the syncer and the driver on host 0, learner m alone on host m + 1 (a custom
resource `host<k>` per node pins each actor). The driver runs as a process inside host 0 (the
hosts' addresses are reachable only from inside the testbed) and hands back the `RunResult`.
`RunResult.wire` holds each host's interface counters over the run, from the start of the
clock to the end of the flush: the learners' answers (the wire format's bytes) and the syncer's
replies, plus Ray's own traffic (the calls, the nodes' heartbeats and resource reports); and
for each learner's host the Ray calls the syncer counted each way (`calls_up`, `calls_down`)
and the bytes their arguments carried beyond the booked ones (`unbooked_up`, `unbooked_down`:
`ray_actors.unbooked_bytes`), and the bytes of peers' inner states it sent to a returning
learner's host or fetched from a peer's (`direct_up`, `direct_down`: they bypass the syncer's
host). Without a testbed (no root or no iproute2) everything falls
back to one local Ray instance, and `wire` is None.

Ray's token authentication is turned off for these nodes (`RAY_AUTH_MODE=disabled`): they
listen only on the testbed's private addresses. Every process of the hosts is killed on every
way out (never `ray stop`, which would stop every Ray process of the machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PORT = 6379


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DILOCO_LITE_DEVICES",)}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", JAX_PLATFORMS="cpu",
               PYTHONUNBUFFERED="1")
    return env


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start_nodes(bed) -> None:
    """A Ray node on each of `bed`'s hosts (the head on host 0), each with a resource
    `host<k>`."""
    for k in range(bed.hosts):
        where = (["--head", f"--port={PORT}", "--include-dashboard=false"] if k == 0
                 else [f"--address={bed.address(0)}:{PORT}"])
        cmd = bed.command(k, [_ray_bin(), "start", *where, f"--node-ip-address={bed.address(k)}",
                              f"--resources={{\"host{k}\": 1}}", "--disable-usage-stats"])
        out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"could not start a Ray node on host {k}: "
                               f"{(out.stderr or out.stdout).strip()[-800:]}")


def stop_nodes(bed) -> None:
    """Kill every process in the testbed's hosts (their Ray nodes and workers), and only those:
    `ray stop` would stop every Ray process of the machine."""
    import signal

    for k in range(bed.hosts):
        pids = subprocess.run(["ip", "netns", "pids", bed.namespace(k)], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def train_on_testbed(config, bed, **kw):
    """`train_actors(config, **kw)` with the syncer on host 0 and learner m on host m + 1 of
    `bed` (an entered `Testbed` of config.workers + 1 hosts); `RunResult.wire` holds what each
    host's interface sent and received from the start of the clock to the end of the flush (None
    without a testbed)."""
    return trains_on_testbed([config], bed, **kw)[0]


def trains_on_testbed(jobs: list, bed, **kw) -> list:
    """`train_on_testbed` of each `RunConfig` of `jobs` in turn, on one Ray cluster (its nodes
    started once, not once a run), each with its `Cluster.link` rate set on every link of `bed`
    first (`testbed.set_rate`, where it is finite and differs from the rate set); a dict in
    `jobs` is the call probe there (`call_bytes`, its keywords), at the rate set. Their
    results, in order."""
    from ..config import RunConfig, check
    from .runtime import train_actors

    configs = [j for j in jobs if isinstance(j, RunConfig)]
    if not bed.emulated:
        return [train_actors(c, **kw) if isinstance(c, RunConfig) else None for c in jobs]
    for config in configs:
        check(bed.hosts == config.workers + 1, "Testbed.hosts", bed.hosts,
              f"RunConfig.workers + 1 = {config.workers + 1} (the syncer's host and one per "
              "learner)")
    return _in_host0(bed, [("train", j, kw) if isinstance(j, RunConfig) else _probe_job(**j)
                           for j in jobs])


def call_bytes(bed, **probe) -> dict:
    """What a Ray call between host 1 and host 0 of `bed` (an entered `Testbed`) puts on host
    1's wire: "up" a call host 1 makes (a learner's answer, report or `until`), "down" one host
    0 makes (the syncer's messages), each as the bytes host 1 sent ("tx") and received ("rx"),
    with Ray's reports of the calls (task events) and TCP's headers and ACKs; measured with
    `calls` empty calls each way, then `calls` carrying `payload` bytes ("up_payload",
    "down_payload"), one every `gap_s` seconds or so, as a run makes them (calls back to back
    share their packets and Ray's reports: 25% fewer bytes a call, measured); and "idle_tx",
    "idle_rx": host 1's bytes per second with no call (the nodes' heartbeats and resource
    reports), left out of the others. `probe`: `calls` (50), `payload` (16 000 bytes) and
    `gap_s` (0.25 s), `_probe_job`'s defaults."""
    return _in_host0(bed, [_probe_job(**probe)], timeout_s=600.0)[0]


def _probe_job(calls: int = 50, payload: int = 16_000, gap_s: float = 0.25) -> tuple:
    """`call_bytes`' job (its arguments: `calls`, `payload`, `gap_s`)."""
    return "calls", calls, payload, gap_s


def _train(config, kw, hosts: int):
    """`train_on_testbed`, inside host 0."""
    from ..distributed.testbed import host_counters
    from .runtime import train_actors

    return train_actors(config, placement=True, meter=lambda: host_counters(hosts), **kw)


def _probe_calls(calls: int, payload: int, gap_s: float, hosts: int) -> dict:
    """`call_bytes`, inside host 0."""
    import time

    import numpy as np
    import ray

    from ..distributed.testbed import host_counters

    @ray.remote(num_cpus=0)
    class Peer:
        def ping(self, data=None):
            return None

        def call(self, other, n, size=0, gap_s=0.0):
            data = np.ones(size, np.uint8) if size else None
            for _ in range(n):
                ray.get(other.ping.remote(data))
                time.sleep(gap_s)

    a = Peer.options(resources={"host0": 1}).remote()
    b = Peer.options(resources={"host1": 1}).remote()
    ray.get(a.call.remote(b, 10))  # both started, their paths warm (one at a time: a call
    ray.get(b.call.remote(a, 10))  # holds its actor's thread while it waits)
    out, spans, settle = {}, {}, 3.0  # Ray reports a worker's task events once a second
    for size, tail in ((0, ""), (payload, "_payload")):
        for way, caller, callee in (("up", b, a), ("down", a, b)):
            time.sleep(settle)
            before, t = host_counters(hosts)[1], time.time()
            ray.get(caller.call.remote(callee, calls, size, gap_s))
            time.sleep(settle)
            after = host_counters(hosts)[1]
            out[way + tail] = {k: after[f"{k}_bytes"] - before[f"{k}_bytes"] for k in ("tx", "rx")}
            spans[way + tail] = time.time() - t
    before, t = host_counters(hosts)[1], time.time()
    time.sleep(10.0)
    after, dt = host_counters(hosts)[1], time.time() - t
    for k in ("tx", "rx"):
        out[f"idle_{k}"] = (after[f"{k}_bytes"] - before[f"{k}_bytes"]) / dt
    for name, span in spans.items():
        for k in ("tx", "rx"):
            out[name][k] = (out[name][k] - out[f"idle_{k}"] * span) / calls
    out["payload"] = payload
    return out


def _in_host0(bed, jobs: list, timeout_s: float | None = None) -> list:
    """Run `jobs` in turn in one driver inside host 0, connected to a Ray node on each host
    (started once for all of them); their results (a driver still running after `timeout_s`
    is killed, with the nodes)."""
    from ray import cloudpickle

    with tempfile.TemporaryDirectory(prefix="diloco_lite-actors-") as tmp:
        path, out = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl"
        rate = bed.link.gbit_per_s if bed.link is not None else None
        path.write_bytes(cloudpickle.dumps((jobs, f"{bed.address(0)}:{PORT}", rate)))
        try:
            start_nodes(bed)
            run = subprocess.run(bed.command(0, [sys.executable, "-m", __name__, str(path),
                                                 str(out), str(bed.hosts)]),
                                 env=_env(), cwd=os.getcwd(), capture_output=True, text=True,
                                 timeout=timeout_s)
        finally:
            stop_nodes(bed)
        if run.returncode != 0 or not out.exists():
            raise RuntimeError(f"the run on the testbed failed:\n{run.stderr[-3000:]}")
        return cloudpickle.loads(out.read_bytes())


def _main(job: str, out: str, hosts: str) -> int:
    """The driver, inside host 0: connect to the testbed's Ray cluster and run the job."""
    from ..devices import emulate_devices

    emulate_devices(1)
    import ray
    from ray import cloudpickle

    from ..distributed.testbed import set_rate

    jobs, address, rate = cloudpickle.loads(Path(job).read_bytes())
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    result = []
    try:
        for kind, *args in jobs:
            if kind == "calls":
                result.append(_probe_calls(*args, int(hosts)))
                continue
            config, kw = args
            want = config.cluster.link.gbit_per_s if config.cluster is not None else rate
            if want != rate and want != float("inf"):  # (`trains_on_testbed`)
                rate = want
                set_rate(int(hosts), rate)
            result.append(_train(config, kw, int(hosts)))
    finally:
        ray.shutdown()
    Path(out).write_bytes(cloudpickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:4]))
