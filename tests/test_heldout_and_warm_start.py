"""Held-out tune/test split and warm starts, each checked against a plain reference loop.

`Corpus.eval_plays` and the evaluator's tune/test/val metrics against a per-sequence loop in
numpy; `RunConfig.warm_start` (batches at `data_offset + k`, the starting parameters,
`init_params`) against separately trained runs; `reproduce.run_cached` training a shared warm
start once.
"""

import dataclasses

import jax
import numpy as np
import pandas as pd
import pytest

import diloco_lite as dl
from diloco_lite import reproduce, training
from diloco_lite.data import HELD_OUT, TEST_PLAYS, TUNE_PLAYS, Corpus, load_corpus
from diloco_lite.model import build_model

from .helpers import TINY, assert_trees_close, max_abs_diff, tiny_run

SEQ_LEN = 16


def _ref_starts_and_plays(corpus, n, b, seq_len):
    """Reference: the evaluation offsets and, per offset, the first held-out play (in text
    order) whose stop lies beyond it (the separator before a play counts for that play)."""
    starts = np.linspace(0, len(corpus.val) - seq_len - 1, n * b).round().astype(int)
    rows = [r for r in corpus.plays.itertuples() if r.split == "val"]
    rows.sort(key=lambda r: r.start)
    titles = []
    for s in starts:
        owner = None
        for r in rows:
            if s < r.stop:
                owner = r.title
                break
        titles.append(owner)
    return starts, np.array(titles, dtype=object)


def test_eval_plays_matches_a_plain_loop_over_the_plays():
    """eval_plays names the play each evaluation sequence starts in, separators included."""
    corpus = load_corpus()
    bounds = sorted((r.start, r.stop) for r in corpus.plays.itertuples() if r.split == "val")
    gaps = [(stop, nxt) for (_, stop), (nxt, _) in zip(bounds, bounds[1:], strict=False)]
    in_gap = 0
    # (2, 64): the evaluation's shape; the others put offsets on a play's last character, on
    # the first separator character, and on the second one.
    for n, b in [(2, 64), (600, 1), (842, 1), (327, 1)]:
        starts, ref = _ref_starts_and_plays(corpus, n, b, SEQ_LEN)
        got = corpus.eval_plays(n, batch_size=b, seq_len=SEQ_LEN)
        assert got.shape == (n, b)
        np.testing.assert_array_equal(got.reshape(-1).astype(object), ref)
        in_gap += sum(lo <= s < hi for s in starts for lo, hi in gaps)
    assert in_gap >= 2  # the separator rule really was exercised
    assert set(TUNE_PLAYS) | set(TEST_PLAYS) == set(HELD_OUT)
    assert (len(TUNE_PLAYS), len(TEST_PLAYS)) == (2, 3) and not set(TUNE_PLAYS) & set(TEST_PLAYS)


def test_evaluator_tune_test_val_match_a_per_sequence_loop():
    """tune_/test_/val_ metrics are the means over their plays' sequences (numpy reference)."""
    corpus = load_corpus()
    mcfg = dl.ModelConfig(context=SEQ_LEN, d_model=16, n_layers=1, n_heads=2)
    model = build_model(dataclasses.replace(mcfg, vocab_size=corpus.vocab_size))
    rng = np.random.default_rng(0)  # sharper logits than the init: no near-tie argmaxes
    init = jax.jit(model.init, static_argnums=0)  # one program: op by op took seconds
    params = jax.tree.map(lambda x: np.asarray(x) + 0.3 * rng.standard_normal(np.shape(x))
                          .astype(np.float32), init(3))
    config = dl.RunConfig(model=mcfg, seq_len=SEQ_LEN, eval_batches=2)
    metrics = training.make_evaluator(model, corpus, config)(params)

    n_seq = config.eval_batches * training.EVAL_BATCH
    starts, plays = _ref_starts_and_plays(corpus, config.eval_batches, training.EVAL_BATCH,
                                          SEQ_LEN)
    seqs = np.stack([corpus.val[s:s + SEQ_LEN + 1] for s in starts])
    logits = np.asarray(jax.jit(model.apply)(params, seqs[:, :-1]), np.float64)
    loss, acc = np.zeros(n_seq), np.zeros(n_seq)
    for i in range(n_seq):
        z = logits[i] - logits[i].max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        targets = seqs[i, 1:]
        loss[i] = -np.mean(logp[np.arange(SEQ_LEN), targets])
        acc[i] = np.mean(logits[i].argmax(-1) == targets)
    tune = np.array([p in TUNE_PLAYS for p in plays])
    test = np.array([p in TEST_PLAYS for p in plays])
    assert tune.sum() > 0 and test.sum() > 0 and (tune ^ test).all()
    expected = {"val_loss": loss.mean(), "val_accuracy": acc.mean(),
                "tune_loss": loss[tune].mean(), "tune_accuracy": acc[tune].mean(),
                "test_loss": loss[test].mean(), "test_accuracy": acc[test].mean()}
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-5, rel=1e-5), key
    assert abs(expected["tune_loss"] - expected["test_loss"]) > 1e-3  # a swap would show


def _warm_and_continued(**kw):
    warm = tiny_run(steps=2, eval_every=2)
    cont = tiny_run(steps=3, eval_every=3, inner_optimizer=None, warm_start=warm, **kw)
    return warm, cont


def _history(result):
    return result.history.drop(columns=["wall_time_s", "train_time_s"])


def test_warm_start_continues_the_data_and_the_parameters(monkeypatch):
    """A warm-started run draws steps data_offset + k and starts from the warm start's params."""
    warm, cont = _warm_and_continued(learning_rate=1e-12, warmup_steps=0)
    assert cont.data_offset == 2 and tiny_run(warm_start=cont).data_offset == 5
    warm_result = training.train(warm, progress=False)
    drawn = []
    original = Corpus.batch

    def recording(self, step, **kw):
        drawn.append(step)
        return original(self, step, **kw)

    monkeypatch.setattr(Corpus, "batch", recording)
    result = training.train(cont, progress=False, init_params=warm_result.params)
    monkeypatch.setattr(Corpus, "batch", original)
    assert sorted(set(drawn)) == [2, 3, 4]
    # lr 1e-12: the continued run ends where it started, i.e. at the warm start's end
    assert_trees_close(result.params, warm_result.params, rtol=0, atol=1e-6)
    _, model, _, _ = training.setup(cont)
    assert max_abs_diff(result.params, model.init(cont.seed)) > 1e-3
    # and it starts from whatever init_params says
    other = jax.tree.map(lambda x: np.asarray(x) + 0.1, model.init(7))
    moved = training.train(cont, progress=False, init_params=other)
    assert_trees_close(moved.params, other, rtol=0, atol=1e-6)


def test_warm_start_init_params_equal_training_it_first():
    """Passing the warm start's params gives the same history as letting train train it."""
    warm, cont = _warm_and_continued()
    given = training.train(cont, progress=False,
                           init_params=training.train(warm, progress=False).params)
    itself = training.train(cont, progress=False)
    pd.testing.assert_frame_equal(_history(given), _history(itself))
    assert_trees_close(given.params, itself.params, rtol=0, atol=0)


def test_run_cached_trains_a_shared_warm_start_once(monkeypatch, tmp_path):
    """Two (then three) cached runs sharing a warm start train it once and save its params."""
    warm = tiny_run(steps=2, eval_every=2, inner_optimizer=None)
    a = tiny_run(steps=2, eval_every=2, inner_optimizer=None, warm_start=warm)
    b = dataclasses.replace(a, seed=1)
    c = dataclasses.replace(a, steps=3, eval_every=3)
    original, warm_results = training.train, []

    def counting(config, **kw):
        result = original(config, **kw)
        if config == warm:
            warm_results.append(result)
        return result

    monkeypatch.setattr(training, "train", counting)
    ha, hb = reproduce.run_cached(a, tmp_path), reproduce.run_cached(b, tmp_path)
    assert len(warm_results) == 1
    assert (tmp_path / f"{reproduce.run_key(warm)}.params.npz").exists()
    reproduce.run_cached(c, tmp_path)
    assert len(warm_results) == 1
    loaded = reproduce.params_cached(warm, tmp_path)
    assert_trees_close(loaded, warm_results[0].params, rtol=0, atol=0)
    assert len(warm_results) == 1 and not ha["val_loss"].equals(hb["val_loss"])


def test_warm_start_validation():
    """warm_start must be a RunConfig of the same model; init_params needs a warm_start."""
    other = dataclasses.replace(TINY, d_model=64)
    with pytest.raises(ValueError, match="RunConfig.warm_start"):
        tiny_run(warm_start=tiny_run(model=other))
    with pytest.raises(ValueError, match="RunConfig.warm_start"):
        tiny_run(warm_start="x")
    cfg = tiny_run()
    _, model, _, _ = training.setup(cfg)
    with pytest.raises(ValueError, match="init_params"):
        training.train(cfg, progress=False, init_params=model.init(0))
    with pytest.raises(ValueError, match="init_params"):  # a tree of other shapes
        wrong = training.setup(tiny_run(model=other))[1].init(0)
        training.train(tiny_run(warm_start=tiny_run()), progress=False, init_params=wrong)
