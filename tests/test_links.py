"""The `links` job's bookkeeping (issue 17): results rows and figures from a measured table,
checked by hand on a table written here (the measurement itself runs in test_testbed.py)."""

import math

import pandas as pd
import pytest

from diloco_lite import plots
from diloco_lite.distributed import measure
from diloco_lite.experiments import published
from diloco_lite.plots import links as lplots


def table(tx=True):
    nan = math.nan
    return pd.DataFrame([
        # rate, method, measured and simulated s per step, model and measured bytes per host
        dict(gbit_per_s=0.01, method="ddp", wall_s_per_step=0.8, sim_s_per_step=0.5,
             wire_model=1e6, tx_per_host=1.1e6 if tx else nan),
        dict(gbit_per_s=0.01, method="diloco", wall_s_per_step=0.1, sim_s_per_step=0.08,
             wire_model=3e5, tx_per_host=3.3e5 if tx else nan),
        dict(gbit_per_s=1.0, method="ddp", wall_s_per_step=0.05, sim_s_per_step=0.04,
             wire_model=1e6, tx_per_host=1.2e6 if tx else nan),
        dict(gbit_per_s=1.0, method="diloco", wall_s_per_step=0.03, sim_s_per_step=0.03,
             wire_model=3e5, tx_per_host=3e5 if tx else nan),
    ]).assign(ratio=lambda d: d.wall_s_per_step / d.sim_s_per_step,
              tx_over_model=lambda d: d.tx_per_host / d.wire_model)


def test_result_rows_by_hand():
    rows = {(r["method"], r["metric"]): r for r in measure.result_rows(table(), "cfg")}
    assert rows["ddp", "measured / simulated s per step @10 Mbit/s"]["value"] == pytest.approx(1.6)
    assert rows["diloco", "measured / simulated s per step @1000 Mbit/s"]["value"] == 1.0
    assert rows["ddp", "bytes on the wire / booked x collective factor @1000 Mbit/s"][
        "value"] == pytest.approx(1.2)
    # at the slowest link only: 0.8 / 0.1 measured, 0.5 / 0.08 simulated
    speed = rows["diloco", "wall-clock speed-up over DDP, measured @10 Mbit/s"]
    assert speed["value"] == pytest.approx(8.0) and speed["published"] == 20.0
    assert rows["diloco", "wall-clock speed-up over DDP, simulated @10 Mbit/s"][
        "value"] == pytest.approx(6.25)
    assert len(rows) == 4 + 4 + 2 and all(r["experiment"] == "links" for r in rows.values())
    assert "classroom scale" in published.note(speed)
    # no testbed (loopback): times only, no bytes rows
    metrics = [r["metric"] for r in measure.result_rows(table(tx=False), "cfg")]
    assert not any("bytes" in m for m in metrics) and len(metrics) == 4 + 2


def test_the_figures_render(tmp_path):
    plots.save(lplots.time_chart(table()), "links_time", tmp_path)
    plots.save(lplots.bytes_chart(table()), "links_bytes", tmp_path)
    assert (tmp_path / "links_time.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "links_bytes.png").stat().st_size > 1000


def test_settings_quick_is_small_and_full_is_the_issues_measurement():
    assert measure.settings(False) == dict(hosts=4, rates=(0.01, 0.1, 1.0), steps=40,
                                           inner_steps=10, window_s=4.0)
    quick = measure.settings(True)
    assert quick["hosts"] == 2 and len(quick["rates"]) == 1 and quick["steps"] <= 12
    assert quick["window_s"] <= 1.0


def test_the_window_opens_at_half_the_steps():
    # rows every steps/4: the first row (evaluator and sync compiled before it, process 0 late)
    # must not open the window; by hand: (9.0 - 5.0) s / (40 - 20) steps. (The rows' seconds
    # are uneven, so that a window opening at any other row gives another number: from step
    # 10, 8/30; from 30, 1/10.)
    history = pd.DataFrame(dict(step=[10, 20, 30, 40], wall_time_s=[1.0, 5.0, 8.0, 9.0]))
    assert measure._window(history, "wall_time_s") == pytest.approx(0.2)


def test_run_length_fills_the_window():
    # 2 x 4 s / 0.05 s = 160 steps, rounded up to a multiple of 4 H = 40
    assert measure._steps(0.05, 40, 40, 4.0) == 160
    assert measure._steps(0.06, 40, 4, 4.0) == 136  # 133.3 -> 136
    assert measure._steps(0.6, 40, 4, 4.0) == 40  # slow link: never fewer than `least`
    assert measure._steps(1e-4, 40, 4, 4.0) == 480  # never more than 12 x `least`
