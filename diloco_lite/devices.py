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
from pathlib import Path

from .config import check, check_int

AXIS = "workers"


def _backends_initialized() -> bool:
    from jax._src import xla_bridge

    probe = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(probe()) if probe is not None else bool(getattr(xla_bridge, "_backends", {}))


def emulate_devices(n: int = 8) -> None:
    """Make JAX's CPU backend expose `n` devices. Call it first, in a fresh process or kernel.

    Idempotent: calling it again with the same `n` is fine. On a machine with an accelerator
    the setting only affects the CPU backend; the worker mesh then uses the accelerator.
    """
    check_int("n", n, 1, 512)
    import jax

    if _backends_initialized():
        have = len(jax.devices("cpu"))
        if have == n:
            return
        raise RuntimeError(
            f"emulate_devices({n}) came too late: a JAX backend is already running with {have} "
            f"CPU device(s). Restart the kernel (or Python process) and call "
            f"diloco_lite.emulate_devices({n}) before any other JAX work, including jax.devices()."
        )
    os.environ["JAX_NUM_CPU_DEVICES"] = str(n)
    jax.config.update("jax_num_cpu_devices", n)


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
