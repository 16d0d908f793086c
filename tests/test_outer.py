"""The outer loop's pieces: Nesterov by hand, merges, fragments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diloco_lite.outer import (
    default_outer_optimizer,
    fragments,
    mean_merge,
    outer_step,
    put_leaves,
    rda_merge,
    take_leaves,
    tree_norm,
)


def test_outer_nesterov_matches_the_update_written_by_hand():
    lr, mu = 0.7, 0.9
    opt = default_outer_optimizer()
    theta = {"w": jnp.array([1.0, -2.0, 0.5])}
    deltas = [jnp.array([0.1, 0.2, -0.3]), jnp.array([-0.05, 0.4, 0.0]), jnp.array([0.3, 0, 1])]
    state = opt.init(theta)
    v, expected = np.zeros(3), np.array(theta["w"])
    for d in deltas:
        theta, state = outer_step(opt, theta, state, {"w": d})
        v = mu * v + np.asarray(d)  # momentum buffer
        expected = expected - lr * (np.asarray(d) + mu * v)  # Nesterov look-ahead step
        np.testing.assert_allclose(theta["w"], expected, rtol=1e-6)


def test_rda_keeps_the_norm_that_plain_averaging_shrinks():
    m, n = 16, 4096
    deltas = {"w": jax.random.normal(jax.random.key(0), (m, n))}  # nearly orthogonal
    w = jnp.ones(m)
    mean_norm = float(tree_norm(mean_merge(deltas, w)))
    rda_norm = float(tree_norm(rda_merge(deltas, w)))
    avg_norm = float(jnp.mean(jnp.linalg.norm(deltas["w"], axis=1)))
    assert mean_norm == pytest.approx(avg_norm / np.sqrt(m), rel=0.05)  # the 1/√M shrink
    assert rda_norm == pytest.approx(avg_norm, rel=1e-5)
    # direction: the same as the (normalised) mean for equal norms
    dot = float(jnp.dot(rda_merge(deltas, w)["w"], mean_merge(deltas, w)["w"]))
    cos = dot / (rda_norm * mean_norm)
    assert cos == pytest.approx(1.0, abs=1e-2)


def test_rda_of_identical_deltas_is_that_delta_and_weights_matter():
    d = {"w": jnp.array([[3.0, 4.0], [3.0, 4.0]])}
    np.testing.assert_allclose(rda_merge(d, jnp.array([1.0, 5.0]))["w"], [3.0, 4.0], rtol=1e-6)
    d = {"w": jnp.array([[1.0, 0.0], [0.0, 1.0]])}
    np.testing.assert_allclose(mean_merge(d, jnp.array([3.0, 1.0]))["w"], [0.75, 0.25])


@pytest.mark.parametrize("how", ["balanced", "layers"])
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_fragments_partition_the_tensors(how, count):
    params = {f"t{i}": jnp.zeros((s,)) for i, s in enumerate([50, 10, 10, 30, 5, 40, 20])}
    frags = fragments(params, count, how)
    assert len(frags) == count and all(frags)
    assert sorted(i for f in frags for i in f) == list(range(7))
    if how == "layers":  # contiguous runs
        assert all(f == list(range(f[0], f[-1] + 1)) for f in frags)


def test_balanced_fragments_are_balanced():
    sizes = [64, 64, 64, 64, 32, 32, 16, 16, 8, 8]
    params = {f"t{i:02d}": jnp.zeros((s,)) for i, s in enumerate(sizes)}
    totals = [sum(sizes[i] for i in f) for f in fragments(params, 4)]
    assert max(totals) - min(totals) <= 8


def test_too_many_fragments_is_a_clear_error():
    with pytest.raises(ValueError, match=r"StreamingDiLoCo.fragments=4 .*\[1, 3\]"):
        fragments({"a": jnp.zeros(2), "b": jnp.zeros(3), "c": jnp.zeros(1)}, 4,
                  field="StreamingDiLoCo.fragments")


def test_take_and_put_leaves_round_trip():
    tree = {"a": jnp.zeros(2), "b": jnp.ones(3), "c": jnp.full(1, 2.0)}
    new = put_leaves(tree, [0, 2], [x + 1 for x in take_leaves(tree, [0, 2])])
    np.testing.assert_array_equal(new["a"], 1.0)
    np.testing.assert_array_equal(new["b"], 1.0)
    np.testing.assert_array_equal(new["c"], 3.0)


def test_rda_weights_lengths_and_directions_by_hand():
    """Two different deltas, weights 3:1: r = (3·3 + 1·1)/4, u = (3·e1 + 1·e2)/4, Δ = r·u/‖u‖."""
    d = {"w": jnp.array([[3.0, 0.0], [0.0, 1.0]])}
    r, u = 2.5, np.array([0.75, 0.25])
    np.testing.assert_allclose(rda_merge(d, jnp.array([3.0, 1.0]))["w"], r * u / np.linalg.norm(u),
                               rtol=1e-6)
    # the weights matter: swapping them gives another length and another direction
    other = np.asarray(rda_merge(d, jnp.array([1.0, 3.0]))["w"])
    assert np.linalg.norm(other) == pytest.approx((1 * 3 + 3 * 1) / 4, rel=1e-6)
    assert other[1] > other[0]


def test_rda_keeps_the_weighted_mean_norm_of_its_inputs():
    key_d, key_w = jax.random.split(jax.random.key(1))
    deltas = {"a": jax.random.normal(key_d, (5, 7)) * jnp.arange(1.0, 6.0)[:, None],
              "b": jnp.ones((5, 3))}
    w = jax.random.uniform(key_w, (5,)) + 0.1
    norms = np.sqrt(np.sum(np.asarray(deltas["a"]) ** 2, axis=1) + 3.0)
    want = float(np.sum(np.asarray(w) * norms) / np.sum(np.asarray(w)))
    assert float(tree_norm(rda_merge(deltas, w))) == pytest.approx(want, rel=1e-5)


def test_layers_fragments_follow_depth_not_the_alphabet():
    """`jax.tree.leaves` sorts keys (block_0, block_1, block_10, …, embed, ln_f, pos); the layer
    split must follow the forward pass: embeddings, block_0 … block_11, final norm."""
    depth = ["embed", "pos"] + [f"block_{i}" for i in range(12)] + ["ln_f"]
    params = {name: {"w": jnp.zeros(10)} for name in depth}
    names = [jax.tree_util.keystr(p)[2:].split("'")[0]
             for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    assert names != depth  # the alphabet really is another order
    frags = fragments(params, 5, "layers")
    positions = [sorted(depth.index(names[i]) for i in f) for f in frags]
    assert [i for pos in positions for i in pos] == list(range(len(depth)))  # contiguous, in order
