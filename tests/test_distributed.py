"""Every method on 2 processes × 4 devices (jax.distributed, gloo) equals 1 process × 8 devices;
a process that dies takes the launch down at once (diloco_lite.distributed)."""

import importlib
import ipaddress
import json
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import diloco_lite as dl
from diloco_lite.distributed import LaunchError, launch
from diloco_lite.training import run_label
from tests.helpers import assert_trees_close, tiny_run

CHAOS = dl.Cluster(failures=dl.FailureRate(mtbf_s=3.0, down_s=2.0))


def identity_configs():
    """One config per method (Decoupled DiLoCo under failures: reloads move a peer's optimizer
    state across processes). A function, so that each process imports it: `optax.sgd` does
    not pickle."""
    return [tiny_run(dl.DDP()),
            tiny_run(dl.DiLoCo(inner_steps=3)),
            tiny_run(dl.StreamingDiLoCo(inner_steps=4, fragments=2, overlap=1, bits=4), steps=8),
            tiny_run(dl.DecoupledDiLoCo(inner_steps=4, fragments=2), steps=8, cluster=CHAOS)]


@pytest.mark.slow
def test_every_method_is_the_same_on_two_processes():
    """One launch runs the four methods in sequence (one start-up and gloo rendezvous); each
    result matches the same config trained here, on one process of 8 devices: final
    parameters, the held-out metrics process 0 measured and the train losses gathered from
    both processes' workers."""
    start = time.monotonic()
    multi = launch("tests.test_distributed:identity_configs", processes=2,
                   devices_per_process=4, timeout_s=600, echo=False)
    print(f"launch: {time.monotonic() - start:.1f} s")
    assert multi[3].counters["failures"] > 0  # the reload path ran
    for config, got in zip(identity_configs(), multi, strict=True):
        want = dl.train(config, progress=False)
        assert run_label(got.config) == run_label(config)
        assert_trees_close(got.params, want.params)
        columns = ["train_loss", "val_loss", "val_accuracy", "test_loss", "comm_bytes",
                   "down_bytes", "sim_time_s", "useful_steps"]
        np.testing.assert_allclose(got.history[columns].to_numpy(float),
                                   want.history[columns].to_numpy(float), rtol=2e-5)


def dies_in_process_1():
    """A long DDP run whose process 1 is killed (SIGKILL, as by the OOM killer) 4 s after it
    starts: process 0 is then inside a collective that waits for it."""
    import jax

    if jax.process_index() == 1:
        threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return tiny_run(dl.DDP(), steps=100_000, eval_every=100_000)


@pytest.mark.slow
def test_a_process_that_dies_takes_the_launch_down_at_once():
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"process 1 of 2 exited with code -9"):
        launch("tests.test_distributed:dies_in_process_1", processes=2, devices_per_process=4,
               timeout_s=300, echo=False)
    assert time.monotonic() - start < 120  # not the 300 s timeout, not a hang


def test_configs_that_do_not_pickle_say_what_to_do():
    with pytest.raises(ValueError, match="module:function"):
        launch(tiny_run(), processes=2, devices_per_process=4)  # optax.sgd: closures
    with pytest.raises(ValueError, match="multiple of the 8 devices"):
        launch(dl.RunConfig(workers=4), processes=2, devices_per_process=4)


def listening_on():
    """No configs: process 0 writes the TCP addresses its own process listens on (once JAX's
    backend, and gloo with it, is up) to the file named by $DILOCO_LITE_TEST_LISTEN."""
    import jax

    out = os.environ.get("DILOCO_LITE_TEST_LISTEN")
    if out and jax.process_count() > 1 and jax.process_index() == 0:
        Path(out).write_text(json.dumps(_listening()))
    return []


def _listening() -> list[str]:
    """"address:port" of each listening TCP socket of this process (Linux's /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            (addr, port), state, inode = fields[1].split(":"), fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            # the address: 32-bit words of hex, each little-endian
            raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
            ip = ipaddress.ip_address(raw)
            ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:a.b.c.d: an IPv4 address
            out.append(f"{ip}:{int(port, 16)}")
    return out


def test_the_coordinator_listens_on_the_launchs_address_only(tmp_path, monkeypatch):
    """Issue 30 defect 6: process 0's coordination service (no authentication) is bound to the
    launch's address, loopback here, not to every interface ([::] is JAX's default); nothing
    of process 0 listens on a wildcard address. A `workdir` that does not exist is made, only
    its owner's."""
    out, workdir = tmp_path / "listening.json", tmp_path / "work"
    monkeypatch.setenv("DILOCO_LITE_TEST_LISTEN", str(out))
    assert launch("tests.test_distributed:listening_on", processes=2, devices_per_process=1,
                  timeout_s=300, echo=False, workdir=workdir) == []
    coordinator = pickle.loads((workdir / "job.pkl").read_bytes()).coordinator
    listening = json.loads(out.read_text())
    assert coordinator.startswith("127.0.0.1:") and coordinator in listening, listening
    assert not [a for a in listening if a.startswith(("0.0.0.0:", ":::"))], listening
    assert workdir.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("how", ["others_write", "not_mine", "a_file"])
def test_a_workdir_someone_else_could_write_is_refused(tmp_path, how):
    """The processes and the launcher load the pickles in `workdir`: one that another user
    owns or could write (or a file) is refused before anything starts."""
    workdir = tmp_path / "work"
    if how == "a_file":
        workdir.write_text("")
    else:
        workdir.mkdir(mode=0o700)
        if how == "others_write":
            workdir.chmod(0o777)
        elif os.geteuid() == 0:
            os.chown(workdir, 65534, 65534)
        else:
            pytest.skip("needs root to give a directory to another user")
    with pytest.raises(ValueError, match=r"workdir=.*(directory|owned|only its owner)"):
        launch(dl.RunConfig(workers=2, steps=2), processes=2, devices_per_process=1,
               workdir=workdir)


@pytest.mark.parametrize("error", [OSError, KeyboardInterrupt])
def test_processes_already_started_are_ended_when_a_later_one_cannot_start(monkeypatch,
                                                                           error):
    """Issue 30 defect 6: process 1 fails to start (or Ctrl-C arrives meanwhile): process 0,
    already started, is ended before the error reaches the caller."""
    module = importlib.import_module("diloco_lite.distributed.launch")
    real, started = module._start, []

    def start(workdir, k, testbed):
        if k == 1:
            raise error("process 1 did not start")
        started.append(real(workdir, k, testbed))
        return started[-1]

    monkeypatch.setattr(module, "_start", start)
    try:
        with pytest.raises(error, match="did not start"):
            launch(dl.RunConfig(workers=2), processes=2, devices_per_process=1, echo=False)
        assert len(started) == 1 and started[0].poll() is not None
    finally:
        for child in started:  # (on a failure: not left behind)
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
