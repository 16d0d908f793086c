"""Exact identities between the methods (docs/algorithms.md §6), to float tolerance, and the
Streaming DiLoCo driver against a plain loop written here from the paper's recipe."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite.outer import fragments
from diloco_lite.training import setup
from tests.helpers import (
    assert_trees_close,
    assert_trees_close_up_to_rounding_flips,
    max_abs_diff,
    tiny_run,
)


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


def test_elastic_ddp_step_is_sgd_on_the_up_workers_sequences():
    """16 workers, two on each device; workers 0, 5 and 6 down (share 0, the others 16/13): one
    step is SGD(0.5) on the mean loss of the other workers' sequences, written here as a plain
    gradient of their batch."""
    from diloco_lite.algorithms.ddp import ddp_step_fn

    cfg = tiny_run(dl.DDP(elastic=True), workers=16)
    corpus, model, mesh, optimizer = setup(cfg)
    params = model.init(0)
    batch = corpus.batch(0, seed=0, workers=16, batch_size=2, seq_len=cfg.seq_len)
    up = np.ones(16, np.float32)
    up[[0, 5, 6]] = 0
    share = up * up.size / up.sum()
    step = ddp_step_fn(model, mesh, optimizer, donate=False)
    placed = jax.device_put((batch, share), mesh.sharding("workers"))
    got, _, loss = step(*jax.device_put((params, optimizer.init(params)), mesh.sharding()),
                        *placed)
    rows = batch[up > 0].reshape(-1, batch.shape[-1])

    @jax.jit  # one program: op by op, this plain gradient took most of the test's time
    def sgd(params, rows):
        loss, grads = jax.value_and_grad(model.loss)(params, rows)
        return loss, jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)

    want_loss, want = sgd(params, rows)
    assert_trees_close(got, want)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    # and the down workers' sequences really would have moved it
    assert max_abs_diff(want, sgd(params, batch.reshape(-1, batch.shape[-1]))[1]) > 1e-4


def bf16(x) -> np.ndarray:
    """`x` rounded to bfloat16 and widened back to fp32."""
    return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))


def test_bf16_ddp_step_is_a_plain_loop_in_bfloat16():
    """DDP(bits=16), one step of 8 workers on the 8 devices, against a loop written here: each
    worker's gradient rounded to bfloat16, the 8 added in fp32 in worker order, divided by 8,
    rounded to bfloat16, then the optimizer in fp32. The optimizer is a trace without decay:
    its state is exactly the gradient the step was given, and the update adds it."""
    from diloco_lite.algorithms.ddp import ddp_step_fn

    cfg = tiny_run(dl.DDP(bits=16))
    corpus, model, mesh, _ = setup(cfg)
    opt = optax.trace(decay=0.0)
    params = model.init(0)
    batch = corpus.batch(0, seed=0, workers=8, batch_size=2, seq_len=cfg.seq_len)
    with jax.default_matmul_precision("highest"):  # the loop and the step, both in full fp32
        step = ddp_step_fn(model, mesh, opt, donate=False, bits=16)
        placed = jax.device_put((batch, np.ones(8, np.float32)), mesh.sharding("workers"))
        new, state, loss = step(*jax.device_put((params, opt.init(params)), mesh.sharding()),
                                *placed)
        per_worker = jax.jit(jax.value_and_grad(model.loss))
        losses, grads = zip(*[per_worker(params, batch[m]) for m in range(8)], strict=True)
    def flat(leaves):
        return np.concatenate([np.ravel(x) for x in leaves])

    got = flat(jax.tree.leaves(state.trace))
    per_worker_MxN = np.stack([flat(jax.tree.leaves(g)) for g in grads])
    total = np.zeros_like(got)
    for g in per_worker_MxN:  # worker by worker, each as sent: in bfloat16
        total = total + bf16(g)
    want = bf16(total / 8)
    unrounded = bf16(per_worker_MxN.mean(axis=0))  # the workers' gradients sent in fp32

    assert np.array_equal(got, bf16(got))  # the mean arrived in bfloat16
    # The step's fp32 gradients may differ from the loop's in their last bits, so a value at a
    # bfloat16 rounding boundary may round the other way: one bfloat16 step (2^-7 relative) of
    # a worker's value or of the mean, in a few elements. Here none did; without the workers'
    # rounding, about a third of the elements differ.
    one_step = 2.0 ** -7 * (np.abs(want) + np.abs(per_worker_MxN).mean(axis=0))
    assert np.all(np.abs(got - want) <= one_step)
    assert np.mean(got != want) < 0.01 < 0.1 < np.mean(unrounded != want)
    assert_trees_close(new, jax.tree.map(lambda p, g: p + g, params, state.trace), rtol=1e-7,
                       atol=0)  # the optimizer got the mean, in fp32
    np.testing.assert_allclose(float(loss), np.mean(losses), rtol=1e-6)  # the loss, exact


def test_diloco_h1_outer_sgd1_is_ddp(ddp8):
    """SGD inner, H=1, outer SGD(lr=1, no momentum): θ − 1·mean(θ − θ_m) = θ − lr·ḡ."""
    diloco = run(tiny_run(dl.DiLoCo(inner_steps=1, outer_optimizer=optax.sgd(1.0))))
    assert_trees_close(ddp8.params, diloco.params)
    # with the default Nesterov outer optimizer it is *not* DDP
    nesterov = run(tiny_run(dl.DiLoCo(inner_steps=1)))
    assert max_abs_diff(ddp8.params, nesterov.params) > 1e-3


def test_diloco_h1_outer_sgd1_with_adamw_inside_is_not_ddp():
    """The identity needs the SGD inner optimizer: each worker's AdamW normalises its own
    gradient, and the mean of M AdamW updates is not one AdamW update of the mean gradient."""
    adamw = optax.adamw(1e-2)
    ddp = run(tiny_run(dl.DDP(), inner_optimizer=adamw))
    diloco = run(tiny_run(dl.DiLoCo(inner_steps=1, outer_optimizer=optax.sgd(1.0)),
                          inner_optimizer=adamw))
    assert max_abs_diff(ddp.params, diloco.params) > 1e-3


def test_streaming_p1_tau0_b32_is_diloco():
    algo = dl.DiLoCo(inner_steps=3)
    streaming = dl.StreamingDiLoCo(inner_steps=3, fragments=1, overlap=0, mix=0.0, bits=32,
                                   fragmentation="layers")
    a, b = run(tiny_run(algo, steps=7)), run(tiny_run(streaming, steps=7))
    assert_trees_close(a.params, b.params)
    np.testing.assert_array_equal(a.history.comm_bytes, b.history.comm_bytes)


SYNC_LIMIT = dict(quorum=8, grace_safety=0.0, merge="mean", down_bits=32)


def test_decoupled_in_its_synchronous_limit_is_diloco():
    """Equal speeds, no failures, K = M, no grace, P = 1, τ = 0, b = 32, mean merge."""
    diloco = run(tiny_run(dl.DiLoCo(inner_steps=3), steps=7))
    dec = run(tiny_run(dl.DecoupledDiLoCo(inner_steps=3, fragments=1, overlap=0, bits=32,
                                          **SYNC_LIMIT), steps=7))
    assert_trees_close(diloco.params, dec.params)
    np.testing.assert_array_equal(diloco.history.comm_bytes, dec.history.comm_bytes)
    np.testing.assert_array_equal(diloco.history.sim_time_s, dec.history.sim_time_s)


STREAMING = dict(inner_steps=3, fragments=2, overlap=1, mix=0.3, bits=4)


@pytest.fixture(scope="module")
def streaming8():
    return run(tiny_run(dl.StreamingDiLoCo(**STREAMING), steps=8, eval_every=8))


def test_decoupled_in_its_synchronous_limit_is_streaming(streaming8):
    dec = run(tiny_run(dl.DecoupledDiLoCo(**STREAMING, **SYNC_LIMIT), steps=8, eval_every=8))
    assert_trees_close(streaming8.params, dec.params)
    assert dec.final.comm_bytes == streaming8.final.comm_bytes
    # ... and RDA, the syncer's default merge, is another method
    rda = run(tiny_run(dl.DecoupledDiLoCo(**STREAMING, **{**SYNC_LIMIT, "merge": "rda"}),
                       steps=8, eval_every=8))
    assert max_abs_diff(streaming8.params, rda.params) > 1e-4


def sgd_steps_by_hand(local, grad, treedef, corpus, cfg, t):
    """Step t of every worker in float64: θ_w ← θ_w − 0.5 · ∇loss(θ_w; worker w's batch t)."""
    batch = corpus.batch(t - 1, seed=cfg.seed, workers=len(local), batch_size=cfg.batch_size,
                         seq_len=cfg.seq_len)
    for w, params in enumerate(local):
        g = jax.tree.leaves(grad(jax.tree.unflatten(treedef, [jnp.float32(x) for x in params]),
                                 batch[w]))
        local[w] = [x - 0.5 * np.asarray(gi, np.float64) for x, gi in zip(params, g, strict=True)]


def rda_by_hand(deltas):
    """Radial-directional averaging of equally weighted Δ_m (lists of arrays, taken together):
    r = mean ‖Δ_m‖, u = mean Δ_m/‖Δ_m‖, Δ = r · u/‖u‖ (docs/algorithms.md §4)."""
    norms = [np.sqrt(sum(np.sum(x * x) for x in d)) for d in deltas]
    u = [np.mean([d[i] / n for d, n in zip(deltas, norms, strict=True)], 0)
         for i in range(len(deltas[0]))]
    scale = np.mean(norms) / np.sqrt(sum(np.sum(x * x) for x in u))
    return [scale * x for x in u]


def decoupled_rda_by_hand(cfg):
    """Decoupled DiLoCo in its synchronous limit with the RDA merge: H = 3, P = 1, τ = 0,
    b = 32, SGD(0.5) inner, Nesterov(0.7, 0.9) outer over 7 steps: outer steps after steps 3
    and 6, each merging the embeddings (`embed`, `pos`) by the mean and every other tensor by
    RDA over them together; after step 7 the end-of-run flush: the plain mean, no momentum."""
    corpus, model, _, _ = setup(cfg)
    m = cfg.workers
    params = model.init(cfg.seed)
    names = [path[0].key for path, _ in jax.tree_util.tree_leaves_with_path(params)]
    leaves, treedef = jax.tree.flatten(params)
    glob = [np.asarray(x, np.float64) for x in leaves]
    local = [[g.copy() for g in glob] for _ in range(m)]
    momentum = [np.zeros_like(g) for g in glob]
    rda_idx = [i for i, n in enumerate(names) if n not in ("embed", "pos")]
    grad = jax.jit(jax.grad(model.loss))
    for t in range(1, cfg.steps + 1):
        sgd_steps_by_hand(local, grad, treedef, corpus, cfg, t)
        if t % 3 and t < cfg.steps:
            continue
        deltas = [[glob[i] - local[w][i] for i in range(len(glob))] for w in range(m)]
        merged = [np.mean([d[i] for d in deltas], 0) for i in range(len(glob))]
        if t % 3 == 0:  # an outer step: RDA for all but the embeddings
            for i, d in zip(rda_idx, rda_by_hand([[d[i] for i in rda_idx] for d in deltas]),
                            strict=True):
                merged[i] = d
            for i in range(len(glob)):
                momentum[i] = 0.9 * momentum[i] + merged[i]
                glob[i] = glob[i] - 0.7 * (merged[i] + 0.9 * momentum[i])
        else:  # the flush
            glob = [g - d for g, d in zip(glob, merged, strict=True)]
        local = [[g.copy() for g in glob] for _ in range(m)]
    return jax.tree.unflatten(treedef, glob)


def test_decoupled_with_rda_matches_a_plain_loop_and_flushes_by_the_mean():
    """The syncer's default merge, RDA, in the synchronous limit, on a run that ends with a
    flush (7 steps, H = 3): the flush is the plain mean (an RDA flush moves the last step's
    update by ~‖mean‖/mean‖Δ_m‖, far outside the tolerance)."""
    cfg = tiny_run(dl.DecoupledDiLoCo(inner_steps=3, fragments=1, overlap=0, bits=32,
                                      **{**SYNC_LIMIT, "merge": "rda"}), steps=7, eval_every=7)
    library = run(cfg)
    assert list(library.fragments.syncs) == [3]  # two outer steps and the flush
    assert_trees_close(library.params, decoupled_rda_by_hand(cfg), rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Streaming DiLoCo against a plain loop
# --------------------------------------------------------------------------------------------


def quantize_4bit(x):
    """Symmetric absmax to 4 bits per row (a vector is one row), back to float."""
    x = np.asarray(x, np.float64)
    rows = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)
    scale = np.abs(rows).max(axis=1, keepdims=True) / 7.0
    scale = np.where(scale > 0, scale, 1.0)
    return (np.clip(np.round(rows / scale), -7, 7) * scale).reshape(x.shape)


def streaming_by_hand(cfg, steps):
    """P=2 fragments, overlap τ=1, mixing α, 4-bit Δ, SGD(0.5) inner, Nesterov(0.7, 0.9) outer;
    fragment p is sent after steps ⌊(p+1)·3/2⌋ + 3k, i.e. fragment 0 after 1, 4, 7, fragment 1
    after 3, 6; its new value is mixed in after step t + τ. At the end: apply what is due, then
    average (plain mean, no momentum) every fragment that holds unsent work and is not in
    flight."""
    corpus, model, _, _ = setup(cfg)
    algo, m = cfg.algorithm, cfg.workers
    params = model.init(cfg.seed)
    leaves, treedef = jax.tree.flatten(params)
    glob = [np.asarray(x, np.float64) for x in leaves]
    local = [[g.copy() for g in glob] for _ in range(m)]
    frags = fragments(params, 2, "balanced")
    momentum = [np.zeros_like(g) for g in glob]
    send_after = {0: {1, 4, 7}, 1: {3, 6}}
    grad = jax.jit(jax.grad(model.loss))
    pending, since = [], [[0, 0] for _ in range(m)]
    for t in range(1, steps + 1):
        sgd_steps_by_hand(local, grad, treedef, corpus, cfg, t)
        for w in range(m):
            since[w] = [s + 1 for s in since[w]]
        for p in (0, 1):
            if t in send_after[p]:
                for i in frags[p]:
                    delta = np.mean([quantize_4bit(glob[i] - local[w][i]) for w in range(m)], 0)
                    momentum[i] = 0.9 * momentum[i] + delta
                    glob[i] = glob[i] - 0.7 * (delta + 0.9 * momentum[i])
                pending.append((t + algo.overlap, p, {i: glob[i].copy() for i in frags[p]}))
        for _due, p, value in [x for x in pending if x[0] == t]:
            for w in range(m):
                for i, v in value.items():
                    local[w][i] = algo.mix * local[w][i] + (1 - algo.mix) * v
                since[w][p] = 0
    in_flight = {p for due, p, _ in pending if due > steps}
    for p in (0, 1):
        if p not in in_flight and since[0][p] > 0:
            for i in frags[p]:
                glob[i] = glob[i] - np.mean([quantize_4bit(glob[i] - local[w][i])
                                             for w in range(m)], 0)
    return jax.tree.unflatten(treedef, glob)


@pytest.mark.parametrize("steps", [7, 8])
def test_streaming_matches_a_plain_loop(steps, streaming8):
    """α = 0.3 (a swapped mix would not look right), b = 4, 7 and 8 steps with H = 3: at 7,
    fragment 0 is in flight and stays out of the end-of-run average; at 8, its arrival is
    applied first and fragment 1 is averaged once more."""
    cfg = tiny_run(dl.StreamingDiLoCo(**STREAMING), steps=steps, eval_every=steps)
    library = streaming8 if steps == 8 else run(cfg)
    assert_trees_close_up_to_rounding_flips(library.params, streaming_by_hand(cfg, steps),
                                            rtol=1e-4, atol=2e-5)


# --------------------------------------------------------------------------------------------
# The clock changes time, not the lock-step computation
# --------------------------------------------------------------------------------------------


def test_lock_step_numbers_do_not_depend_on_the_clock():
    """A slow worker and a failure (the job stops and redoes the round) cost DiLoCo time, not
    different parameters; elastic DiLoCo, which drops the failed worker, does differ."""
    algo = dl.DiLoCo(inner_steps=3)
    plain = run(tiny_run(algo, steps=6, eval_every=6))
    slow = dl.Cluster(step_time_s=(1, 1, 1, 2, 1, 1, 1, 1), failures=((5, 7.5, 9.0),))
    stressed = run(tiny_run(algo, steps=6, eval_every=6, cluster=slow))
    assert_trees_close(plain.params, stressed.params, rtol=0, atol=0)
    # by hand: round 1 ends at 6 s (worker 3 takes 2 s a step); in round 2 the seven others
    # finish step 4 at 7 s, worker 5 fails at 7.5 s, everyone restarts round 2 at 9 s, and
    # worker 3 ends it at 9 + 3·2 = 15 s. Lost: the seven steps done before the failure.
    assert plain.final.sim_time_s == 6.0 and stressed.final.sim_time_s == 15.0
    assert stressed.final.lost_steps == 7 and plain.final.lost_steps == 0
    elastic = run(tiny_run(dl.DiLoCo(inner_steps=3, elastic=True), steps=6, eval_every=6,
                           cluster=slow))
    assert max_abs_diff(plain.params, elastic.params) > 1e-4
    assert elastic.final.sim_time_s == 12.0  # no restart: worker 3 sets the pace
