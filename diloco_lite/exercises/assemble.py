"""The "assemble the method" exercises of notebooks 02 and 03, checked against the readable
reference (`diloco_lite.reference`); notebook 04's (the syncer's event loop) is `eventloop.py`.

- `check_diloco_loop` (02): a whole DiLoCo training loop, from one worker's inner step and an
  optax outer optimizer (the one of exercise 2);
- `check_streaming_round` (03): what Streaming DiLoCo does after a step, written for the
  workers stacked on axis 0 (the library's layout, not the reference's one worker at a time),
  with one optax outer state per fragment and exercise 3's mixing.

Each check runs the student's code on a small problem, compares it with the reference and with
the classic wrong versions (written here, each one change away from the right one), and names
the mistake it matches. Both train a tiny model for a few steps (seconds).
"""

from __future__ import annotations

import functools

from ._core import Result, Stop, attempt, exercise, judge

# ---- 02: a DiLoCo training loop -------------------------------------------------------------


@functools.cache
def _tiny(algorithm, steps: int, workers: int = 2):
    """A tiny run (the reference's pieces for it, and its config): 2 workers, 16 characters."""
    import diloco_lite as dl

    from ..reference.common import setup

    cfg = dl.RunConfig(algorithm=algorithm, workers=workers, steps=steps, batch_size=2,
                       seq_len=16, learning_rate=3e-3, warmup_steps=2, eval_every=steps,
                       model=dl.ModelConfig(context=16, d_model=32, n_layers=1, n_heads=2,
                                            mlp_ratio=2))
    return cfg, setup(cfg)


def _outer_opt(lr):
    from ..outer import default_outer_optimizer

    return default_outer_optimizer(lr)


def _diloco(run, workers, steps, H, opt, mistake=None):
    """DiLoCo written once more (optax outer step), with one classic `mistake` (None: right)."""
    import optax

    theta = list(run.init)
    outer_state = opt.init(theta)
    local, states = [theta] * workers, [run.optimizer.init(theta)] * workers
    for k in range(steps):
        for m in range(workers):
            local[m], states[m] = run.step(local[m], states[m], run.batch(k)[m])
        t = k + 1
        if t % H and (t < steps or mistake == "no_flush"):
            continue
        delta = [sum(x - xm[i] for xm in local) / workers for i, x in enumerate(theta)]
        if mistake == "sign":
            delta = [-d for d in delta]
        if mistake == "no_outer":
            theta = [x - d for x, d in zip(theta, delta, strict=True)]
        elif t % H == 0 or mistake == "outer_flush":
            updates, outer_state = opt.update(delta, outer_state, theta)
            theta = list(optax.apply_updates(theta, updates))
        else:
            theta = [x - d for x, d in zip(theta, delta, strict=True)]
        if mistake != "kept_local":
            local = [theta] * workers
        if mistake == "reset_state":
            states = [run.optimizer.init(theta)] * workers
    return theta


@exercise("DiLoCo training loop", todo="train the workers H steps each on their own batches, "
                                       "then sync; repeat until `steps`; return θ")
def check_diloco_loop(fn) -> Result:
    """`fn(run, workers, steps, H, outer_opt)` -> θ (a list of arrays) after `steps` steps of
    DiLoCo: `run.init` θ, `run.step(params, opt_state, batch)` one worker's AdamW step,
    `run.optimizer.init(params)`, `run.batch(k)` every worker's batch of step k; `outer_opt`
    the outer optimizer (optax: Nesterov SGD)."""
    import diloco_lite as dl

    from ..reference import diloco

    H, steps, lr = 3, 7, 0.7
    cfg, run = _tiny(dl.DiLoCo(inner_steps=H, outer_lr=lr), steps)
    opt = _outer_opt(lr)
    got = attempt(fn, run, cfg.workers, steps, H, opt)

    def wrong(mistake):
        return _diloco(run, cfg.workers, steps, H, opt, mistake)

    return judge([*got] if isinstance(got, tuple) else got, diloco(cfg), rtol=1e-4, atol=1e-6,
                 success="θ equals the reference's DiLoCo after 2 outer steps and the end's "
                 "average", mistakes=[
        ("reset_state", wrong("reset_state"), "you reset each worker's AdamW at the sync: "
         "think about what DiLoCo keeps of the inner optimizer across syncs"),
        ("sign", wrong("sign"), "your pseudo-gradient points the wrong way: reread exercise 1"),
        ("no_outer", wrong("no_outer"), "that is plain averaging: reread what a sync does with "
         "the averaged pseudo-gradient (exercise 2)"),
        ("kept_local", wrong("kept_local"), "after a sync every worker must restart from the "
         "new θ"),
        ("no_flush", wrong("no_flush"), "the run ends between two syncs and the work after the "
         "last one never reached θ: what should happen to it at the end?"),
        ("outer_flush", wrong("outer_flush"), "the end-of-run average is not a sync like the "
         "others: reread how the reference (diloco_lite.reference.diloco) treats the end"),
    ], other="θ differs from the reference's DiLoCo (diloco_lite.reference.diloco): compare "
             "your loop with it line by line")


# ---- 03: one round of Streaming DiLoCo, on stacked workers ----------------------------------


class StreamingState:
    """What Streaming DiLoCo keeps between steps, every worker stacked on axis 0 (one array per
    tensor): `theta` (the global tensors), `local[i]` (every worker's tensor i, shape [M, ...]),
    `base[i]` (every worker's global value of tensor i when it last took fragment p, [M, ...]),
    `outer_state[p]` (the outer optimizer's state of fragment p, over its list of tensors) and
    `in_flight`: fragment -> (the step after which it arrives, its new global tensors)."""

    def __init__(self, init, workers, outer_states):
        import jax.numpy as jnp

        self.theta = list(init)
        self.local = [jnp.stack([x] * workers) for x in init]
        self.base = [jnp.stack([x] * workers) for x in init]
        self.outer_state = dict(enumerate(outer_states))
        self.in_flight = {}


def _streaming_round(mistake=None):
    """After step t: the fragments whose turn it is sync; those due arrive (one `mistake`)."""
    import jax.numpy as jnp
    import optax

    def round_(t, s, frags, first, H, tau, alpha, opt):
        for p, idx in enumerate(frags):
            if t < first[p] or (t - first[p]) % H:
                continue
            sign = -1 if mistake == "sign" else 1
            delta = [sign * jnp.mean(s.base[i] - s.local[i], axis=0) for i in idx]
            old = [s.theta[i] for i in idx]
            if mistake == "no_outer":
                new = [x - d for x, d in zip(old, delta, strict=True)]
            else:
                updates, s.outer_state[p] = opt.update(delta, s.outer_state[p], old)
                new = list(optax.apply_updates(old, updates))
            for n, i in enumerate(idx):
                s.theta[i] = new[n]
            s.in_flight[p] = (t + (0 if mistake == "no_overlap" else tau), new)
        for p, (due, new) in list(s.in_flight.items()):
            if due != t:
                continue
            a = 1 - alpha if mistake == "swapped" else alpha
            for i, x in zip(frags[p], new, strict=True):
                s.local[i] = a * s.local[i] + (1 - a) * x
                if mistake != "base":
                    s.base[i] = jnp.broadcast_to(x, s.local[i].shape)
            del s.in_flight[p]
        return s
    return round_


def _drive(round_, run, cfg, frags, first, opt):
    """Train with `round_` after every step, then the end's plain average; return θ."""
    import jax.numpy as jnp

    a, M = cfg.algorithm, cfg.workers
    s = StreamingState(run.init, M, [opt.init([run.init[i] for i in idx]) for idx in frags])
    states = [run.optimizer.init(run.init)] * M
    for k in range(cfg.steps):
        batch = run.batch(k)
        moved = []
        for m in range(M):
            params, states[m] = run.step([x[m] for x in s.local], states[m], batch[m])
            moved.append(params)
        s.local = [jnp.stack([moved[m][i] for m in range(M)]) for i in range(len(run.init))]
        s = attempt(round_, k + 1, s, frags, list(first), a.inner_steps, a.overlap, a.mix, opt)
        if not isinstance(s, StreamingState):
            raise Stop("structure", "return the state you were given, changed")
    for p, idx in enumerate(frags):  # the end: arrived last at its latest send + τ ≤ steps
        sends = range(first[p], cfg.steps + 1, a.inner_steps)
        arrived = max([t + a.overlap for t in sends if t + a.overlap <= cfg.steps], default=0)
        if arrived < cfg.steps and all(t + a.overlap <= cfg.steps for t in sends):
            for i in idx:
                s.theta[i] = s.theta[i] - jnp.mean(s.base[i] - s.local[i], axis=0)
    return s.theta


@exercise("one round of Streaming DiLoCo", todo="sync each fragment whose turn it is after "
                                                "step t, and apply each one due at t")
def check_streaming_round(fn) -> Result:
    """`fn(t, state, frags, first, H, tau, alpha, outer_opt)`: after every worker's step t
    (from 1), change `state` (a `StreamingState`) and return it. The check trains 9 steps of a
    tiny model (P = 2, H = 4, τ = 1, α = 0.3) with it and compares θ with the reference's."""
    import diloco_lite as dl

    from ..reference import streaming
    from ..reference.common import balanced_fragments, first_send

    algo = dl.StreamingDiLoCo(inner_steps=4, fragments=2, overlap=1, mix=0.3, bits=32)
    cfg, run = _tiny(algo, 9)
    frags = balanced_fragments(run.init, 2)
    first = [first_send(p, 4, 2) for p in range(2)]
    opt = _outer_opt(algo.outer_lr)
    got = _drive(fn, run, cfg, frags, first, opt)
    return judge(got, streaming(cfg), rtol=1e-4, atol=1e-6,
                 success="θ equals the reference's Streaming DiLoCo: staggered fragments, "
                 "arrivals τ steps later, mixed with α", mistakes=[
        (key, _drive(_streaming_round(key), run, cfg, frags, first, opt), sentence)
        for key, sentence in [
            ("swapped", "the arriving fragment is mixed in the wrong proportions: check which "
             "side α weighs (exercise 3)"),
            ("no_overlap", "the new fragment arrived at once: reread when a synced fragment "
             "reaches the workers"),
            ("base", "after an arrival, the workers' next Δ is measured from the wrong point: "
             "reread what the arriving fragment also becomes for each worker"),
            ("sign", "your Δ points the wrong way: reread exercise 1 of notebook 02"),
            ("no_outer", "that is plain averaging: each fragment's averaged Δ goes through its "
             "outer optimizer"),
        ]], other="θ differs from the reference's (diloco_lite.reference.streaming): compare "
                  "your round with its loop")


__all__ = ["check_diloco_loop", "check_streaming_round", "StreamingState"]
