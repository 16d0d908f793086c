"""Byte accounting: the HLO counter on known functions, and what runs book against the HLO."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite.algorithms import make_driver
from diloco_lite.algorithms.ddp import ddp_step_fn
from diloco_lite.algorithms.learners import close_fn, inner_fn
from diloco_lite.clock.plan import make_plan
from diloco_lite.comm import collective_bytes, collectives_in_hlo, shape_bytes
from diloco_lite.devices import AXIS, worker_mesh
from diloco_lite.model import build_model
from diloco_lite.outer import take_leaves
from diloco_lite.training import setup as setup_run
from diloco_lite.wire import WireFormat
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


def fp32_bytes(tree) -> int:
    """Independent of the wire format: 4 bytes per value."""
    return 4 * sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("workers", [8, 16])
def test_ddp_step_is_one_all_reduce_of_the_gradient(setup, workers):
    model, params = setup
    mesh = worker_mesh(workers)
    opt = optax.sgd(0.1)
    step = ddp_step_fn(model, mesh, opt)
    p = jax.device_put(params, mesh.sharding())
    batch = jax.device_put(np.zeros((workers, 2, 17), np.int32), mesh.sharding(AXIS))
    share = jax.device_put(np.ones(workers, np.float32), mesh.sharding(AXIS))
    out = collective_bytes(step, p, opt.init(p), batch, share)
    assert set(out["by_kind"]) == {"all-reduce"}
    # the gradient (= parameter) bytes, plus the 4-byte mean loss riding along
    assert out["by_kind"]["all-reduce"] in (fp32_bytes(params), fp32_bytes(params) + 4)
    # in one flat buffer, not a tuple of tensors (gloo runs one ring per tuple element)
    [op] = out["ops"]
    assert not op.shape.startswith("("), op.shape[:60]


@pytest.mark.parametrize("workers", [8, 16])
def test_bf16_ddp_step_moves_the_gradient_as_16_bit_values(workers):
    """DDP(bits=16): an all-to-all of each device's gradient in 16-bit values (padded to a
    multiple of the 8 devices: this model's gradient is not) and an all-gather of the mean
    chunks, plus each device's fp32 loss (4 bytes): half the bytes of the fp32 all-reduce, and
    no collective that XLA widens to fp32."""
    model = build_model(dl.ModelConfig(vocab_size=81, context=16, d_model=6, n_layers=1,
                                       n_heads=2, mlp_ratio=2))
    params = model.init(0)
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    assert n % 8, "a gradient that does not split evenly over the 8 devices"
    padded = 8 * -(-n // 8)
    mesh = worker_mesh(workers)
    opt = optax.sgd(0.1)
    step = ddp_step_fn(model, mesh, opt, bits=16)
    p = jax.device_put(params, mesh.sharding())
    batch = jax.device_put(np.zeros((workers, 2, 17), np.int32), mesh.sharding(AXIS))
    share = jax.device_put(np.ones(workers, np.float32), mesh.sharding(AXIS))
    out = collective_bytes(step, p, opt.init(p), batch, share)
    assert out["by_kind"] == {"all-to-all": 2 * padded, "all-gather": 2 * padded + 4 * 8}
    for op in out["ops"]:  # 16-bit codes only: an f32 here would be a widened collective
        assert set(re.findall(r"([a-z]+[0-9]+)\[", op.shape)) == {"u16"}, op.shape[:80]


def stacked(mesh, tree, m=8):
    """`tree` repeated for m workers on a leading axis, placed by worker. Jitted, as the values
    below: one program, where op by op took most of these tests' time."""
    return jax.jit(lambda t: jax.tree.map(lambda x: jnp.broadcast_to(x, (m,) + jnp.shape(x)), t),
                   out_shardings=mesh.sharding(AXIS))(tree)


def test_inner_steps_have_no_collectives(setup):
    model, params = setup
    mesh = worker_mesh(8)
    opt = optax.adamw(1e-3)
    batches = jax.device_put(np.zeros((8, 5, 2, 17), np.int32), mesh.sharding(AXIS))
    mask = jax.device_put(np.ones((8, 5), bool), mesh.sharding(AXIS))
    out = collective_bytes(inner_fn(model, mesh, opt), stacked(mesh, params),
                           stacked(mesh, opt.init(params)), batches, mask)
    assert out["ops"] == []


@pytest.mark.parametrize("bits", [32, 16, 8, 4, 2])
def test_the_sync_moves_exactly_the_booked_b_bit_payload(setup, bits):
    """One all-gather per sync (one byte buffer, `wire.to_bytes`), of what the 8 learners send:
    8 × the wire format's bytes. The count of the wire format itself is checked by hand in
    test_wire.py."""
    _, params = setup
    mesh = worker_mesh(8)
    wire = WireFormat(bits)
    leaves = jax.tree.leaves(params)
    sent = stacked(mesh, jax.jit(lambda xs: [wire.encode(x) for x in xs])(leaves))
    outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
    glob = jax.device_put(leaves, mesh.sharding())
    close = close_fn(mesh, outer, wire, WireFormat(32))
    out = collective_bytes(close, glob, outer.init(glob), sent, jnp.ones(8), mean_leaves=None,
                           rda=False, flush=False)
    assert set(out["by_kind"]) == {"all-gather"}
    assert out["by_kind"]["all-gather"] == 8 * wire.tree_nbytes(params)
    # one buffer: one round of messages on a real link, not one per leaf (26 tensors here)
    assert len(out["ops"]) == 1


@pytest.mark.parametrize("algo", [
    dl.DDP(), dl.DDP(bits=16), dl.DiLoCo(inner_steps=2),
    dl.StreamingDiLoCo(inner_steps=4, fragments=3, overlap=1, bits=4),
    # every learner answers every ask (K = M, equal speeds), with the syncer's RDA merge
    dl.DecoupledDiLoCo(inner_steps=4, fragments=3, overlap=1, bits=4, quorum=8, merge="rda")])
def test_history_bytes_match_the_compiled_program(algo):
    """comm_bytes booked by a run = Σ over its syncs of the bytes the compiled sync moves."""
    cfg = tiny_run(algo, steps=8, eval_every=8)
    result = dl.train(cfg, progress=False)
    corpus, model, mesh, optimizer = setup_run(cfg)
    params = model.init(0)
    driver = make_driver(cfg, model, mesh, optimizer, params)
    state = driver.init(params)
    if isinstance(algo, dl.DDP):
        batch = jax.device_put(np.zeros((8, 2, 17), np.int32), mesh.sharding(AXIS))
        share = jax.device_put(np.ones(8, np.float32), mesh.sharding(AXIS))
        ops = collective_bytes(driver.step_fn, *state, batch, share)["by_kind"]
        # fp32: one all-reduce, minus the loss riding along; bf16: the all-to-all of the
        # gradient (its all-gather moves as much back, plus the losses: test above)
        per_device = ops["all-reduce"] - 4 if algo.bits == 32 else ops["all-to-all"]
        per_sync, syncs = [8 * per_device], [cfg.steps]
    else:
        per_sync = []
        for p, idx in enumerate(driver.frags):
            ops = collective_bytes(driver.close, take_leaves(state["global"], idx),
                                   state["outer"][p], state["sent"][p], jnp.ones(8),
                                   mean_leaves=driver.mean_leaves[p], rda=driver.rda,
                                   flush=False)
            per_sync.append(ops["by_kind"]["all-gather"])
        syncs = list(result.fragments.syncs)
    assert result.final.comm_bytes == sum(b * n for b, n in zip(per_sync, syncs, strict=True))
    assert sum(syncs) >= 2


def test_the_clock_charges_bf16_ddp_its_bfloat16_gradient():
    """DDP(bits=16) on a 1 Mbit/s link: every step is 1 s of compute plus the ring's share,
    2(M−1)/M, of one bfloat16 gradient per worker (2 bytes per value, padded to whole chunks
    of the 8 devices): the bytes booked and the clock both count half of fp32's."""
    cluster = dl.Cluster(step_time_s=1.0, link=dl.Link(gbit_per_s=1e-3))
    result = dl.train(tiny_run(dl.DDP(bits=16), steps=4, eval_every=4, cluster=cluster),
                      progress=False)
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(result.params))
    per_worker = 2 * 8 * -(-n // 8)
    assert result.final.comm_bytes == 4 * 8 * per_worker
    assert result.final.sim_time_s == pytest.approx(4 * (1.0 + 1.75 * per_worker * 8 / 1e6))


def test_diloco_h50_sends_one_fiftieth_of_ddp():
    ddp = dl.train(tiny_run(dl.DDP(), steps=100, eval_every=100, batch_size=1), progress=False)
    diloco = dl.train(tiny_run(dl.DiLoCo(inner_steps=50), steps=100, eval_every=100,
                               batch_size=1), progress=False)
    assert diloco.final.comm_bytes * 50 == ddp.final.comm_bytes == 100 * 8 * fp32_bytes(
        ddp.params)


def test_fragments_lower_the_peak_bytes():
    results = {}
    for p in (1, 4):
        algo = dl.StreamingDiLoCo(inner_steps=8, fragments=p, overlap=0, mix=0.0, bits=32)
        results[p] = dl.train(tiny_run(algo, steps=16, eval_every=16), progress=False)
    one, four = results[1].final, results[4].final
    # the same total: every fragment syncs twice in 16 steps and the run ends on a sync of
    # every fragment (P=4: the three others have 16 − offset steps of work left, flushed once)
    assert one.comm_bytes == 2 * 8 * fp32_bytes(results[1].params)
    assert list(results[4].fragments.syncs) == [3, 3, 3, 2]
    # about 4x lower peak per step (the fragments are balanced, not exactly equal)
    assert 3.0 <= one.peak_step_bytes / four.peak_step_bytes <= 5.0


def test_decoupled_books_the_answers_the_all_gather_moves_every_slot():
    """With K = 1 on a jittery cluster some learners do not answer an ask. The close's
    all-gather still moves all 8 slots (the emulation), but a learner that did not answer sent
    nothing: comm_bytes = answers × one payload (= the all-gather's bytes / 8), counted here
    from the plan's send events, fewer than 8 per close."""
    algo = dl.DecoupledDiLoCo(inner_steps=4, fragments=2, overlap=1, bits=4, quorum=1)
    cfg = tiny_run(algo, steps=12, eval_every=12, cluster=dl.Cluster(jitter=0.4, seed=3))
    result = dl.train(cfg, progress=False)
    corpus, model, mesh, optimizer = setup_run(cfg)
    params = model.init(0)
    driver = make_driver(cfg, model, mesh, optimizer, params)
    state = driver.init(params)
    payload = []
    for p, idx in enumerate(driver.frags):
        ops = collective_bytes(driver.close, take_leaves(state["global"], idx),
                               state["outer"][p], state["sent"][p], jnp.ones(8),
                               mean_leaves=driver.mean_leaves[p], rda=True, flush=False)
        assert ops["by_kind"]["all-gather"] % 8 == 0
        payload.append(ops["by_kind"]["all-gather"] // 8)
    plan = make_plan(cfg, up_nbytes=driver.up_nbytes, down_nbytes=driver.down_nbytes,
                     sizes=driver.sizes, rejoin_nbytes=driver.rejoin_nbytes, eval_at=[12])
    sends = [e for b in plan.blocks for e in b.events if e.kind == "send"]
    closes = [e for b in plan.blocks for e in b.events if e.kind == "close"]
    answers = sum(int(e.mask.sum()) for e in sends)
    assert answers < 8 * len(closes)  # some learners were left out
    assert result.final.comm_bytes == sum(int(e.mask.sum()) * payload[e.fragment]
                                          for e in sends)
