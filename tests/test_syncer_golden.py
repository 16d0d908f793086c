"""Golden plans of Decoupled DiLoCo: a refactor of the clock must keep every run bit for bit.

Each config below is planned on the host (no device) and the whole plan is hashed: every block's
per-learner steps and data indices, every event's kind, time, fragment, mask, weights, flush
flag, peer, positions and history row, each learner's step times, the per-fragment bytes and
the final counters, floats by `repr` (so a change in the last bit shows), and the warning of a
run that ends short. The expected sha1s were generated from the event loop of `clock.syncer`
before its decisions moved into `clock.syncer_state` (issue 18.1), then re-hashed with the
counters at 12 digits (`counter`), once the refactored code still matched the bit-for-bit
hashes, so that Colab's numpy agrees; they must never change
unless a change of the *rules* is intended (then regenerate them with `python -m
tests.test_syncer_golden` and say why in the commit).

The configs vary what the syncer decides on: equal and unequal step times, jitter, speed
spread, fixed failure windows (one at an ask's very instant, several per learner, down for
good, everyone down for good), drawn failures, finite links (bandwidth and latency), K < M and
K = M (and K above the learners up), τ = 0, 1, 2, 3, P = 1, 3, 4, grace on and off, the mix α,
merge "mean" and "rda" (same plan), and the reply's bits (the bytes down).
"""

import hashlib
import math
import warnings

import pytest

import diloco_lite as dl
from diloco_lite.clock import Cluster, FailureRate, Link
from diloco_lite.clock.plan import make_plan

SIZES = [3000, 2000, 1500, 1000]  # values per fragment (unequal: each fragment's own bytes)
SLOW = Link(gbit_per_s=2e-5, latency_s=0.1)  # 1500 B (3000 values at 4 bits) take 0.6 s
LAGGY = Link(gbit_per_s=1e-4, latency_s=0.35)


def golden_plan(cluster=None, workers=4, steps=24, eval_every=4, **algo):
    algo = dl.DecoupledDiLoCo(**{**dict(inner_steps=4, fragments=1, overlap=0, quorum=1),
                                 **algo})
    cfg = dl.RunConfig(algorithm=algo, workers=workers, steps=steps, cluster=cluster)
    sizes = SIZES[:algo.fragments] if algo.fragments <= len(SIZES) else [500] * algo.fragments
    return make_plan(cfg, up_nbytes=[s * algo.bits // 8 for s in sizes],
                     down_nbytes=[s * algo.down_bits // 8 for s in sizes], sizes=sizes,
                     rejoin_nbytes=4 * sum(sizes),
                     eval_at=list(range(eval_every, steps + 1, eval_every)))


CONFIGS = {
    # equal speeds: DiLoCo and Streaming DiLoCo
    "equal_p1_kM": dict(quorum=4),
    "equal_p4_t0_kM": dict(fragments=4, quorum=4, inner_steps=8, steps=32),
    "equal_p3_t2_k1": dict(fragments=3, overlap=2, inner_steps=6),
    # unequal step times
    "slow3_t2_grace": dict(cluster=Cluster(step_time_s=(1, 1, 1, 1.5)), overlap=2),
    "slow3_t2_nograce": dict(cluster=Cluster(step_time_s=(1, 1, 1, 1.5)), overlap=2,
                             grace_safety=0.0),
    "five_k4": dict(cluster=Cluster(step_time_s=(1, 1, 1, 2, 3)), workers=5, quorum=4,
                    steps=12),
    "five_k5": dict(cluster=Cluster(step_time_s=(1, 1, 1, 2, 3)), workers=5, quorum=5,
                    steps=12),
    "two_t3": dict(cluster=Cluster(step_time_s=(1, 4)), workers=2, steps=12, overlap=3),
    "two_k2_h3": dict(cluster=Cluster(step_time_s=(1, 2.5)), workers=2, steps=6, inner_steps=3,
                      quorum=2, grace_safety=0.0),
    "ties_p3_t1": dict(cluster=Cluster(step_time_s=(1, 2, 0.5, 1)), fragments=3, overlap=1,
                       inner_steps=6, quorum=2, grace_safety=1.0),
    # jitter and spread
    "jitter_p3_t1_k2": dict(cluster=Cluster(jitter=0.2, seed=3), fragments=3, overlap=1,
                            quorum=2, inner_steps=6, steps=30),
    "spread_p4_t2_k2": dict(cluster=Cluster(speed_spread=0.3, seed=1), workers=6, fragments=4,
                            overlap=2, quorum=2, inner_steps=8, steps=32),
    "spread_jitter_kM_mean": dict(cluster=Cluster(speed_spread=0.5, jitter=0.1, seed=2),
                                  fragments=3, overlap=1, quorum=4, merge="mean"),
    "spread_jitter_kM_rda": dict(cluster=Cluster(speed_spread=0.5, jitter=0.1, seed=2),
                                 fragments=3, overlap=1, quorum=4, merge="rda"),
    # fixed failure windows
    "fail_k4_waits": dict(cluster=Cluster(failures=((1, 2.5, 9.5),)), quorum=4, steps=12),
    "fail_back_k1": dict(cluster=Cluster(failures=((2, 5.5, 9.0),)), steps=16),
    "fail_at_ask_instant": dict(cluster=Cluster(failures=((0, 4.0, 7.0), (3, 8.0, 8.5))),
                                overlap=1, quorum=2, fragments=3, inner_steps=6),
    "fail_twice_t2": dict(cluster=Cluster(step_time_s=(1, 1.3, 1, 0.8),
                                          failures=((1, 3.1, 6.0), (1, 11.0, 14.2),
                                                    (2, 9.9, 10.4))),
                          overlap=2, fragments=3, inner_steps=6, quorum=2, steps=30),
    "down_for_good": dict(cluster=Cluster(failures=((1, 2.5, math.inf),)), steps=12),
    "down_for_good_kM": dict(cluster=Cluster(step_time_s=(1, 1, 1.5),
                                             failures=((2, 5.2, math.inf),)),
                             workers=3, quorum=3, overlap=1, fragments=3, inner_steps=3),
    "all_down_ends_short": dict(cluster=Cluster(failures=tuple((m, 2.5 + m, math.inf)
                                                              for m in range(4))), steps=6),
    "failed_out_of_quorum": dict(cluster=Cluster(step_time_s=(1, 1, 1, 3, 3),
                                                 failures=((0, 2.5, 100.0),)),
                                 workers=5, steps=6, inner_steps=2, overlap=1, quorum=4,
                                 grace_safety=0.0),
    # drawn failures
    "chaos_m8_p4_t2_k2": dict(cluster=Cluster(jitter=0.2, failures=FailureRate(20.0, 5.0),
                                              seed=1),
                              workers=8, steps=48, fragments=4, inner_steps=8, overlap=2,
                              quorum=2, eval_every=8),
    "chaos_p2_t1_mix": dict(cluster=Cluster(jitter=0.3, failures=FailureRate(30.0, 5.0)),
                            steps=60, fragments=2, overlap=1, quorum=2, mix=0.5,
                            eval_every=10),
    "chaos_often_p1_kM": dict(cluster=Cluster(jitter=0.3, failures=FailureRate(6.0, 3.0),
                                              seed=2),
                              steps=24, inner_steps=3, quorum=4),
    # finite links
    "link_p1_k1": dict(cluster=Cluster(link=SLOW)),
    "link_p4_t2_k2": dict(cluster=Cluster(link=SLOW, step_time_s=(1, 1.2, 0.9, 1)),
                          fragments=4, overlap=2, quorum=2, inner_steps=8, steps=32),
    "link_p3_t1_kM_down4": dict(cluster=Cluster(link=LAGGY), fragments=3, overlap=1,
                                quorum=4, down_bits=4, inner_steps=6),
    "link_p3_t1_kM_down32": dict(cluster=Cluster(link=LAGGY), fragments=3, overlap=1,
                                 quorum=4, down_bits=32, inner_steps=6),
    "link_fail_jitter_p3_t2": dict(cluster=Cluster(link=SLOW, jitter=0.2,
                                                   failures=((3, 5.0, 12.0),
                                                             (0, 17.3, math.inf)), seed=4),
                                   fragments=3, overlap=2, quorum=2, inner_steps=6, steps=30,
                                   bits=8),
    "link_chaos_spread_grace1": dict(cluster=Cluster(link=LAGGY, speed_spread=0.4,
                                                     failures=FailureRate(25.0, 4.0), seed=5),
                                     workers=6, fragments=4, overlap=2, quorum=3,
                                     inner_steps=8, steps=40, grace_safety=1.0, bits=2,
                                     down_bits=8),
    "h1_every_step": dict(cluster=Cluster(step_time_s=(1, 1.4, 0.7)), workers=3, inner_steps=1,
                          steps=10, quorum=2, eval_every=5),
}


def counter(v) -> str:
    """A booked counter (history stats, final counters): floats to 12 significant digits.
    They are sums that numpy orders differently across versions (Colab's numpy 2.0.2 ends
    `lost_steps` one bit off), unlike the clock's times and weights, kept bit for bit."""
    return f"{v:.12g}" if isinstance(v, float) else repr(v)


def fingerprint(plan, caught=()) -> str:
    """sha1 of everything in a plan (module docstring), floats by repr, counters by `counter`."""
    fl = lambda xs: None if xs is None else [repr(float(x)) for x in xs]  # noqa: E731
    lines = [f"M={plan.learners} t_ref={plan.t_ref!r}"]
    for b in plan.blocks:
        lines.append(f"block {b.steps.tolist()} {b.first.tolist()}")
        for e in b.events:
            mask = None if e.mask is None else e.mask.tolist()
            peer = None if e.peer is None else e.peer.tolist()
            stats = None if e.stats is None else [(k, counter(v)) for k, v in
                                                  sorted(e.stats.items())]
            lines.append(f"{e.kind} {e.time_s!r} {e.fragment} {mask} {fl(e.weights)} {e.flush} "
                         f"{peer} {sorted(e.at.items())} {stats}")
    lines += [repr([fl(t) for t in plan.step_time]), repr(plan.fragments),
              repr([(k, counter(v)) for k, v in sorted(plan.final.items())])]
    lines += [str(w.message) for w in caught]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def run(name: str) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = golden_plan(**CONFIGS[name])
    return fingerprint(plan, caught)


GOLDEN = {
    "all_down_ends_short": "40195a66dc5170fa27d83033f15559baed3ba314",
    "chaos_m8_p4_t2_k2": "c06719c8f0ec8ee4357688deb9c1e568bf53b94f",
    "chaos_often_p1_kM": "d26685d7f4771de5afcaa2ab792f761f7442ba9a",
    "chaos_p2_t1_mix": "2bc6ee9733b83b3369ea661113eb34fbdebdd914",
    "down_for_good": "7743edab6afc42b5c94145214ff54988704d183e",
    "down_for_good_kM": "a500b2ad351e6a7cd6e04d741207efa41698a044",
    "equal_p1_kM": "06824fde4cb8f50e6126e6ed1d769959c00b4322",
    "equal_p3_t2_k1": "c55ec61b06eae3a9b72f0d2644c4b47270bec930",
    "equal_p4_t0_kM": "78a1221cdacc8f71714a1f98cf9014f18b076a7a",
    "fail_at_ask_instant": "e66df51a0aa8e163b04299c124324755c845ca27",
    "fail_back_k1": "f5069207632ec12146cf380e17e9c9e0554e202b",
    "fail_k4_waits": "01e88066fba3ed57e702e3b21ccb3d3e38372d84",
    "fail_twice_t2": "4e86f888b1dc3370e9d720f1e78f50589778f828",
    "failed_out_of_quorum": "775afb848077628a9af0b66f2a89e1befb2df49d",
    "five_k4": "afb46cba5f2cc773654012b5ab34acd0dcf22215",
    "five_k5": "43f9eb15df1e92a351fbd629216c50d7c0809d67",
    "h1_every_step": "2fec3cc22f34a5521c4bf56a27c076fae9bc609f",
    "jitter_p3_t1_k2": "3f051b949f49735463dd6d8adbbb39a23f28b32c",
    "link_chaos_spread_grace1": "b34abf3505348784101cd02ddb995c31a159e322",
    "link_fail_jitter_p3_t2": "5886fe77697057e2f3e9114af8135ccb4d1527d7",
    "link_p1_k1": "c05df25ec6731ddd3362b6976999320c3f51a6b3",
    "link_p3_t1_kM_down32": "1ce40e5962aeaab3ad40f97e4db49102ab028d03",
    "link_p3_t1_kM_down4": "5186d3900fa69f91947b385dc872db6da00086a2",
    "link_p4_t2_k2": "5747547a0f10e650a08b8586a7b5f28600d9295b",
    "slow3_t2_grace": "2475dba9e2e1a594530c551ed4c52d3202d2c5c4",
    "slow3_t2_nograce": "7506130ed7bb4248a9e18bd1296dea609ddbd1dd",
    "spread_jitter_kM_mean": "17d41e1057d97c4420307123a972c3239d1d20fd",
    "spread_jitter_kM_rda": "17d41e1057d97c4420307123a972c3239d1d20fd",
    "spread_p4_t2_k2": "303b3d4ec26dd5079e9ff02ee11c08e161c215c5",
    "ties_p3_t1": "923bbcc72ea8d4b5a8e1d7b5f9b07404aa0c67c9",
    "two_k2_h3": "46cde7b0488e871024cbafe99fd9626ca11c6c60",
    "two_t3": "fe56b6e010d78cb226c4366ceb77088d3c3b013d",
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_plan_is_bit_identical_to_the_golden_one(name):
    assert run(name) == GOLDEN[name]


def test_the_configs_are_many_and_distinct():
    assert len(CONFIGS) >= 25
    fps = {n: run(n) for n in CONFIGS}
    # merge "mean" and "rda" plan alike; every other config plans a run of its own
    assert fps["spread_jitter_kM_mean"] == fps["spread_jitter_kM_rda"]
    assert len(set(fps.values())) == len(CONFIGS) - 1


if __name__ == "__main__":  # regenerate GOLDEN (only for an intended change of the rules)
    for name in sorted(CONFIGS):
        print(f'    "{name}": "{run(name)}",')
