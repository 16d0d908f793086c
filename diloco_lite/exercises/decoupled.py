"""Checks for notebook 04 (Decoupled DiLoCo's syncer): its token weights, when it closes a
merge (quorum and grace window), and the goodput of a run (the event loop: `eventloop.py`).

The references are written here from docs/algorithms.md §4 (the same rules as `clock.syncer`), and
each check also computes the classic wrong answers and names the one the student's answer
matches.
"""

from __future__ import annotations

import numpy as np

from ._core import Result, Stop, attempt, exercise, failed, fmt, judge

# One sync of one fragment: 5 learners, their tokens and steps since their base.
TOKENS = np.array([4096.0, 4096.0, 3072.0, 2048.0, 0.0])
STEPS = np.array([4.0, 4.0, 3.0, 4.0, 0.0])  # learner 3 used smaller batches; learner 4 is new


def _weights(tokens, steps):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(steps > 0, tokens * (tokens / np.where(steps > 0, steps, 1.0)), 0.0)


@exercise("token weights", todo="return one merge weight per learner")
def check_token_weights(fn) -> Result:
    """`fn(tokens, steps)` -> one merge weight per learner (any common scale is fine: the merge
    divides by the sum)."""
    got = np.asarray(attempt(fn, TOKENS.copy(), STEPS.copy()), dtype=np.float64)
    if got.shape != TOKENS.shape:
        raise Stop("shape", f"return one weight per learner: shape {TOKENS.shape}, "
                            f"not {got.shape}")
    if not np.all(np.isfinite(got)):
        return failed("zero", "a learner that took no step since its base must get weight 0, "
                              "not NaN or inf: it has nothing to merge")
    ref = _weights(TOKENS, STEPS)
    norm = lambda w: w / w.sum() if w.sum() else w  # noqa: E731
    return judge(norm(got), norm(ref), success="the tokens since the base, times the tokens per "
                 "step: learners 0 and 1 weigh the same, learner 3 (smaller batches) much less "
                 "than its step count says", mistakes=[
                     ("tokens", norm(TOKENS), "your weights follow the tokens alone: learner 3, "
                      "with smaller batches, gets too much weight; reread how the batch size "
                      "(tokens per step) enters the weight"),
                     ("ratio", norm(_weights(TOKENS, STEPS) / np.where(TOKENS > 0, TOKENS, 1)),
                      "your weights ignore how much a learner trained: learner 2, with 3 steps, "
                      "weighs as much as learners 0 and 1 with 4"),
                     ("steps", norm(STEPS), "your weights follow the step counts: learners may "
                      "use different batch sizes, so count tokens"),
                     ("equal", norm(np.where(STEPS > 0, 1.0, 0.0)), "your weights are equal: "
                      "the merge weighs each learner by its work"),
                 ], other="your weights do not grow with the tokens per step as the notebook's "
                 "weight does: compare learners 2 and 3 by hand", rtol=1e-6)


# When the syncer closes: asked at T = 10 s; the answers arrive at these times.
ASK, ARRIVALS = 10.0, np.array([10.0, 10.2, 10.9, 11.6, 13.0])
QUORUM, TAU, T_REF, T_REPLY, SAFETY = 2, 2, 1.0, 0.3, 0.5


def _close_time(ask, arrivals, quorum, tau, t_ref, t_reply, safety) -> float:
    """The reference: the quorum at the K-th answer (an instant, t_quorum); then wait up to
    safety · slack more, slack = τ·t_ref − ((t_quorum − ask) + t_reply); close early once
    everyone has answered."""
    t_q = float(np.sort(arrivals)[quorum - 1])
    slack = tau * t_ref - ((t_q - ask) + t_reply)
    grace = safety * slack if slack > 0 else 0.0
    return max(t_q, min(t_q + grace, float(np.max(arrivals))))


@exercise("syncer closes", todo="return the time the syncer closes the merge")
def check_close_time(fn) -> Result:
    """`fn(ask, arrivals, quorum, tau, t_ref, t_reply, safety)` -> when the merge closes."""
    args = (ASK, ARRIVALS.copy(), QUORUM, TAU, T_REF, T_REPLY, SAFETY)
    got = float(attempt(fn, *args))
    ref = _close_time(*args)
    t_q = float(np.sort(ARRIVALS)[QUORUM - 1])
    slack = TAU * T_REF - ((t_q - ASK) + T_REPLY)
    merged = int(np.sum(ARRIVALS <= ref))
    result = judge(got, ref, success=f"closes at {fmt(ref)} s with {merged} of "
                   f"{ARRIVALS.size} learners (quorum at {fmt(t_q)} s, grace "
                   f"{fmt(SAFETY * slack)} s)", mistakes=[
                       ("no grace", t_q, "that is the quorum's instant: reread what the "
                        "syncer may still wait for when the result is not needed yet"),
                       ("everyone", float(ARRIVALS.max()), "that waits for every learner: a "
                        "straggler would hold the syncer back; the grace window ends the wait"),
                       ("from ask", ASK + SAFETY * slack, "your grace window is counted from "
                        "the wrong instant"),
                       ("first", float(ARRIVALS.min()), "that is the first answer: the syncer "
                        "waits for a quorum first"),
                       ("full slack", t_q + slack, "your grace window is too long: reread what "
                        "the safety factor is for"),
                       ("no reply", max(t_q, min(t_q + SAFETY * (TAU * T_REF - (t_q - ASK)),
                                                 float(ARRIVALS.max()))),
                        "your grace window is too long: the slack must also leave time for the "
                        "reply to reach the learners"),
                   ], other="the syncer neither closes then nor at a classic wrong time: list "
                   "the arrivals, mark the quorum, then the end of the grace window",
                   rtol=1e-9, atol=1e-9)
    return result


@exercise("goodput of a run", todo="return the run's goodput, a fraction")
def check_run_goodput(fn) -> Result:
    """`fn(processed, lost, elapsed_s, step_times)` -> the goodput measured from a run."""
    processed, lost, elapsed, times = 900.0, 60.0, 130.0, np.array([1.0] * 7 + [2.0])
    got = float(attempt(fn, processed, lost, elapsed, times.copy()))
    offered = float(np.sum(elapsed / times))
    ref = (processed - lost) / offered
    return judge(got, ref, success=f"{ref:.1%}: what the cluster could have done, minus idling, "
                 "downtime and lost work", mistakes=[
                     ("lost", processed / offered, "the lost steps (a failure's unmerged work, "
                      "work an arrival overwrote) never reached the model: they are not useful "
                      "work"),
                     ("equal speeds", (processed - lost) / (elapsed * times.size / times.min()),
                      "you gave every learner the fastest learner's speed: each learner offers "
                      "steps at its own pace"),
                     ("processed", (processed - lost) / processed, "you divided by what the "
                      "cluster did, so idling does not count against goodput: divide by what it "
                      "could have done"),
                 ], other="compare what you divide by with the learner-steps the cluster could "
                 "have done in the elapsed time, each learner at its own speed", rtol=1e-9)


__all__ = ["check_token_weights", "check_close_time", "check_run_goodput"]
