"""What the launcher hands each process: the `Job` (pickled to a file) and its configs."""

from __future__ import annotations

import dataclasses
import importlib
import pickle


@dataclasses.dataclass(frozen=True)
class Job:
    """What every process of a launch needs: the configs (pickled `RunConfig`s, or a
    `"module:function"` reference that returns one or a list), the layout, where to meet and
    where process 0 writes the results."""

    configs: bytes | str
    processes: int
    devices_per_process: int
    coordinator: str  # host:port of process 0's coordination service
    out: str
    progress: bool = False
    heartbeat_s: int = 30
    pace_s: float = 0.0  # `train`'s: seconds of compute added to every step
    testbed_hosts: int | None = None  # set each config's link rate on them (`launch`'s set_links)


def resolve_configs(configs: bytes | str) -> list:
    """The job's configs: unpickled, or `module:function` imported and called."""
    if isinstance(configs, bytes):
        out = pickle.loads(configs)
    else:
        module, _, name = configs.partition(":")
        out = getattr(importlib.import_module(module), name)()
    return list(out) if isinstance(out, (list, tuple)) else [out]
