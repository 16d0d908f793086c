"""The event-loop exercise of notebook 04: the student writes the syncer's handler, and the check
drives it over the events of real runs of the readable reference, `reference.decoupled`, and
compares its decisions with what that run's log says the syncer did.

For each scenario (a tiny `RunConfig`, seconds to run) the check runs the reference with a
log, turns the log into what the syncer sees, in time order, and calls the student's
`handle(state, event, rules)` on each event, as an event loop does: a heap of events ordered by
time (at equal times: asks, then arrivals, then timers, then failures, rejoins and the end, the
reference's order), plus the timers the handler sets. The events:

- `("ask", t, p)`: the syncer opens a sync of fragment p (it asks every learner that is up);
- `("arrive", t, m, p, asked, tokens, steps)`: learner m's answer for fragment p reaches the
  syncer; `asked` is the time of the ask it answers, `tokens` and `steps` its work since its
  base when it sent it (an answer may arrive after its sync closed: late, or even while a
  newer sync of p is open: stale);
- `("deadline", t, p)`: a timer the handler set with `("timer", t, p)` went off;
- `("fail", t, m)`, `("rejoin", t, m)`: learner m goes down, comes back;
- `("end", t, reports)`: the run is over; `reports[m][p] = (base, tokens, steps)` for each
  learner m that is up: `base` is the time of the ask whose merged fragment p the learner holds
  as its base (None: the initial parameters), `tokens` and `steps` its work since that base.

The handler returns a list of actions: `("timer", when, p)`, `("close", p, {learner: weight})`
(the syncer merges those answers, RDA then the outer step, and sends the reply) and, at the end,
`("flush", p, {learner: weight}, merge, outer_step)` with `merge` "mean" or "rda" and
`outer_step` True or False. The decisions compared with the log: every close (its time,
fragment, merged learners and their weights as shares of their sum) and every flush (its
learners, their shares, how).

The expected decisions are read from the reference's log alone; the named mistakes come from
the handler written here once more with one classic change each (`_handler(mistake)`), which
the tests hold to the reference's log on every scenario.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import heapq
import itertools
import math

from ._core import TODO, Result, Stop, answer, exercise, failed, passed

# at equal times, in the reference's order (its event kinds ASK < ANSWER < DEADLINE < FAIL <
# REJOIN < END)
ORDER = {"ask": 0, "arrive": 2, "deadline": 3, "fail": 6, "rejoin": 7, "end": 8}


@dataclasses.dataclass(frozen=True)
class SyncerRules:
    """What the syncer knows of the run: `learners` (M), `fragments` (P), `quorum` (K), `tau`
    (τ, reference steps until the learners need a result), `t_ref` (seconds of a reference
    step), `safety` (the grace window's safety factor) and `t_reply` (seconds the merged
    fragment's reply takes to reach the learners: the link's latency here)."""

    learners: int
    fragments: int
    quorum: int
    tau: int
    t_ref: float
    safety: float
    t_reply: float


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    step_time_s: tuple
    fragments: int
    inner_steps: int
    overlap: int
    quorum: int
    safety: float
    latency_s: float = 0.0
    failures: tuple = ()


STEPS = 14  # every scenario: the same budget, so that the reference compiles one program
SCENARIOS = (
    Scenario("notebook 04's worked example", "5 learners, two of them slow, one fragment",
             (1, 1, 1, 1.5, 3), fragments=1, inner_steps=4, overlap=2, quorum=2, safety=0.5),
    Scenario("failures", "learner 0 fails after its answer arrived, which breaks the quorum, "
             "and comes back; learner 3, slow, is down for a whole sync; learner 1 fails while "
             "its answer is on its way", (1, 1, 1, 1.7), fragments=1, inner_steps=4, overlap=2,
             quorum=3, safety=0.5, latency_s=0.3,
             failures=((0, 4.6, 6.2), (3, 7.0, 9.5), (1, 12.1, 14.0))),
    Scenario("a slow link", "two fragments, 0.8 s of latency: learner 3's answers come late, "
             "one after the next sync of its fragment opened", (1, 1, 1, 3.4), fragments=2,
             inner_steps=2, overlap=1, quorum=2, safety=0.5, latency_s=0.8),
)


def scenario_config(s: Scenario):
    """The `RunConfig` of a scenario: a tiny model, 32-bit answers, the plain-mean merge (the
    decisions do not depend on the numbers)."""
    import diloco_lite as dl

    algo = dl.DecoupledDiLoCo(inner_steps=s.inner_steps, fragments=s.fragments,
                              overlap=s.overlap, quorum=s.quorum, grace_safety=s.safety, bits=32)
    cluster = dl.Cluster(step_time_s=tuple(float(t) for t in s.step_time_s),
                         failures=s.failures, link=dl.Link(latency_s=s.latency_s))
    return dl.RunConfig(algorithm=algo, workers=len(s.step_time_s), steps=STEPS, batch_size=2,
                        seq_len=16, warmup_steps=2, eval_every=STEPS, cluster=cluster,
                        model=dl.ModelConfig(context=16, d_model=16, n_layers=1, n_heads=1,
                                             mlp_ratio=2))


def rules_of(config) -> SyncerRules:
    from ..clock import Timeline

    a = config.algorithm
    return SyncerRules(learners=config.workers, fragments=a.fragments, quorum=a.quorum,
                       tau=a.overlap, t_ref=Timeline(config.cluster, config.workers).t_ref,
                       safety=a.grace_safety, t_reply=config.cluster.link.latency_s)


@functools.cache
def reference_log(index: int) -> tuple:
    """The reference's log of scenario `index` (run once per process)."""
    from ..reference import decoupled

    log: list = []
    decoupled(scenario_config(SCENARIOS[index]), log=log)
    return tuple(log)


def replay(log, rules: SyncerRules, tokens_per_step: int):
    """(the syncer's events, the decisions the reference took) from a reference log."""
    M, P = rules.learners, rules.fragments
    asked = [None] * P          # each fragment's latest ask
    closed = [None] * P         # ... the ask of its latest closed sync
    published = [None] * P      # ... the ask of its latest sync whose merge reached the learners
    since = [[0] * P for _ in range(M)]
    base = [[None] * P for _ in range(M)]
    up = [True] * M
    in_flight = collections.defaultdict(collections.deque)  # (m, p) -> answers on their way
    arrived = [{} for _ in range(P)]  # the open sync's arrivals: learner -> weight
    end = max(t for t, what, _, _ in log if what == "step")
    events, closes, flushes = [], [], {}
    for t, what, who, p in log:
        if what == "flush":
            flushes[p] = {m: _weight(since[m][p] * tokens_per_step, since[m][p]) for m in who}
            continue
        if t > end:
            continue  # after the end: what was in flight is published, nothing the syncer sees
        if what == "step":
            since[who] = [n + 1 for n in since[who]]
        elif what == "ask":
            asked[p], arrived[p] = t, {}
            events.append(("ask", t, p))
        elif what == "answer":
            n = since[who][p]
            in_flight[who, p].append((asked[p], n * tokens_per_step, n))
        elif what == "arrive":
            ask, tokens, steps = in_flight[who, p].popleft()
            if ask == asked[p]:
                arrived[p][who] = _weight(tokens, steps)
            events.append(("arrive", t, who, p, ask, tokens, steps))
        elif what == "close":
            closed[p] = asked[p]
            closes.append((t, p, {m: arrived[p][m] for m in who}))
        elif what == "publish":
            published[p] = closed[p]
        elif what == "apply":
            base[who][p], since[who][p] = published[p], 0
        elif what == "fail":
            up[who] = False
            events.append(("fail", t, who))
        elif what == "rejoin":
            up[who], base[who], since[who] = True, list(published), [0] * P
            events.append(("rejoin", t, who))
    reports = {m: {p: (base[m][p], since[m][p] * tokens_per_step, since[m][p]) for p in range(P)}
               for m in range(M) if up[m]}
    events.append(("end", end, reports))
    expected = [("close", t, p, w) for t, p, w in closes]
    expected += [("flush", p, w, "mean", False) for p, w in sorted(flushes.items())]
    return events, expected


def _weight(tokens, steps):
    return tokens * tokens / steps if steps else 0.0


# ---- the loop that drives a handler ---------------------------------------------------------


def drive(handle, events, rules):
    """Run `handle(state, event, rules)` over `events` and the timers it sets; return its
    decisions: ("close", t, p, weights) and ("flush", p, weights, merge, outer_step)."""
    events = copy.deepcopy(events)  # a handler may change what it is given
    heap = [(e[1], ORDER[e[0]], i, e) for i, e in enumerate(events)]
    heapq.heapify(heap)
    seq = itertools.count(len(heap))
    state: dict = {}
    decisions, replies = [], 0
    while heap:
        t, _, _, event = heapq.heappop(heap)
        try:
            actions = handle(state, event, rules)
        except Stop:
            raise
        except Exception as err:
            from ._core import _short

            raise Stop("error", f"your handler raised {_short(err)} on the event "
                                f"{_show_event(event)}") from None
        if actions is Ellipsis:
            raise Stop(TODO)
        if actions is None:
            continue
        replies += 1
        if not isinstance(actions, (list, tuple)):
            raise Stop("structure", f"return a list of actions (got {type(actions).__name__} on "
                                    f"the event {_show_event(event)})")
        for action in actions:
            decisions += _act(action, t, event, heap, seq)
        if event[0] == "end":
            break
    if not replies and not decisions:
        raise Stop(TODO)
    return decisions


def _act(action, t, event, heap, seq):
    kind = action[0] if isinstance(action, tuple) and action else None
    if kind == "timer" and len(action) == 3:
        _, when, p = action
        when = float(when)
        if not when >= t - 1e-12:
            raise Stop("structure", f"at {t:g} s you set a timer for {when:g} s: a timer goes "
                                    "off at a time still to come (or now)")
        heapq.heappush(heap, (max(when, t), ORDER["deadline"], next(seq),
                              ("deadline", max(when, t), int(p))))
        return []
    if kind == "close" and len(action) == 3 and isinstance(action[2], dict):
        return [("close", t, int(action[1]), _floats(action[2]))]
    if kind == "flush" and len(action) == 5 and isinstance(action[2], dict):
        _, p, weights, merge, outer = action
        return [("flush", int(p), _floats(weights), str(merge), bool(outer))]
    raise Stop("structure", f"unknown action {action!r} (on the event {_show_event(event)}): "
                            "an action is ('timer', when, p), ('close', p, weights) or "
                            "('flush', p, weights, merge, outer_step)")


def _floats(weights):
    return {int(m): float(w) for m, w in weights.items()}


def _show_event(event):
    if event[0] == "end":
        return f"('end', {event[1]:g}, ...)"
    return "(" + ", ".join(f"{x:g}" if isinstance(x, float) else repr(x) for x in event) + ")"


def _shares(weights):
    total = sum(weights.values())
    return {m: (w / total if total else w) for m, w in sorted(weights.items())}


def same(a, b, tol=1e-6) -> bool:
    """Two decisions agree: same kind, time, fragment, learners, shares of weight, how."""
    if a[0] != b[0] or len(a) != len(b):
        return False
    if a[0] == "close":
        (_, ta, pa, wa), (_, tb, pb, wb) = a, b
        head = abs(ta - tb) < 1e-9 and pa == pb
    else:
        (_, pa, wa, ma, oa), (_, pb, wb, mb, ob) = a, b
        head = pa == pb and ma == mb and oa == ob
    sa, sb = _shares(wa), _shares(wb)
    return head and sa.keys() == sb.keys() and all(abs(sa[m] - sb[m]) <= tol for m in sa)


def agree(got, want) -> int | None:
    """The index of the first decision where `got` differs from `want` (None: they agree)."""
    for i, (a, b) in enumerate(itertools.zip_longest(got, want)):
        if a is None or b is None or not same(a, b):
            return i
    return None


# ---- the syncer's handler, written once more, right or with one classic mistake ----------


def _handler(mistake=None):
    """The syncer as an event handler (right, or with one named `mistake`)."""

    def handle(state, event, rules):
        K, M = rules.quorum, rules.learners
        down = state.setdefault("down", set())
        syncs = state.setdefault("syncs", {})      # fragment -> its open sync
        closed = state.setdefault("closed", {})    # fragment -> the ask of its last close
        kind, t = event[0], event[1]

        def close_if_done(p, over=False):
            s = syncs.get(p)
            if s is None or s["quorum"] is None:
                return []
            awaited = [m for m in range(M) if m not in s["answered"]
                       and (m not in down or mistake == "down_awaited")]
            if awaited and not (over and mistake != "everyone"):
                return []
            del syncs[p]
            closed[p] = s["asked"]
            return [("close", p, dict(s["answers"]))]

        if kind == "ask":
            syncs[event[2]] = dict(asked=t, answers={}, answered=set(), quorum=None,
                                   deadline=math.inf)
            return []
        if kind == "arrive":
            _, _, m, p, asked, tokens, steps = event
            s = syncs.get(p)
            if s is None or (m in down and mistake != "down_merged") or (
                    asked != s["asked"] and mistake != "stale"):
                return []  # late (its sync closed), or its learner failed since it sent it
            s["answers"][m] = 1.0 if mistake == "equal" else tokens * tokens / steps
            s["answered"].add(m)
            out = []
            if s["quorum"] is None and len(s["answers"]) >= K:
                s["quorum"] = t
                reply = 0.0 if mistake == "no_reply" else rules.t_reply
                slack = rules.tau * rules.t_ref - ((t - s["asked"]) + reply)
                grace = 0.0 if mistake == "no_grace" else rules.safety * max(slack, 0.0)
                s["deadline"] = (s["asked"] if mistake == "from_ask" else t) + grace
                out.append(("timer", max(s["deadline"], t), p))
            return out + close_if_done(p)
        if kind == "deadline":
            s = syncs.get(event[2])
            if s is not None and t >= s["deadline"]:
                return close_if_done(event[2], over=True)
            return []
        if kind == "fail":
            down.add(event[2])
            out = []
            for p, s in list(syncs.items()):
                if mistake != "failed_kept":
                    s["answers"].pop(event[2], None)
                    if s["quorum"] is not None and len(s["answers"]) < K:
                        s["quorum"], s["deadline"] = None, math.inf
                out += close_if_done(p)
            return out
        if kind == "rejoin":
            down.discard(event[2])
            return []
        if kind == "end":
            out = []
            for p in range(rules.fragments):
                who = {m: tokens * tokens / steps for m, report in event[2].items()
                       for base, tokens, steps in [report[p]]
                       if steps >= 1 and (base == closed.get(p) or mistake == "flush_stale")}
                if who:
                    out.append(("flush", p, who, "rda" if mistake == "flush_rda" else "mean",
                                mistake == "flush_outer"))
            return out
        return []

    return handle


# key, what the check says (what is wrong and where to look, never the rule itself)
MISTAKES = [
    ("failed_kept", "a learner that failed still counts in a sync: when a learner goes down, "
     "reread what happens to the answer it had sent and to the quorum it helped make"),
    ("stale", "you merged an answer into a sync it was not meant for: an answer can arrive "
     "after its own sync closed, even once a newer sync of that fragment is open; look at "
     "which ask each answer replies to"),
    ("flush_rda", "the end-of-run flush is not merged like a sync: reread how the remaining "
     "work is averaged in at the end (notebook 04, section 1, `flush`)"),
    ("flush_outer", "the end-of-run flush moved Θ_p with the outer optimizer: reread what the "
     "end of the run does with the remaining work (notebook 04, section 1, `flush`)"),
    ("flush_stale", "the flush averaged in work measured from an old base: check which "
     "learners' remaining work is measured from the newest merged fragment"),
    ("down_merged", "you merged an answer that arrived from a learner that was down: its "
     "work was lost with it"),
    ("no_grace", "your syncs close as soon as the quorum is in: reread what the syncer may "
     "still wait for after the quorum, and for how long"),
    ("everyone", "you waited for every learner that is up, past the end of the grace window: "
     "the deadline ends the wait"),
    ("from_ask", "your grace windows end at the wrong time: check from which instant the "
     "grace window is counted"),
    ("no_reply", "your grace windows are too long when the link has latency: reread what the "
     "slack must leave room for"),
    ("down_awaited", "your syncs wait for learners that are down: only a learner that is up "
     "can still answer"),
    ("equal", "your weights do not follow the learners' work: use the token weights of "
     "exercise 1"),
]
MISTAKE_KEYS = [key for key, _ in MISTAKES]


def _describe(d) -> str:
    if d is None:
        return "nothing"
    shares = ", ".join(f"{m}: {w:.2f}" for m, w in _shares(d[2] if d[0] == "flush" else d[3])
                       .items())
    if d[0] == "close":
        return f"a close of fragment {d[2]} at {d[1]:g} s with {{{shares}}}"
    outer = "with" if d[4] else "without"
    return f"a flush of fragment {d[1]} by the {d[3]} of {{{shares}}} {outer} an outer step"


@functools.cache
def _scenario(index: int):
    cfg = scenario_config(SCENARIOS[index])
    rules = rules_of(cfg)
    events, expected = replay(reference_log(index), rules, cfg.batch_size * cfg.seq_len)
    return rules, events, expected


def _probe(fn):
    """A blank handler (it returns nothing to a sync that reaches its quorum) is not done yet."""
    rules = SyncerRules(learners=2, fragments=1, quorum=1, tau=1, t_ref=1.0, safety=0.0,
                        t_reply=0.0)
    state: dict = {}
    outs = []
    for event in [("ask", 0.0, 0), ("arrive", 0.0, 0, 0, 0.0, 16, 1),
                  ("arrive", 0.0, 1, 0, 0.0, 16, 1), ("deadline", 0.0, 0)]:
        try:
            outs.append(fn(state, event, rules))
        except Exception:
            return  # the real scenarios will say what went wrong
    if all(out is None or out is Ellipsis for out in outs):
        raise Stop(TODO)


@exercise("the syncer's event loop", todo="write handle(state, event, rules): what the syncer "
                                          "does on each event, as a list of actions")
def check_syncer(fn) -> Result:
    """`fn(state, event, rules)` -> a list of actions, driven over the events of
    `len(SCENARIOS)` runs of `reference.decoupled`; its closes and flushes must be the
    reference's."""
    fn = answer(fn)
    if not callable(fn):
        raise Stop("error", f"expected a function, got {type(fn).__name__}")
    _probe(fn)
    runs = [_scenario(n) for n in range(len(SCENARIOS))]
    got = []
    for n, (rules, events, _) in enumerate(runs):
        try:
            got.append(drive(fn, events, rules))
        except Stop as stop:
            if not any(agree(g, e) is not None for g, (_, _, e) in zip(got, runs, strict=False)):
                if stop.key == TODO:
                    raise
                raise Stop(stop.key, f"scenario {n + 1} ({SCENARIOS[n].name}): "
                                     f"{stop.message}") from None
            break  # an earlier scenario already differs: name that
    wrong = next((n for n, g in enumerate(got) if agree(g, runs[n][2]) is not None), None)
    if wrong is None:
        closes = sum(sum(d[0] == "close" for d in e) for _, _, e in runs)
        return passed(f"every close and flush of the {len(SCENARIOS)} reference runs ({closes} "
                      "syncs, late and stale answers, failures, a rejoin, the end) is yours")
    name = f"scenario {wrong + 1} ({SCENARIOS[wrong].name})"
    for key, sentence in MISTAKES:  # the same decisions as a classic mistake, on every scenario
        if all(agree(g, drive(_handler(key), events, rules)) is None
               for g, (rules, events, _) in zip(got, runs, strict=False)):
            return failed(key, f"{name}: {sentence}")
    expected = runs[wrong][2]
    first = agree(got[wrong], expected)
    mine = got[wrong][first] if first < len(got[wrong]) else None
    theirs = expected[first] if first < len(expected) else None
    return failed("other", f"{name}: your decision {first + 1} is {_describe(mine)}, the "
                           f"reference's {_describe(theirs)}")


__all__ = ["check_syncer", "SyncerRules", "SCENARIOS", "ORDER"]
