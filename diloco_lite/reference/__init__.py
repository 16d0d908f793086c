"""The readable reference: each method in plain JAX and numpy, on one device, top to bottom.

    from diloco_lite import reference
    theta = reference.decoupled(config)      # a RunConfig of DecoupledDiLoCo(); θ as a list of
                                             # arrays, one per tensor (jax.tree.leaves order)

| function     | method            | what it shows                                                |
|--------------|-------------------|--------------------------------------------------------------|
| `ddp`        | DDP               | M gradients averaged, one update                             |
| `diloco`     | DiLoCo            | H local steps, the pseudo-gradient, the outer Nesterov step  |
| `streaming`  | Streaming DiLoCo  | fragments, τ-delayed arrival, α mixing, b-bit deltas         |
| `decoupled`  | Decoupled DiLoCo  | a discrete-event program in five layers (`Core`, `Quorum`,   |
|              |                   | `Weighted`, `Failures`, `Run`): learners that never wait; a  |
|              |                   | syncer with quorum, grace, token weights, RDA; failures and  |
|              |                   | rejoin; finite links and b bits                              |

No mesh, no planner, nothing of the fast library's machinery (`algorithms`, `clock.plan`,
`training`, ...): only the model, the corpus and the cluster's step times (`clock.Timeline`),
which are the inputs of a run, not the method. It is the specification: `tests/test_reference.py`
checks that `dl.train` gives the reference's parameters to float tolerance, for every method
and, for Decoupled DiLoCo, with slow learners, a quorum under jitter, failures, a finite link
and 4-bit deltas. It is slow (one learner at a time, one call per step): use it to read and to
check, and `dl.train` to train. It refuses, with a `ValueError` naming the field, every setting
it does not model (a custom outer optimizer, elastic or failing lock-step runs, layer
fragmentation), rather than return a wrong answer.
"""

from .ddp import ddp
from .decoupled import decoupled
from .diloco import diloco
from .streaming import streaming

__all__ = ["ddp", "decoupled", "diloco", "streaming"]
