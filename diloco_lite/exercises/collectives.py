"""Checks for notebooks 00 (meshes and collectives) and 01 (DDP by hand).

Each check runs the student's per-device program on the library's worker mesh (8 emulated CPU
devices, or every worker on the one chip of a Colab GPU/TPU runtime) and compares it with an
answer computed independently, on the host.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..wire import WireFormat
from ._core import Result, Stop, answer, attempt, exercise, fmt, judge, number, shapes

# Exercise 00.1: a sharded array whose global max (11) differs from every simple mistake.
MAX_DATA = (3.0, -1, 7, 2, 9, 0, 4, 4, 1, 8, 6, 5, -2, 11, 10, 3)
PAIR_SHAPES = ((64, 64), (100,))  # exercise 00.2: the arrays each device averages


def on_mesh(fn, mesh) -> Any:
    """`jit(shard_map(fn))` over the mesh's "workers" axis: input split, output replicated."""
    import jax

    return jax.jit(jax.shard_map(fn, mesh=mesh.mesh, in_specs=jax.P("workers"),
                                 out_specs=jax.P()))


def _unreplicated(what: str):
    """An `explain` for shard_map's "out_specs require replication" error."""
    def explain(err: Exception) -> str | None:
        if "replicat" in str(err):
            return (f"no_collective: each device returned its own {what}, so the devices "
                    "disagree and shard_map refuses to call the result replicated. Combine the "
                    "devices' values with a collective over 'workers'")
        return None
    return explain


@exercise("global max", todo="return the largest value of the whole sharded array, the same "
                              "number on every device")
def check_global_max(fn) -> Result:
    """`fn(x_local)` must return the max over ALL devices' blocks, the same on every device."""
    import jax
    import jax.numpy as jnp

    from ..devices import worker_mesh

    mesh = worker_mesh(8)
    x = jax.device_put(jnp.array(MAX_DATA), mesh.sharding("workers"))
    got = number(attempt(on_mesh(answer(fn), mesh), x, explain=_unreplicated("maximum")))
    local_maxima = np.array(MAX_DATA).reshape(mesh.devices, -1).max(axis=1)
    return judge(got, max(MAX_DATA), success="every device knows the global max, 11", mistakes=[
        ("psum", local_maxima.sum(), "that is the SUM of the devices' maxima: psum adds; "
         "jax.lax has a collective that keeps the largest value too"),
        ("pmean", local_maxima.mean(), "that is the MEAN of the devices' maxima: averaging "
         "is not what you want here; look for the collective that keeps the largest value"),
    ], other=f"got {fmt(got)}, expected 11: each device reduces its own block first, then the "
             "devices' values are combined")


@exercise("all-reduce bytes", todo="set `predicted` to the bytes ONE device contributes to "
                                    "the all-reduce of the two arrays")
def check_allreduce_bytes(predicted, workers: int = 8) -> Result:
    """`predicted`: bytes each device contributes when it all-reduces f32[64, 64] and f32[100]."""
    predicted = number(predicted)
    import jax

    arrays = [jax.ShapeDtypeStruct(s, np.float32) for s in PAIR_SHAPES]
    values = sum(int(np.prod(s)) for s in PAIR_SHAPES)
    ref = WireFormat(32).tree_nbytes(arrays)
    return judge(predicted, ref, success=f"{ref:,} bytes per device, in one combined all-reduce",
                 rtol=0, atol=0.5, mistakes=[
        ("values", values, f"{values:,} is the number of VALUES: a float32 takes 4 bytes"),
        ("all_devices", workers * ref, f"that is all {workers} devices together: count what "
         "ONE device contributes (every device sends the same amount)"),
        ("one_array", 64 * 64 * 4, "you counted the f32[64, 64] array only: the f32[100] one "
         "is all-reduced too"),
        ("bits", 8 * ref, "that is in bits: divide by 8 for bytes"),
    ], other=f"got {fmt(predicted)}: count the values of both arrays, then the bytes each "
             "one takes")


@exercise("mean loss over 16 workers", todo="return the mean of the 16 workers' losses, "
                                              "the same number on every device")
def check_mean_loss(fn) -> Result:
    """16 workers (several per device); worker m holds [m, 2m] and its loss is 3m. `fn(w_local)`
    must return the mean loss over all 16 workers: 22.5."""
    import jax
    import jax.numpy as jnp

    from ..devices import worker_mesh

    mesh = worker_mesh(16)
    m = jnp.arange(16.0)
    w = jax.device_put(jnp.stack([m, 2 * m], axis=1), mesh.sharding("workers"))
    got = number(attempt(on_mesh(answer(fn), mesh), w, explain=_unreplicated("mean")))
    per_device, devices = mesh.workers_per_device, mesh.devices
    return judge(got, 22.5, success="the mean loss of the 16 workers is 22.5 on every device",
                 mistakes=[
        ("psum", 22.5 * devices, f"your mean is {devices}× too large: psum adds the "
         f"{devices} devices' means, and you want their average"),
        ("local_sum", 22.5 * per_device, f"you summed the {per_device} workers of a device: "
         "average them (jnp.mean) so that each worker counts once"),
        ("both_sums", 22.5 * 16, "that is the SUM of the 16 losses: average over the device's "
         "workers (jnp.mean) and over the devices (pmean)"),
    ], other=f"got {fmt(got)}, expected 22.5, the mean of the 16 workers' losses")


@exercise("DDP gradient", todo="write ddp_grad, then grad_fn: the mean loss over all M "
                                "workers and its gradient, the same on every device")
def check_ddp_gradient(grad_fn, loss_fn, params, batch_MxBxL1) -> Result:
    """`grad_fn(params, batch)` (jitted shard_map) must return the gradient of the mean loss over
    the global batch (or `(loss, grads)`); checked against one device on the whole batch."""
    import jax

    got = attempt(grad_fn, params, batch_MxBxL1)
    grads = got[1] if isinstance(got, tuple) and len(got) == 2 else got
    batch = np.asarray(jax.device_get(batch_MxBxL1))
    workers, b, l1 = batch.shape
    host = jax.device_get(params)
    grad = _jitted_grad(loss_fn)
    ref = grad(host, batch.reshape(workers * b, l1))
    if jax.tree.structure(grads) != jax.tree.structure(ref):
        raise Stop("structure", f"expected a gradient shaped like the parameters "
                                f"({shapes(ref)}), got {shapes(grads)}")
    sharding = getattr(batch_MxBxL1, "sharding", None)
    devices = len(sharding.device_set) if sharding is not None else 1
    times = lambda k: jax.tree.map(lambda g: k * g, ref)  # noqa: E731
    mistakes = [("times_devices", times(devices),
                 f"your gradient is {devices}× too large ({devices} devices). Either jax.grad "
                 "ran inside a check_vma=True shard_map, where autodiff already SUMS the "
                 "gradient over the devices (the transpose of broadcasting the replicated "
                 "parameters) so the pmean after it averages identical sums; or you used psum. "
                 "Notebook 01 §3 shows which shard_map argument gives each device its local "
                 "gradient")]
    if workers != devices:
        mistakes.append(("times_workers", times(workers),
                         f"your gradient is {workers}× too large: the {workers} workers' "
                         "gradients were added, not averaged"))
    mistakes.append(("one_worker", grad(host, batch[0]), "that is worker 0's gradient alone: "
                     "the workers' gradients must be combined across the devices"))
    return judge(grads, ref, mistakes=mistakes, rtol=2e-4,
                 success="equal to the gradient of the mean loss over the whole global batch",
                 other="your gradient differs from the gradient of the mean loss over the "
                       "global batch (and from every known mistake): print a few values")


@functools.lru_cache(maxsize=8)
def _jitted_grad(loss_fn):
    """One compiled reference gradient per loss function, however often a check runs."""
    import jax

    return jax.jit(jax.grad(loss_fn))


@exercise("bytes of one DDP step", todo="set `predicted` to the bytes ONE worker "
                                         "contributes to the all-reduce of one DDP step")
def check_ddp_step_bytes(predicted, params, workers: int = 8) -> Result:
    """`predicted`: bytes one worker contributes to the single all-reduce of a DDP step."""
    predicted = number(predicted)
    from ..model import count_params

    grads = WireFormat(32).tree_nbytes(params)
    n = count_params(params)
    ref = grads + 4
    return judge(predicted, ref, rtol=0, atol=0.5,
                 success=f"{ref:,} bytes: the {grads:,}-byte gradient and the 4-byte loss",
                 mistakes=[
        ("no_loss", grads, "almost: the 4-byte loss is averaged in the same all-reduce"),
        ("values", n + 1, "that counts values: a float32 takes 4 bytes"),
        ("values", n, "that counts parameters: a float32 gradient takes 4 bytes each, and "
         "the loss adds 4"),
        ("all_workers", workers * ref, f"that is all {workers} workers together: count ONE "
         "worker's contribution"),
        ("all_workers", workers * grads, f"that is all {workers} workers' gradients: count ONE "
         "worker's contribution, plus the 4-byte loss"),
    ], other=f"got {fmt(predicted)}: list what the step's one all-reduce carries (the model "
             f"has {n:,} parameters), then count its bytes")
