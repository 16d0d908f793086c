"""The scaling-law sweep (`experiments.scaling`): its design (tokens in proportion to parameters,
the batch finding at equal outer steps), the choices on the tune plays, the paired gaps over
seeds, the findings' verdicts, and `make reproduce` never training it."""

import math

import jax
import pandas as pd
import pytest

import diloco_lite as dl
from diloco_lite import reproduce
from diloco_lite.experiments import scaling
from diloco_lite.model import build_model


def _final(**values) -> pd.DataFrame:
    return pd.DataFrame([{"step": 20, "outer_steps": 5.0, **values}])


@pytest.mark.parametrize("quick", [False, True])
def test_every_size_trains_on_the_same_tokens_per_parameter(quick):
    ratio = scaling.TOKENS_PER_PARAM[quick]
    for size, (_, n_params, own) in scaling.SIZES[quick].items():
        cells = [c for c in scaling.cells(quick)
                 if c.size == size and c.factor == 1 and c.more_tokens == 1]
        for cell in cells:
            cfg, batch = scaling.config(quick, cell), cell.base or own
            tokens = cfg.steps * cfg.workers * cfg.batch_size * cfg.seq_len
            # whole outer steps of H, the nearest: within half an outer step of the ratio
            half_outer_step = scaling.H[quick] * batch * cfg.seq_len / 2
            assert abs(tokens - ratio * n_params) <= half_outer_step
            if not cell.base:
                assert abs(tokens / n_params / ratio - 1) < (0.1 if quick else 0.03)
            assert cfg.workers * cfg.batch_size == batch  # M × B: the size's global batch
            assert cell.base in (0, scaling.SMALL_BASE[quick])  # or the batch cause's
            assert cfg.steps % scaling.H[quick] == 0
    counts = [n for _, n, _ in scaling.SIZES[quick].values()]
    if not quick:
        assert max(counts) / min(counts) >= 8  # the issue: sizes spanning at least 8x


def test_the_recorded_parameter_counts_are_the_models():
    for sizes in scaling.SIZES.values():
        for model, n_params, _ in sizes.values():
            m = build_model(dl.ModelConfig(**{**model.__dict__, "vocab_size": 76}))
            leaves = jax.tree.leaves(m.template)
            assert sum(math.prod(getattr(x, "value", x).shape) for x in leaves) == n_params


def test_the_larger_batch_keeps_tokens_and_outer_steps():
    for quick in (False, True):
        cells = scaling.cells(quick)
        big = [c for c in cells if c.factor == scaling.LARGE_BATCH and c.more_tokens == 1]
        for size in scaling.SIZES[quick]:  # every size: DDP and M = 8 at least
            assert {0, 8} <= {c.m for c in big if c.size == size}
        for c in big:
            small = scaling.config(quick, scaling.Cell(c.size, 1, c.m, c.inner_lr, c.outer_lr,
                                                       c.seed, base=c.base))
            large = scaling.config(quick, c)
            assert large.tokens_per_step == scaling.LARGE_BATCH * small.tokens_per_step
            assert large.tokens_per_step * large.steps == small.tokens_per_step * small.steps
            if c.m:  # H / 4: the same number of outer steps
                assert large.steps // large.algorithm.inner_steps == \
                    small.steps // small.algorithm.inner_steps


def test_the_cause_checks_change_one_thing_each():
    for quick in (False, True):
        for c in scaling.cause_cells(quick):
            plain = scaling.config(quick, scaling.Cell(c.size, c.factor, c.m, c.inner_lr,
                                                       c.outer_lr, c.seed))
            cfg = scaling.config(quick, c)
            assert cfg.model == plain.model
            h, h0 = (getattr(x.algorithm, "inner_steps", None) for x in (cfg, plain))
            if c.base:  # a smaller global batch, the same tokens and H
                assert c.more_syncs == c.more_tokens == 1
                assert cfg.tokens_per_step == c.base * c.factor * cfg.seq_len
                assert plain.tokens_per_step == scaling.SIZES[quick][c.size][2] * c.factor * 64
                tokens = cfg.steps * cfg.tokens_per_step  # the ratio's, to half an outer step
                ratio = scaling.TOKENS_PER_PARAM[quick] * scaling.SIZES[quick][c.size][1]
                assert abs(tokens - ratio) <= scaling.H[quick] * cfg.tokens_per_step / 2
                assert h == h0
                continue
            assert cfg.tokens_per_step == plain.tokens_per_step
            if c.more_syncs > 1:  # same tokens, 4x the outer steps
                assert cfg.steps == plain.steps and h * scaling.MORE == h0
            else:  # 4x the tokens at the same H
                assert c.more_tokens == scaling.MORE and cfg.steps == scaling.MORE * plain.steps
                assert h == h0


def test_labels_round_trip_and_are_unique():
    for quick in (False, True):
        cells = scaling.cells(quick)
        assert len({c.label for c in cells}) == len(cells)
        assert all(scaling.Cell.parse(c.label) == c for c in cells)


def _histories(quick, loss) -> dict:
    """Synthetic final rows for every cell of the sweep: `loss(cell)` -> (tune, test)."""
    out = {}
    for c in scaling.cells(quick):
        tune, test = loss(c)
        out[c.label] = _final(tune_loss=tune, test_loss=test, test_accuracy=0.5)
    return out


def test_choices_read_the_tune_plays_only_and_mark_the_edges(monkeypatch):
    chosen = scaling.CHOSEN[True]

    def loss(c):  # tune prefers the largest lr of every grid, test the smallest
        lr = c.inner_lr if c.m == 0 else c.outer_lr
        return 3.0 - lr, 3.0 + lr

    grid = scaling.choices(_histories(True, loss))
    inner, outer = grid[grid.knob == "inner_lr"], grid[grid.knob == "outer_lr"]
    assert set(inner.chosen) == {max(scaling.INNER_LRS[True])}
    assert set(outer.chosen) == {max(scaling.OUTER_LRS[True])}
    assert grid.on_edge.all()
    # the recorded quick choices: DDP at 1e-2 agrees, every outer lr of 0.4 disagrees
    longer = scaling.CHOSEN_LONGER[True]
    assert list(inner.agrees) == [(chosen if t == 1 else longer)[(s, f)]["DDP"] == 1e-2
                                  for s, f, t in zip(inner["size"], inner.factor, inner.tokens,
                                                     strict=True)]
    said = scaling.disagreements(_histories(True, loss))
    assert len(said) == (~grid.agrees).sum() and "outer_lr 1" in said[0]
    # an interior optimum is not on the edge
    monkeypatch.setitem(scaling.OUTER_LRS, True, (0.4, 0.7, 1.0))
    monkeypatch.setattr(scaling, "cells", lambda quick: [
        scaling.Cell("2k", 1, 0, 1e-2, None, 0),
        *(scaling.Cell("2k", 1, 8, 1e-2, o, 0) for o in (0.4, 0.7, 1.0))])
    g = scaling.choices(_histories(True, lambda c: (((c.outer_lr or 0.7) - 0.7) ** 2, 2.0)))
    row = g[g.knob == "outer_lr"].iloc[0]
    assert row.chosen == 0.7 and not row.on_edge


# The gaps of a sweep whose DiLoCo test loss is DDP's × (1 + pct / 100), seed by seed.
PAPER_LIKE = {"2k": {1: -0.1, 2: 0.7, 4: 2.0, 8: 3.9}, "6k": {1: -0.4, 2: -0.1, 4: 0.3, 8: 1.1}}


def _sweep(pct: dict, ddp_by_seed=(2.0, 2.0, 2.0), big=(2.2, 1.02), noise=0.0,
           quick=True) -> dict:
    """Chosen cells get test losses from `pct`; the 4x-batch DDP `big[0]`, DiLoCo M=8 its 1x
    loss × `big[1]`; other cells a worse tune loss (never chosen). `noise`: seed 1 of DiLoCo
    adds this many % to its gap."""
    rec = scaling.CHOSEN[quick]

    def loss(c):
        r = (scaling.CHOSEN_LONGER[quick] if c.more_tokens > 1 else rec)[(c.size, c.factor)]
        chosen = c.inner_lr == r["DDP"] and (c.m == 0 or c.outer_lr == r[c.m])
        if not chosen:
            return 9.0, 9.0
        if c.more_tokens > 1 or c.more_syncs > 1:  # the cause checks: DiLoCo = DDP
            return 1.0, 2.0
        ddp = ddp_by_seed[c.seed]
        if c.factor == 1:
            gap = 0.0 if c.m == 0 else pct[c.size][c.m] + (noise if c.seed == 1 else 0.0)
            return 1.0, ddp * (1 + gap / 100)
        one = ddp * (1 + pct[c.size][8] / 100)
        return 1.0, big[0] if c.m == 0 else one * big[1]

    return _histories(quick, loss)


def test_the_gap_is_paired_by_seed_then_averaged():
    # DDP 2.0 (seed 0) and 2.5 (seed 1); M=8 +3.9% on seed 0, +5.9% on seed 1 (noise 2)
    r = scaling.results(_sweep(PAPER_LIKE, ddp_by_seed=(2.0, 2.5), noise=2.0))
    row = r[(r["size"] == "2k") & (r.M == 8) & (r.factor == 1)].iloc[0]
    gaps = [3.9, 5.9]  # by hand: each seed's DiLoCo against the same seed's DDP
    assert row.gap_pct == pytest.approx(sum(gaps) / 2)
    assert row.gap_std == pytest.approx(math.sqrt(2 * (1.0 ** 2)))  # sample std of {3.9, 5.9}
    assert row.test_loss == pytest.approx((2.0 * 1.039 + 2.5 * 1.059) / 2)
    assert row.seeds == 2


def test_the_findings_follow_the_papers_definitions():
    f = scaling.findings(_sweep(PAPER_LIKE)).set_index("finding").verdict
    assert list(f) == [1.0, 1.0, 1.0, 1.0]
    # M = 1 worse than DDP in one size; the gap not monotone in M there; grows with size at
    # M = 2 only; DiLoCo's loss rises more than DDP's at 4x the batch
    other = {"2k": {1: -0.2, 2: 0.5, 4: 1.4, 8: 3.0}, "6k": {1: 0.8, 2: 1.0, 4: 0.2, 8: 2.0}}
    f = scaling.findings(_sweep(other, big=(2.1, 1.2))).set_index("finding").verdict
    assert f["DiLoCo with M = 1 matches or beats DDP"] == 0.5
    assert f["the gap to DDP grows with M"] == 0.5  # 6k: 1.0 then 0.2: no
    assert f["the gap shrinks as the model grows"] == 0.5  # M=2: 0.5 → 1.0 grows
    assert f["DiLoCo tolerates a larger batch than DDP"] == 0.0  # +20% against +5%
    # within the seeds' spread counts as a match: +0.5% and +1.5% (std 0.71) on M = 1
    noisy = {s: {**v, 1: 0.5} for s, v in PAPER_LIKE.items()}
    f = scaling.findings(_sweep(noisy, noise=1.0)).set_index("finding").verdict
    assert f["DiLoCo with M = 1 matches or beats DDP"] == 0.0  # +1.0 ± 0.71: worse
    noisy = {s: {**v, 1: 0.2} for s, v in PAPER_LIKE.items()}
    f = scaling.findings(_sweep(noisy, noise=1.0)).set_index("finding").verdict
    assert f["DiLoCo with M = 1 matches or beats DDP"] == 1.0  # +0.7 ± 0.71: within


def test_the_gap_must_shrink_from_size_to_size_not_only_end_to_end():
    # three sizes: at M = 8 the middle one is worse than both ends
    pct = {"11k": {1: -0.1, 2: 0.7, 4: 2.0, 8: 3.9}, "30k": {1: -0.2, 2: 0.5, 4: 1.0, 8: 4.5},
           "109k": {1: -0.4, 2: -0.1, 4: 0.3, 8: 1.1}}
    f = scaling.findings(_sweep(pct, quick=False)).set_index("finding").verdict
    assert f["the gap shrinks as the model grows"] == 0.5  # M = 2 and 4 shrink, M = 8 does not
    assert f["the gap to DDP grows with M"] == 1.0


def test_rows_report_the_test_plays_with_seeds_and_the_papers_numbers():
    rows = scaling.rows("scaling", _sweep(PAPER_LIKE))
    gaps = [r for r in rows if r["metric"] == "test loss vs DDP (%)"]
    m8 = next(r for r in gaps if r["method"] == "6k · 1× batch · M=8")
    assert m8["value"] == pytest.approx(1.1) and m8["seeds"] == 2
    assert m8["published"] == scaling.PAPER_LOSS_VS_DP_PCT["35M"][8]
    assert all(r["experiment"] == scaling.EXPERIMENT for r in rows)
    verdicts = [r for r in rows if r["metric"].startswith("reproduced")]
    assert len(verdicts) == 4 and all(r["value"] == 1.0 for r in verdicts)


def test_make_reproduce_reads_the_sweep_but_never_trains_it(monkeypatch, tmp_path):
    import json

    from diloco_lite import experiments

    trained = []
    monkeypatch.setattr(experiments, "groups", lambda quick: {
        "h_sweep": {"a": "cfg-a"}, "scaling": {"b": "cfg-b"}})
    monkeypatch.setattr(reproduce, "run_key", lambda cfg: cfg)
    monkeypatch.setattr(reproduce, "run_cached",
                        lambda cfg, d, progress: trained.append(cfg) or "history")
    monkeypatch.setattr(reproduce, "runs_dir", lambda quick: tmp_path)
    monkeypatch.setattr(experiments, "figures", lambda g, h: {})
    monkeypatch.setattr(experiments, "rows", lambda g, h: [
        {"experiment": scaling.EXPERIMENT if g == "scaling" else g, "method": "m",
         "metric": "x", "value": 2.0}])
    reproduce.training_job(tmp_path, quick=True, progress=False)
    assert trained == ["cfg-a"]  # not cached: the scaling run is skipped, not trained
    (tmp_path / "cfg-b.csv").write_text("")
    rows = reproduce.training_job(tmp_path, quick=True, progress=False)
    assert trained == ["cfg-a", "cfg-a", "cfg-b"]  # cached: read
    assert {r["experiment"] for r in rows} == {"h_sweep", scaling.EXPERIMENT}
    trained.clear()
    reproduce.training_job(tmp_path, quick=True, progress=False, groups=("scaling",))
    (tmp_path / "cfg-b.csv").unlink()
    reproduce.training_job(tmp_path, quick=True, progress=False, groups=("scaling",))
    assert trained == ["cfg-b", "cfg-b"]  # named: trained when missing
    # a results table written without the sweep's rows keeps the old ones
    old = [{"experiment": scaling.EXPERIMENT, "method": "kept", "metric": "x", "value": 1.0},
           {"experiment": "h_sweep", "method": "dropped", "metric": "x", "value": 1.0}]
    (tmp_path / "results.json").write_text(json.dumps(old))
    new = pd.DataFrame([{"experiment": "h_sweep", "method": "new", "metric": "x",
                         "value": 3.0}])
    reproduce.write_results(new, tmp_path, keep=(scaling.EXPERIMENT,))
    methods = [r["method"] for r in json.loads((tmp_path / "results.json").read_text())]
    assert sorted(methods) == ["kept", "new"]


def test_a_notebook_reads_a_separate_group_only_when_every_run_is_cached(monkeypatch, tmp_path):
    from diloco_lite import experiments

    monkeypatch.setattr(experiments, "groups", lambda quick: {"scaling": {"a": "ka", "b": "kb"}})
    monkeypatch.setattr(reproduce, "run_key", lambda cfg: cfg)
    monkeypatch.setattr(reproduce, "runs_dir", lambda quick: tmp_path)
    monkeypatch.setattr(reproduce, "run_cached", lambda *a, **k: pytest.fail("trained"))
    session = reproduce.Session(quick=True, progress=False)
    pd.DataFrame({"step": [1], "test_loss": [2.5]}).to_csv(tmp_path / "ka.csv", index=False)
    assert session.cached_group("scaling") is None  # one of two cached: nothing, not a part
    pd.DataFrame({"step": [1], "test_loss": [3.5]}).to_csv(tmp_path / "kb.csv", index=False)
    got = session.cached_group("scaling")
    assert sorted(got) == ["a", "b"]
    assert (got["a"].test_loss.iloc[0], got["b"].test_loss.iloc[0]) == (2.5, 3.5)


def test_a_notebook_reads_the_committed_findings_back(tmp_path):
    histories = _sweep(PAPER_LIKE)
    rows = scaling.rows("scaling", histories)
    reproduce.write_results(pd.DataFrame(rows), tmp_path)
    back = scaling.committed(tmp_path)
    direct = scaling.findings(histories)
    assert list(back["findings"].finding) == list(direct.finding)
    assert list(back["findings"].evidence) == list(direct.evidence)
    gaps = back["gaps"].set_index(["size", "batch", "M"]).gap_pct
    assert gaps["6k", "1× batch", "M=8"] == pytest.approx(1.1)
    assert scaling.committed(tmp_path / "absent")["findings"].empty


def test_the_cause_checks_pick_on_the_tune_plays_and_pair_seeds():
    longer = scaling.CHOSEN_LONGER[True][("2k", 1)]

    def loss(c):
        if c.more_syncs > 1:  # tune prefers outer lr 1.0 (test: DDP's + 1%), test the other
            return (1.0, 2.0 * 1.01) if c.outer_lr == 1.0 else (2.0, 2.0 * 1.005)
        if c.more_tokens > 1:
            chosen = c.inner_lr == longer["DDP"] and (c.m == 0 or c.outer_lr == longer[c.m])
            if not chosen:
                return 9.0, 9.0
            ddp = (1.5, 1.6)[c.seed]
            return 1.0, ddp * (1 + {0: 0.0, 1: (-0.5, 0.1)[c.seed], 8: 2.0}[c.m] / 100)
        return 1.0, 2.0  # the sweep: every method equal to DDP
    t = scaling.causes(_histories(True, loss)).set_index(["M", "variant"])
    assert t.gap_pct[1, "4× the outer steps"] == pytest.approx(1.0)
    assert t.outer_lr[1, "4× the outer steps"] == 1.0
    assert t.gap_pct[1, "4× the tokens"] == pytest.approx((-0.5 + 0.1) / 2)  # paired by seed
    assert t.gap_pct[8, "4× the tokens"] == pytest.approx(2.0)
    assert t.seeds[1, "4× the tokens"] == 2
    assert t.gap_pct[1, "the sweep"] == pytest.approx(0.0)


def test_a_finding_not_reproduced_carries_what_the_cause_checks_found(tmp_path):
    rec, longer = scaling.CHOSEN[True], scaling.CHOSEN_LONGER[True]

    def loss(c, tokens_gap):
        r = longer[(c.size, c.factor)] if c.more_tokens > 1 else rec[(c.size, c.factor)]
        if c.inner_lr != r["DDP"] or (c.m and c.outer_lr != r[c.m]):
            return 9.0, 9.0  # off the choices: never chosen
        if c.m == 0:
            return 1.0, 2.0
        gap = tokens_gap if c.more_tokens > 1 else 2.0  # the sweep and 4x syncs: +2%
        return 1.0, 2.0 * (1 + gap / 100)

    back = _histories(True, lambda c: loss(c, -0.3))
    f = scaling.findings(back).set_index("finding")
    m1 = "DiLoCo with M = 1 matches or beats DDP"
    assert f.verdict[m1] == 0.0
    assert "2k -0.30%" in f.cause[m1] and "More tokens bring it back" in f.cause[m1]
    assert "2k +2.00%" in f.cause[m1]  # 4x the outer steps
    f = scaling.findings(_histories(True, lambda c: loss(c, 1.5))).set_index("finding")
    assert "Neither check brings it back" in f.cause[m1]
    # and the committed table gives it back to a notebook
    reproduce.write_results(pd.DataFrame(scaling.rows("scaling", back)), tmp_path)
    read = scaling.committed(tmp_path)["findings"].set_index("finding")
    assert read.cause[m1] == scaling.findings(back).set_index("finding").cause[m1]


def test_the_batch_finding_compares_each_method_with_itself_at_1x_and_4x():
    # each method's test loss at 4x its own batch: the rise (%) per (size, tokens, base, M),
    # and M = 8's own test loss at 1× per setting (DDP's is 2.0, other M's 2.2)
    small = ("6k", 1, scaling.SMALL_BASE[True])
    rises = {("2k", 1, 0): {0: 10, 1: 16, 2: 14, 4: 12, 8: 20},  # the sweep: not on 2k,
             ("6k", 1, 0): {0: 10, 8: 5},  # but on 6k
             ("2k", scaling.MORE, 0): {0: 10, 8: 5},  # longer runs
             small: {0: 10, 8: 3}}  # from the smaller batch
    m8_at_1x = {("2k", 1, 0): 2.1, ("6k", 1, 0): 2.5, ("2k", scaling.MORE, 0): 2.4, small: 2.3}

    def loss(c):
        rec = scaling.recorded(True, c.size, c.factor, c.more_tokens, c.base)
        if c.more_syncs > 1 or c.inner_lr != rec["DDP"] or (c.m and c.outer_lr != rec[c.m]):
            return 9.0, 9.0  # off the recorded choices: never read
        key = (c.size, c.more_tokens, c.base)
        at_1x = 2.0 if c.m == 0 else m8_at_1x[key] if c.m == 8 else 2.2
        rise = rises[key].get(c.m, 0)
        return 1.0, at_1x * (1 + rise / 100) if c.factor > 1 else at_1x

    b = scaling.batch_rise(_histories(True, loss))
    got = {(r.size, r.tokens, r.base, r.M): r.rise_pct for r in b.itertuples()}
    want = {(*k, m): v for k, by_m in rises.items() for m, v in by_m.items()}
    assert got == pytest.approx(want)
    assert set(b.batch[b.base > 0]) == {scaling.SMALL_BASE[True]} and set(b.seeds) == {2}
    assert b.set_index(["size", "tokens", "base", "M"]).loss_1x[(*small, 8)] == \
        pytest.approx(2.3)
    f = scaling.findings(_histories(True, loss)).set_index("finding")
    batch = "DiLoCo tolerates a larger batch than DDP"
    assert f.verdict[batch] == 0.5  # on 6k, not on 2k
    assert "2k: DDP +10.0%, M = 8 +20.0%; 6k: DDP +10.0%, M = 8 +5.0%" in f.evidence[batch]
    cause = f.cause[batch]
    assert "2k: DDP +10.0%, M = 8 +20.0% (M = 8 at 1×: 2.10 nats)" in cause
    assert "6k from a global batch of 8 (1 sequence per worker at M = 8): DDP +10.0%, " \
           "M = 8 +3.0% (M = 8 at 1×: 2.30 nats)" in cause
    assert "2k with 4× the tokens: DDP +10.0%, M = 8 +5.0%" in cause
    assert "holds only where DiLoCo M = 8 ends at 1× at 2.30 nats or more" in cause
    assert "(2.10 nats or less" in cause
    assert "2k, every M: DDP +10.0% (1×: 2.00), M = 1 +16.0% (1×: 2.20)" in cause
    rises[small][8], m8_at_1x[small] = 15, 2.6  # fails where M = 8 is the least trained
    f = scaling.findings(_histories(True, loss)).set_index("finding")
    assert "No loss level separates" in f.cause[batch]
    rises[small][8], rises["2k", 1, 0][8] = 3, 8  # now on both sizes of the sweep
    f = scaling.findings(_histories(True, loss)).set_index("finding")
    assert f.verdict[batch] == 1.0 and f.cause[batch] == ""


def test_the_inner_lr_check_compares_with_ddps_lr_per_size_batch_and_m():
    # DiLoCo at DDP's inner lr: test 2.0; at the neighbour: 2.0 × (1 + pct / 100), per factor
    pct = {(1, 1): -1.0, (1, 8): 3.0, (4, 1): 2.0, (4, 8): -4.0}

    def loss(c):
        rec = scaling.recorded(True, c.size, c.factor, c.more_tokens, c.base)
        if c.m == 0 or c.more_syncs > 1 or c.more_tokens > 1 or c.base or c.seed:
            return 5.0, 5.0
        if c.outer_lr != rec[c.m]:
            return 9.0, 9.0
        off = c.inner_lr != rec["DDP"]
        test = 2.0 * (1 + pct.get((c.factor, c.m), 0) / 100) if off else 2.0
        return test, test  # tune = test here

    check = scaling.inner_check(_histories(True, loss))
    assert set(check["size"]) == {"2k", "6k"} and set(check.factor) == {1, 4}
    for r in check.itertuples():
        p = pct[(r.factor, int(r.method.split("=")[1]))]
        assert r.vs_ddps_lr_pct == pytest.approx(0.0 if r.is_ddps else p)
        assert r.best_on_tune == ((p > 0) if r.is_ddps else (p < 0))


@pytest.mark.parametrize("quick", [False, True])
def test_the_tuning_figure_shows_every_size_of_the_sweep_at_its_own_choices(quick):
    def loss(c):  # the tune loss: lowest at the recorded lrs
        rec = scaling.recorded(quick, c.size, c.factor, c.more_tokens, c.base)
        on = c.inner_lr == rec["DDP"] and (c.m == 0 or c.outer_lr == rec[c.m])
        return 2.0 + 0.5 * (not on), 2.0

    h = _histories(quick, loss)
    chart = scaling.figures("scaling", h)["scaling_tuning"]
    df = chart.data
    assert set(df["size"]) == set(scaling.SIZES[quick])  # the cause checks' runs do not mix in
    assert set(df.base) == {0} and set(df.factor) == {1}
    for size in scaling.SIZES[quick]:  # DDP's recorded inner lr, the recorded outer lr ringed
        rec = scaling.CHOSEN[quick][(size, 1)]
        d = df[df["size"] == size]
        assert set(d.inner_lr) == {rec["DDP"]}
        assert {(r.method, r.outer_lr) for r in d[d.chosen].itertuples()} == {
            (f"M={m}", rec[m]) for m in scaling.WORKERS}
