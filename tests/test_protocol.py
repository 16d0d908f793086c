"""The papers' protocol (`experiments.protocol`): tuning on the tune plays, the warm-start
table, the outer learning rate, and the results table's notes (the scaling-law sweep:
tests/test_scaling.py)."""

import math

import jax
import numpy as np
import optax
import pandas as pd
import pytest

import diloco_lite as dl
from diloco_lite.experiments import protocol, published
from tests.helpers import tiny_run


def _final(**values) -> pd.DataFrame:
    return pd.DataFrame([{"step": 40, "outer_steps": 5.0, **values}])


def test_the_outer_lr_is_chosen_on_the_tune_plays_never_on_the_test_plays(monkeypatch):
    # tune loss prefers 0.4 for DiLoCo and 1.0 for Streaming; the test loss prefers the opposite
    tune = {("DiLoCo", 0.4): 2.0, ("DiLoCo", 0.7): 2.1, ("DiLoCo", 1.0): 2.3,
            ("Streaming DiLoCo", 0.4): 2.4, ("Streaming DiLoCo", 0.7): 2.2,
            ("Streaming DiLoCo", 1.0): 2.1}
    histories = {f"{m} · outer lr {lr:g}": _final(tune_loss=v, tune_accuracy=0.3,
                                                  test_loss=5.0 - v)
                 for (m, lr), v in tune.items()}
    grid = protocol.choose(histories)
    chosen = dict(zip(grid[grid.chosen].method, grid[grid.chosen].outer_lr, strict=True))
    assert chosen == {"DiLoCo": 0.4, "Streaming DiLoCo": 1.0}
    assert grid.chosen.sum() == 2  # one per method
    monkeypatch.setattr(protocol, "TUNED", {"DiLoCo": 0.7, "Streaming DiLoCo": 1.0})
    said = protocol.disagreements(histories)
    assert len(said) == 1 and "TUNED" in said[0]  # Streaming's recorded choice agrees
    assert "set experiments.protocol.TUNED['DiLoCo'] = 0.4" in said[0]


def test_warm_table_compares_each_method_with_ddp_in_the_same_regime():
    acc = {("DDP", "from scratch"): 0.48, ("DDP", "warm start"): 0.50,
           ("DiLoCo", "from scratch"): 0.45, ("DiLoCo", "warm start"): 0.49}
    loss = {k: 3.0 - 2 * a for k, a in acc.items()}
    t = protocol.warm_table({f"{m} · {r}": _final(test_accuracy=a, test_loss=loss[m, r])
                             for (m, r), a in acc.items()}).set_index(["method", "regime"])
    assert t.gap_points["DiLoCo", "warm start"] == pytest.approx(-1.0)
    assert t.gap_points["DiLoCo", "from scratch"] == pytest.approx(-3.0)
    assert t.ppl_ratio["DiLoCo", "warm start"] == pytest.approx(math.exp(0.02))


def test_every_protocol_group_shares_the_protocol_and_the_warm_start():
    for quick in (False, True):
        g = protocol.groups(quick)
        warm = {k: c for k, c in g["warm_start"].items() if k.endswith("warm start")}
        assert len({repr(c.warm_start) for c in warm.values()}) == 1  # one pre-training
        w = next(iter(warm.values())).warm_start
        assert w.algorithm == dl.DDP() and w.steps == protocol.WARM_STEPS[quick]
        assert all(c.data_offset == w.steps for c in warm.values())
        m = protocol.m_sweep(quick)  # notebook 02's M sweep: equal tokens, global batch 32
        assert len({c.tokens_per_step * c.steps for c in m.values()}) == 1
        assert {c.global_batch for c in m.values()} == {8 * protocol.BATCH[quick]}


def test_outer_lr_is_nesterov_at_that_rate_and_validated():
    explicit = optax.sgd(0.3, momentum=0.9, nesterov=True)
    a = dl.train(tiny_run(dl.DiLoCo(inner_steps=2, outer_lr=0.3), steps=4), progress=False)
    b = dl.train(tiny_run(dl.DiLoCo(inner_steps=2, outer_optimizer=explicit), steps=4),
                 progress=False)
    c = dl.train(tiny_run(dl.DiLoCo(inner_steps=2), steps=4), progress=False)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.final.val_loss != c.final.val_loss  # the default 0.7 is another run
    for algo in (dl.DiLoCo, dl.StreamingDiLoCo, dl.DecoupledDiLoCo):
        with pytest.raises(ValueError, match=f"{algo.__name__}.outer_lr"):
            algo(outer_lr=0.0)


def test_runs_of_one_schedule_share_their_compiled_steps_and_others_do_not():
    from diloco_lite.algorithms.learners import inner_fn
    from diloco_lite.training import setup

    run = lambda **kw: tiny_run(dl.DiLoCo(inner_steps=2), inner_optimizer=None, **kw)  # noqa: E731
    _, model, mesh, opt = setup(run(steps=4))
    _, model2, mesh2, opt2 = setup(run(steps=4, seed=3))
    _, _, _, longer = setup(run(steps=5))
    assert inner_fn(model, mesh, opt) is inner_fn(model2, mesh2, opt2)
    assert inner_fn(model, mesh, opt) is not inner_fn(model, mesh, longer)


def test_every_published_row_says_why_it_differs_and_the_others_say_none():
    row = dict(experiment="h_sweep", method="DiLoCo H=50", metric="perplexity / DDP perplexity",
               value=1.28, published=0.98)
    assert "150M" in published.note(row)
    assert published.note({**row, "value": 0.99}) == "matches"
    assert published.note({**row, "published": None}) == published.NO_ANALOGUE
    ablation = dict(experiment="decoupled ablations", metric="accuracy vs reference (points)",
                    value=-0.8, published=-12.7)
    assert "2-bit" in published.note({**ablation, "method": "2-bit"})
    assert "one seed" in published.note({**ablation, "method": "mean, M=8"})


def test_a_chosen_outer_lr_on_the_grids_edge_says_so():
    # tune loss lowest at 1.0 for DiLoCo (inside the grid), at the grid's top for Streaming
    tune = {"DiLoCo": {0.4: 2.3, 0.7: 2.1, 1.0: 2.0, 1.3: 2.2},
            "Streaming DiLoCo": {0.4: 2.3, 0.7: 2.2, 1.0: 2.1, 1.3: 2.0}}
    histories = {f"{m} · outer lr {lr:g}": _final(tune_loss=v, tune_accuracy=0.3, test_loss=2.0)
                 for m, by_lr in tune.items() for lr, v in by_lr.items()}
    assert set(protocol.OUTER_LRS) == {0.4, 0.7, 1.0, 1.3}
    chosen = {r["method"]: r for r in protocol.rows("tuning", histories)
              if r["metric"] == "chosen outer lr (tune plays)"}
    assert chosen["DiLoCo"]["value"] == 1.0 and "EDGE" not in chosen["DiLoCo"]["config"]
    assert chosen["Streaming DiLoCo"]["value"] == 1.3
    assert "ON THE GRID'S EDGE" in chosen["Streaming DiLoCo"]["config"]
