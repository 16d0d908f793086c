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
