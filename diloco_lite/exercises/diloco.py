"""Checks for notebooks 02 (DiLoCo's outer loop) and 03 (Streaming DiLoCo's pieces).

The references come from `diloco_lite.outer` and `diloco_lite.wire`, or are written here; each
check also computes the classic wrong answers and names the one the student's answer matches.
Inputs are small random pytrees, so every check runs in well under a second.
"""

from __future__ import annotations

import numpy as np

from .. import outer
from ..wire import WireFormat
from ._core import Result, Stop, attempt, exercise, fmt, judge, number

WORKERS = 4


def example(seed: int = 0, workers: int = WORKERS, spread: float = 0.1):
    """(θ, θ_M): a small parameter pytree and `workers` perturbed copies on a leading axis."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    theta = {"b": jnp.asarray(rng.normal(size=3), jnp.float32),
             "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)}
    local = {k: v[None] + spread * jnp.asarray(rng.normal(size=(workers, *v.shape)), jnp.float32)
             for k, v in theta.items()}
    return theta, local


def _stack(tree, workers: int):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda x: jnp.broadcast_to(x, (workers, *x.shape)), tree)


def _mean(tree_M):
    import jax

    return jax.tree.map(lambda x: x.mean(axis=0), tree_M)


@exercise("pseudo-gradient", todo="return worker m's pseudo-gradient, leaf by leaf")
def check_pseudo_gradient(fn) -> Result:
    """`fn(global_params, local_params)` must return Δ = θ − θ_m for one worker."""
    import jax

    theta, local = example()
    worker = jax.tree.map(lambda x: x[0], local)
    ref = outer.pseudo_gradient(theta, worker)
    return judge(attempt(fn, theta, worker), ref, success="Δ = θ − θ_m", mistakes=[
        ("sign", jax.tree.map(lambda d: -d, ref),
         "wrong sign: your Δ points from where the worker started to where it went. The "
         "pseudo-gradient points back (uphill, like a gradient), so that the outer optimizer's "
         "DESCENT step moves θ toward the worker; flipped, it would push θ away from it"),
        ("local", worker, "that is the worker's parameters θ_m themselves: the "
         "pseudo-gradient is a difference"),
    ], other="your Δ is neither the pseudo-gradient nor a classic mistake: compute one leaf "
             "by hand")


@exercise("outer step", todo="take one sync's outer step on the global θ; return (θ, the "
                              "outer optimizer's state)")
def check_outer_step(fn) -> Result:
    """`fn(theta, outer_state, local_M, outer_opt)` -> (new θ, new outer state); checked over
    two syncs in a row, so the momentum must be carried from the first to the second."""
    import jax

    opt = outer.default_outer_optimizer()
    theta0, first = example(1)
    _, second = example(2)
    rounds = (first, second)

    def run(step):
        theta, state, out = theta0, opt.init(theta0), []
        for local in rounds:
            got = step(theta, state, local)
            if not (isinstance(got, tuple) and len(got) == 2):
                raise Stop("structure", "return the pair (new θ, new outer optimizer state)")
            theta, state = got
            out.append(theta)
        return tuple(out)

    def reference(variant):
        def step(theta, state, local):
            delta = _mean(outer.pseudo_gradient(_stack(theta, WORKERS), local))
            if variant == "sign":
                delta = jax.tree.map(lambda d: -d, delta)
            if variant == "average":
                return _mean(local), state
            start = _mean(local) if variant == "workers" else theta
            new, new_state = outer.outer_step(opt, start, state, delta)
            return new, (state if variant == "stale" else new_state)
        return run(step)

    got = attempt(lambda: run(lambda t, s, loc: attempt(fn, t, s, loc, opt)))
    return judge(got, reference("ok"), success="one outer Nesterov step on the global θ, "
                                                "momentum carried to the next sync", mistakes=[
        ("sign", reference("sign"), "your Δ has the wrong sign: the outer step then moves θ "
         "away from where the workers went (reread exercise 1)"),
        ("workers", reference("workers"), "you applied the outer step to the WORKERS' "
         "parameters (their average) instead of the global copy θ: the outer optimizer updates "
         "θ, the point every worker started this round from"),
        ("stale", reference("stale"), "the first sync is right, the second is not: return the "
         "NEW outer optimizer state, so that Nesterov's momentum carries over to the next sync"),
        ("average", reference("average"), "that is plain averaging of the workers' parameters: "
         "a sync feeds the averaged pseudo-gradient to the outer optimizer"),
    ], other="θ after the two syncs differs from the reference: check the Δ you give the outer "
             "optimizer, and what you apply its updates to")


@exercise("next round", todo="return what the workers start the next round from: their "
                              "parameters and their inner optimizer states")
def check_next_round(fn) -> Result:
    """`fn(theta, local_M, inner_state_M, inner_opt)` -> (local_M, inner_state_M) for the next
    round of H inner steps, after a sync produced the new global θ."""
    import jax
    import jax.numpy as jnp
    import optax

    inner_opt = optax.adamw(1e-3)
    theta, local = example(3)
    state = jax.vmap(inner_opt.init)(local)
    for i in range(2):  # two inner steps, so that moments and step count are not at their init
        grads = jax.tree.map(lambda x, i=i: jnp.cos(x + i), local)
        updates, state = jax.vmap(inner_opt.update)(grads, state, local)
    restarted = _stack(theta, WORKERS)
    got = attempt(fn, theta, local, state, inner_opt)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Stop("structure", "return the pair (workers' parameters, inner optimizer states)")
    return judge(got, (restarted, state), success="workers restart from θ and keep their "
                                                   "AdamW moments and step count", mistakes=[
        ("reset_state", (restarted, jax.vmap(inner_opt.init)(restarted)),
         "you reset the inner optimizer at the sync: DiLoCo keeps each worker's AdamW state "
         "(moments and step count, hence its place in the learning-rate schedule) across syncs; "
         "only the parameters restart from θ"),
        ("kept_local", (local, state), "the workers kept their own parameters θ_m: after a sync "
         "every worker restarts from the new global θ"),
    ], other="neither the parameters nor the optimizer states are what the workers start "
             "the next round from: decide for each what a sync replaces and what it keeps")


@exercise("RDA merge", todo="merge the M pseudo-gradients by RDA, with the weights")
def check_rda_merge(fn) -> Result:
    """`fn(deltas_M, weights_M)` must merge M pseudo-gradients by Radial-Directional Averaging."""
    import jax
    import jax.numpy as jnp

    _, deltas = example(4, spread=1.0)  # nearly orthogonal Δ_m ...
    lengths = jnp.arange(1.0, WORKERS + 1)  # ... of different lengths
    deltas = jax.tree.map(lambda d: d * lengths.reshape(-1, *[1] * (d.ndim - 1)), deltas)
    weights = jnp.array([1.0, 2.0, 3.0, 4.0])
    ref = outer.rda_merge(deltas, weights)
    norms = jax.vmap(outer.tree_norm)(deltas)
    unit = jax.tree.map(lambda d: d / norms.reshape(-1, *([1] * (d.ndim - 1))), deltas)
    radius = jnp.sum(weights * norms) / jnp.sum(weights)
    return judge(attempt(fn, deltas, weights), ref, success="norms and directions averaged "
                                                            "separately", mistakes=[
        ("mean", outer.mean_merge(deltas, weights),
         "you averaged the vectors: nearly orthogonal Δ_m cancel, so their mean shrinks and the "
         "outer step gets small. Reread what RDA averages, and separately"),
        ("unweighted", outer.rda_merge(deltas, jnp.ones(WORKERS)),
         "the weights are ignored: both of RDA's averages are weighted"),
        ("no_renorm", jax.tree.map(lambda u: radius * u, outer.mean_merge(unit, weights)),
         "your result is too short: reread what RDA does to the mean direction before it "
         "scales it"),
        ("per_leaf", jax.tree.map(lambda d: outer.rda_merge(d, weights), deltas),
         "‖Δ_m‖ is the norm of a worker's WHOLE pseudo-gradient (all tensors together, "
         "outer.tree_norm), not one norm per tensor"),
    ], other="your merge is neither RDA nor a classic mistake: compute its length and "
             "direction on the check's input by hand")


@exercise("4-bit quantizer", todo="return what arrives when x is sent in 4 bits, one scale "
                                   "per row")
def check_quantizer(fn, bits: int = 4) -> Result:
    """`fn(x)` must return what arrives after sending x in `bits` bits with one fp32 scale per
    row (symmetric absmax, codes in [−q_max, q_max], q_max = 2^(b−1) − 1)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(4, 6)) * np.array([[0.01], [0.3], [2.0], [50.0]]),
                    jnp.float32)
    q = 2 ** (bits - 1) - 1

    def sent(scale, q_max=q):
        return jnp.clip(jnp.round(x / scale), -q_max, q_max)

    row = jnp.max(jnp.abs(x), axis=1, keepdims=True)
    ref = WireFormat(bits).round_trip(x)
    return judge(attempt(fn, x), ref, success=f"{bits}-bit codes with one scale per row",
                 rtol=1e-5, mistakes=[
        ("no_scale", sent(1.0), "you forgot the scale: rounding x itself sends whole numbers, "
         "so every value below 0.5 in magnitude arrives as 0; reread what the scale is for"),
        ("codes", sent(row / q), "you returned the integer codes: the receiver multiplies "
         "them back by the row's scale s"),
        ("tensor_scale", sent(jnp.max(row) / q) * jnp.max(row) / q, "one scale for the whole "
         "tensor: the rows of small values then round to zero. Use one scale per ROW (last "
         "axis)"),
        ("q_max", sent(row / (q + 1), q + 1) * row / (q + 1), f"your codes go one level too "
         f"far: count the symmetric {bits}-bit codes again"),
        ("q_max", sent(row / (2 * q + 1), 2 * q + 1) * row / (2 * q + 1), "your codes use the "
         "unsigned range: symmetric codes keep one bit for the sign"),
        ("no_round", x, "nothing was rounded: the codes that travel are integers"),
    ], other="your values are neither the round trip nor a classic mistake: quantize one row "
             "by hand")


@exercise("bytes of a 4-bit tensor", todo="count the bytes the matrix takes on the wire, scales "
                                           "included")
def check_wire_bytes(predicted, shape: tuple[int, ...] = (76, 64), bits: int = 4) -> Result:
    """`predicted`: bytes of a `shape` tensor on the wire in `bits` bits (codes + scales)."""
    predicted = number(predicted)
    rows, n = int(np.prod(shape[:-1])), int(shape[-1])
    ref = WireFormat(bits).nbytes(shape)
    codes = rows * n * bits // 8
    return judge(predicted, ref, rtol=0, atol=0.5,
                 success=f"{ref:,} bytes: {codes:,} of codes and {rows} scales × 4 bytes",
                 mistakes=[
        ("no_scales", codes, f"you forgot the scales: each of the {rows} rows also sends its "
         "fp32 scale (4 bytes)"),
        ("tensor_scale", codes + 4, f"one scale per ROW ({rows} of them), not per tensor"),
        ("bits", 8 * ref, "that is in bits: divide by 8"),
        ("fp32", rows * n * 4, "that is the fp32 size: 4 bits is half a byte per value"),
    ], other=f"got {fmt(predicted)}: count the bytes of the codes, then those of the scales")


@exercise("mixing α", todo="return every worker's fragment after the arrival")
def check_mix(fn) -> Result:
    """`fn(local_MxD, arrived_D, alpha)` -> the workers' fragment after the arrival."""
    import jax.numpy as jnp

    local = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    arrived, alpha = jnp.array([10.0, 20.0]), 0.25
    got = attempt(fn, local, arrived, alpha)
    return judge(got, alpha * local + (1 - alpha) * arrived, success="α·θ_m + (1 − α)·θ̃",
                 mistakes=[
        ("swapped", alpha * arrived + (1 - alpha) * local, "α and 1 − α are swapped: α weighs "
         "the WORKER's own fragment (α = 0 is DiLoCo's plain replacement by θ̃)"),
        ("replace", jnp.broadcast_to(arrived, local.shape), "that is plain replacement (α = 0)"
         " whatever α: keep α of the worker's fragment"),
        ("keep", local, "the arriving fragment was ignored"),
    ], other=f"got {np.asarray(got).tolist()}: neither the mix nor a classic mistake; try "
             "α = 0 and α = 1 by hand")

