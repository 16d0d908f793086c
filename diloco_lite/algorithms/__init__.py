"""Algorithm drivers: each runs a plan's blocks (`clock.plan`) on the worker mesh.

A driver turns an algorithm config into what the training loop calls:

- `init(params) -> state`: place the initial global parameters (and per-learner copies);
- `run(state, block, batches_MxNxBxL1, mask_MxN) -> (state, losses_MxN, diagnostics)`: each
  learner's inner steps of the block, then its events;
- `global_params(state)`: the parameters to evaluate;
- `up_nbytes`, `down_nbytes`, `sizes`, `rejoin_nbytes`: what the plan books per fragment.

All arrays live in `state`, a plain pytree; the host holds only the plan (the schedule).
"""

from __future__ import annotations

from ..config import DDP, DecoupledDiLoCo, DiLoCo, StreamingDiLoCo, check


def make_driver(config, model, mesh, optimizer, params):
    """The driver for `config.algorithm` on `mesh` (`params`: the initial parameters)."""
    algo = config.algorithm
    if isinstance(algo, DDP):
        from .ddp import DDPDriver

        return DDPDriver(model, mesh, optimizer, params, bits=algo.bits)
    check(isinstance(algo, (DiLoCo, StreamingDiLoCo, DecoupledDiLoCo)), "RunConfig.algorithm",
          algo, "an instance of DDP, DiLoCo, StreamingDiLoCo or DecoupledDiLoCo")
    from .learners import LearnersDriver

    return LearnersDriver(config, model, mesh, optimizer, params)
