"""Algorithm drivers: each a thin wrapper around `steps.inner_step` (and `outer.*` at syncs).

A driver turns an algorithm config into the methods the training loop calls:

- `init(params) -> state`: place the initial global parameters (and per-worker copies);
- `place_batches(batches_NxMxBxL1)`: put a block's batches on the mesh in the driver's layout;
- `block(step) -> int`: how many steps the next call advances (DDP: 1; DiLoCo: up to the
  next sync);
- `advance(state, batches_NxMxBxL1, step) -> (state, info)`: run those steps; `info` holds
  `loss` (mean train loss), `bytes` (payload sent by all workers), `peak_step_bytes` and any
  diagnostics;
- `global_params(state)`: the parameters to evaluate.

The arrays live in `state`; the only host-side state is the schedule (DiLoCo's fragments in
flight between a sync and its arrival τ steps later), which `init` resets.
"""

from __future__ import annotations

from ..config import DDP, DecoupledDiLoCo, DiLoCo, StreamingDiLoCo


def make_driver(config, model, mesh, optimizer):
    """The driver for `config.algorithm` on `mesh`."""
    algo = config.algorithm
    if isinstance(algo, DDP):
        from .ddp import DDPDriver

        return DDPDriver(model, mesh, optimizer)
    if isinstance(algo, (DiLoCo, StreamingDiLoCo)):
        from .diloco import DiLoCoDriver

        return DiLoCoDriver(algo, model, mesh, optimizer, total_steps=config.steps)
    if isinstance(algo, DecoupledDiLoCo):
        raise NotImplementedError(
            "DecoupledDiLoCo training is not implemented yet; its config already drives the "
            "bandwidth and goodput simulators (diloco_lite.bandwidth, diloco_lite.goodput)."
        )
    raise TypeError(f"unknown algorithm {algo!r}")
