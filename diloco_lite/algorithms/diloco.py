"""DiLoCo (ALGORITHMS.md §2) and Streaming DiLoCo (§3), one driver.

DiLoCo is the special case P=1 fragment, overlap τ=0, mix α=0, b=32 bits of Streaming DiLoCo,
so both run through the same three compiled pieces:

- `inner`: every worker runs N inner steps (`lax.scan` of `steps.inner_step`, vmapped over the
  workers that share a device, inside `shard_map`) — zero collectives;
- `sync`: for one fragment, each worker's pseudo-gradient Δ_m = θ − θ_m goes through the b-bit
  wire format, is averaged (one `pmean`: the only all-reduce) and the outer optimizer steps;
- `mix`: τ inner steps after a sync, workers take the new global fragment:
  θ_m ← α·θ_m + (1−α)·θ̃ (α=0: plain replacement, as in DiLoCo).

Schedule (host side). After inner step t (1-based), fragment p sends when
(t − t_p) mod H = 0 with offsets t_p = ⌊(p+1)·H/P⌋ spread over the period (P=1: t = H, 2H, …),
and receives at t + τ. Within a step, sends happen before receives, so τ=0 applies at once.
Choice for the end of a run whose length is not a multiple of H: after the last step every
fragment syncs once more (a shorter last round) and every pending fragment is applied, so the
returned global parameters contain all the work done. That flush is booked in `comm_bytes`
but not in `peak_step_bytes`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..comm import payload_bytes
from ..config import DiLoCo
from ..devices import AXIS
from ..outer import (
    fragments,
    outer_step,
    pseudo_gradient,
    put_leaves,
    resolve_outer_optimizer,
    take_leaves,
)
from ..quantize import fake_quantize_tree
from ..steps import inner_step


def inner_fn(model, mesh, optimizer):
    """Jitted `inner(local_M, state_M, batches_MxNxBxL1) -> (local_M, state_M, losses_MxN)`."""

    def one_worker(params, opt_state, batches_NxBxL1):
        def body(carry, batch_BxL1):
            params, opt_state, loss = inner_step(model.loss, optimizer, *carry, batch_BxL1)
            return (params, opt_state), loss

        (params, opt_state), losses_N = jax.lax.scan(body, (params, opt_state), batches_NxBxL1)
        return params, opt_state, losses_N

    spec = jax.P(AXIS)
    return jax.jit(jax.shard_map(jax.vmap(one_worker), mesh=mesh.mesh, in_specs=(spec,) * 3,
                                 out_specs=(spec,) * 3))


def sync_fn(mesh, outer_optimizer, bits: int):
    """Jitted `sync(global, outer_state, local_M) -> (global, outer_state)` for one fragment."""

    def mean_pseudo_gradient(global_params, local_mx):
        deltas_m = jax.vmap(lambda local: fake_quantize_tree(
            pseudo_gradient(global_params, local), bits))(local_mx)
        local_mean = jax.tree.map(lambda d: jnp.mean(d, axis=0), deltas_m)
        return jax.lax.pmean(local_mean, AXIS)  # the sync's one all-reduce

    reduce = jax.shard_map(mean_pseudo_gradient, mesh=mesh.mesh,
                           in_specs=(jax.P(), jax.P(AXIS)), out_specs=jax.P(), check_vma=False)

    @jax.jit
    def sync(global_params, outer_state, local_M):
        return outer_step(outer_optimizer, global_params, outer_state,
                          reduce(global_params, local_M))

    return sync


@jax.jit
def mix(local_M, global_params, alpha):
    """θ_m ← α·θ_m + (1−α)·θ̃ for every worker (θ̃ broadcast from the replicated global)."""
    return jax.tree.map(lambda loc, g: alpha * loc + (1 - alpha) * g[None], local_M, global_params)


def diagnostics_fn(mesh):
    """Jitted `(global, local_M) -> (‖mean Δ‖, mean pairwise cos(Δ_m, Δ_n), mean ‖Δ_m‖)`.

    A measurement, not part of the algorithm: it all-gathers the workers' Δ (outside the
    accounted sync) and works from their Gram matrix.
    """

    def gram(global_params, local_mx):
        flat_mxN = jnp.concatenate([
            (g[None] - loc).reshape(loc.shape[0], -1)
            for g, loc in zip(jax.tree.leaves(global_params), jax.tree.leaves(local_mx),
                              strict=True)], axis=1)
        all_MxN = jax.lax.all_gather(flat_mxN, AXIS, tiled=True)
        return all_MxN @ all_MxN.T

    gram = jax.shard_map(gram, mesh=mesh.mesh, in_specs=(jax.P(), jax.P(AXIS)),
                         out_specs=jax.P(), check_vma=False)

    @jax.jit
    def diagnostics(global_params, local_M):
        g_MxM = gram(global_params, local_M)
        m = g_MxM.shape[0]
        norms_M = jnp.sqrt(jnp.maximum(jnp.diag(g_MxM), 0.0))
        cos_MxM = g_MxM / jnp.maximum(norms_M[:, None] * norms_M[None, :], 1e-30)
        off_diagonal = (jnp.sum(cos_MxM) - jnp.trace(cos_MxM)) / max(m * (m - 1), 1)
        return jnp.sqrt(jnp.maximum(jnp.sum(g_MxM), 0.0)) / m, off_diagonal, jnp.mean(norms_M)

    return diagnostics


class DiLoCoDriver:
    """Drives DiLoCo / StreamingDiLoCo; see the module docstring for the schedule."""

    def __init__(self, algo, model, mesh, optimizer, *, total_steps: int):
        self.algo, self.mesh, self.total_steps = algo, mesh, total_steps
        self.H = algo.inner_steps
        self.P = getattr(algo, "fragments", 1)
        self.tau = getattr(algo, "overlap", 0)
        self.alpha = float(getattr(algo, "mix", 0.0))
        self.bits = getattr(algo, "bits", 32)
        self.outer_optimizer = resolve_outer_optimizer(algo)
        self.optimizer = optimizer
        self.inner = inner_fn(model, mesh, optimizer)
        self.sync = sync_fn(mesh, self.outer_optimizer, self.bits)
        self.diagnostics = diagnostics_fn(mesh)
        self.offsets = [((p + 1) * self.H // self.P) % self.H for p in range(self.P)]
        self.pending: list[tuple[int, int, list]] = []  # (apply at step, fragment, values)

    # ---- placement --------------------------------------------------------------------------
    def init(self, params):
        name = type(self.algo).__name__
        how = "balanced" if isinstance(self.algo, DiLoCo) else self.algo.fragmentation
        self.frags = fragments(params, self.P, how, field=f"{name}.fragments")
        self.frag_bytes = [self.mesh.workers * payload_bytes(take_leaves(params, f), self.bits)
                           for f in self.frags]
        replicated, stacked = self.mesh.sharding(), self.mesh.sharding(AXIS)
        glob = jax.device_put(params, replicated)
        outer_states = [jax.device_put(self.outer_optimizer.init(take_leaves(glob, f)), replicated)
                        for f in self.frags]
        stack = functools.partial(_stack, self.mesh.workers)
        local = jax.device_put(jax.tree.map(stack, params), stacked)
        inner_state = jax.device_put(jax.tree.map(stack, self.optimizer.init(params)), stacked)
        self.pending = []
        return {"global": glob, "outer": outer_states, "local": local, "inner": inner_state}

    def place_batches(self, batches_NxMxBxL1):
        return jax.device_put(np.swapaxes(batches_NxMxBxL1, 0, 1), self.mesh.sharding(AXIS))

    # ---- schedule ---------------------------------------------------------------------------
    def scheduled_sends(self, t: int) -> list[int]:
        return [p for p, off in enumerate(self.offsets) if (t - off) % self.H == 0]

    def sends_at(self, t: int) -> list[int]:
        """Fragments that send after step t: the schedule, or all of them after the last step."""
        return list(range(self.P)) if t >= self.total_steps else self.scheduled_sends(t)

    def block(self, step: int) -> int:
        """Steps until the next send or receive event after `step`."""
        nxt = [step + 1 + ((off - step - 1) % self.H) for off in self.offsets]
        nxt += [due for due, _, _ in self.pending if due > step]
        return min(nxt) - step

    # ---- one block --------------------------------------------------------------------------
    def advance(self, state, batches_MxNxBxL1, step: int):
        local, inner_state, losses_MxN = self.inner(state["local"], state["inner"],
                                                    batches_MxNxBxL1)
        t = step + batches_MxNxBxL1.shape[1]
        glob, outer_states = state["global"], list(state["outer"])
        info, sent, diag = {"loss": losses_MxN}, 0, []
        for p in self.sends_at(t):
            idx = self.frags[p]
            g_p, loc_p = take_leaves(glob, idx), take_leaves(local, idx)
            diag.append(self.diagnostics(g_p, loc_p))
            new_g_p, outer_states[p] = self.sync(g_p, outer_states[p], loc_p)
            glob = put_leaves(glob, idx, new_g_p)
            self.pending.append((t + self.tau, p, new_g_p))
            sent += self.frag_bytes[p]
        final = t >= self.total_steps
        for _due, p, values in [x for x in self.pending if x[0] <= t or final]:
            idx = self.frags[p]
            local = put_leaves(local, idx, mix(take_leaves(local, idx), values, self.alpha))
        self.pending = [x for x in self.pending if x[0] > t and not final]
        if diag:
            diag = np.asarray(jax.device_get(diag))  # [syncs, 3]
            norm, cos, drift = diag.mean(axis=0)
            info.update(pseudo_grad_norm=norm, pseudo_grad_cosine=cos, worker_drift=drift)
        # The end-of-run flush is booked in `bytes` but not in the per-step peak, which measures
        # the steady-state schedule (a flush of all P fragments at once would hide the P-fold
        # lower peak that streaming buys).
        natural = sum(self.frag_bytes[p] for p in self.scheduled_sends(t))
        info.update(bytes=sent, peak_step_bytes=natural)
        return {"global": glob, "outer": outer_states, "local": local, "inner": inner_state}, info

    def global_params(self, state):
        return state["global"]


def _stack(m: int, x):
    x = jnp.asarray(x)
    return jnp.broadcast_to(x, (m,) + x.shape)
