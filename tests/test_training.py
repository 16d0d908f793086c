"""The training loop's bookkeeping (history rows) and its watchdog."""

import subprocess
import sys

import numpy as np
import pytest

from diloco_lite.clock.plan import Plan
from diloco_lite.training import COLUMNS, _history


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


def test_watchdog_ends_a_stuck_run_with_a_message():
    code = ("import time; from diloco_lite.training import Watchdog\n"
            "w = Watchdog('DDP M=8', stall_s=1.0)\n"
            "time.sleep(30)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 3
    assert "no progress for 1 s" in out.stderr and "DILOCO_LITE_DEVICES=4" in out.stderr


def test_watchdog_stays_quiet_while_progress_is_made():
    code = ("import time; from diloco_lite.training import Watchdog\n"
            "w = Watchdog('DDP M=8', stall_s=1.0)\n"
            "for _ in range(8):\n    time.sleep(0.3); w.beat()\n"
            "w.stop(); print('finished')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "finished"
