"""The training loop's bookkeeping (history rows) and its watchdog."""

import os
import subprocess
import sys

import numpy as np
import pytest

from diloco_lite.clock.plan import Plan
from diloco_lite.training import COLUMNS, _history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def row(t, diags=()):
    stats = dict.fromkeys(COLUMNS, 0.0)
    stats.update(sim_time_s=t, diags=list(diags))
    return stats


def test_train_loss_is_the_mean_over_learner_steps_not_over_blocks():
    """Learner 0 takes steps at 1, 2, 3 s (a block of one step, then one of two), learner 1 at
    2 s only: the row at 3 s averages the four learner-steps; a mean of block means would not."""
    plan = Plan(blocks=[], learners=2, t_ref=1.0, fragments=[], final={},
                step_time=[np.array([1.0, 2.0, 3.0]), np.array([2.0])])
    losses = [([np.array([[1.0], [0.0]])], np.array([1, 0])),
              ([np.array([[2.0, 3.0], [6.0, 0.0]])], np.array([2, 1]))]
    history = _history([row(1.5), row(3.0)], losses, plan)
    assert history.train_loss.tolist() == [1.0, pytest.approx((2 + 3 + 6) / 3)]


def test_pseudo_gradient_norm_is_the_whole_models():
    """Fragments merged with ‖Δ_0‖² = 9 and ‖Δ_1‖² = 16: the model's ‖Δ‖ is 5, not 3.5; the
    drift likewise √(4 + 12); the end-of-run flush is left out."""
    plan = Plan(blocks=[], learners=1, t_ref=1.0, fragments=[], final={},
                step_time=[np.array([1.0])])
    diags = [(0, False, np.array([9.0, 0.5, 4.0])), (1, False, np.array([16.0, 0.3, 12.0])),
             (1, True, np.array([100.0, -1.0, 100.0]))]
    history = _history([row(1.0, diags)], [([np.array([[1.0]])], np.array([1]))], plan)
    assert history.pseudo_grad_norm.iloc[0] == 5.0
    assert history.worker_drift.iloc[0] == 4.0
    assert history.pseudo_grad_cosine.iloc[0] == pytest.approx(0.4)


def run_python(code: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (the watchdog ends its process with `os._exit`)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env}, cwd=ROOT)


def test_watchdog_ends_a_stuck_run_with_a_message():
    code = ("import time; from diloco_lite.training import Watchdog\n"
            "with Watchdog('DDP M=8', stall_s=1.0):\n    time.sleep(30)\n")
    out = run_python(code)
    assert out.returncode == 3
    assert "no progress for 1 s" in out.stderr and "DILOCO_LITE_DEVICES=4" in out.stderr


def test_watchdog_stays_quiet_while_progress_is_made():
    code = ("import time; from diloco_lite.training import Watchdog\n"
            "with Watchdog('DDP M=8', stall_s=1.0) as w:\n"
            "    for _ in range(8):\n        time.sleep(0.3); w.beat()\n"
            "time.sleep(2.0); print('finished')\n")
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "finished", out.stderr


def test_watchdog_is_stopped_when_its_block_is_interrupted():
    """A KeyboardInterrupt (or any exception) inside the `with` stops the watchdog: the process
    is still alive well past the stall limit, and the watching thread has ended."""
    code = ("import threading, time; from diloco_lite.training import Watchdog\n"
            "try:\n"
            "    with Watchdog('DDP M=8', stall_s=0.5) as w:\n"
            "        raise KeyboardInterrupt\n"
            "except KeyboardInterrupt:\n    print('interrupted')\n"
            "time.sleep(3.0)\n"
            "print('alive', w._thread.is_alive(), threading.active_count())\n")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["interrupted", "alive", "False", "1"]


def test_an_interrupted_train_stops_its_watchdog_and_closes_its_progress_bar():
    """`train` interrupted inside its loop (here: by its first block's batches) leaves no
    watchdog behind to end the process `stall_s` later, and its progress bar closed."""
    code = """
import threading, time
from tqdm.auto import tqdm
import diloco_lite as dl
from diloco_lite import training
from tests.helpers import tiny_run

bars = []
progress = training._progress
training._progress = lambda *a: bars.append(progress(*a)) or bars[-1]
def interrupt(*a):
    raise KeyboardInterrupt
training._block_batches = interrupt
try:
    training.train(tiny_run(dl.DiLoCo(inner_steps=3), workers=2))
except KeyboardInterrupt:
    print("interrupted", len(bars), bars[0] in tqdm._instances)
time.sleep(3.0)
print("alive", sum("watchdog" in t.name for t in threading.enumerate()))
"""
    out = run_python(code, DILOCO_LITE_STALL_S="0.5", JAX_NUM_CPU_DEVICES="2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["interrupted", "1", "False", "alive", "0"]


def test_a_paced_run_sleeps_its_steps_times_pace_before_each_block_and_learns_the_same(
        monkeypatch):
    """`train(pace_s=…)`, an emulated slower chip (`actors.versus` paces the lock-step
    processes with it): before each block it sleeps `pace_s` times the block's steps, so a run
    sleeps `steps × pace_s` in all, and its numbers are the unpaced run's."""
    import jax

    import diloco_lite as dl
    from diloco_lite import training
    from tests.helpers import tiny_run

    config = tiny_run(dl.DiLoCo(inner_steps=2), steps=6, eval_every=3)
    slept = []
    plain = training.train(config, progress=False)
    monkeypatch.setattr(training.time, "sleep", slept.append)
    paced = training.train(config, progress=False, pace_s=0.25)
    # blocks of 2 steps (H = 2; the evaluations at 3 and 6 cut the second and third): 2, 1,
    # 1, 2 steps -- one sleep per block, of its steps × 0.25 s
    assert slept, "a paced run never slept"
    assert sum(slept) == pytest.approx(6 * 0.25)
    assert all(s in (0.25, 0.5) for s in slept), slept
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(paced.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="pace_s"):
        training.train(config, progress=False, pace_s=-0.1)
