"""Run `train(config)` on several local processes joined by `jax.distributed` (gloo on CPU).

    import diloco_lite as dl
    from diloco_lite.distributed import launch
    [result] = launch(dl.RunConfig(algorithm=dl.DiLoCo(inner_steps=50), workers=8, steps=600),
                      processes=2, devices_per_process=4)

or from a shell (each CONFIG a `module:function` returning RunConfig(s), or an expression over
`diloco_lite`'s names):

    python -m diloco_lite launch --processes 2 --devices-per-process 4 \\
        "RunConfig(algorithm=DiLoCo(inner_steps=50), steps=600)"

`launch` starts `processes` Python processes (`worker.py`), each emulating
`devices_per_process` CPU devices; they meet at process 0's coordination service
(`jax.distributed.initialize`) and run the same plan on one worker mesh over all N·D devices,
its collectives over gloo's TCP transport. The configs reach them pickled (configs are frozen
dataclasses); a config that does not pickle (an optax optimizer's closures) goes by a
`"module:function"` reference instead, which each process imports. Process 0 alone evaluates;
its `RunResult`s come back (pickled) and are returned; the others exit 0. The results equal a
one-process run of the same layout to float rounding (`tests/test_distributed.py`).

Process 0's coordination service listens only on the launch's address (loopback, or host
0's testbed address), not on every interface: it has no authentication. gloo's TCP pairs bind
to the address of this machine's host name (no public JAX setting changes that: on a machine
whose host name resolves to a public address, run launches on a testbed, whose hosts map it
to their private ones, or behind a firewall).

A process that dies takes the run down: the launcher polls its children, and when one exits
with an error it ends the others (SIGTERM, then SIGKILL) and raises `LaunchError` with the
tail of that process's output, within about a second, whatever the survivors were doing (a
gloo collective waiting for a dead peer would otherwise wait for minutes). A child whose
launcher dies is ended by the kernel (`PR_SET_PDEATHSIG`), and `timeout_s` bounds the whole
launch; a process that fails to start, or Ctrl-C while they start, ends the ones already
started. Each process writes its output to `<workdir>/process<k>.log`; process 0's is echoed.

With a `testbed.Testbed`, each process runs in its own network namespace ("host") behind a
throttled link, and its interface counters measure the bytes that really left it.

**On a real multi-host machine** (a Cloud TPU slice, GPU hosts under SLURM or Kubernetes) there
is nothing to launch: the platform starts one process per host. Run in each the same code the
workers here run, with the platform's own settings:

    import jax, diloco_lite as dl
    jax.distributed.initialize()   # TPU / SLURM / Open MPI / K8s: detected from the environment
    # elsewhere: jax.distributed.initialize("HOST0:1234", num_processes=N, process_id=k)
    result = dl.train(config, progress=jax.process_index() == 0)
    if jax.process_index() == 0: ...   # only process 0 writes histories, figures, caches

On CPU hosts set `jax.config.update("jax_cpu_collectives_implementation", "gloo")` before
`initialize`. The worker mesh spans `jax.devices()` (every host's chips); `RunConfig.workers`
must be a multiple of their count so that every host holds workers.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..config import RunConfig, check, check_int
from ..validate import check_nonnegative
from .job import Job, resolve_configs

KILL_GRACE_S = 3.0  # after SIGTERM, before SIGKILL
POLL_S = 0.2


class LaunchError(RuntimeError):
    """A process of a launch failed (or the launch timed out); the others were ended."""


def launch(configs, processes: int = 2, devices_per_process: int = 4, *, testbed=None,
           timeout_s: float | None = None, progress: bool = False, echo: bool = True,
           workdir: str | Path | None = None, pace_s: float = 0.0,
           set_links: bool = False) -> list:
    """Run each config of `configs` (a `RunConfig`, a list of them, or a `"module:function"`
    reference returning either) across `processes` local processes of `devices_per_process`
    CPU devices each; returns process 0's `RunResult`s, one per config, in order.

    `testbed`: a `testbed.Testbed` (entered) whose hosts the processes run in; default: all on
    this machine's loopback. `echo`: copy process 0's output to this process's stdout.
    `workdir`: where the job, the logs and the results go (default: a new temporary
    directory); one given must be this user's and writable by no one else (`own_workdir`).
    `pace_s`: every process runs `train(config, pace_s=pace_s)` (an emulated slower chip:
    `pace_s` more seconds of compute per step). `set_links`: before each config's run, its
    `Cluster.link` rate becomes the rate of every link of `testbed` (`testbed.set_rate`, by
    process 0, then all processes meet), so one set of processes measures several link speeds
    in turn, compiling each program once (a config whose link is free keeps the rate set)."""
    check_int("processes", processes, 1, 64)
    check_nonnegative("pace_s", pace_s)
    check_int("devices_per_process", devices_per_process, 1, 512)
    resolved, payload = _configs(configs)
    total = processes * devices_per_process
    for c in resolved:
        check(c.workers % total == 0, "RunConfig.workers", c.workers,
              f"a multiple of the {total} devices of {processes} × {devices_per_process} "
              "(every process must hold workers)")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="diloco_lite-"))
        workdir = own_workdir(workdir)
        host0 = testbed.address(0) if testbed is not None else "127.0.0.1"
        job = Job(configs=payload, processes=processes, devices_per_process=devices_per_process,
                  coordinator=f"{host0}:{_free_port()}", out=str(workdir / "results.pkl"),
                  progress=progress, pace_s=float(pace_s),
                  testbed_hosts=testbed.hosts if set_links and testbed is not None
                  and testbed.emulated else None)
        (workdir / "job.pkl").write_bytes(pickle.dumps(job))
        children = []
        try:  # a process that fails to start, or Ctrl-C meanwhile, ends the ones started
            for k in range(processes):
                children.append(_start(workdir, k, testbed))
            _watch(children, workdir, timeout_s, echo)
        finally:
            _end(children)
        results = pickle.loads((workdir / "results.pkl").read_bytes())
    for r, c in zip(results, resolved, strict=True):
        r.config = c
    return results


def _configs(configs) -> tuple[list, bytes | str]:
    if isinstance(configs, str):
        check(":" in configs, "configs", configs, "a RunConfig, a list, or 'module:function'")
        return resolve_configs(configs), configs
    resolved = [configs] if isinstance(configs, RunConfig) else list(configs)
    for c in resolved:
        check(isinstance(c, RunConfig), "configs", type(c).__name__, "RunConfig(s)")
    try:
        return resolved, pickle.dumps(resolved)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise ValueError(
            f"these configs do not pickle ({e}), so they cannot be sent to the processes: "
            "pass a 'module:function' reference instead, a function that returns them (each "
            "process imports it)") from None


def own_workdir(workdir) -> Path:
    """`workdir` for a launch: made (mode 0700) if missing; one that exists must be a directory
    of this user that no one else can write, since the processes load the pickles in it (the
    job) and so does the launcher (the results)."""
    path = Path(workdir)
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        return path
    st = path.stat()
    check(path.is_dir(), "workdir", str(path), "a directory")
    check(st.st_uid == os.getuid(), "workdir", str(path),
          f"a directory owned by this user (uid {os.getuid()}, not {st.st_uid}): the launch "
          "loads the pickles in it")
    check(not st.st_mode & 0o022, "workdir", str(path),
          f"a directory only its owner can write (its mode is {st.st_mode & 0o777:o}: "
          "chmod go-w it): the launch loads the pickles in it")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(workdir: Path, k: int, testbed) -> subprocess.Popen:
    env = {key: v for key, v in os.environ.items()
           if key not in ("DILOCO_LITE_DEVICES", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "diloco_lite.distributed.worker", str(workdir / "job.pkl"),
           str(k), str(os.getpid())]
    if testbed is not None:
        cmd = testbed.command(k, cmd)
    log = open(workdir / f"process{k}.log", "wb")  # noqa: SIM115 - closed with the process
    try:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 cwd=os.getcwd(), start_new_session=True)
    except BaseException:
        log.close()
        raise
    child.log = log
    return child


def _watch(children: list, workdir: Path, timeout_s: float | None, echo: bool) -> None:
    """Wait for every child to exit 0; on the first failure (or the timeout) raise."""
    start, echoed = time.monotonic(), 0
    while True:
        if echo:
            echoed = _echo(workdir / "process0.log", echoed)
        codes = [c.poll() for c in children]
        failed = [k for k, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            k = failed[0]
            raise LaunchError(
                f"process {k} of {len(children)} exited with code {codes[k]}; the others were "
                f"ended. Its last output:\n{_tail(workdir / f'process{k}.log')}")
        if all(code == 0 for code in codes):
            if echo:
                _echo(workdir / "process0.log", echoed)
            return
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise LaunchError(f"the launch ran past timeout_s={timeout_s:g} s; every process "
                              f"was ended. Process 0's last output:\n"
                              f"{_tail(workdir / 'process0.log')}")
        time.sleep(POLL_S)


def _end(children: list) -> None:
    """SIGTERM every child still running (its whole session), SIGKILL after a grace."""
    for c in children:
        if c.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    for c in children:
        try:
            c.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.pid, signal.SIGKILL)
            c.wait()
        c.log.close()


def _echo(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            new = f.read()
    except OSError:
        return offset
    if new:
        sys.stdout.write(new.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(new)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(no output)"


def parse_config(text: str):
    """A config of the command line: `"module:function"` (kept as a reference, imported by each
    process) or an expression over diloco_lite's public names, e.g.
    `"RunConfig(algorithm=DiLoCo(inner_steps=50), steps=600)"`."""
    import importlib

    if ":" in text and "(" not in text:
        return text
    dl = importlib.import_module("diloco_lite")
    names = {name: getattr(dl, name) for name in dl.__all__}
    config = eval(text, {"__builtins__": {}}, {**names, "dl": dl})  # noqa: S307 - your own CLI
    check(isinstance(config, RunConfig), "CONFIG", text, "an expression giving a RunConfig")
    return config


def cli(args) -> int:
    """`python -m diloco_lite launch ...` (the arguments parsed by `__main__`): each CONFIG in
    turn; with `--testbed` (or a link's rate or latency) on a `testbed.Testbed` of one host per
    process, printing per host the bytes that left it beside the bytes booked."""
    import math

    from ..clock import Link
    from ..training import run_label
    from .testbed import Testbed

    link = None
    if args.gbit_per_s is not None or args.latency_ms:
        link = Link(gbit_per_s=args.gbit_per_s or math.inf, latency_s=args.latency_ms / 1e3)
    use_bed = args.testbed or link is not None
    with Testbed(args.processes, link) if use_bed else contextlib.nullcontext() as bed:
        for text in args.configs:
            before = bed.counters() if bed else None
            for r in launch(parse_config(text), args.processes, args.devices_per_process,
                            testbed=bed, progress=not args.no_progress,
                            timeout_s=args.timeout_s):
                final = r.final
                print(f"{run_label(r.config)}: val_loss {final.val_loss:.4f}, val_accuracy "
                      f"{final.val_accuracy:.4f}, {final.wall_time_s:.1f} s; booked "
                      f"{final.comm_bytes / r.config.workers:,.0f} bytes per worker")
            sent = bed.sent_since(before) if bed else None
            for k, host in enumerate(sent or []):
                print(f"  host {k}: {host['tx_bytes']:,} bytes left it "
                      f"({host['tx_packets']:,} packets), {host['rx_bytes']:,} arrived")
    return 0
