"""Golden plans of Decoupled DiLoCo: a refactor of the clock must keep every run bit for bit.

Each config below is planned on the host (no device) and the whole plan is hashed: every block's
per-learner steps and data indices, every event's kind, time, fragment, mask, weights, flush
flag, peer, positions and history row, each learner's step times, the per-fragment bytes and
the final counters, floats by `repr` (so a change in the last bit shows), and the warning of a
run that ends short. The expected sha1s were generated from the event loop of `clock.syncer`
before its decisions moved into `clock.syncer_state` (issue 18.1); they must never change
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


def fingerprint(plan, caught=()) -> str:
    """sha1 of everything in a plan (module docstring), floats by repr."""
    fl = lambda xs: None if xs is None else [repr(float(x)) for x in xs]  # noqa: E731
    lines = [f"M={plan.learners} t_ref={plan.t_ref!r}"]
    for b in plan.blocks:
        lines.append(f"block {b.steps.tolist()} {b.first.tolist()}")
        for e in b.events:
            mask = None if e.mask is None else e.mask.tolist()
            peer = None if e.peer is None else e.peer.tolist()
            stats = None if e.stats is None else [(k, repr(v)) for k, v in
                                                  sorted(e.stats.items())]
            lines.append(f"{e.kind} {e.time_s!r} {e.fragment} {mask} {fl(e.weights)} {e.flush} "
                         f"{peer} {sorted(e.at.items())} {stats}")
    lines += [repr([fl(t) for t in plan.step_time]), repr(plan.fragments),
              repr([(k, repr(v)) for k, v in sorted(plan.final.items())])]
    lines += [str(w.message) for w in caught]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def run(name: str) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = golden_plan(**CONFIGS[name])
    return fingerprint(plan, caught)


GOLDEN = {
    "all_down_ends_short": "303841a8d34791147b89da4090fbc978e5d8161e",
    "chaos_m8_p4_t2_k2": "382d165778911df84fdb4fc7ae67d83fcb515d35",
    "chaos_often_p1_kM": "c6920e8b93e1c05aeadbe35949a44cbdcf94d10c",
    "chaos_p2_t1_mix": "189eaefe47d95ca91872d8e62bab865e8d17e73d",
    "down_for_good": "e24e4703cf6291573b699307e32349efa298e022",
    "down_for_good_kM": "b3771b1f23ec8794acb5a61049db651526ffeff8",
    "equal_p1_kM": "7a3646778a71aedde2fe20266f58cdb94b5d240b",
    "equal_p3_t2_k1": "9244b33085c81eedab31b4e0134d419a05e00680",
    "equal_p4_t0_kM": "fa0e63b112227b6ffd470da8efe8b6c86b0d2c8e",
    "fail_at_ask_instant": "89a27c980721f00b5a865098bc39f141d3322a6a",
    "fail_back_k1": "707a187837f172905502fa973105844a4447f665",
    "fail_k4_waits": "9077701af0f89aea4f1ed75799895c77a47d7b44",
    "fail_twice_t2": "30177347baf118dbb33052de530cda47ae1014a4",
    "failed_out_of_quorum": "32790da94291b3f21639fcb1c2000de932e27480",
    "five_k4": "3487a67b772a0dececcab2cad86cc2bdb246c26b",
    "five_k5": "bf0ae8f1f24b99302deb20eab00a488b7204861e",
    "h1_every_step": "bd48f618e5ba8e67c2b952fb083b8110d91479c1",
    "jitter_p3_t1_k2": "c49a7c10039a2f160a483873fc578b3ba5d0c2e3",
    "link_chaos_spread_grace1": "e2e9b5b73dc4dd844fe7d8c1b7d5e714f7bbf7a5",
    "link_fail_jitter_p3_t2": "22e87548e9b0569cf304462d2e04f2928afb8b46",
    "link_p1_k1": "17799ccc0abd9de619ed5d8f65a5342acf98f9f8",
    "link_p3_t1_kM_down32": "9ec4a0fb73cd1fa7826119bb947fe338a0a59d4d",
    "link_p3_t1_kM_down4": "d948544666e0f49b73086052c0f96f39af4ff06d",
    "link_p4_t2_k2": "012942d095a6cda32438606d0c1af3d7063decdc",
    "slow3_t2_grace": "e5ead86445fd262d9235b76d4b58bd1a9baf590f",
    "slow3_t2_nograce": "c0aa85fa74bf845bc0e88176f3c7c37752c10b41",
    "spread_jitter_kM_mean": "655bc081d018fa262fe1ccd6347376e9c6c19419",
    "spread_jitter_kM_rda": "655bc081d018fa262fe1ccd6347376e9c6c19419",
    "spread_p4_t2_k2": "2cd9b6b3b4534b1675b92518116c81debde1b9dc",
    "ties_p3_t1": "90e0323c2b2049898988638e2cb0e849e37d76d9",
    "two_k2_h3": "4ac89ab879b7b82fa1e34787436cc75e0f14ba32",
    "two_t3": "f2b99a3ade8e8e3ff2a239b911d019348c522ceb",
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
