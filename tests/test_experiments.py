"""The experiment definitions and the resumable runner behind `make reproduce`."""

import json
import math

import pandas as pd
import pytest

import diloco_lite as dl
from diloco_lite import experiments, reproduce
from tests.helpers import tiny_run


def test_quick_mode_keeps_every_group_and_label():
    from diloco_lite.experiments import scaling

    full, quick = experiments.groups(False), experiments.groups(True)
    assert list(full) == list(quick) == list(experiments.GROUPS)
    for group in full:
        if group == "scaling":  # quick mode: two sizes and smaller grids, the same stages
            stages = lambda g: {(c.factor, c.m) for c in map(scaling.Cell.parse, g)}  # noqa: E731
            assert stages(full[group]) == stages(quick[group])
        else:
            assert len(full[group]) == len(quick[group])
        for cfg in [*full[group].values(), *quick[group].values()]:
            assert cfg.inner_optimizer is None  # cacheable by repr
            assert getattr(cfg.algorithm, "outer_optimizer", None) is None
    # equal tokens within the H sweep and the M sweep (global batch held fixed)
    for group in ("h_sweep", "m_sweep"):
        assert len({c.tokens_per_step * c.steps for c in full[group].values()}) == 1


def test_run_cached_resumes_without_retraining(tmp_path, monkeypatch):
    cfg = tiny_run(dl.DDP(), inner_optimizer=None, steps=2, eval_every=2)
    first = reproduce.run_cached(cfg, tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.csv"))) == 1

    def no_training(*a, **k):
        raise AssertionError("a cached run was trained again")

    monkeypatch.setattr("diloco_lite.training.train", no_training)
    again = reproduce.run_cached(cfg, tmp_path, progress=False)
    pd.testing.assert_frame_equal(first, again, check_dtype=False)
    other = tiny_run(dl.DDP(), inner_optimizer=None, steps=3, eval_every=3)
    with pytest.raises(AssertionError, match="trained again"):
        reproduce.run_cached(other, tmp_path, progress=False)  # a new config is not cached


def test_run_cached_refuses_custom_optimizers(tmp_path):
    with pytest.raises(ValueError, match="default"):
        reproduce.run_cached(tiny_run(dl.DDP()), tmp_path)


def test_results_table_merges_the_experiments_not_rerun(tmp_path):
    row = dict(experiment="bandwidth", method="ddp", metric="m", value=1.0, published=2.0,
               config="c")
    reproduce.write_results(pd.DataFrame([row, {**row, "experiment": "goodput"}]), tmp_path)
    reproduce.write_results(pd.DataFrame([{**row, "value": 3.0}]), tmp_path, merge=True)
    records = json.loads((tmp_path / "results.json").read_text())
    # the re-run experiment keeps its place: bandwidth first, as it was
    assert [(r["experiment"], r["value"]) for r in records] == [("bandwidth", 3.0),
                                                                ("goodput", 1.0)]
    assert "| bandwidth | ddp | m | 3 | 2 |" in (tmp_path / "results.md").read_text()


def test_cache_key_follows_the_training_code(tmp_path, monkeypatch):
    """A fix to a driver must invalidate cached runs; a change to a figure must not."""
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(reproduce.Path(reproduce.__file__).parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    before = reproduce.source_hash(copy)
    (copy / "plots" / "__init__.py").write_text("# a figure changed\n")
    assert reproduce.source_hash.__wrapped__(copy) == before
    lockstep = copy / "clock" / "lockstep.py"
    lockstep.write_text(lockstep.read_text().replace('"""', '"""Prose changed. ', 1) + "\n# note\n")
    assert reproduce.source_hash.__wrapped__(copy) == before  # docstrings and comments only
    lockstep.write_text(lockstep.read_text() + "\nMAX_RESTARTS_PER_STEP = 99\n")
    assert reproduce.source_hash.__wrapped__(copy) != before
    # and the run cache uses it: another source hash is a cache miss
    cfg = tiny_run(dl.DDP(), inner_optimizer=None, steps=2, eval_every=2)
    key = reproduce.run_key(cfg)
    monkeypatch.setattr(reproduce, "source_hash", lambda: "another code")
    assert reproduce.run_key(cfg) != key


def _final(**values):
    """A one-row history: the final numbers of a run (the columns `quality.summary` reads)."""
    cols = dict(step=600, tokens=1e6, val_accuracy=0.4, val_loss=2.0, test_accuracy=0.4,
                test_loss=2.0, comm_bytes=1e6, down_bytes=0.0, peak_step_bytes=1e4,
                peak_gbps=1.0, goodput=1.0)
    return pd.DataFrame([{**cols, **values}])


def test_quality_group_is_every_method_over_seeds_at_the_protocol_and_the_tuned_lr():
    from diloco_lite.experiments import decoupled, protocol, quality

    for quick in (False, True):
        g = experiments.groups(quick)
        runs = g["quality"]
        assert len(runs) == len(quality.METHODS) * len(quality.SEEDS) and len(quality.SEEDS) >= 3
        for method in quality.METHODS:
            cfgs = [runs[quality.label(method, s)] for s in quality.SEEDS]
            assert [c.seed for c in cfgs] == list(quality.SEEDS)
            assert len({c.tokens_per_step * c.steps for c in cfgs}) == 1
        tokens = {c.tokens_per_step * c.steps for c in runs.values()}
        assert tokens == {g["h_sweep"]["DDP"].tokens_per_step * g["h_sweep"]["DDP"].steps}
        chaos = [runs[quality.label("Decoupled DiLoCo, chaos", s)].cluster for s in quality.SEEDS]
        assert [c.seed for c in chaos] == list(quality.SEEDS)  # a failure draw per seed
        h = experiments.H_REF[quick]
        for method in protocol.TUNABLE:  # seed 0 is the tuning run at the recorded choice
            cfg = runs[quality.label(method, 0)]
            assert cfg.algorithm.outer_lr == protocol.TUNED[method]
            assert repr(cfg) == repr(g["tuning"][f"{method} · outer lr {protocol.TUNED[method]:g}"])
            assert cfg.algorithm.inner_steps == h
        ref = decoupled.reference(quick, outer_lr=protocol.TUNED["Decoupled DiLoCo"])
        assert ref == runs[quality.label("Decoupled DiLoCo", 1)].algorithm
    full = experiments.groups(False)["quality"]
    outer = {c.steps // c.algorithm.inner_steps for c in full.values()
             if hasattr(c.algorithm, "inner_steps")}
    assert outer == {48}  # the papers' protocol: enough outer steps to mean something


def test_quality_rows_are_mean_and_sample_std_over_seeds_with_the_gaps_to_ddp():
    import statistics

    from diloco_lite.experiments import quality

    acc = {"DDP": (0.50, 0.52, 0.51), "DiLoCo": (0.47, 0.49, 0.44),
           "Decoupled DiLoCo": (0.46, 0.48, 0.50)}
    loss = {"DDP": (1.8, 1.7, 1.9), "DiLoCo": (2.0, 2.2, 2.1), "Decoupled DiLoCo": (2.1, 2.0, 2.3)}
    sent = {"DDP": 5e8, "DiLoCo": 1e7, "Decoupled DiLoCo": 2.5e6}
    histories = {quality.label(m, s): _final(test_accuracy=acc[m][s], test_loss=loss[m][s],
                                             comm_bytes=sent[m] * (1 + s / 10),
                                             down_bytes=3e6 if m.startswith("Dec") else 0.0)
                 for m in acc for s in range(3)}
    rows = quality.rows("quality", histories)
    get = {(r["method"], r["metric"]): r for r in rows}
    for m in acc:
        r = get[m, "held-out accuracy"]
        assert r["experiment"] == "quality" and r["seeds"] == 3
        assert r["value"] == pytest.approx(statistics.mean(acc[m]))
        assert r["std"] == pytest.approx(statistics.stdev(acc[m]))  # ddof = 1, not 0
        assert get[m, "held-out loss"]["std"] == pytest.approx(statistics.stdev(loss[m]))
        assert get[m, "total bytes sent"]["value"] == pytest.approx(sent[m] * 1.1)
    assert ("DDP", "total bytes down (syncer)") not in get  # lock-step: nothing comes down
    assert get["Decoupled DiLoCo", "total bytes down (syncer)"]["value"] == 3e6
    gap = get["Decoupled DiLoCo", "accuracy gap to DDP (points)"]
    assert gap["value"] == pytest.approx(100 * (0.48 - 0.51))
    assert gap["published"] == pytest.approx(-0.3)  # 64.1 vs 64.4
    ppl = get["DiLoCo", "perplexity / DDP perplexity"]
    assert ppl["value"] == pytest.approx(math.exp(2.1) / math.exp(1.8))
    assert ppl["published"] == pytest.approx(15.02 / 15.30)
    assert get["DiLoCo", "accuracy gap to DDP (points)"]["published"] is None
    assert get["DiLoCo", "bytes reduction vs DDP (x)"]["value"] == pytest.approx(50)


def test_results_table_shows_mean_std_and_seeds(tmp_path):
    row = dict(experiment="quality", method="DDP", metric="held-out accuracy", value=0.5,
               std=0.01, seeds=3, published=None, config="c")
    other = dict(experiment="bandwidth", method="ddp", metric="m", value=1.0, published=2.0,
                 config="c")
    close = dict(experiment="goodput", method="dp", metric="goodput @1.2M chips", value=0.265,
                 published=0.27, config="c")
    reproduce.write_results(pd.DataFrame([row, other, close]), tmp_path)
    records = {r["experiment"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert records["quality"]["std"] == 0.01 and records["quality"]["seeds"] == 3
    assert records["bandwidth"]["std"] is None and records["bandwidth"]["seeds"] is None
    text = (tmp_path / "results.md").read_text()
    assert ("| quality | DDP | held-out accuracy | 0.5 ± 0.01 (3 seeds) | none "
            "| no published analogue | c |") in text
    assert "| bandwidth | ddp | m | 1 | 2 | the published figure's inputs were not" in text
    assert "| goodput | dp | goodput @1.2M chips | 0.265 | 0.27 | matches | c |" in text
