"""DiLoCo (§2), Streaming DiLoCo (§3) and Decoupled DiLoCo (§4) on the worker mesh: one driver.

The plan (`clock.plan`) says *what* happens and when; this driver does it on the device. The
three methods differ only in their plans (and in the merge rule), so they share every compiled
piece. State, a plain pytree:

    global  Θ, replicated: the syncer's copy (lock-step: every worker's copy of it)
    outer   per fragment, the outer optimizer's state (replicated)
    local   θ_m, stacked [M, ...] and sharded over the `workers` axis
    inner   each learner's inner optimizer state, stacked [M, ...]
    base    the global value each learner last took, stacked [M, ...]: Δ_m = base_m − θ_m
    sent    per fragment, each learner's last payload in the wire format, stacked [M, ...]

Compiled pieces (one inner step, one wire format, one outer update for every method):
- `inner`: N inner steps per learner (`lax.scan` of `steps.inner_step`, vmapped over the learners
  of a device, inside `shard_map`): zero collectives. A learner whose mask is off for a step
  keeps its state bit for bit (it is not due, or it is down).
- `send`: the learners in the mask put Δ = base − θ through `WireFormat(bits)` (no collective).
- `close`: ONE all-gather of the b-bit payloads, then, on every device alike, decode, merge with
  the weights (weighted mean; RDA for Decoupled DiLoCo, with the embeddings by the weighted
  mean) and take the outer step; the end-of-run flush merges by the plain weighted mean and
  takes no outer step, whatever the merge rule. The all-gather moves every learner's slot, M
  payloads; on a real network a learner left out of the merge (weight 0: it did not answer)
  sends nothing, so `comm_bytes` books the answers, one payload each: the compiled program
  moves exactly the booked bytes when every learner answers (lock-step methods always; tested
  against the HLO in test_comm.py). Its diagnostics (the merged Δ's norm, the mean pairwise
  cosine and the mean norm of the Δ_m) come from the gathered Δ_m, at no extra communication.
  The driver waits for each close before it dispatches the next program: nothing is queued
  behind a collective that waits for its participants (`devices`).
- `arrive`: the learners in the mask take the fragment: θ ← α·θ + (1−α)·Θ, base ← Θ.
- `reload`: returning learners take Θ and a healthy peer's inner optimizer state (with no
  peer up, `FRESH`: the inner optimizer's initial state from Θ, as a new process starts).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..clock.recorder import FRESH
from ..config import DecoupledDiLoCo, DiLoCo
from ..devices import AXIS, fetch
from ..outer import (
    fragments,
    mean_merge,
    outer_step,
    put_leaves,
    rda_merge,
    resolve_outer_optimizer,
    take_leaves,
    tree_norm,
)
from ..steps import inner_step
from ..wire import WireFormat, from_bytes, to_bytes

MEAN_MERGED = ("embed", "pos")  # top-level parameter names merged by the weighted mean in RDA


@functools.lru_cache(maxsize=16)  # runs of one shape and schedule share it (compiling: s)
def inner_fn(model, mesh, optimizer, donate: bool = True):
    """Jitted `inner(local_M, state_M, batches_MxNxBxL1, mask_MxN) -> (local, state, loss_MxN)`."""

    def one_learner(params, opt_state, batches_NxBxL1, mask_N):
        def body(carry, x):
            batch_BxL1, on = x
            new_params, new_state, loss = inner_step(model.loss, optimizer, *carry, batch_BxL1)
            keep = functools.partial(jax.tree.map, lambda a, b: jnp.where(on, a, b))
            return (keep(new_params, carry[0]), keep(new_state, carry[1])), loss

        (params, opt_state), losses_N = jax.lax.scan(body, (params, opt_state),
                                                     (batches_NxBxL1, mask_N))
        return params, opt_state, losses_N

    spec = jax.P(AXIS)
    return jax.jit(jax.shard_map(jax.vmap(one_learner), mesh=mesh.mesh, in_specs=(spec,) * 4,
                                 out_specs=(spec,) * 3), donate_argnums=(0, 1) if donate else ())


@functools.lru_cache(maxsize=16)  # runs of one shape and schedule share it (compiling: s)
def send_fn(mesh, wire: WireFormat):
    """Jitted `send(local_p, base_p, sent_p, mask_M) -> sent_p`: Δ = base − θ on the wire."""

    def one_learner(local, base, sent, on):
        new = [wire.encode(b - x) for x, b in zip(local, base, strict=True)]
        return jax.tree.map(lambda a, b: jnp.where(on, a, b), new, sent)

    spec = jax.P(AXIS)
    return jax.jit(jax.shard_map(jax.vmap(one_learner), mesh=mesh.mesh, in_specs=(spec,) * 4,
                                 out_specs=spec), donate_argnums=(2,))


@functools.lru_cache(maxsize=16)  # runs of one shape and schedule share it (compiling: s)
def close_fn(mesh, outer_optimizer, up: WireFormat, down: WireFormat):
    """Jitted `close(global_p, outer_p, sent_p, weights_M, mean_leaves, rda, flush)
    -> (global_p, outer_p, diagnostics)` for one fragment (see the module docstring)."""
    def gather_one(sent):  # one all-gather of the fragment's payloads as one byte buffer
        return from_bytes(jax.lax.all_gather(to_bytes(sent), AXIS, tiled=True), sent)

    gather = jax.shard_map(gather_one, mesh=mesh.mesh, in_specs=jax.P(AXIS), out_specs=jax.P(),
                           check_vma=False)

    @functools.partial(jax.jit, static_argnames=("mean_leaves", "rda", "flush"))
    def close(global_p, outer_p, sent_p, weights_M, mean_leaves, rda, flush):
        sent_M = gather(sent_p)  # the sync's one collective
        return merge_step(outer_optimizer, up, down, global_p, outer_p, sent_M, weights_M,
                          mean_leaves, rda, flush)

    return close


def merge_step(outer_optimizer, up: WireFormat, down: WireFormat, global_p, outer_p, sent_M,
               weights_M, mean_leaves, rda: bool, flush: bool):
    """The syncer's work on one fragment, once every payload is in (`sent_M`, stacked [M, ...]):
    decode, merge with the weights, take the outer step (none for the flush), round the reply
    to `down` bits. Returns (global_p, outer_p, diagnostics). The lock-step `close` runs it after
    its all-gather; the actor runtime's syncer (`diloco_lite.actors`) runs it on the payloads it
    received."""
    deltas_M = [jax.vmap(lambda s, g=g: up.decode(s, g.shape))(s_M)
                for g, s_M in zip(global_p, sent_M, strict=True)]
    # end of run: the plain (weighted) average of the learners, no momentum, never RDA
    merged = merge(deltas_M, weights_M, mean_leaves if rda and not flush else None)
    if flush:
        new = [g - d for g, d in zip(global_p, merged, strict=True)]
    else:
        new, outer_p = outer_step(outer_optimizer, global_p, outer_p, merged)
    if down.bits < 32:  # the reply travels as a b-bit update; everyone applies the same one
        new = take_reply(down, global_p, reply_payload(down, global_p, new))
    return new, outer_p, diagnostics(deltas_M, weights_M, merged)


def reply_payload(down: WireFormat, global_p: list, new: list) -> list:
    """A merge's reply as it travels (one payload per tensor of the fragment): Θ_p itself at 32
    bits, else the update Θ_p − old through the b-bit wire format."""
    if down.bits == 32:
        return [down.encode(n) for n in new]
    return [down.encode(n - g) for g, n in zip(global_p, new, strict=True)]


def take_reply(down: WireFormat, global_p: list, payload: list) -> list:
    """The new Θ_p that a holder of the old one (`global_p`) makes of `reply_payload`'s payload:
    every copy the same (the syncer's own included)."""
    if down.bits == 32:
        return [down.decode(x, g.shape) for g, x in zip(global_p, payload, strict=True)]
    return [g + down.decode(x, g.shape) for g, x in zip(global_p, payload, strict=True)]


def merge(deltas_M: list, weights_M: jax.Array, mean_leaves: tuple | None) -> list:
    """Weighted mean of the Δ_m (mean_leaves None), or RDA over the leaves not in mean_leaves
    (their norm and direction taken together) with the rest by the weighted mean."""
    mean = mean_merge(deltas_M, weights_M)
    if mean_leaves is None or all(mean_leaves):
        return mean
    rda_idx = [i for i, is_mean in enumerate(mean_leaves) if not is_mean]
    rda = rda_merge([deltas_M[i] for i in rda_idx], weights_M)
    for i, d in zip(rda_idx, rda, strict=True):
        mean[i] = d
    return mean


def diagnostics(deltas_M: list, weights_M: jax.Array, merged: list) -> jax.Array:
    """[‖merged Δ‖², mean pairwise cosine of the Δ_m, mean ‖Δ_m‖²] over the merged learners."""
    flat_MxN = jnp.concatenate([d.reshape(d.shape[0], -1) for d in deltas_M], axis=1)
    gram_MxM = flat_MxN @ flat_MxN.T
    on_M = (weights_M > 0).astype(jnp.float32)
    sq_M = jnp.diag(gram_MxM)
    norms_M = jnp.sqrt(jnp.maximum(sq_M, 0.0))
    cos_MxM = gram_MxM / jnp.maximum(norms_M[:, None] * norms_M[None, :], 1e-30)
    pairs_MxM = on_M[:, None] * on_M[None, :] * (1.0 - jnp.eye(on_M.size))
    cosine = jnp.sum(cos_MxM * pairs_MxM) / jnp.maximum(jnp.sum(pairs_MxM), 1.0)
    drift = jnp.sum(on_M * sq_M) / jnp.maximum(jnp.sum(on_M), 1.0)
    return jnp.stack([jnp.square(tree_norm(merged)), cosine, drift])


@jax.jit
def arrive(local_p, base_p, global_p, mask_M, alpha):
    """The learners in `mask_M` take the fragment: θ ← α·θ + (1−α)·Θ and base ← Θ (lists of the
    fragment's leaves: `local_p`, `base_p` stacked [M, ...], `global_p` one copy)."""

    def take(x_M, g):
        on = mask_M.reshape((-1,) + (1,) * g.ndim)
        return jnp.where(on, alpha * x_M + (1 - alpha) * g[None], x_M)

    local = [take(x, g) for x, g in zip(local_p, global_p, strict=True)]
    base = [jnp.where(mask_M.reshape((-1,) + (1,) * g.ndim), g[None], b)
            for b, g in zip(base_p, global_p, strict=True)]
    return local, base


@jax.jit
def _reload(local, base, global_params, mask_M):
    def take(x_M, g):
        return jnp.where(mask_M.reshape((-1,) + (1,) * g.ndim), g[None], x_M)

    return jax.tree.map(take, local, global_params), jax.tree.map(take, base, global_params)


class LearnersDriver:
    """Runs a plan's blocks for DiLoCo, StreamingDiLoCo or DecoupledDiLoCo on `mesh`."""

    def __init__(self, config, model, mesh, optimizer, params, donate: bool = True):
        algo = config.algorithm
        self.mesh, self.optimizer = mesh, optimizer
        self.alpha = float(getattr(algo, "mix", 0.0))
        self.rda = getattr(algo, "merge", "mean") == "rda"
        up = WireFormat(getattr(algo, "bits", 32))
        down = WireFormat(getattr(algo, "down_bits", 32))
        how = "balanced" if isinstance(algo, DiLoCo) else algo.fragmentation
        count = 1 if isinstance(algo, DiLoCo) else algo.fragments
        self.frags = fragments(params, count, how, field=f"{type(algo).__name__}.fragments")
        names = [path[0].key for path, _ in jax.tree_util.tree_leaves_with_path(params)]
        self.mean_leaves = [tuple(names[i] in MEAN_MERGED for i in f) for f in self.frags]
        leaves = jax.tree.leaves(params)
        self.up_nbytes = [up.tree_nbytes(take_leaves(params, f)) for f in self.frags]
        self.down_nbytes = ([down.tree_nbytes(take_leaves(params, f)) for f in self.frags]
                            if isinstance(algo, DecoupledDiLoCo) else [0] * len(self.frags))
        self.sizes = [sum(leaves[i].size for i in f) for f in self.frags]
        state_bytes = sum(x.size * x.dtype.itemsize
                          for x in jax.tree.leaves(jax.eval_shape(optimizer.init, params)))
        self.rejoin_nbytes = 4 * sum(self.sizes) + state_bytes  # Θ (fp32) + a peer's state
        self.up, self.down = up, down
        self.outer_optimizer = resolve_outer_optimizer(algo)
        self.inner_init = jax.jit(optimizer.init)
        self.inner = inner_fn(model, mesh, optimizer, donate)
        self.send = send_fn(mesh, up)
        self.close = close_fn(mesh, self.outer_optimizer, up, down)

    def init(self, params) -> dict:
        """The initial state (module docstring). Built from numpy and two small jitted calls, so
        that setting up costs no per-shape compilation."""
        put, m = self.mesh.put, self.mesh.workers
        stack = lambda x: np.broadcast_to(np.asarray(x), (m,) + np.shape(x))  # noqa: E731
        frags = [take_leaves(params, f) for f in self.frags]
        inner = self.inner_init(params)
        outer = jax.jit(lambda fs: [self.outer_optimizer.init(f) for f in fs])(frags)
        sent = jax.eval_shape(lambda fs: [[self.up.encode(x) for x in f] for f in fs], frags)
        zeros = lambda s: np.zeros((m,) + s.shape, s.dtype)  # noqa: E731
        return {"global": put(params), "outer": put(outer),
                "local": put(jax.tree.map(stack, params), AXIS),
                "base": put(jax.tree.map(stack, params), AXIS),
                "inner": put(jax.tree.map(stack, jax.device_get(inner)), AXIS),
                "sent": put(jax.tree.map(zeros, sent), AXIS)}

    def global_params(self, state):
        return state["global"]

    def run(self, state, block, batches_MxNxBxL1, mask_MxN):
        """One block: the inner steps, then the events. Returns (state, the losses of the inner
        calls as a list of [M, n] arrays, the closes' diagnostics as (fragment, flush, [3]))."""
        state = dict(state)
        losses = []
        for start, n in _pieces(batches_MxNxBxL1.shape[1]):
            placed = self.mesh.put_rows((batches_MxNxBxL1[:, start:start + n],
                                         mask_MxN[:, start:start + n]))  # this process's rows
            state["local"], state["inner"], loss = self.inner(state["local"], state["inner"],
                                                              *placed)
            losses.append(loss)
        diags = []
        for ev in block.events:
            if ev.kind == "send":
                idx = self.frags[ev.fragment]
                state["sent"] = list(state["sent"])
                state["sent"][ev.fragment] = self.send(
                    take_leaves(state["local"], idx), take_leaves(state["base"], idx),
                    state["sent"][ev.fragment], self._on(ev.mask))
            elif ev.kind == "close":
                p = ev.fragment
                idx = self.frags[p]
                outer = list(state["outer"])
                new, outer[p], diag = self.close(
                    take_leaves(state["global"], idx), outer[p], state["sent"][p],
                    jnp.asarray(ev.weights), mean_leaves=self.mean_leaves[p], rda=self.rda,
                    flush=ev.flush)
                state["global"], state["outer"] = put_leaves(state["global"], idx, new), outer
                diags.append((p, ev.flush, diag))
                jax.block_until_ready(new)  # the all-gather is done before anything is queued
            elif ev.kind == "arrive":
                idx = self.frags[ev.fragment]
                local, base = arrive(take_leaves(state["local"], idx),
                                      take_leaves(state["base"], idx),
                                      take_leaves(state["global"], idx), self._on(ev.mask),
                                      self.alpha)
                state["local"] = put_leaves(state["local"], idx, local)
                state["base"] = put_leaves(state["base"], idx, base)
            elif ev.kind == "reload":
                state["local"], state["base"] = _reload(state["local"], state["base"],
                                                        state["global"], self._on(ev.mask))
                # a peer's inner state crosses devices: copied through the host (rare event)
                state["inner"] = self._from_peers(state["inner"], state["global"], ev)
        return state, losses, diags

    def _from_peers(self, inner, global_params, ev):
        """Each reloading learner's inner state from its peer's, or (`FRESH`: no peer was up)
        the initial state from Θ: across devices, so through the host (a rare event)."""
        source = np.where(ev.mask, ev.peer, np.arange(ev.mask.size))
        host = jax.tree.map(lambda x: np.asarray(x)[np.maximum(source, 0)], fetch(inner))
        fresh = source == FRESH
        if fresh.any():
            init = jax.device_get(self.inner_init(fetch(global_params)))
            host = jax.tree.map(lambda x, f: np.where(
                fresh.reshape((-1,) + (1,) * np.ndim(f)), np.asarray(f)[None], x), host, init)
        return self.mesh.put(host, AXIS)

    def _on(self, mask_M: np.ndarray):
        return self.mesh.put(mask_M, AXIS)


def _pieces(n: int) -> list[tuple[int, int]]:
    """Split n steps into runs of powers of two (at most log2 n + 1 compiled scan lengths)."""
    out, start = [], 0
    while n - start > 0:
        size = 1 << ((n - start).bit_length() - 1)
        out.append((start, size))
        start += size
    return out

