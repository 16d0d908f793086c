"""The "assemble the method" exercises of notebooks 02, 03 and 04, checked against the readable
reference (`diloco_lite.reference`).

- `check_diloco_loop` (02): a whole DiLoCo training loop, from one worker's inner step;
- `check_streaming_round` (03): what happens after a step of Streaming DiLoCo: the fragments
  whose turn it is sync, those due arrive (τ, α);
- `check_syncer` (04): the syncer's decisions for one sync, from a stream of events: when it
  closes and with which weights.

Each check runs the student's code on a small problem, compares it with the reference and with
the classic wrong versions (written here, each one change away from the right one), and names
the mistake it matches. The 02 and 03 checks train a tiny model for a few steps (seconds).
"""

from __future__ import annotations

import functools
import math

from ._core import Result, Stop, attempt, close, exercise, failed, judge, passed

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


def _diloco(run, workers, steps, H, lr, mistake=None):
    """DiLoCo written once more, with one classic `mistake` (None: right)."""
    from ..reference.common import outer_nesterov

    theta = list(run.init)
    velocity = [0.0 * x for x in theta]
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
            theta, velocity = outer_nesterov(theta, velocity, delta, lr)
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
    """`fn(run, workers, steps, H, outer_lr)` -> θ (a list of arrays) after `steps` steps of
    DiLoCo: `run.init` θ, `run.step(params, opt_state, batch)` one worker's AdamW step,
    `run.optimizer.init(params)`, `run.batch(k)` every worker's batch of step k."""
    import diloco_lite as dl

    from ..reference import diloco

    H, steps, lr = 3, 7, 0.7
    cfg, run = _tiny(dl.DiLoCo(inner_steps=H, outer_lr=lr), steps)
    got = attempt(fn, run, cfg.workers, steps, H, lr)

    def wrong(mistake):
        return _diloco(run, cfg.workers, steps, H, lr, mistake)

    return judge([*got] if isinstance(got, tuple) else got, diloco(cfg), rtol=1e-4, atol=1e-6,
                 success="θ equals the reference's DiLoCo after 2 outer steps and the end's "
                 "average", mistakes=[
        ("reset_state", wrong("reset_state"), "you reset each worker's AdamW at the sync: DiLoCo "
         "keeps the inner optimizer state (moments, step count) across syncs"),
        ("sign", wrong("sign"), "the pseudo-gradient has the wrong sign: Δ = θ − θ_m"),
        ("no_outer", wrong("no_outer"), "that is plain averaging: feed Δ to the outer "
         "Nesterov step at each sync"),
        ("kept_local", wrong("kept_local"), "after a sync every worker restarts from the new θ"),
        ("no_flush", wrong("no_flush"), "the last step (7 = 2·3 + 1) was never averaged in: at "
         "the end of a run that stops between syncs, average the remaining work once more"),
        ("outer_flush", wrong("outer_flush"), "the end-of-run average takes no outer step: "
         "θ ← θ − Δ, plainly (an outer step would extrapolate once more with momentum)"),
    ], other="θ differs from the reference's DiLoCo (diloco_lite.reference.diloco): compare "
             "your loop with it line by line")


# ---- 03: one round of Streaming DiLoCo ------------------------------------------------------


class StreamingState:
    """What Streaming DiLoCo keeps between steps (lists of arrays, one per tensor): `theta` and
    `velocity` (the global parameters and the outer momentum), per worker `local[m]` (θ_m) and
    `base[m]` (the global value it last took), and `in_flight`: fragment -> (the step after
    which it arrives, its new global value Θ_p)."""

    def __init__(self, init, workers):
        self.theta, self.velocity = list(init), [0.0 * x for x in init]
        self.local = [list(init) for _ in range(workers)]
        self.base = [list(init) for _ in range(workers)]
        self.in_flight = {}


def _streaming_round(mistake=None):
    """After step t: the fragments whose turn it is sync; those due arrive (one `mistake`)."""
    from ..reference.common import first_send, outer_nesterov, quantize

    def round_(t, s, frags, H, tau, alpha, bits, lr):
        M = len(s.local)
        for p, idx in enumerate(frags):
            if (t - first_send(p, H, len(frags))) % H:
                continue
            sign = -1 if mistake == "sign" else 1
            delta = [sum(sign * quantize(s.base[m][i] - s.local[m][i], bits) for m in range(M))
                     / M for i in idx]
            old = [s.theta[i] for i in idx]
            if mistake == "no_outer":
                new, vel = [x - d for x, d in zip(old, delta, strict=True)], None
            else:
                new, vel = outer_nesterov(old, [s.velocity[i] for i in idx], delta, lr)
            for n, i in enumerate(idx):
                s.theta[i] = new[n]
                if vel is not None:
                    s.velocity[i] = vel[n]
            s.in_flight[p] = (t + (0 if mistake == "no_overlap" else tau), new)
        for p, (due, new) in list(s.in_flight.items()):
            if due != t:
                continue
            a = 1 - alpha if mistake == "swapped" else alpha
            for m in range(M):
                for i, x in zip(frags[p], new, strict=True):
                    s.local[m][i] = a * s.local[m][i] + (1 - a) * x
                    if mistake != "base":
                        s.base[m][i] = x
            del s.in_flight[p]
        return s
    return round_


def _drive(round_, run, cfg, frags):
    """Train with `round_` after every step, then the end's plain average; return θ."""
    from ..reference.common import first_send, quantize

    a, M = cfg.algorithm, cfg.workers
    s = StreamingState(run.init, M)
    states = [run.optimizer.init(run.init)] * M
    for k in range(cfg.steps):
        for m in range(M):
            s.local[m], states[m] = run.step(s.local[m], states[m], run.batch(k)[m])
            s.local[m] = list(s.local[m])
        s = attempt(round_, k + 1, s, frags, a.inner_steps, a.overlap, a.mix, a.bits, a.outer_lr)
        if not isinstance(s, StreamingState):
            raise Stop("structure", "return the state you were given, changed")
    for p, idx in enumerate(frags):  # the end: arrived last at its latest send + τ ≤ steps
        sends = range(first_send(p, a.inner_steps, len(frags)), cfg.steps + 1, a.inner_steps)
        arrived = max([t + a.overlap for t in sends if t + a.overlap <= cfg.steps], default=0)
        if arrived < cfg.steps and all(t + a.overlap <= cfg.steps for t in sends):
            for i in idx:
                s.theta[i] = s.theta[i] - sum(quantize(s.base[m][i] - s.local[m][i], a.bits)
                                              for m in range(M)) / M
    return s.theta


@exercise("one round of Streaming DiLoCo", todo="sync each fragment whose turn it is after "
                                                "step t, and apply each one due at t")
def check_streaming_round(fn) -> Result:
    """`fn(t, state, frags, H, tau, alpha, bits, outer_lr)`: after every worker's step t (from
    1), change `state` (a `StreamingState`) and return it. The check trains 9 steps of a tiny
    model (P = 2, H = 4, τ = 1, α = 0.3) with it and compares θ with the reference's."""
    import diloco_lite as dl

    from ..reference import streaming
    from ..reference.common import balanced_fragments

    algo = dl.StreamingDiLoCo(inner_steps=4, fragments=2, overlap=1, mix=0.3, bits=32)
    cfg, run = _tiny(algo, 9)
    frags = balanced_fragments(run.init, 2)
    got = _drive(fn, run, cfg, frags)
    return judge(got, streaming(cfg), rtol=1e-4, atol=1e-6,
                 success="θ equals the reference's Streaming DiLoCo: staggered fragments, "
                 "arrivals τ steps later, mixed with α", mistakes=[
        (key, _drive(_streaming_round(key), run, cfg, frags), sentence)
        for key, sentence in [
            ("swapped", "α and 1 − α are swapped: the worker keeps α of its own fragment, "
             "θ_m ← α·θ_m + (1 − α)·Θ_p"),
            ("no_overlap", "the new fragment arrived at once: it is applied τ steps after its "
             "sync, training goes on meanwhile"),
            ("base", "the arriving Θ_p must also become the worker's base: its next Δ is "
             "measured from there"),
            ("sign", "Δ has the wrong sign: Δ_m = base_m − θ_m"),
            ("no_outer", "that is plain averaging: each fragment's Δ goes through the outer "
             "Nesterov step"),
        ]], other="θ differs from the reference's (diloco_lite.reference.streaming): compare "
                  "your round with its loop")


# ---- 04: the syncer's decisions -------------------------------------------------------------

# Streams of one sync (free links: an answer arrives when it is sent), as (time, kind, ...):
# ("ask", learners up), ("answer", learner, tokens, steps), ("fail", learner). STREAMS[0] is the
# first sync of notebook 04's worked example (section 2: 5 learners, step times 1, 1, 1, 1.5,
# 3 s; 256 tokens a step), whose close `tests/test_exercises.py` reads from the reference's
# own run; the second has a failure that breaks the quorum and learners of different batches.
STREAMS = [
    dict(events=[(4.0, "ask", (0, 1, 2, 3, 4)), (4.0, "answer", 0, 1024, 4),
                 (4.0, "answer", 1, 1024, 4), (4.0, "answer", 2, 1024, 4),
                 (4.5, "answer", 3, 768, 3), (6.0, "answer", 4, 512, 2)],
         quorum=2, tau=2, t_ref=1.0, safety=0.5),
    dict(events=[(10.0, "ask", (0, 1, 2, 3)), (10.0, "answer", 0, 4096, 4),
                 (10.2, "answer", 1, 3072, 3), (10.3, "fail", 0), (10.5, "answer", 2, 2048, 4),
                 (11.1, "answer", 3, 4096, 4)],
         quorum=2, tau=2, t_ref=1.0, safety=0.5),
]


def syncer(events, quorum, tau, t_ref, safety, mistake=None):
    """One sync, decided by the reference's rules (`reference.decoupled`, on a free link), or
    with one classic `mistake`: the quorum is K answers in from learners up; then a grace
    window of safety · slack, slack = τ · t_ref − (t_quorum − t_ask), closing early once no
    learner up is awaited; a failure takes the learner's answer out and may undo the quorum;
    weights tokens · tokens/steps. Events of one instant all happen before the syncer decides."""
    ask, up, answers, t_q, deadline = None, set(), {}, None, math.inf
    for t in sorted({e[0] for e in events}):
        if t > deadline and mistake != "everyone":
            break  # the grace window ran out before this instant
        for _, kind, *data in [e for e in events if e[0] == t]:
            if kind == "ask":
                ask, up = t, set(data[0])
            elif kind == "answer":
                m, tokens, steps = data
                answers[m] = tokens if mistake == "tokens" else tokens * tokens / steps
            elif kind == "fail" and mistake != "failed_counted":
                up.discard(data[0])
                answers.pop(data[0], None)
                if t_q is not None and len(answers) < quorum:
                    t_q, deadline = None, math.inf
        if t_q is None and len(answers) >= quorum:
            t_q, slack = t, tau * t_ref - (t - ask)
            grace = safety * slack if slack > 0 and mistake != "no_grace" else 0.0
            deadline = (ask if mistake == "from_ask" else t) + grace
        if t_q is not None and (up <= set(answers) or t >= deadline):
            return t, dict(sorted(answers.items()))
    return (deadline, dict(sorted(answers.items()))) if t_q is not None else None


MISTAKES = [
    ("no_grace", "you closed at the quorum: the grace window lets in the answers that come "
     "before the learners need the result"),
    ("from_ask", "the grace window starts at the quorum, not at the ask"),
    ("tokens", "the weights are the tokens alone: weigh quantity × quality, tokens · "
     "tokens/steps (learners with bigger batches took better steps)"),
    ("failed_counted", "a learner that failed is out of the merge and of the quorum: drop its "
     "answer (and the quorum, if it falls below K)"),
    ("everyone", "you waited for every learner: the grace window ends the wait"),
]


@exercise("the syncer's decisions", todo="go through the events in time order: when does the "
                                        "sync close, and with which weight for each answer?")
def check_syncer(fn) -> Result:
    """`fn(events, quorum, tau, t_ref, safety)` -> (close time, {learner: weight}) for each
    stream of `STREAMS` (weights up to a common scale)."""
    def normal(result):
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
            raise Stop("structure", "return (close time, {learner: weight})")
        t, w = result
        total = sum(w.values()) or 1.0
        return float(t), {int(m): float(v) / total for m, v in sorted(w.items())}

    def equal(a, b):
        return (b is not None and abs(a[0] - b[0]) < 1e-9 and a[1].keys() == b[1].keys()
                and close(list(a[1].values()), list(b[1].values()), 1e-6, 1e-9))

    for n, s in enumerate(STREAMS):
        got = normal(attempt(fn, list(s["events"]), s["quorum"], s["tau"], s["t_ref"],
                             s["safety"]))
        want = normal(syncer(**s))
        if equal(got, want):
            continue
        for key, sentence in MISTAKES:
            wrong = syncer(**s, mistake=key)
            if wrong is not None and equal(got, normal(wrong)):
                return failed(key, f"stream {n}: {sentence}")
        show = lambda r: f"{r[0]:g} s with {({m: round(w, 3) for m, w in r[1].items()})}"  # noqa
        return failed("other", f"stream {n}: you closed at {show(got)}, the reference at "
                               f"{show(want)} (weights as shares of their sum)")
    return passed("every stream closes when the reference's syncer does, with its weights")


__all__ = ["check_diloco_loop", "check_streaming_round", "check_syncer", "StreamingState",
           "syncer", "STREAMS"]
