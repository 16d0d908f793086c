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
