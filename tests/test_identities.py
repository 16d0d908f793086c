"""Exact identities between the methods (ALGORITHMS.md §1–§3), to float tolerance."""

import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite.comm import payload_bytes
from tests.helpers import assert_trees_close, max_abs_diff, tiny_run


def run(cfg):
    return dl.train(cfg, progress=False)


@pytest.fixture(scope="module")
def ddp8():
    return run(tiny_run(dl.DDP(), workers=8, batch_size=2))


def test_ddp_equals_large_batch(ddp8):
    """8 workers with batch B ≡ 1 worker with batch 8B (same global batch every step)."""
    one = run(tiny_run(dl.DDP(), workers=1, batch_size=16))
    assert_trees_close(ddp8.params, one.params)
    # and the run really trained: parameters moved far more than the tolerance
    one_step = dl.train(tiny_run(dl.DDP(), steps=1), progress=False)
    assert max_abs_diff(ddp8.params, one_step.params) > 1e-3


def test_ddp_sixteen_workers_vmapped_on_eight_devices(ddp8):
    sixteen = run(tiny_run(dl.DDP(), workers=16, batch_size=1))
    assert_trees_close(ddp8.params, sixteen.params)


def test_diloco_h1_outer_sgd1_is_ddp(ddp8):
    """SGD inner, H=1, outer SGD(lr=1, no momentum): θ − 1·mean(θ − θ_m) = θ − lr·ḡ."""
    diloco = run(tiny_run(dl.DiLoCo(inner_steps=1, outer_optimizer=optax.sgd(1.0))))
    assert_trees_close(ddp8.params, diloco.params)
    # with the default Nesterov outer optimizer it is *not* DDP
    nesterov = run(tiny_run(dl.DiLoCo(inner_steps=1)))
    assert max_abs_diff(ddp8.params, nesterov.params) > 1e-3


def test_streaming_p1_tau0_b32_is_diloco():
    algo = dl.DiLoCo(inner_steps=3)
    streaming = dl.StreamingDiLoCo(inner_steps=3, fragments=1, overlap=0, mix=0.0, bits=32,
                                   fragmentation="layers")
    a, b = run(tiny_run(algo, steps=7)), run(tiny_run(streaming, steps=7))
    assert_trees_close(a.params, b.params)
    np.testing.assert_array_equal(a.history.comm_bytes, b.history.comm_bytes)
    # each knob on its own changes the result
    for knob in (dict(bits=4), dict(overlap=1, mix=0.5), dict(fragments=2)):
        other = dl.StreamingDiLoCo(**{**dict(inner_steps=3, fragments=1, overlap=0, mix=0.0,
                                             bits=32), **knob})
        assert max_abs_diff(a.params, run(tiny_run(other, steps=7)).params) > 1e-5, knob


def test_diloco_final_partial_round_is_synced():
    """A run of 7 steps with H=3 ends with a one-step third round that still reaches θ."""
    seven = run(tiny_run(dl.DiLoCo(inner_steps=3), steps=7, eval_every=7))
    six = run(tiny_run(dl.DiLoCo(inner_steps=3), steps=6, eval_every=6))
    # three syncs of the whole model by 8 workers (the third after the last step) ...
    assert seven.final.comm_bytes == 3 * 8 * payload_bytes(seven.params)
    assert six.final.comm_bytes == 2 * 8 * payload_bytes(six.params)
    # ... so the seventh step's work is in the returned global parameters
    assert max_abs_diff(seven.params, six.params) > 1e-4
