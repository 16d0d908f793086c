"""Checks for notebook 04 (Decoupled DiLoCo's syncer): its token weights, when it closes a
merge (quorum and grace window), and the goodput of a run.

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
        return failed("zero", "a learner that took no step (steps = 0) must get weight 0, not "
                              "NaN or inf: it has nothing to merge")
    ref = _weights(TOKENS, STEPS)
    norm = lambda w: w / w.sum() if w.sum() else w  # noqa: E731
    return judge(norm(got), norm(ref), success="quantity × quality: more tokens and more tokens "
                 "per step both count", mistakes=[
                     ("tokens", norm(TOKENS), "those are the tokens alone (quantity): the paper "
                      "also weighs quality, tokens per step (a learner with bigger batches "
                      "took better steps)"),
                     ("ratio", norm(_weights(TOKENS, STEPS) / np.where(TOKENS > 0, TOKENS, 1)),
                      "that is tokens per step alone (quality): multiply by the tokens too "
                      "(quantity), or a learner that barely trained counts as much as the others"),
                     ("steps", norm(STEPS), "those are step counts: weigh by tokens, since "
                      "learners may use different batch sizes"),
                     ("equal", norm(np.where(STEPS > 0, 1.0, 0.0)), "equal weights throw the "
                      "token counts away: the syncer's merge is token-weighted"),
                 ], other="expected w_m = tokens_m · tokens_m / steps_m (up to a common scale)",
                 rtol=1e-6)


# When the syncer closes: asked at T = 10 s; the answers arrive at these times.
ASK, ARRIVALS = 10.0, np.array([10.0, 10.2, 10.9, 11.6, 13.0])
QUORUM, TAU, T_REF, T_SYNC, SAFETY = 2, 2, 1.0, 0.3, 0.5


def close_time(ask, arrivals, quorum, tau, t_ref, t_sync, safety) -> float:
    """The reference: quorum at the K-th answer; then wait up to safety · slack more, slack =
    τ·t_ref − ((t_quorum − ask) + t_sync), and close early once everyone has answered."""
    t_q = float(np.sort(arrivals)[quorum - 1])
    slack = tau * t_ref - ((t_q - ask) + t_sync)
    grace = safety * slack if slack > 0 else 0.0
    return max(t_q, min(t_q + grace, float(np.max(arrivals))))


@exercise("syncer closes", todo="return the time the syncer closes the merge")
def check_close_time(fn) -> Result:
    """`fn(ask, arrivals, quorum, tau, t_ref, t_sync, safety)` -> when the merge closes."""
    args = (ASK, ARRIVALS.copy(), QUORUM, TAU, T_REF, T_SYNC, SAFETY)
    got = float(attempt(fn, *args))
    ref = close_time(*args)
    t_q = float(np.sort(ARRIVALS)[QUORUM - 1])
    slack = TAU * T_REF - ((t_q - ASK) + T_SYNC)
    merged = int(np.sum(ARRIVALS <= ref))
    result = judge(got, ref, success=f"closes at {fmt(ref)} s with {merged} of "
                   f"{ARRIVALS.size} learners (quorum at {fmt(t_q)} s, grace "
                   f"{fmt(SAFETY * slack)} s)", mistakes=[
                       ("no grace", t_q, "that is the quorum time: the grace window lets more "
                        "learners in when the result is not needed yet (slack > 0)"),
                       ("everyone", float(ARRIVALS.max()), "that waits for every learner: a "
                        "straggler would hold the syncer back; stop at the end of the grace "
                        "window"),
                       ("from ask", ASK + SAFETY * slack, "the grace window starts at the quorum, "
                        "not at the ask"),
                       ("first", float(ARRIVALS.min()), "that is the first answer: wait for K of "
                        "them (the quorum)"),
                       ("full slack", t_q + slack, "scale the slack by the safety factor"),
                   ], other="expected the later of the quorum time and min(t_quorum + grace, "
                   "the last answer)", rtol=1e-9, atol=1e-9)
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
                      "work an arrival overwrote) never reached the model: not useful work"),
                     ("equal speeds", (processed - lost) / (elapsed * times.size / times.min()),
                      "each learner offers elapsed / its own step time: the slow one offers "
                      "fewer steps"),
                     ("processed", (processed - lost) / processed, "divide by what the cluster "
                      "could have done (offered), not by what it did: idling counts against "
                      "goodput"),
                 ], other="expected (processed − lost) / Σ_m elapsed / step_time_m", rtol=1e-9)


__all__ = ["check_token_weights", "check_close_time", "check_run_goodput", "close_time"]
