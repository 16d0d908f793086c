"""DiLoCo: each of the M workers takes H optimizer steps on its own data, alone; then the
workers' moves are averaged into one pseudo-gradient Δ and an outer Nesterov step moves θ."""

from __future__ import annotations

from .common import outer_nesterov, refuse_lockstep, setup


def diloco(config, params=None) -> list:
    """Train `config` (a `RunConfig` of `DiLoCo()`) and return θ (a list of leaves)."""
    refuse_lockstep(config, "DiLoCo")
    algo, M = config.algorithm, config.workers
    run = setup(config, params)
    theta = run.init
    velocity = [0.0 * x for x in theta]
    local = [theta] * M                                   # θ_m: every worker starts from θ
    states = [run.optimizer.init(theta)] * M              # kept across syncs
    for k in range(config.steps):
        batch_MxBxL1 = run.batch(k)
        for m in range(M):                                # no communication
            local[m], states[m] = run.step(local[m], states[m], batch_MxBxL1[m])
        t = k + 1
        if t % algo.inner_steps == 0 or t == config.steps:    # a sync: one exchange of Δ
            delta = [sum(x - xm[i] for xm in local) / M for i, x in enumerate(theta)]
            if t % algo.inner_steps == 0:
                theta, velocity = outer_nesterov(theta, velocity, delta, algo.outer_lr)
            else:  # the run ends between syncs: the plain average, no outer momentum
                theta = [x - d for x, d in zip(theta, delta, strict=True)]
            local = [theta] * M
    return theta
