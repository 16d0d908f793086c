"""Decoupled DiLoCo against DDP on the testbed (`actors.versus`): the arithmetic of the
comparison, each against a plain computation written here. (The measurement itself needs root,
the testbed and Ray, and takes minutes: `make reproduce`'s `versus` job.)"""

import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import diloco_lite as dl
from diloco_lite.actors import versus
from tests.helpers import tiny_run


def test_the_step_and_the_time_to_a_loss_are_interpolated_between_evaluations():
    h = pd.DataFrame(dict(step=[10, 20, 30, 40], sim_time_s=[1.0, 3.0, 4.0, 8.0],
                          val_loss=[3.0, 2.6, 2.2, 2.0]))
    # 2.4 lies halfway between the rows at steps 20 (2.6) and 30 (2.2): a plain line
    assert versus.steps_to(h, 2.4) == pytest.approx(25.0)
    assert versus.seconds_to(h, 2.4) == pytest.approx(3.5)
    assert versus.steps_to(h, 3.5) == 10.0  # reached by the first evaluation
    assert np.isnan(versus.seconds_to(h, 1.9))  # never reached


def test_seconds_per_step_leave_out_the_first_block_and_the_evaluations():
    # the first row comes after the first block, which compiled (5 s); each evaluation took
    # 1 s of wall time
    steps = np.array([1, 3, 5, 7])
    train = np.array([5.0, 5.0 + 2 * 0.3, 5.0 + 4 * 0.3, 5.0 + 6 * 0.3])
    h = pd.DataFrame(dict(step=steps, train_time_s=train,
                          wall_time_s=train + np.arange(1, 5)))
    assert versus.seconds_per_step(h) == pytest.approx(0.3)


def test_a_runs_training_time_leaves_its_evaluations_out(monkeypatch):
    """Each evaluation is made to take 0.3 s more: the wall clock carries them, `train_time_s`
    does not (each evaluation widens the gap between the two by 0.3 s)."""
    from diloco_lite import training

    real = training.make_evaluator

    def slow(*args, **kw):
        evaluate = real(*args, **kw)

        def wait_then_evaluate(params):
            time.sleep(0.3)
            return evaluate(params)
        return wait_then_evaluate

    monkeypatch.setattr(training, "make_evaluator", slow)
    h = dl.train(tiny_run(steps=6, eval_every=2), progress=False).history
    assert len(h) == 3
    gap = (h.wall_time_s - h.train_time_s).to_numpy()  # (the first also compiles the evaluator)
    assert gap[0] >= 0.3 and np.diff(gap) == pytest.approx([0.3, 0.3], abs=0.1)


def test_the_control_traffic_is_the_calls_times_their_bytes_plus_the_idle_traffic_and_tcp():
    # measured on the testbed: empty calls each way, then calls carrying 1,000 payload bytes
    per_call = {"up": {"tx": 800.0, "rx": 200.0}, "down": {"tx": 500.0, "rx": 600.0},
                "up_payload": {"tx": 1850.0, "rx": 230.0},
                "down_payload": {"tx": 520.0, "rx": 1660.0},
                "idle_tx": 900.0, "idle_rx": 500.0, "payload": 1000}
    wire = [{"tx_bytes": 400_000, "rx_bytes": 230_000, "s": 30.0},  # the syncer's host
            {"tx_bytes": 100_000, "rx_bytes": 200_000, "calls_up": 10, "calls_down": 20,
             "unbooked_up": 3_000, "unbooked_down": 1_000, "s": 30.0},
            {"tx_bytes": 120_000, "rx_bytes": 180_000, "calls_up": 30, "calls_down": 40,
             "unbooked_up": 5_000, "unbooked_down": 2_000, "s": 30.0}]
    run = SimpleNamespace(wire=wire, config=SimpleNamespace(workers=2),
                          final=SimpleNamespace(comm_bytes=2 * 50_000, down_bytes=2 * 90_000))
    out = versus.wire_rows(run, per_call)
    assert out["up_wire"] == 110_000 and out["down_wire"] == 190_000
    assert out["up_booked"] == 50_000 and out["down_booked"] == 90_000
    assert out["syncer_up_wire"] == 400_000 and out["syncer_down_wire"] == 230_000
    assert out["syncer_up_booked"] == 180_000 and out["syncer_down_booked"] == 100_000
    # learner 0 sends: 10 calls up × 800 + 20 down × 500 + 30 s × 900 B/s; then per byte its
    # calls up carried (its 50,000 booked + 3,000 more) 1.05 bytes (1850 - 800 over 1000), and
    # per byte it received (90,000 + 1,000) 0.02 (its ACKs: 520 - 500 over 1000); learner 1
    # likewise, with its own calls and bytes
    sent = [10 * 800 + 20 * 500 + 30 * 900 + 53_000 * 1.05 + 91_000 * 0.02,
            30 * 800 + 40 * 500 + 30 * 900 + 55_000 * 1.05 + 92_000 * 0.02]
    got = [10 * 200 + 20 * 600 + 30 * 500 + 53_000 * 0.03 + 91_000 * 1.06,
           30 * 200 + 40 * 600 + 30 * 500 + 55_000 * 0.03 + 92_000 * 1.06]
    assert out["up_control"] == pytest.approx(np.mean(sent) - 50_000)
    assert out["down_control"] == pytest.approx(np.mean(got) - 90_000)
    # the syncer's host sends what both learners receive, and receives what they send
    assert out["syncer_up_control"] == pytest.approx(sum(got) - 180_000)
    assert out["syncer_down_control"] == pytest.approx(sum(sent) - 100_000)
    assert versus.wire_rows(SimpleNamespace(wire=None), per_call) == {}


def test_a_calls_unbooked_bytes_are_its_pickle_less_its_booked_arrays():
    import pickle

    from diloco_lite.actors.ray_actors import unbooked_bytes

    payload = np.arange(1000, dtype=np.uint8)
    report = {"losses": [2.5, 2.4]}
    args = (0, 1, 2, 3, payload, 4, 5.0, report)
    assert unbooked_bytes(args, payload) == len(pickle.dumps(args, protocol=5)) - 1000
    assert unbooked_bytes(("publish", 1.5), None) == len(pickle.dumps(("publish", 1.5),
                                                                      protocol=5))


def test_the_results_rows_carry_both_speedups_and_the_bytes_with_their_control_traffic():
    r = dict(gbit_per_s=0.001, learners=4, steps=240, inner_steps=40, speedup=25.0,
             sim_speedup=24.0, up_wire=130.0, up_booked=100.0, up_control=30.0, down_wire=90.0,
             down_booked=70.0, down_control=30.0, syncer_up_wire=330.0, syncer_up_booked=280.0,
             syncer_up_control=20.0, syncer_down_wire=420.0, syncer_down_booked=400.0,
             syncer_down_control=100.0)
    rows = versus.result_rows(pd.DataFrame([r]))
    got = {row["metric"]: row["value"] for row in rows}
    assert got["wall-clock speed-up over DDP to the same loss, measured @1 Mbit/s"] == 25.0
    assert got["wall-clock speed-up over DDP to the same loss, simulated @1 Mbit/s"] == 24.0
    up = "a learner host's bytes on the wire / booked with the control traffic, up @1 Mbit/s"
    down = up.replace(", up", ", down")
    assert got[up] == pytest.approx(1.0) and got[down] == pytest.approx(0.9)
    syncer = up.replace("a learner host's", "the syncer's host's")
    assert got[syncer] == pytest.approx(1.1)
    assert got[syncer.replace(", up", ", down")] == pytest.approx(0.84)
    assert [row.get("published") for row in rows] == [20.0] + [None] * 5


def test_the_docs_and_the_readme_quote_the_committed_measurement():
    """docs/systems.md shows `figures/versus.md` (what `make reproduce` wrote from the table),
    and the README's "20×" paragraph the speed-ups of `figures/versus.csv`."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    table = pd.read_csv(root / "figures" / "versus.csv")
    shown = versus.markdown(table)
    assert (root / "figures" / "versus.md").read_text().strip() == shown
    assert shown in (root / "docs" / "systems.md").read_text()
    readme = (root / "README.md").read_text()
    at = {round(r["gbit_per_s"] * 1e3): r for r in table.to_dict("records")}
    for quoted in (f"**{at[1]['speedup']:.1f}×**", f"(the simulated clock: "
                   f"{at[1]['sim_speedup']:.1f}×)", f"10 Mbit/s {at[10]['speedup']:.1f}× "
                   f"({at[10]['sim_speedup']:.1f}×)", f"slower ({at[1000]['speedup']:.2f}×)"):
        assert quoted in readme
