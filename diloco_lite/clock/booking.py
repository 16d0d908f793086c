"""The booking order of a Decoupled DiLoCo run, in one place: in which order the events of one
instant come, and what each event books on a `Recorder`, call by call.

Both clocks book a run with these functions: the simulated clock as its event queue goes
(`clock.learner_rules.LearnerRules`, driven by `clock.syncer.plan_decoupled`), the actor
runtime once the run is over, from the learners' reports and the syncer's own events
(`actors.booking.Books`). So the two can differ in when they learn of an event, never in how
it is booked.

The events of one instant come in the order of their kinds (the constants below): an ask
reaches a learner that finishes a step at that very instant (`ASK` first); then the step
boundaries (`BOUNDARY`: the steps and the answers sent there); the answers' arrivals
(`RESPONSE`) and the grace deadlines (`DEADLINE`), which may close a sync; the merges published
(`PUBLISH`); the learners' applies (`APPLY`: a step boundary's applies come after the merges of
its instant) and the evaluations they complete; failures (`FAIL`), rejoins (`REJOIN`); the end
(`END`: the budget's last step). Events of one kind at one instant: the simulated clock takes
them in the order it queued them, the actors' books by learner (the syncer's own first).

What each event books, in this order:

- `step`: the step, then each answer sent at that boundary (one sent after its sync closed:
  left out at once, `drop`: the learner hears of the close only with the publish);
- `close` (at an arrival or a deadline): its answers are in the merge from now on (`closing`),
  then the answers to that sync already on the wire and not in it are left out;
- `publish`: the merge, with the bytes of one reply per learner up at the close;
- `apply`: each fragment's arrival at the learner, then the evaluations due (`evals_due`:
  every M × e learner-steps, once the step boundary that reached them has applied);
- `fail`, `reload` (a rejoin: Θ and a peer's inner optimizer state, or a fresh one);
- `flush` (after the end): the answers of the flush, then its plain weighted mean.
"""

from __future__ import annotations

__all__ = ["APPLY", "ASK", "BOUNDARY", "DEADLINE", "END", "FAIL", "PUBLISH", "REJOIN",
           "RESPONSE", "apply", "close", "evals_due", "fail", "flush", "publish", "reload",
           "step"]

# The order of the events of one instant (module docstring).
ASK, BOUNDARY, RESPONSE, DEADLINE, PUBLISH, APPLY, FAIL, REJOIN, END = range(9)


def step(rec, m: int, k: int, t: float, answers: list[tuple[int, bool]]) -> None:
    """Learner m's step k (its data index, 0 for the first) ended at t, and it sent `answers`
    there: [(fragment, whether its sync had closed already)]."""
    rec.step(m, k, t)
    for p, too_late in answers:
        rec.send(p, [m], t)
        if too_late:
            rec.drop(p, m)  # its sync had closed: its work stays unmerged in m


def close(rec, p: int, weights: dict, on_the_wire) -> None:
    """Fragment p's sync closed with `weights` (learner -> weight); the answers of the learners
    `on_the_wire` were sent before the close and are not in it."""
    rec.closing(p, weights)
    for m in on_the_wire:
        rec.drop(p, m)  # closed without it: its work stays unmerged in m


def publish(rec, p: int, weights: dict, t: float, *, receivers, wait_s: float) -> None:
    """Fragment p's merge (`weights`) reached `receivers`, the learners up at its close, at t."""
    rec.close(p, weights, t, receivers=receivers, wait_s=wait_s)


def apply(rec, m: int, fragments, t: float) -> None:
    """Learner m applied `fragments` at its step boundary at t."""
    for p in fragments:
        rec.arrive(p, [m], t)


def evals_due(evals: list, processed: int, M: int) -> list:
    """The evaluations due once `processed` learner-steps have been applied (each at M × its
    step), taken off the front of `evals` (sorted)."""
    due = []
    while evals and processed >= evals[0] * M:
        due.append(evals.pop(0))
    return due


def fail(rec, m: int) -> None:
    """Learner m went down: out of the merges; its unsynced work is lost."""
    rec.fail(m)


def reload(rec, m: int, peer: int, t: float) -> None:
    """Learner m is back at t with Θ and `peer`'s inner optimizer state (`FRESH`: a fresh one)."""
    rec.reload(m, peer, t)


def flush(rec, p: int, weights: dict, t: float) -> None:
    """The end-of-run flush of fragment p from `weights`' learners: their answers (bytes up),
    then the plain weighted mean."""
    rec.send(p, list(weights), t, flush=True)
    rec.close(p, weights, t, flush=True)
