"""Where the speed-up comes from (`actors.versus`): the arithmetic of the table, each part
against a plain computation written here on synthetic histories. (The measurement itself needs
root, the testbed and Ray, and takes an hour: `make reproduce`'s `versus` job.)"""

import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import diloco_lite as dl
from diloco_lite.actors import versus, versus_runs
from diloco_lite.clock import Cluster, Link
from diloco_lite.training import eval_points
from tests.helpers import tiny_run


def history(steps, losses, times) -> pd.DataFrame:
    return pd.DataFrame(dict(step=np.asarray(steps, float), val_loss=np.asarray(losses, float),
                             time_s=np.asarray(times, float)))


def run(method, gbit, times, losses, sim_times=None, sim_losses=None, repeat=0,
        how="end to end", **extra) -> dict:
    """A synthetic run: evaluations at steps 10, 20, 30, 40."""
    steps = [10, 20, 30, 40]
    return dict(gbit_per_s=gbit, method=method, repeat=repeat, how=how,
                measured=history(steps, losses, times),
                simulated=history(steps, sim_losses or losses, sim_times or times), **extra)


def test_the_target_is_the_worst_final_loss_and_each_time_to_it_is_interpolated():
    runs = [run("ddp", 0.1, [1, 2, 3, 4], [3.0, 2.6, 2.2, 2.0]),
            run("decoupled", 0.1, [0.5, 1.0, 1.5, 2.0], [2.9, 2.5, 2.4, 2.3]),
            # another speed: its own target
            run("ddp", 0.001, [10, 20, 30, 40], [3.0, 2.6, 2.2, 2.0]),
            run("decoupled", 0.001, [1, 2, 3, 4], [2.9, 2.5, 2.4, 2.1])]
    t = versus.cells(runs).set_index(["gbit_per_s", "method"])
    assert t.target_loss[0.1, "ddp"] == 2.3 and t.target_loss[0.001, "ddp"] == 2.1
    # DDP reaches 2.3 three quarters of the way from 2.6 (at 2 s) to 2.2 (at 3 s)
    assert t.s[0.1, "ddp"] == pytest.approx(2.75)
    assert t.s[0.1, "decoupled"] == pytest.approx(2.0)  # its own final loss: its last row
    # at 1 Mbit/s: 2.1 lies halfway from 2.2 (30 s) to 2.0 (40 s)
    assert t.s[0.001, "ddp"] == pytest.approx(35.0)
    assert t.s[0.001, "decoupled"] == pytest.approx(4.0)
    assert t.measured_over_sim[0.1, "ddp"] == pytest.approx(1.0)


def test_the_simulated_clock_has_its_own_target_and_the_target_is_one_every_curve_reaches():
    runs = [run("ddp", 0.1, [1, 2, 3, 4], [3.0, 2.6, 2.2, 2.0], sim_times=[2, 4, 6, 8]),
            run("decoupled", 0.1, [1, 2, 3, 4], [2.9, 2.5, 2.4, 2.3],
                sim_times=[1, 2, 3, 4], sim_losses=[2.9, 2.5, 2.4, 2.4])]
    t = versus.cells(runs).set_index("method")
    # the measured runs' worst final loss is 2.3, but the clock's Decoupled ends at 2.4: the
    # target is 2.4, a loss every curve reaches
    assert t.sim_target_loss["ddp"] == 2.4 and t.target_loss["ddp"] == 2.4
    # the clock's DDP to its own target: 2.4 halfway between 2.6 (4 s) and 2.2 (6 s)
    assert t.sim_own_s["ddp"] == pytest.approx(5.0)
    assert t.sim_own_s["decoupled"] == pytest.approx(3.0)  # its first row at 2.4
    # measured ÷ clock compares the same loss: measured DDP at 2.4 halfway from 2 s to 3 s
    assert t.s["ddp"] == pytest.approx(2.5) and t.sim_s["ddp"] == pytest.approx(5.0)
    assert t.measured_over_sim["ddp"] == pytest.approx(2.5 / 5.0)
    assert t.s["decoupled"] == pytest.approx(3.0) and t.sim_s["decoupled"] == pytest.approx(3.0)
    assert versus.speedups(versus.cells(runs)).set_index("method").sim_speedup[
        "decoupled"] == pytest.approx(5.0 / 3.0)
    # where the measured runs end worse than the clock's, theirs is the target
    worse = [run("ddp", 0.1, [1, 2, 3, 4], [3.0, 2.6, 2.2, 2.2], sim_losses=[3.0, 2.6, 2.2, 2.0])]
    assert versus.cells(worse).target_loss[0] == 2.2


def test_repeats_give_the_median_and_the_min_and_max_and_extras_their_mean():
    losses = [3.0, 2.6, 2.2, 2.0]
    runs = [run("ddp", 0.1, [k * x for x in (1, 2, 3, 4)], losses, repeat=i,
                booked_per_host=float(b))
            for i, (k, b) in enumerate([(1.0, 10), (3.0, 20), (1.5, 60)])]
    t = versus.cells(runs).iloc[0]
    # the target is DDP's own final loss, 2.0: its last row, 4 s × each repeat's scale
    assert t.repeats == 3 and t.target_loss == 2.0
    assert (t.s, t.s_min, t.s_max) == pytest.approx((6.0, 4.0, 12.0))
    assert t.booked_per_host == pytest.approx(30.0)


def test_the_speedups_and_the_decomposition_of_decoupleds_into_the_cut_and_the_decoupling():
    losses = [3.0, 2.6, 2.2, 2.0]
    secs = {"ddp": (100.0, 80.0, 120.0), "diloco": (20.0,) * 3, "diloco-4bit": (16.0,) * 3,
            "streaming": (10.0, 8.0, 11.0), "decoupled": (5.0, 4.0, 6.0)}
    sim = {"ddp": 90.0, "diloco": 30.0, "diloco-4bit": 15.0, "streaming": 9.0, "decoupled": 6.0}
    runs = [run(m, 0.001, [s / 4 * k for k in (1, 2, 3, 4)], losses,
                sim_times=[sim[m] / 4 * k for k in (1, 2, 3, 4)], repeat=i)
            for m, ss in secs.items() for i, s in enumerate(ss)]
    t = versus.speedups(versus.cells(runs)).set_index("method")
    # every run ends at the target (the same losses): its last row, its seconds
    assert t.speedup["decoupled"] == pytest.approx(100.0 / 5.0)
    assert t.speedup_min["decoupled"] == pytest.approx(80.0 / 6.0)
    assert t.speedup_max["decoupled"] == pytest.approx(120.0 / 4.0)
    assert t.sim_speedup["streaming"] == pytest.approx(90.0 / 9.0)
    d = versus.decomposition(versus.cells(runs)).iloc[0]
    assert d.diloco == pytest.approx(5.0) and d.diloco_4bit == pytest.approx(100.0 / 16.0)
    assert d.cut == pytest.approx(10.0) and d.decoupling == pytest.approx(2.0)
    assert d.total == pytest.approx(20.0) == d.cut * d.decoupling
    assert d.sim_cut == pytest.approx(10.0) and d.sim_decoupling == pytest.approx(1.5)
    assert d.sim_total == pytest.approx(15.0)


def test_published_20_stands_beside_decoupled_against_ddp_at_the_slowest_link_only():
    losses = [3.0, 2.6, 2.2, 2.0]
    runs = [run(m, gbit, [k * x for x in (1, 2, 3, 4)], losses)
            for gbit in (1.0, 0.01, 0.001)
            for m, k in (("ddp", 10.0), ("streaming", 2.0), ("decoupled", 1.0))]
    table = versus.speedups(versus.cells(runs)).assign(learners=4, steps=240)
    rows = versus.result_rows(table)
    published = [r for r in rows if r.get("published") is not None]
    assert len(published) == 1
    [p] = published
    assert p["published"] == 20.0 and p["method"] == "decoupled vs ddp"
    assert p["metric"] == "wall-clock speed-up over DDP to the same loss, measured @1 Mbit/s"
    assert p["value"] == pytest.approx(10.0)
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    cut = "speed-up factor from the communication cut (DDP / Streaming), measured @10 Mbit/s"
    assert got[("decoupled vs ddp", cut)] == pytest.approx(5.0)
    assert got[("streaming vs ddp", "wall-clock speed-up over DDP to the same loss, measured "
                "@1000 Mbit/s")] == pytest.approx(5.0)


def test_a_window_is_timed_at_its_pace_over_the_full_loss_curve(monkeypatch):
    """`lockstep_runs` with a fake launch: a windowed DDP run's seconds are its seconds per
    step over the window (from the row at `lead` to the last, evaluations left out) times the
    full loss curve's steps; an end-to-end run keeps its own `train_time_s`. Two speeds in one
    launch that sets each run's link (`set_links`): one warm-up per method measured end to end
    somewhere, at the first speed only; then each speed's repeats in turn."""
    import dataclasses
    import importlib

    launch_module = importlib.import_module("diloco_lite.distributed.launch")
    testbed_module = importlib.import_module("diloco_lite.distributed.testbed")

    class Bed:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def counters(self):
            return None

        def sent_since(self, before):
            return None

    launched = []

    def fake_launch(configs, **kw):
        assert kw["set_links"]
        launched.extend(configs)
        out = []
        for c in configs:
            steps = np.array(eval_points(c), float)
            if c.steps == 6:  # the window: 2 steps that compile (5 s), 0.5 s a step, then 0.25
                train = np.interp(steps, [2, 4, 8], [5.0, 6.0, 7.0])
                sim = 0.4 * steps
            else:
                train, sim = 0.1 * steps, 0.2 * steps
            h = pd.DataFrame(dict(step=steps, val_loss=3.0 - steps / 100, train_time_s=train,
                                  wall_time_s=train + 1.0, sim_time_s=sim,
                                  comm_bytes=100.0 * steps))
            out.append(SimpleNamespace(history=h, final=h.iloc[-1]))
        return out

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    monkeypatch.setattr(testbed_module, "Testbed", Bed)
    base = tiny_run(dl.DDP(), workers=2, steps=12, eval_every=4)
    configs = {"ddp": base, "diloco": tiny_run(dl.DiLoCo(inner_steps=4), workers=2, steps=12,
                                               eval_every=4)}
    full = pd.DataFrame(dict(step=[4.0, 8.0, 12.0], val_loss=[2.9, 2.8, 2.7],
                             comm_bytes=[400.0, 800.0, 1200.0]))
    at = {g: {n: dataclasses.replace(c, cluster=Cluster(link=Link(gbit_per_s=g)))
              for n, c in configs.items()} for g in (0.01, 0.001)}
    runs = versus_runs.lockstep_runs(at, 2, {"ddp": full}, {0.001: {"ddp": (2, 4)}})
    # first a warm-up of each method (DDP is measured end to end at 10 Mbit/s), at the first
    # speed, left out; then each speed's repeats in turn
    assert [(c.steps, c.cluster.link.gbit_per_s) for c in launched] == [
        (12, 0.01), (12, 0.01)] + [(12, 0.01)] * 4 + [(6, 0.001), (12, 0.001)] * 2
    assert [(r["gbit_per_s"], r["method"], r["repeat"]) for r in runs] == [
        (g, n, r) for g in (0.01, 0.001) for r in (0, 1) for n in ("ddp", "diloco")]
    ddp, diloco = runs[4], runs[5]
    assert ddp["how"] == "window of 4 steps" and diloco["how"] == "end to end"
    # from the row at step 2 (5 s) to the last, step 6 (6.5 s): 0.375 s a step, times the full
    # curve's steps 4, 8, 12
    np.testing.assert_allclose(ddp["measured"].time_s, [1.5, 3.0, 4.5])
    np.testing.assert_allclose(ddp["simulated"].time_s, [1.6, 3.2, 4.8])  # 0.4 s a step
    np.testing.assert_allclose(ddp["measured"].val_loss, [2.9, 2.8, 2.7])
    assert ddp["booked_per_host"] == 600.0  # the full run's 1200 bytes over 2 hosts
    np.testing.assert_allclose(diloco["measured"].time_s, [0.4, 0.8, 1.2])
    np.testing.assert_allclose(diloco["simulated"].time_s, [0.8, 1.6, 2.4])
    assert diloco["eval_s"] == 1.0
    how = versus.cells(runs).set_index(["gbit_per_s", "method"]).how
    assert how[(0.001, "ddp")] == "window of 4 steps" and how[(0.01, "ddp")] == "end to end"


def test_a_window_config_evaluates_where_its_window_starts_and_ends():
    c = versus_runs.window_config(tiny_run(dl.DDP(), steps=240, eval_every=20), 4, 20)
    assert c.steps == 24 and eval_points(c) == [4, 8, 12, 16, 20, 24]


def test_which_runs_are_windowed_follows_the_clocks_rough_prediction():
    cluster = Cluster(step_time_s=0.04, link=Link(gbit_per_s=0.001, latency_s=0.002))
    c = tiny_run(dl.DDP(), workers=4, steps=240, cluster=cluster)
    # per step: 0.04 s compute, 2(M-1) = 6 hops of 2 ms, 2(M-1)/M = 1.5 × 500 kB at 1 Mbit/s
    by_hand = 240 * (0.04 + 6 * 0.002 + 1.5 * 500_000 * 8 / 1e6)
    assert versus_runs.predicted_s(c, 500_000.0) == pytest.approx(by_hand)
    d = tiny_run(dl.DiLoCo(inner_steps=40), workers=4, steps=240, cluster=cluster)
    # DiLoCo: one all-gather (M-1 = 3 payloads, 3 hops) every 40 steps
    by_hand = 240 * (0.04 + (3 * 0.002 + 3 * 500_000 * 8 / 1e6) / 40)
    assert versus_runs.predicted_s(d, 500_000.0 / 40) == pytest.approx(by_hand)


def test_the_decoupling_scenarios_and_the_synchronous_limits():
    row = tiny_run(dl.DecoupledDiLoCo(inner_steps=8, fragments=4, overlap=2, bits=4,
                                      down_bits=4, quorum=1, grace_safety=0.5), workers=3,
                   steps=24, cluster=Cluster(step_time_s=0.05, link=Link(gbit_per_s=0.01)))
    slow = versus.decoupling_configs(row, "slow", 30.0)
    assert slow["diloco"][0].cluster.step_time_s == (0.05, 0.05, 0.1)
    killed = versus.decoupling_configs(row, "killed", 30.0)
    for name in ("diloco", "streaming", "decoupled"):
        assert killed[name][0].cluster.failures == ((2, 10.0, 20.0),)  # the middle third
    dil, lock = killed["diloco"]
    a = dil.algorithm
    assert (a.quorum, a.grace_safety, a.merge, a.down_bits, a.fragments, a.overlap, a.bits,
            a.mix) == (3, 0.0, "mean", 32, 1, 0, 32, 0.0)
    assert lock.algorithm == dl.DiLoCo(inner_steps=8, elastic=True)
    s = killed["streaming"][0].algorithm
    assert (s.quorum, s.fragments, s.overlap, s.bits, s.down_bits) == (3, 4, 2, 4, 32)
    assert slow["streaming"][1].algorithm.elastic is False
    assert killed["decoupled"] == (dataclasses_replace(row, killed), None)
    with pytest.raises(ValueError, match="scenario"):
        versus.decoupling_configs(row, "late", 30.0)


def dataclasses_replace(row, killed):
    import dataclasses

    return dataclasses.replace(row, cluster=killed["decoupled"][0].cluster)


def test_the_table_s_methods_are_the_four_methods_at_the_same_h():
    import dataclasses

    if "bits" not in {f.name for f in dataclasses.fields(dl.DDP)}:
        pytest.skip("DDP(bits=16) comes with branch wip-ddpbits (the ddp-bf16 row needs it)")
    m = versus.methods(4, 240, 40)
    assert m["ddp"].algorithm == dl.DDP() and m["ddp-bf16"].algorithm == dl.DDP(bits=16)
    assert m["diloco"].algorithm == dl.DiLoCo(inner_steps=40)
    assert m["diloco-4bit"].algorithm == dl.StreamingDiLoCo(inner_steps=40, fragments=1,
                                                            overlap=0, bits=4, mix=0.0)
    st, dec = m["streaming"].algorithm, m["decoupled"].algorithm
    assert (st.fragments, st.overlap, st.bits, st.mix) == (dec.fragments, dec.overlap,
                                                           dec.bits, dec.mix) == (4, 2, 4, 0.0)
    assert {c.steps for c in m.values()} == {240} and {c.workers for c in m.values()} == {4}


def test_a_decoupled_runs_flush_ends_where_its_meter_stopped():
    result = SimpleNamespace(wire=[{"s": 31.5}])
    assert versus_runs.flush_end_s(result) == pytest.approx(31.0)
    assert np.isnan(versus_runs.flush_end_s(SimpleNamespace(wire=None)))


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
    # learner 0 was a returning learner's peer: its inner state (7,000 bytes) went from its host
    # to learner 1's, not through the syncer's, whose booked bytes each way leave it out
    wire[1]["direct_up"], wire[2]["direct_down"] = 7_000, 7_000
    out = versus.wire_rows(run, None)
    assert out["syncer_up_booked"] == 180_000 - 7_000
    assert out["syncer_down_booked"] == 100_000 - 7_000
    assert out["up_booked"] == 50_000 and out["down_booked"] == 90_000


def test_a_calls_unbooked_bytes_are_its_pickle_less_its_booked_arrays():
    import pickle

    from diloco_lite.actors.ray_actors import unbooked_bytes

    payload = np.arange(1000, dtype=np.uint8)
    report = {"losses": [2.5, 2.4]}
    args = (0, 1, 2, 3, payload, 4, 5.0, report)
    assert unbooked_bytes(args, payload) == len(pickle.dumps(args, protocol=5)) - 1000
    assert unbooked_bytes(("publish", 1.5), None) == len(pickle.dumps(("publish", 1.5),
                                                                      protocol=5))



def test_the_docs_show_the_committed_table():
    """docs/systems.md shows `figures/versus.md` (what `make reproduce` wrote from the tables)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    table = pd.read_csv(root / "figures" / "versus.csv")
    if "method" not in table:
        pytest.skip("figures/versus.csv predates the four-method table (issue 37): the full "
                    "run writes it")
    decoupling = pd.read_csv(root / "figures" / "versus_decoupling.csv")
    shown = versus.markdown(table) + "\n\n" + versus.decoupling_markdown(decoupling)
    assert (root / "figures" / "versus.md").read_text().strip() == shown
    assert versus.markdown(table) in (root / "docs" / "systems.md").read_text()


def test_a_runs_startup_is_its_first_block_beyond_the_pace_of_the_rest():
    # rows at steps 10, 20, 30: 0.05 s a step after the first row, which took 5 s for 10 steps
    h = pd.DataFrame(dict(step=[10, 20, 30], train_time_s=[5.0, 5.5, 6.0]))
    assert versus_runs.startup_s(h) == pytest.approx(5.0 - 10 * 0.05)


def test_a_runs_kill_times_are_its_replacements_longest_finite_times():
    """`kill_times`: over `runtime["kills"]` (`runtime._kills`), the largest `ready_s` and
    `first_step_s` among the finite ones; a run without a kill (or a runtime) gives nothing,
    and one whose replacements never served (NaN) leaves that time out."""
    def kill(m, kill_s, back_s, ready_s, first_step_s):
        return dict(learner=m, kill_s=kill_s, back_s=back_s, ready_s=ready_s,
                    first_step_s=first_step_s)

    kills = [kill(0, 1.0, 2.0, 0.25, 0.5),
             kill(1, 3.0, 4.5, 0.75, np.nan),  # its replacement never took a step
             kill(0, 5.0, 6.0, np.nan, 1.25)]  # never ran (killed again, or the end)
    got = versus_runs.kill_times(SimpleNamespace(runtime={"kills": kills}))
    assert got == {"max_ready_s": max(0.25, 0.75), "max_first_step_s": max(0.5, 1.25)}
    # one kill whose replacement never ran: no time at all
    assert versus_runs.kill_times(SimpleNamespace(runtime={"kills": [kills[2]]})) == {
        "max_first_step_s": 1.25}
    assert versus_runs.kill_times(SimpleNamespace(runtime={"kills": [
        kill(2, 1.0, 2.0, np.nan, np.inf)]})) == {}
    assert versus_runs.kill_times(SimpleNamespace(runtime={"kills": []})) == {}
    assert versus_runs.kill_times(SimpleNamespace(runtime={"clock": {}})) == {}
    assert versus_runs.kill_times(SimpleNamespace(runtime=None)) == {}
    assert versus_runs.kill_times(SimpleNamespace()) == {}


def test_the_decoupling_rows_time_the_lockstep_reference_to_the_clocks_target():
    steps = [10, 20, 30, 40]
    runs = [dict(scenario="killed", method=m, repeat=0, how="end to end", goodput=g,
                 measured=history(steps, [3.0, 2.6, 2.2, final - 0.05], [1, 2, 3, 4]),
                 simulated=history(steps, [3.0, 2.6, 2.2, final], [1, 2, 3, 4]))
            for m, final, g in (("diloco", 2.0, 0.7), ("decoupled", 2.1, 0.9))]
    # the lock-step method itself on the clock: not part of the target
    runs[0]["lockstep"] = history(steps, [3.0, 2.6, 2.2, 1.5], [2, 4, 6, 8])
    t = versus.cells(runs, by="scenario").set_index("method")
    assert t.sim_target_loss["diloco"] == 2.1  # decoupled's final, the worse one
    # the target: the worst final of every run, measured (decoupled's 2.05) or on the clock
    # (decoupled's 2.1)
    assert t.target_loss["diloco"] == pytest.approx(2.1)
    # timed to the target, as `sim_s`: 2.1 lies 0.1 of 0.7 of the way from 2.2 (6 s) to 1.5
    # (8 s)
    assert t.lockstep_sim_s["diloco"] == pytest.approx(6.0 + 2.0 * 0.1 / 0.7)
    assert np.isnan(t.lockstep_sim_s["decoupled"]) and t.goodput["decoupled"] == 0.9
