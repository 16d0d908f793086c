"""Emulated devices and the worker mesh.

`emulate_devices(n)` must run before anything initializes a JAX backend (even
`jax.devices()`), because XLA fixes the CPU device count when the backend starts.

`worker_mesh(M)` lays M workers over the devices on one mesh axis, `"workers"`: one worker per
device when the counts match, several per device (vmapped inside `shard_map`) when M exceeds
them. 16 workers on 8 CPU devices, or 8 workers on one Colab GPU, both work.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from .config import check, check_int

AXIS = "workers"


# Emulated devices on few cores, and what goes wrong on a busy machine (notebooks and CI run on
# 2 cores). XLA:CPU runs one thread per emulated device in a pool as large as the device count
# (no spare), and a collective blocks its thread until every device has arrived:
# - a late device (the machine is busy) makes XLA abort the process after 40 s: we raise that
#   limit (`COLLECTIVE_TIMEOUTS`; the flags exist from jaxlib 0.8.0 on, and an older XLA rejects
#   unknown flags fatally, so they are only set where they exist);
# - the next dispatched programs can hold the pool's threads while a collective still waits for
#   its last participants: a deadlock. The training loop therefore waits for each block before it
#   dispatches the next (`training.train`), and a watchdog ends a run that stops progressing with
#   a message that says what to do;
# - when the devices alone keep every core busy, XLA's own multi-threaded matmuls only compete
#   for the same cores, and their async work shares the pool a collective can block: we turn
#   them off (`--xla_cpu_multi_thread_eigen=false`; about as fast, measured with `make bench`).
#   We turn them off for every count above one, on any number of cores, because they also
#   change the float rounding where several workers are vmapped on a device: `make reproduce`'s
#   2 devices trained `RunConfig(algorithm=DiLoCo(inner_steps=50), steps=150)` to parameters
#   whose Σ|θ| (float64) is 10157.334245121983 single-threaded and 10157.334252364515
#   multi-threaded, each repeatable. A machine with more cores than devices would otherwise not
#   reproduce the committed numbers.
#   (8 devices, one worker each, gave the same bits both ways. One device keeps XLA's threads:
#   they are its only parallelism, and its numbers may differ with the core count.)
# Every flag is left alone when the user set it in XLA_FLAGS.
COLLECTIVE_TIMEOUTS_SINCE = (0, 8, 0)
COLLECTIVE_TIMEOUTS = {
    "xla_cpu_collective_call_warn_stuck_timeout_seconds": 120,
    "xla_cpu_collective_call_terminate_timeout_seconds": 1800,
}
SINGLE_THREADED_OPS = "xla_cpu_multi_thread_eigen"
DEVICES_ENV = "DILOCO_LITE_DEVICES"


def emulate_devices(n: int = 8) -> int:
    """Make JAX's CPU backend expose `n` devices; returns the count in effect.

    Call it first, in a fresh process or kernel: XLA fixes the CPU device count when its backend
    starts. Idempotent: calling it again with the same `n` is fine. `$DILOCO_LITE_DEVICES`, when
    set, overrides `n` (the single-device test lane sets it to 1: 8 workers then share one
    device, as on a one-chip Colab GPU or TPU). It also sets the XLA flags of the comment above
    (`COLLECTIVE_TIMEOUTS`, and single-threaded ops when n > 1), unless `XLA_FLAGS`
    already names them. On a machine with an accelerator the setting only affects the CPU
    backend; the worker mesh uses the accelerator.
    """
    check_int("n", n, 1, 512)
    if os.environ.get(DEVICES_ENV):
        n = int(os.environ[DEVICES_ENV])
        check_int(f"${DEVICES_ENV}", n, 1, 512)
    _set_xla_flags(n)
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # a backend already runs with another count
        have = len(jax.devices("cpu"))
        if have != n:
            raise RuntimeError(
                f"emulate_devices({n}) came too late: a JAX backend is already running with "
                f"{have} CPU device(s). Restart the kernel (or Python process) and call "
                f"diloco_lite.emulate_devices({n}) before any other JAX work, including "
                f"jax.devices().") from None
    os.environ["JAX_NUM_CPU_DEVICES"] = str(n)  # for subprocesses started from here
    return n


def _set_xla_flags(n: int) -> None:
    import importlib.metadata

    wanted = {SINGLE_THREADED_OPS: "false"} if n > 1 else {}
    try:
        version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    if tuple(int(x) for x in re.findall(r"\d+", version)[:3]) >= COLLECTIVE_TIMEOUTS_SINCE:
        wanted.update(COLLECTIVE_TIMEOUTS)
    flags = os.environ.get("XLA_FLAGS", "")
    extra = [f"--{k}={v}" for k, v in wanted.items() if k not in flags]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()


@dataclasses.dataclass(frozen=True)
class WorkerMesh:
    """M workers on a 1-D device mesh: `workers_per_device` workers share each device."""

    mesh: object  # jax.sharding.Mesh
    workers: int

    @property
    def devices(self) -> int:
        return self.mesh.devices.size

    @property
    def workers_per_device(self) -> int:
        return self.workers // self.devices

    def sharding(self, *spec):
        """`NamedSharding` on this mesh; `sharding("workers")` shards the leading axis."""
        import jax

        return jax.sharding.NamedSharding(self.mesh, jax.P(*spec))

    # Placement. In one process these are `jax.device_put`. Under `jax.distributed` (several
    # processes, `diloco_lite.distributed`) the mesh spans devices this process cannot address:
    # each process then places only its own devices' shards (`device_put` would first check,
    # by a collective, that every process passed the same value).

    @property
    def local_workers(self):
        """The workers (rows of a `sharding(AXIS)` array) on this process's devices: all of
        them in one process."""
        import numpy as np

        index = self.sharding(AXIS).addressable_devices_indices_map((self.workers,))
        return np.unique(np.concatenate([np.arange(self.workers)[i] for i in index.values()]))

    def put(self, tree, *spec):
        """Place `tree` (host or JAX arrays, the same value on every process) with
        `sharding(*spec)`."""
        import jax
        import numpy as np

        sharding = self.sharding(*spec)
        if jax.process_count() == 1:
            return jax.device_put(tree, sharding)
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
            sharding, np.asarray(x), np.shape(x)), tree)

    def put_rows(self, tree):
        """Place arrays of the `local_workers`' rows only (leading axis) as the global
        [M, ...] arrays sharded over the workers."""
        import jax
        import numpy as np

        sharding = self.sharding(AXIS)
        if jax.process_count() == 1:
            return jax.device_put(tree, sharding)
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
            sharding, np.asarray(x), (self.workers, *np.shape(x)[1:])), tree)


def fetch(tree):
    """`jax.device_get`, also of arrays spread over several processes: those are gathered to
    every process (a collective: under `jax.distributed` every process must call it)."""
    import jax

    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
            return multihost_utils.process_allgather(x, tiled=True)
        return jax.device_get(x)

    return jax.tree.map(one, tree)


def worker_mesh(workers: int, devices=None) -> WorkerMesh:
    """Mesh with one axis `"workers"` over min(M, #devices) devices.

    M must be a multiple of the number of devices in use (when M exceeds the devices available),
    so that every device holds the same number of workers.
    """
    import jax

    check_int("workers", workers, 1)
    devices = list(jax.devices() if devices is None else devices)
    n = min(workers, len(devices))
    check(
        workers % n == 0,
        "workers",
        workers,
        f"a multiple of the {n} devices in use (or at most {len(devices)} workers)",
    )
    mesh = jax.make_mesh(
        (n,), (AXIS,), axis_types=(jax.sharding.AxisType.Explicit,), devices=devices[:n]
    )
    return WorkerMesh(mesh=mesh, workers=workers)


def enable_compilation_cache(path: str | Path | None = None) -> Path:
    """Keep compiled XLA programs on disk, so that a program another run already compiled (the
    same inner loop, sync or evaluator shapes) is loaded instead of recompiled.

    Compilation, not training, dominates the small runs of a sweep on CPU. The cache is keyed
    by the program text and the JAX version, so it never returns a stale program. Default
    directory: `$DILOCO_LITE_XLA_CACHE`, else `~/.cache/diloco_lite/xla`. Call it explicitly
    (after `emulate_devices`); importing this module changes nothing.
    """
    import jax

    default = os.environ.get("DILOCO_LITE_XLA_CACHE") or Path.home() / ".cache/diloco_lite/xla"
    out = Path(path if path is not None else default)
    out.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(out))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return out
