"""Decoupled DiLoCo's syncer on the simulated clock: quorum, grace, token weights, failures.

Most tests read the plan (host only, no device): who is merged, with which weight, when. The
last ones run the device: a returning learner really takes Θ and a peer's optimizer state, and
a chaotic run finishes with finite numbers."""

import math

import jax
import numpy as np
import pytest

import diloco_lite as dl
from diloco_lite.algorithms import make_driver
from diloco_lite.clock import Cluster, FailureRate
from diloco_lite.clock.plan import Block, Event, make_plan
from diloco_lite.clock.recorder import FRESH
from diloco_lite.training import setup
from tests.helpers import final_stats as final
from tests.helpers import plan_events as events
from tests.helpers import tiny_run

BL2 = float(16 * 64) ** 2  # (tokens per step)² with RunConfig's default batch 16 × 64


def plan(cluster=None, workers=4, steps=12, **algo):
    algo = dl.DecoupledDiLoCo(**{**dict(inner_steps=4, fragments=1, overlap=0, quorum=1),
                                 **algo})
    cfg = dl.RunConfig(algorithm=algo, workers=workers, steps=steps, cluster=cluster)
    p = algo.fragments
    return make_plan(cfg, up_nbytes=[100] * p, down_nbytes=[10] * p, sizes=[1] * p,
                     rejoin_nbytes=0, eval_at=[steps])


def sends_of(pl, m):
    return [e for e in events(pl, "send") if e.mask[m]]


@pytest.mark.parametrize("quorum", [1, 4])
def test_equal_speeds_merge_everyone_with_equal_weights(quorum):
    """Every learner answers at the instant of the ask: all of them are merged, even with K = 1
    and no grace (τ = 0)."""
    pl = plan(quorum=quorum)
    closes = events(pl, "close")
    assert len(closes) == 3 and all((c.weights == 4 * BL2).all() for c in closes)
    assert [c.time_s for c in closes] == [4.0, 8.0, 12.0]
    assert final(pl)["learner_steps"] == 48 and final(pl)["sim_time_s"] == 12.0
    assert final(pl)["down_bytes"] == 3 * 4 * 10  # every learner gets every new fragment
    # peaks over one reference step (1 s): 4 learners × 100 B up, 4 × 10 B down, in Gbit/s
    assert final(pl)["peak_gbps"] == 4 * 100 * 8 / 1e9
    assert final(pl)["peak_down_gbps"] == 4 * 10 * 8 / 1e9


@pytest.mark.parametrize("safety, included", [(0.5, True), (0.1, False)])
def test_grace_window_lets_a_slightly_late_learner_in(safety, included):
    """Learner 3 takes 1.5 s a step: at the ask (4 s) it is mid-step, answering at 4.5 s with 3
    steps. Quorum (K=1) at 4 s, the instant of the ask; slack = τ·t_ref − ((t_quorum − t_ask) +
    t_reply) = 2·1 − 0, grace = safety · 2: 1 s lets it in, 0.2 s does not."""
    pl = plan(Cluster(step_time_s=(1, 1, 1, 1.5)), overlap=2, grace_safety=safety)
    first = events(pl, "close")[0]
    want = [4 * BL2] * 3 + ([3 * BL2] if included else [0.0])
    np.testing.assert_array_equal(first.weights, want)  # w = tokens · tokens/steps
    assert first.time_s == (4.5 if included else 4.2)


def test_quorum_larger_than_the_learners_up_makes_the_syncer_wait():
    """K = 4 and learner 1 down from 2.5 s to 9.5 s: the first merge waits until it is back and
    has taken a step (10.5 s); the others never stop training meanwhile."""
    pl = plan(Cluster(failures=((1, 2.5, 9.5),)), quorum=4)
    first = events(pl, "close")[0]
    assert first.time_s == 10.5
    np.testing.assert_array_equal(first.weights, [4 * BL2, 1 * BL2, 4 * BL2, 4 * BL2])
    stats = final(pl)
    # the ask at 12 s waits too: learner 1, back at 9.5 s, answers at 12.5 s
    assert stats["syncer_wait_s"] == pytest.approx(6.5 + 0.5)
    assert stats["outer_steps"] == 2  # asks at 4 s (merged at 10.5 s) and 12 s (at 12.5 s)
    assert stats["learner_steps"] == 48  # equal tokens: the others made up for learner 1
    # with K = 1 nobody waits
    assert final(plan(Cluster(failures=((1, 2.5, 9.5),))))["syncer_wait_s"] == 0.0


def test_a_failed_learner_is_left_out_loses_its_work_and_comes_back_from_theta():
    pl = plan(Cluster(failures=((2, 5.5, 9.0),)), steps=16)
    (reload,) = events(pl, "reload")
    assert reload.time_s == 9.0 and reload.peer[2] == 0 and reload.mask.tolist() == [
        False, False, True, False]
    sends = [s.time_s for s in sends_of(pl, 2)]
    assert sends[:2] == [4.0, 12.0] and not [t for t in sends if 5.5 <= t <= 9.0]
    closes = events(pl, "close")
    assert closes[1].weights[2] == 0  # the merge at 8 s goes on without it
    assert closes[2].weights[2] == 3 * BL2  # its first delta counts the 3 steps since reload
    stats = final(pl)
    assert stats["lost_steps"] == 1  # step 5, done at 5 s, never sent
    assert stats["learner_steps"] == 64 and stats["outer_steps"] == 4


@pytest.mark.parametrize("down_at", [7.0, 8.5])
def test_a_learner_that_fails_between_a_close_and_its_publish_answers_again(down_at):
    """K = M = 2, H = 4, a 2 s link latency: the ask at 4 s closes at 6 s (both answers took
    2 s) and is published at 8 s. Learner 1 down from 7 s (after the close, before the publish)
    or from 8.5 s, back at 10 s: either way, once back it holds the newest Θ and answers the
    later asks, so every ask (4, 12, 20, 28 and 36 s) gets its outer step. (The merged answer's
    flag used to survive the reload: the learner skipped every later ask and, with K = M, the
    fragment never synced again: 1 outer step in 40 steps.)"""
    cluster = Cluster(link=dl.Link(latency_s=2.0), failures=((1, down_at, 10.0),))
    pl = plan(cluster, workers=2, steps=40, quorum=2)
    assert [c.time_s for c in events(pl, "close")][:2] == [8.0, 16.0]
    assert final(pl)["outer_steps"] == 5
    assert [s.time_s for s in sends_of(pl, 1)][:2] == [4.0, 12.0]


def test_a_learner_back_with_no_peer_up_starts_a_fresh_optimizer_state():
    """K = 1, M = 2: learner 0 down for good at 2.5 s, learner 1 down from 3.5 s to 6 s. At 6 s
    no learner is up to hand it an inner optimizer state, and its own was lost with it: the
    plan says FRESH (-1), not its own index, and the reload waits for no peer's position."""
    assert FRESH == -1
    pl = plan(Cluster(failures=((0, 2.5, math.inf), (1, 3.5, 6.0))), workers=2, steps=8)
    (reload,) = events(pl, "reload")
    assert reload.time_s == 6.0 and reload.mask.tolist() == [False, True]
    assert reload.peer.tolist() == [0, -1] and reload.at == {1: 3}  # 3 steps before 3.5 s


def test_a_learner_that_never_comes_back_is_fine():
    """Learner 1 fails at 2.5 s for good (K = 1, τ = 0). By hand: it took 2 steps; the other
    three take 3 steps a second, so the 48 learner-steps of the budget run out at 16 s (8 by
    2 s, 39 more by 15 s, learner 0's step at 16 s is the last). The syncer merges at every ask,
    4, 8, 12 and 16 s: 4 outer steps, each learner up with weight 4 steps (it applied the
    previous merge at the ask before); at 16 s only learner 0 answers (learners 2 and 3 finish
    that instant past the budget) and no grace (τ = 0) waits for them."""
    pl = plan(Cluster(failures=((1, 2.5, math.inf),)), steps=12)
    stats = final(pl)
    assert stats["learner_steps"] == 48 and stats["outer_steps"] == 4
    assert stats["sim_time_s"] == 16.0
    closes = [c for c in events(pl, "close") if not c.flush]
    assert [c.time_s for c in closes] == [4.0, 8.0, 12.0, 16.0]
    assert [(c.weights / BL2).tolist() for c in closes] == [[4, 0, 4, 4]] * 3 + [[4, 0, 0, 0]]
    assert not events(pl, "reload") and all(s.time_s < 2.5 for s in sends_of(pl, 1))


@pytest.mark.parametrize("quorum, closes, rows", [
    # K = 4: at 4 s learners 0-2 (4 steps) and 3 (its 2nd step ends at 4 s) answer: the quorum
    # at once, and no grace (τ = 0); learner 4 (3 s a step) is left out. It applies that merge
    # after its step 2 (6 s), so at 8 s it is mid-step again; at 12 s it answers with 1 step.
    (4, [(4.0, [4, 4, 4, 2, 0]), (8.0, [4, 4, 4, 2, 0]), (12.0, [4, 4, 4, 2, 1])],
     [(6.0, 1, 0.0), (11.0, 2, 0.0), (16.0, 3, 0.0)]),
    # K = 5: the ask at 4 s waits for learner 4's answer at 6 s (2 steps); everyone applies at
    # 6 s. At 8 s: learners 0-2 answer with 2 steps, 3 with 1, 4 at 9 s with 1 (waits 1 s).
    # At 12 s: 0-2 applied at 9 s (3 steps), 3 at 10 s (1), 4 at 9 s (1): nobody waits.
    (5, [(6.0, [4, 4, 4, 2, 2]), (9.0, [2, 2, 2, 1, 1]), (12.0, [3, 3, 3, 1, 1])],
     [(6.0, 1, 2.0), (11.0, 2, 3.0), (16.0, 3, 3.0)]),
])
def test_the_syncer_merges_the_first_k_answers_timed_by_hand(quorum, closes, rows):
    """5 learners of 1, 1, 1, 2 and 3 s a step (t_ref = 1 s), H = 4, τ = 0, no failures: the
    merges, their weights (in steps) and the history rows (evaluations at steps 4, 8, 12, i.e.
    when 20, 40, 60 learner-steps are done: 3 + 1/2 + 1/3 a second gives 6, 11, 16 s) worked
    out by hand from the step times. The outer steps are cumulative; the end-of-run flush at
    16 s is not one."""
    algo = dl.DecoupledDiLoCo(inner_steps=4, fragments=1, overlap=0, quorum=quorum)
    cfg = dl.RunConfig(algorithm=algo, workers=5, steps=12,
                       cluster=Cluster(step_time_s=(1, 1, 1, 2, 3)))
    pl = make_plan(cfg, up_nbytes=[100], down_nbytes=[10], sizes=[1], rejoin_nbytes=0,
                   eval_at=[4, 8, 12])
    merges = [c for c in events(pl, "close") if not c.flush]
    assert [(c.time_s, (c.weights / BL2).tolist()) for c in merges] == closes
    got = [(e.stats["sim_time_s"], e.stats["outer_steps"], e.stats["syncer_wait_s"])
           for e in events(pl, "eval")]
    assert got == rows
    assert [e.stats["learner_steps"] for e in events(pl, "eval")] == [23, 41, 60]


def test_chaos_plan_keeps_the_budget_and_is_deterministic():
    chaos = Cluster(jitter=0.2, failures=FailureRate(mtbf_s=20.0, down_s=5.0), seed=1)
    pl = plan(chaos, workers=8, steps=48, fragments=4, inner_steps=8, overlap=2, quorum=2)
    stats = final(pl)
    assert stats["learner_steps"] == 8 * 48 and stats["lost_steps"] > 0
    assert 0 < stats["goodput"] < 1
    again = plan(chaos, workers=8, steps=48, fragments=4, inner_steps=8, overlap=2, quorum=2)
    assert [e.time_s for e in events(again, "close")] == [e.time_s for e in events(pl, "close")]


def test_arrivals_come_tau_own_steps_after_the_ask():
    pl = plan(Cluster(step_time_s=(1, 1, 1, 2)), overlap=2, grace_safety=0.0)
    arrivals = {m: [a.time_s for a in events(pl, "arrive") if a.mask[m]] for m in (0, 3)}
    assert arrivals[0][0] == 6.0  # asked at 4 s (its step 4), applied after its step 6
    assert arrivals[3][0] == 8.0  # at 4 s it is at its step 2: applied after its step 4


# --------------------------------------------------------------------------------------------
# On the device
# --------------------------------------------------------------------------------------------


def test_reload_takes_theta_and_a_peers_inner_state_and_masked_steps_keep_state():
    cfg = tiny_run(dl.DecoupledDiLoCo(inner_steps=2, fragments=1, overlap=0), workers=4,
                   inner_optimizer=None)
    corpus, model, mesh, optimizer = setup(cfg)
    params = model.init(0)
    driver = make_driver(cfg, model, mesh, optimizer, params)
    state = driver.init(params)
    batches = np.stack([np.stack([corpus.batch(k, seed=0, workers=4, batch_size=2, seq_len=16)[m]
                                  for k in range(3)]) for m in range(4)])
    mask = np.array([[True] * 3, [True] * 3, [True, False, False], [False] * 3])
    block = Block(np.array([3, 3, 1, 0]), np.zeros(4, int), [])
    state, _, _ = driver.run(state, block, batches, mask)
    get = lambda tree, m: [np.asarray(x)[m] for x in jax.tree.leaves(tree)]  # noqa: E731
    # learner 3 took no step: bit for bit its initial parameters (and base)
    for a, b in zip(get(state["local"], 3), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(get(state["local"], 0),
                                                         jax.tree.leaves(params), strict=True))
    reload = Event("reload", 0.0, mask=np.array([False, False, True, False]),
                   peer=np.array([0, 1, 0, 3]))
    state, _, _ = driver.run(state, Block(np.zeros(4, int), np.zeros(4, int), [reload]),
                             batches[:, :0], mask[:, :0])
    for a, b in zip(get(state["local"], 2), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)  # Θ (nothing merged yet: the initial parameters)
    for a, b in zip(get(state["base"], 2), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)  # its next Δ is measured from what it loaded
    for a, b in zip(get(state["inner"], 2), get(state["inner"], 0), strict=True):
        np.testing.assert_array_equal(a, b)  # learner 0's AdamW state, step count included
    # learner 1 back with no peer up (FRESH): AdamW's initial state, all zeros (moments and
    # step count), not its own (lost) one, nor another learner's
    assert any(np.any(a != 0) for a in get(state["inner"], 1))
    alone = Event("reload", 0.0, mask=np.array([False, True, False, False]),
                  peer=np.array([0, FRESH, 2, 3]))
    state, _, _ = driver.run(state, Block(np.zeros(4, int), np.zeros(4, int), [alone]),
                             batches[:, :0], mask[:, :0])
    assert all(np.all(a == 0) for a in get(state["inner"], 1))
    for a, b in zip(get(state["local"], 1), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)  # Θ, as any returning learner
    for a, b in zip(get(state["inner"], 0), get(state["inner"], 2), strict=True):
        np.testing.assert_array_equal(a, b)  # the others' states untouched


def test_a_chaotic_run_finishes_with_finite_numbers():
    chaos = Cluster(jitter=0.3, failures=FailureRate(mtbf_s=6.0, down_s=3.0), seed=2)
    cfg = tiny_run(dl.DecoupledDiLoCo(inner_steps=3, fragments=2, overlap=1), steps=12,
                   eval_every=4, cluster=chaos)
    result = dl.train(cfg, progress=False)
    h = result.history
    assert np.isfinite(h[["train_loss", "val_loss"]].to_numpy()).all()
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.params))
    assert h.outer_steps.iloc[-1] > 0  # exact cumulative counts: the test timed by hand above
    assert h.learner_steps.iloc[-1] == 8 * 12 and h.lost_steps.iloc[-1] > 0
