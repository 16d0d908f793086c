"""The experiment definitions and the resumable runner behind `make reproduce`."""

import json

import pandas as pd
import pytest

import diloco_lite as dl
from diloco_lite import experiments, reproduce
from tests.helpers import tiny_run


def test_quick_mode_keeps_every_group_and_label():
    full, quick = experiments.groups(False), experiments.groups(True)
    assert list(full) == list(quick) == list(experiments.GROUPS)
    for group in full:
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
    assert {(r["experiment"], r["value"]) for r in records} == {("goodput", 1.0),
                                                                ("bandwidth", 3.0)}
    assert "| bandwidth | ddp | m | 3 | 2 | c |" in (tmp_path / "results.md").read_text()


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
