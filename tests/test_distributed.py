"""Every method on 2 processes × 4 devices (jax.distributed, gloo) equals 1 process × 8 devices;
a process that dies takes the launch down at once (diloco_lite.distributed)."""

import os
import signal
import threading
import time

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
