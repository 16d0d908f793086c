"""Small shared fixtures: a tiny model and run config so that each `train` takes seconds."""

import dataclasses

import jax
import numpy as np
import optax

import diloco_lite as dl

TINY = dl.ModelConfig(context=16, d_model=32, n_layers=1, n_heads=2, mlp_ratio=2)


def tiny_run(algorithm=None, **kw) -> dl.RunConfig:
    algorithm = algorithm if algorithm is not None else dl.DDP()
    base = dict(algorithm=algorithm, workers=8, steps=6, batch_size=2, seq_len=16, model=TINY,
                inner_optimizer=optax.sgd(0.5), eval_every=3, eval_batches=1, seed=0)
    base.update(kw)
    return dl.RunConfig(**base)


def assert_trees_close(a, b, rtol=2e-5, atol=2e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y),
                                                         rtol=rtol, atol=atol), a, b)


def max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def replace(cfg, **kw):
    return dataclasses.replace(cfg, **kw)


def assert_trees_close_up_to_rounding_flips(a, b, rtol, atol, max_flips=1e-2, flip_size=5e-3):
    """`assert_trees_close` for runs that quantize: a value within float error of a rounding
    boundary can round one way in the library (float32) and the other in a float64 reference,
    which moves that one element by about a quantization step. Allow such flips in at most
    `max_flips` of all elements, each at most `flip_size` off; a real bug (a swapped mix, a
    wrong sign, a missed sync) moves nearly every element of a fragment."""
    bad, total, worst = 0, 0, 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        off = np.abs(x - y) > atol + rtol * np.abs(y)
        bad, total = bad + int(off.sum()), total + x.size
        worst = max(worst, float(np.abs(x - y)[off].max(initial=0.0)))
    assert bad <= max_flips * total, f"{bad} of {total} elements differ (largest {worst:.2e})"
    assert worst <= flip_size, f"{bad} elements differ, the largest by {worst:.2e} > {flip_size}"


def plan_events(plan, kind: str) -> list:
    """Every event of `kind` in a plan's blocks, in order."""
    return [e for b in plan.blocks for e in b.events if e.kind == kind]


def final_stats(plan) -> dict:
    """The counters of a plan's last history row."""
    return plan_events(plan, "eval")[-1].stats
