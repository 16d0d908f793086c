"""Checks for notebook 08 (Decoupled DiLoCo on real actors): when a learner applies a published
fragment, a real run's goodput, and what a real kill cost (its detection and its downtime).

Host-only and fast: no Ray, no JAX program. The data are real: step boundaries, counters and
the syncer's logs (`result.log`, trimmed) of notebook 08's kill run on Ray actors (M = 4,
0.2 s steps, K = 2, τ = 1; learner 1 killed at 1.1 s, window until 4.05 s), and of the same run
with learner 2 killed too (at 1.5 s, window until 3.0 s), recorded on a shared 2-core machine.
The references are written here in plain Python from the learner-side rules of
`actors.syncer` / `clock.syncer` and the goodput of `clock.recorder`, never with them; each check
also computes the classic wrong answers and names the one the student's answer matches.
"""

from __future__ import annotations

import numpy as np

from ._core import Result, Stop, answer, attempt, exercise, fmt, judge, number

# ---- exercise 1: when a learner applies a published fragment -------------------------------

_GRID = [round(0.2 * k, 3) for k in range(1, 15)]  # a learner on time: a step every 0.2 s
_LATE = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.577, 1.777, 1.977, 2.177, 2.377, 2.577]  # learner 0
_BACK = [0.2, 0.4, 0.6, 0.8, 1.0, 8.787, 8.987, 9.187, 9.387, 9.587]  # learner 1 (killed)
# (who, ask_s, boundaries_s, publish_s, tau): five applies of the kill run, as its log has them
APPLY_CASES = [
    ("learner 2, on time", 0.4, _GRID, 0.483, 1),
    ("learner 0, a late step", 1.2, _LATE, 1.356, 1),
    ("learner 0, out of phase", 1.6, _LATE, 1.752, 1),
    ("learner 1, back from its kill", 8.8, _BACK, 8.927, 1),
    ("learner 2, a slow merge", 2.0, _GRID, 2.212, 1),
]


def _apply_position(ask_s, boundaries_s, publish_s, tau) -> int:
    """The reference: the learner's first boundary at or after the ask is step f (steps done,
    counted from 1); it applies at its first boundary that is at least f + τ and at or after
    the publish."""
    f = next(i for i, t in enumerate(boundaries_s, 1) if t >= ask_s)
    return next(i for i, t in enumerate(boundaries_s, 1) if i >= f + tau and t >= publish_s)


def _first(boundaries, after, strict=False) -> int:
    return next(i for i, t in enumerate(boundaries, 1) if (t > after if strict else t >= after))


def _applied(boundaries, due, publish) -> int:
    return next(i for i, t in enumerate(boundaries, 1) if i >= due and t >= publish)


@exercise("when a learner applies", todo="return the learner's steps done at the boundary "
                                         "where it applies the merged fragment")
def check_apply_position(fn) -> Result:
    """`fn(ask_s, boundaries_s, publish_s, tau)` -> the learner's steps done (1, 2, ...) at the
    boundary where it applies the published fragment."""
    got = []
    for _, ask, b, pub, tau in APPLY_CASES:
        out = attempt(fn, ask, list(b), pub, tau)
        if np.ndim(out) != 0:
            raise Stop("shape", f"return one number, the learner's steps done when it applies "
                                f"(got {type(out).__name__})")
        got.append(float(out))
    got = np.array(got)
    ref = np.array([_apply_position(*c[1:]) for c in APPLY_CASES], dtype=float)

    def rule(due, publish=True):
        return np.array([_applied(b, due(ask, b, pub, tau), pub if publish else -np.inf)
                         for _, ask, b, pub, tau in APPLY_CASES], dtype=float)

    times = np.array([c[2][int(r) - 1] for c, r in zip(APPLY_CASES, ref, strict=True)])
    bad = next((i for i in range(len(ref)) if got[i] != ref[i]), 0)
    who, ask, b, pub, tau = APPLY_CASES[bad]
    return judge(got, ref, success="the log's five applies: steps " + ", ".join(
                     f"{r:.0f}" for r in ref) + " (at " + ", ".join(f"{t:g}" for t in times)
                 + " s)", mistakes=[
        ("from_publish", rule(lambda a, b, p, t: _first(b, p) + t), "τ counts from the "
         "learner's first boundary since the ask (the step where it answered, or would have), "
         "not from the publish: the result is due τ steps after the ask, however long the "
         "merge took"),
        ("ignores_publish", rule(lambda a, b, p, t: _first(b, a) + t, publish=False), "a "
         "learner cannot apply a fragment before it is published: when the merge is published "
         "after the due boundary (a slow merge), it cannot be applied there"),
        ("strict_ask", rule(lambda a, b, p, t: _first(b, a, strict=True) + t), "a boundary at "
         "the very instant of the ask comes after it (the ask reaches a learner that finishes a "
         "step at that time): it is the learner's first boundary since the ask"),
        ("from_ask", rule(lambda a, b, p, t: _first(b, a) - 1 + t), "off by one: τ counts from "
         "the learner's first boundary at or after the ask (where it answers), not from the "
         "steps it had done when the ask came"),
        ("zero_based", ref - 1, "off by one: return the learner's steps done at that boundary "
         "(1 for its first step), not the boundary's index in `boundaries_s` (from 0)"),
        ("one_late", ref + 1, "off by one: the learner applies one boundary earlier, at the "
         "due boundary itself when the fragment is published by then"),
        ("time", times, "that is the time of the boundary: return the learner's steps done "
         "there (its position), not the time"),
    ], other=f"{who} (ask {ask:g} s, publish {pub:g} s, τ = {tau}): you said "
             f"{fmt(got[bad])}; replay that case by hand, boundary by boundary",
        rtol=1e-9, atol=1e-9)


# ---- exercise 2: a real run's goodput --------------------------------------------------------

# The final row of the kill run on actors (dl.Cluster(step_time_s=0.2), M = 4, 80 steps each)
KILL_ROW = dict(sim_time_s=18.017, learner_steps=320, useful_steps=143.5, lost_steps=176.5)


@exercise("goodput of the killed run", todo="the killed run's goodput, as a fraction")
def check_kill_goodput(predicted, *, useful_steps: float = 143.5, learner_steps: float = 320,
                       elapsed_s: float = 18.017, step_s: float = 0.2,
                       learners: int = 4) -> Result:
    """`predicted`: the run's goodput (a fraction, not a percentage)."""
    got = number(predicted)
    offered = learners * elapsed_s / step_s
    ref = useful_steps / offered
    return judge(got, ref, success=f"{ref:.1%}: {fmt(useful_steps)} useful learner-steps of the "
                 f"{fmt(offered)} that {learners} learners could have done in {fmt(elapsed_s)} s",
                 mistakes=[
        ("done", useful_steps / learner_steps, "that divides by the learner-steps done: goodput "
         "divides by what the cluster could have done at nominal speed in the elapsed time "
         "(offered), so a learner down or late counts against it"),
        ("learners_up", useful_steps / ((learners - 1) * elapsed_s / step_s), "the killed "
         "learner is offered too: goodput counts every learner of the cluster over the whole "
         "run, failures included (that is what it measures)"),
        ("lost", learner_steps / offered, "that counts every learner-step as useful: the lost "
         "ones (work a failure or an arriving fragment threw away) never reached the model"),
        ("one_learner", useful_steps / (elapsed_s / step_s), "goodput cannot exceed 1: the "
         f"cluster offers the steps of all {learners} learners, not one"),
        ("percent", 100 * ref, "give a fraction (0.5), not a percentage (50)"),
    ], other=f"got {fmt(got)}: neither the goodput nor a classic mistake; what did the "
             "cluster offer, and what of it was useful?",
        rtol=1e-6)


# ---- exercise 3: what a real kill cost -------------------------------------------------------


def _log(text: str) -> list:
    """`result.log` from 'time event learner fragment; ...'."""
    out = []
    for item in text.split(";"):
        t, event, m, p = item.split()
        out.append((float(t), event, int(m), int(p)))
    return out


# notebook 08's kill run: learner 1 killed at 1.1 s, window until 4.05 s (events after 2.85 s
# left out, but those around the rejoin)
KILL_LOG = _log("""
    0.4 ask -1 0; 0.4 answer 0 0; 0.4 answer 3 0; 0.4 answer 1 0; 0.4 answer 2 0;
    0.428 close -1 0; 0.483 merge -1 0; 0.6 apply 1 0; 0.6 apply 0 0; 0.6 apply 3 0;
    0.6 apply 2 0; 0.8 ask -1 1; 0.8 answer 2 1; 0.8 answer 0 1; 0.8 answer 3 1;
    0.8 answer 1 1; 0.826 close -1 1; 0.838 merge -1 1; 1 apply 1 1; 1 apply 3 1;
    1 apply 0 1; 1 apply 2 1; 1.2 ask -1 0; 1.2 answer 3 0; 1.2 answer 0 0; 1.2 answer 2 0;
    1.316 close -1 0; 1.356 merge -1 0; 1.4 apply 2 0; 1.4 apply 3 0; 1.577 apply 0 0;
    1.6 ask -1 1; 1.6 answer 3 1; 1.6 answer 2 1; 1.733 close -1 1; 1.752 merge -1 1;
    1.8 apply 3 1; 1.8 apply 2 1; 1.977 apply 0 1; 2 ask -1 0; 2 answer 3 0; 2 answer 2 0;
    2.116 close -1 0; 2.212 merge -1 0; 2.4 ask -1 1; 2.4 answer 3 1; 2.4 apply 3 0;
    2.4 answer 2 1; 2.4 apply 2 0; 2.478 fail 1 -1; 2.524 close -1 1; 2.543 merge -1 1;
    2.577 apply 0 0; 2.6 apply 3 1; 2.6 apply 2 1; 2.777 apply 0 1; 2.8 ask -1 0;
    2.8 answer 3 0; 2.8 answer 2 0; 8.377 apply 0 1; 8.4 ask -1 0; 8.4 answer 2 0;
    8.4 answer 3 0; 8.509 close -1 0; 8.527 merge -1 0; 8.587 rejoin 1 -1; 8.6 apply 2 0;
    8.6 apply 3 0; 8.777 apply 0 0; 8.8 ask -1 1; 8.8 answer 2 1; 8.8 answer 3 1;
    8.909 close -1 1; 8.927 merge -1 1
""")
# the same run with learner 2 killed too, at 1.5 s (window until 3.0 s)
TWO_KILLS_LOG = _log("""
    0.4 ask -1 0; 0.4 answer 0 0; 0.4 answer 3 0; 0.4 answer 1 0; 0.4 answer 2 0;
    0.437 close -1 0; 0.484 merge -1 0; 0.6 apply 2 0; 0.6 apply 0 0; 0.6 apply 1 0;
    0.6 apply 3 0; 0.8 ask -1 1; 0.8 answer 0 1; 0.8 answer 2 1; 0.8 answer 1 1;
    0.8 answer 3 1; 0.833 close -1 1; 0.86 merge -1 1; 1 apply 3 1; 1 apply 0 1; 1 apply 2 1;
    1 apply 1 1; 1.2 ask -1 0; 1.2 answer 3 0; 1.2 answer 0 0; 1.2 answer 2 0;
    1.322 close -1 0; 1.348 merge -1 0; 1.4 apply 0 0; 1.4 apply 2 0; 1.6 ask -1 1;
    1.6 answer 0 1; 1.686 answer 3 1; 1.686 apply 3 0; 1.863 close -1 1; 2.07 merge -1 1;
    2.07 ask -1 0; 2.371 answer 0 0; 2.371 apply 0 1; 2.4 ask -1 1; 2.402 answer 3 0;
    2.402 apply 3 1; 2.483 close -1 0; 2.547 merge -1 0; 2.571 answer 0 1; 2.571 apply 0 0;
    2.602 answer 3 1; 2.602 apply 3 0; 2.622 close -1 1; 2.663 merge -1 1; 2.709 fail 2 -1;
    2.732 fail 1 -1; 2.771 apply 0 1; 2.8 ask -1 0; 2.802 answer 3 0; 2.802 apply 3 1;
    6.571 answer 0 1; 6.583 close -1 1; 6.6 merge -1 1; 6.602 apply 3 1; 6.771 apply 0 1;
    6.781 rejoin 1 -1; 6.8 ask -1 0; 6.802 answer 3 0; 6.971 answer 0 0; 6.981 answer 1 0;
    6.989 close -1 0; 7.013 merge -1 0; 8.571 answer 0 0; 8.581 answer 1 0; 8.589 close -1 0;
    8.605 merge -1 0; 8.771 apply 0 0; 8.781 apply 1 0; 8.793 rejoin 2 -1; 8.8 ask -1 1;
    8.802 answer 3 1; 8.802 apply 3 0; 8.971 answer 0 1; 8.981 answer 1 1; 8.992 close -1 1;
    9.016 merge -1 1
""")
# (log, learner, its failure window (down_s, back_s)): what the check asks about
KILL_CASES = [(KILL_LOG, 1, (1.1, 4.05)), (TWO_KILLS_LOG, 2, (1.5, 3.0))]


def _kill_timing(log, learner, window) -> tuple[float, float]:
    """The reference: (when the syncer learned of the kill − the kill, the rejoin − the kill);
    the kill is the window's start, `fail` and `rejoin` the learner's first events of those
    kinds after it."""
    down = window[0]
    fail = min(t for t, e, m, _ in log if e == "fail" and m == learner and t >= down)
    back = min(t for t, e, m, _ in log if e == "rejoin" and m == learner and t >= fail)
    return fail - down, back - down


@exercise("detection and downtime", todo="return (detection delay, downtime) of the "
                                         "learner's kill, in seconds, read from the log")
def check_kill_timing(fn) -> Result:
    """`fn(log, learner, window)` -> (detection delay s, downtime s) of the learner's kill."""
    got = []
    for log, m, window in KILL_CASES:
        out = answer(attempt(fn, list(log), m, tuple(window)))
        if np.shape(out) != (2,):
            raise Stop("shape", "return two numbers: (detection delay, downtime), in seconds")
        got.append([float(answer(x)) for x in out])
    got = np.array(got)
    ref = np.array([_kill_timing(*c) for c in KILL_CASES])

    def events(log, m, kind):
        return min(t for t, e, q, _ in log if e == kind and (m is None or q == m))

    fails = np.array([events(log, m, "fail") for log, m, _ in KILL_CASES])
    backs = np.array([events(log, m, "rejoin") for log, m, _ in KILL_CASES])
    starts = np.array([w[0] for _, _, w in KILL_CASES])
    ends = np.array([w[1] for _, _, w in KILL_CASES])
    detect = ref[:, 0]

    def pair(d, down):
        return np.stack([d, down], axis=1)

    anyone = pair(*(np.array([events(log, None, k) for log, _, _ in KILL_CASES]) - starts
                    for k in ("fail", "rejoin")))
    return judge(got, ref, success="; ".join(
        f"learner {m}: known dead {d:.2f} s after its kill, down {down:.2f} s (its window: "
        f"{w[1] - w[0]:.2f} s)" for (_, m, w), (d, down) in zip(KILL_CASES, ref, strict=True)),
                 mistakes=[
        ("from_detection", pair(detect, backs - fails), "the learner is down from its kill, "
         "not from when the syncer heard of it: the detection delay is downtime too"),
        ("window", pair(detect, ends - starts), "that is the failure window the Cluster "
         "planned; on actors the learner is back when its new process is ready and rejoins "
         "(the log's `rejoin`), often later"),
        ("past_window", pair(detect, backs - ends), "that is how late the rejoin came after the "
         "window's end; the downtime runs from the kill (the window's start)"),
        ("absolute", pair(fails, backs), "those are times since the run's start: measure both "
         "from the kill (the window's start)"),
        ("other_learner", anyone, "take the `fail` and `rejoin` events of this learner (the log's "
         "third field): in the second log two learners were killed"),
    ], other="neither pair matches the logs: find the learner's own `fail` and `rejoin` "
             "events by hand", rtol=1e-6, atol=1e-9)


__all__ = ["check_apply_position", "check_kill_goodput", "check_kill_timing", "APPLY_CASES",
           "KILL_LOG", "KILL_ROW", "TWO_KILLS_LOG"]
