"""Byte accounting: the HLO counter on known functions, and the histories against the HLO."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite.algorithms.ddp import ddp_step_fn
from diloco_lite.algorithms.diloco import inner_fn, sync_fn
from diloco_lite.comm import collective_bytes, collectives_in_hlo, payload_bytes, shape_bytes
from diloco_lite.devices import AXIS, worker_mesh
from diloco_lite.model import build_model
from diloco_lite.quantize import fake_quantize, scale_count
from tests.helpers import TINY, tiny_run


def test_shape_bytes_parses_arrays_and_tuples():
    assert shape_bytes("f32[64,3]{1,0}") == 64 * 3 * 4
    assert shape_bytes("(f32[8]{0}, bf16[2,2]{1,0}, /*index=2*/s32[])") == 32 + 8 + 4
    hlo = "%ar = (f32[10]{0}, /*index=1*/f32[2,5]{1,0}) all-reduce(%a, %b), replica_groups={}"
    (op,) = collectives_in_hlo(hlo)
    assert (op.kind, op.bytes) == ("all-reduce", 80)


def test_collective_bytes_on_a_known_psum():
    mesh = worker_mesh(8)
    f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, AXIS), mesh=mesh.mesh,
                              in_specs=jax.P(AXIS), out_specs=jax.P()))
    x = jax.device_put(jnp.ones((8, 100, 3)), mesh.sharding(AXIS))
    out = collective_bytes(f, x)
    assert out["by_kind"] == {"all-reduce": 100 * 3 * 4}  # each device's block [1, 100, 3]
    np.testing.assert_allclose(f(x), 8.0)


@pytest.fixture(scope="module")
def setup():
    model = build_model(dataclasses.replace(TINY, vocab_size=80))
    params = model.init(0)
    return model, params


@pytest.mark.parametrize("workers", [8, 16])
def test_ddp_step_is_one_all_reduce_of_the_gradient(setup, workers):
    model, params = setup
    mesh = worker_mesh(workers)
    opt = optax.sgd(0.1)
    step = ddp_step_fn(model, mesh, opt)
    p = jax.device_put(params, mesh.sharding())
    batch = jax.device_put(np.zeros((workers, 2, 17), np.int32), mesh.sharding(AXIS))
    out = collective_bytes(step, p, opt.init(p), batch)
    assert set(out["by_kind"]) == {"all-reduce"}
    # the gradient (= parameter) bytes, plus the 4-byte mean loss riding along
    assert out["by_kind"]["all-reduce"] in (payload_bytes(params), payload_bytes(params) + 4)


def test_diloco_inner_loop_has_no_collectives_and_sync_is_one_all_reduce(setup):
    model, params = setup
    mesh = worker_mesh(8)
    opt = optax.adamw(1e-3)
    stack = lambda x: jnp.broadcast_to(x, (8,) + jnp.shape(x))  # noqa: E731
    local = jax.device_put(jax.tree.map(stack, params), mesh.sharding(AXIS))
    state = jax.device_put(jax.tree.map(stack, opt.init(params)), mesh.sharding(AXIS))
    batches = jax.device_put(np.zeros((8, 5, 2, 17), np.int32), mesh.sharding(AXIS))
    assert collective_bytes(inner_fn(model, mesh, opt), local, state, batches)["ops"] == []

    outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
    glob = jax.device_put(params, mesh.sharding())
    sync = collective_bytes(sync_fn(mesh, outer, 32), glob, outer.init(glob), local)
    assert sync["by_kind"] == {"all-reduce": payload_bytes(params)}


def test_history_bytes_match_the_hlo():
    """comm_bytes booked by DDP and DiLoCo = workers × the all-reduce payload in the HLO."""
    ddp = dl.train(tiny_run(dl.DDP(), steps=4, eval_every=4), progress=False)
    diloco = dl.train(tiny_run(dl.DiLoCo(inner_steps=2), steps=4, eval_every=4), progress=False)
    grad_bytes = payload_bytes(ddp.params)
    assert ddp.final.comm_bytes == 4 * 8 * grad_bytes
    assert diloco.final.comm_bytes == 2 * 8 * grad_bytes
    assert ddp.final.peak_step_bytes == diloco.final.peak_step_bytes == 8 * grad_bytes


def test_diloco_h50_sends_one_fiftieth_of_ddp():
    ddp = dl.train(tiny_run(dl.DDP(), steps=100, eval_every=100, batch_size=1), progress=False)
    diloco = dl.train(tiny_run(dl.DiLoCo(inner_steps=50), steps=100, eval_every=100,
                               batch_size=1), progress=False)
    assert diloco.final.comm_bytes * 50 == ddp.final.comm_bytes


def test_quantized_bytes_are_an_eighth_plus_scales(setup):
    _, params = setup
    values = sum(x.size for x in jax.tree.leaves(params))
    scales = sum(scale_count(x.shape) for x in jax.tree.leaves(params))
    assert payload_bytes(params, 32) == 4 * values
    assert payload_bytes(params, 4) == values // 2 + 4 * scales
    assert payload_bytes(params, 16) == 2 * values + 4 * scales


def test_fake_quantize_error_is_bounded_by_half_a_step():
    x = jax.random.normal(jax.random.key(0), (16, 64))
    for bits in (4, 8):
        q = fake_quantize(x, bits)
        step = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / (2 ** (bits - 1) - 1)
        assert jnp.all(jnp.abs(q - x) <= step / 2 + 1e-6)
        levels = jnp.unique(jnp.round(q / step))
        assert levels.size <= 2 ** bits - 1
    assert jnp.array_equal(fake_quantize(x, 32), x)


def test_fragments_lower_the_peak_bytes():
    results = {}
    for p in (1, 4):
        algo = dl.StreamingDiLoCo(inner_steps=8, fragments=p, overlap=0, mix=0.0, bits=32)
        results[p] = dl.train(tiny_run(algo, steps=16, eval_every=16), progress=False).final
    # about 4x lower peak per step ...
    # ... for about the same total: every fragment syncs twice in 16 steps, and the end-of-run
    # flush re-sends the three fragments whose offsets are not 0 (2 + 3/4 models vs 2 models)
    assert results[4].comm_bytes / results[1].comm_bytes == pytest.approx(2.75 / 2, rel=0.1)
    assert 3.0 <= results[1].peak_step_bytes / results[4].peak_step_bytes <= 5.0
