"""diloco_lite: low-communication distributed training in JAX, small enough to read.

Public API (imported lazily, so `import diloco_lite` neither imports JAX eagerly nor
initializes a backend; call `emulate_devices(n)` first in a fresh process):

    emulate_devices, worker_mesh,         devices
    enable_compilation_cache
    load_corpus, Corpus                   data
    ModelConfig, RunConfig,               config
    DDP, DiLoCo, StreamingDiLoCo, DecoupledDiLoCo
    Cluster, Link, FailureRate            clock (the simulated clock: step times, link, failures)
    train, RunResult                      training
    quick_mode                            plots (DILOCO_LITE_QUICK=1: shrink steps, not code
                                          paths; the default on Colab)
    Session                               reproduce (a notebook's runs, shared with make reproduce)
    collective_bytes                      comm (the collectives of a compiled program, in bytes)
    build_model, count_params             model

Subpackages for the notebooks: `reference` (each method, readable, on one device), `wire`,
`plots`, `systems`, `distributed`, `actors`, `exercises`.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "emulate_devices": "devices",
    "worker_mesh": "devices",
    "enable_compilation_cache": "devices",
    "load_corpus": "data",
    "Corpus": "data",
    "ModelConfig": "config",
    "RunConfig": "config",
    "DDP": "config",
    "DiLoCo": "config",
    "StreamingDiLoCo": "config",
    "DecoupledDiLoCo": "config",
    "Cluster": "clock",
    "Link": "clock",
    "FailureRate": "clock",
    "train": "training",
    "RunResult": "training",
    "quick_mode": "plots",
    "Session": "reproduce",
    "collective_bytes": "comm",
    "build_model": "model",
    "count_params": "model",
    "scaling_results": "experiments.scaling_report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'diloco_lite' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
