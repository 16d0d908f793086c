"""Streaming DiLoCo: DiLoCo with the parameters cut into P fragments that sync at staggered
steps, each one's new global value mixed in τ steps after it was sent (training goes on
meanwhile), and the pseudo-gradients sent in b bits."""

from __future__ import annotations

from ..validate import check
from .common import (
    balanced_fragments,
    first_send,
    outer_nesterov,
    quantize,
    refuse_lockstep,
    setup,
)


def streaming(config, params=None) -> list:
    """Train `config` (a `RunConfig` of `StreamingDiLoCo()`) and return θ (a list of leaves)."""
    refuse_lockstep(config, "StreamingDiLoCo")
    a, M = config.algorithm, config.workers
    check(a.fragmentation == "balanced", "StreamingDiLoCo.fragmentation", a.fragmentation,
          "'balanced' in the reference")
    run = setup(config, params)
    H, tau, alpha = a.inner_steps, a.overlap, a.mix
    frags = balanced_fragments(run.init, a.fragments)
    theta = run.init
    velocity = [0.0 * x for x in theta]
    local = [list(theta) for _ in range(M)]            # θ_m
    base = [list(theta) for _ in range(M)]             # the global value θ_m last took
    states = [run.optimizer.init(theta)] * M
    in_flight = {}                                     # fragment -> (arrival step, its new Θ_p)
    arrived = [0] * a.fragments                        # the step each fragment last arrived at
    for k in range(config.steps):
        batch_MxBxL1 = run.batch(k)
        for m in range(M):
            local[m], states[m] = run.step(local[m], states[m], batch_MxBxL1[m])
        local = [list(x) for x in local]
        t = k + 1
        for p, idx in enumerate(frags):
            if (t - first_send(p, H, a.fragments)) % H == 0:   # fragment p's sync
                delta = [sum(quantize(base[m][i] - local[m][i], a.bits) for m in range(M)) / M
                         for i in idx]
                new, vel = outer_nesterov([theta[i] for i in idx], [velocity[i] for i in idx],
                                          delta, a.outer_lr)
                for i, x, v in zip(idx, new, vel, strict=True):
                    theta[i], velocity[i] = x, v
                in_flight[p] = (t + tau, new)
        for p, (due, new) in list(in_flight.items()):
            if due == t:                               # it arrives: mix it in, it is the base
                for m in range(M):
                    for i, x in zip(frags[p], new, strict=True):
                        local[m][i] = alpha * local[m][i] + (1 - alpha) * x
                        base[m][i] = x
                del in_flight[p]
                arrived[p] = t
    # The end: a fragment not in flight that holds work since its last sync is averaged once
    # more, plainly (no outer momentum), so θ holds every step's work.
    for p, idx in enumerate(frags):
        if p not in in_flight and arrived[p] < config.steps:
            for i in idx:
                theta[i] = theta[i] - sum(quantize(base[m][i] - local[m][i], a.bits)
                                          for m in range(M)) / M
    return theta
