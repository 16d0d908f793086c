"""The syncer's syncs in the actor runtime: the actions of its state machine, carried out.

`SyncerState` (`clock.syncer_state`) decides; `Syncs` carries out what it returns, as the
simulated clock's driver does (`clock.syncer.plan_decoupled`): a timer (the next ask, a grace
deadline) goes on the syncer's `Timers`; an ask opens a sync and numbers it (a learner's
answer names the sync by fragment and number); a close makes a `Merge` job for `Merges`, with
its publish at the time the clock's links (`clock.Links`) deliver the last copy of the reply,
sends each learner up its publish notice at once (through the `Mailbox`; the reply follows once
merged) and books the close. An answer that reaches the syncer goes into its open sync
(`arrived`); a publish makes the merged fragment the newest version (`versions`, what a
returning learner reloads) and is booked. A returning learner is asked again by the open syncs
it had not answered (`back`). Nothing here imports Ray.
"""

from __future__ import annotations

from ..clock.booking import ASK, DEADLINE, PUBLISH, RESPONSE
from ..clock.syncer_state import Ask, AskAt, Close, SetDeadline
from .merging import Merge

__all__ = ["Syncs"]


class Syncs:
    """The syncs of `state` (`SyncerState`) over `links` (`clock.Links`; a reply of fragment p
    is `down_nbytes[p]` bytes), with the syncer's `events` (`Timers`), `merges` (`Merges`),
    `mail` (`Mailbox`) and `books` (`Books`); `theta0`: each fragment's Θ_p at the start; a
    learner-step is `tokens` tokens."""

    def __init__(self, state, links, down_nbytes, events, merges, mail, books, theta0: list,
                 tokens: int):
        self.state, self.links, self.down_nbytes = state, links, down_nbytes
        self.events, self.merges, self.mail, self.books = events, merges, mail, books
        self.M, self.P, self.tokens = state.M, state.P, tokens
        self.versions = [[(0.0, f)] for f in theta0]  # each fragment's (publish time, Θ_p)
        self.asked_n = [0] * self.P  # each fragment's asks so far: the next one's number
        self.open: list = [None] * self.P  # p's open sync: (its id, its number)
        self.payloads = [{} for _ in range(self.P)]  # the open sync's answers

    def act(self, actions: list, t: float, kind: int = ASK) -> list:
        """Carry out the syncer's actions at t (while handling an event of `kind`); returns the
        asks of a returning learner: ("ask", t, fragment, number) of each open sync."""
        again = []
        for a in actions:
            match a:
                case AskAt(p, when):
                    self.events.push(when, ASK, p)
                case Ask(p, sync, _) if self.open[p] is None:
                    self.open[p], self.payloads[p] = (sync, self.asked_n[p]), {}
                    self.asked_n[p] += 1
                case Ask(p, _, _):
                    again.append(("ask", t, p, self.open[p][1]))
                case SetDeadline(p, sync, when):
                    self.events.push(when, DEADLINE, p, sync)
                case Close(p, _, weights, _, _, wait_s):
                    self._close(p, weights, wait_s, t, kind)
        return again

    def arrived(self, p: int, m: int, n: int, since: int, sent_at: float, payload, t) -> None:
        """Learner m's answer to the n-th sync of p (`since` steps, sent at `sent_at`) reached the
        syncer at t (one to a sync already closed, or of a learner down since, is left out:
        `actors.booking` books it so)."""
        o = self.open[p]
        if o is None or o[1] != n or not self.state.up[m]:
            return
        self.act(self.state.sent(p, m, o[0], since * self.tokens, since, sent_at), t)
        if self.state.holds(p, m, o[0]):
            self.payloads[p][m] = payload
        self.act(self.state.arrived(p, m, o[0], t), t, RESPONSE)

    def published(self, job: Merge, t: float) -> None:
        """`job`'s merge is published at t: the newest version of its fragment, booked."""
        actions = self.state.published(job.p, t)
        assert actions == [AskAt(job.p, job.next_ask)], (actions, job.next_ask)
        self.act(actions, t, PUBLISH)
        leaves, diag = job.result
        self.versions[job.p].append((t, leaves))
        self.books.syncer(t, PUBLISH, "publish", job.p, job.weights, job.receivers, job.wait_s,
                          leaves, diag)

    def back(self, m: int, t: float) -> tuple[list, list, list, list]:
        """Learner m is back at t: (its messages: the asks of the open syncs it had not
        answered, the asks to come, the publish notice of each merge in flight; the version of
        each fragment it loads, the newest published by t; their leaves; the merges in flight,
        whose replies it is to get)."""
        asks = self.act(self.state.back(m, t), t)
        asks += [("ask", when, p, self.asked_n[p]) for when, _, _, p, _ in
                 self.events.of_kind(ASK)]  # (those after a merge in flight come with it)
        flying = [job for *_, job in sorted(self.events.of_kind(PUBLISH))]
        held = [max(i for i, (at, _) in enumerate(v) if at <= t) for v in self.versions]
        fragments = [self.versions[p][i][1] for p, i in enumerate(held)]
        return asks + [self.notice(m, job) for job in flying], held, fragments, flying

    def notice(self, m: int, job: Merge) -> tuple:
        """The publish notice of `job` to learner m."""
        return ("publish", job.published_at, job.p, job.n, m in job.weights, job.next_ask)

    def reply_s(self, p: int, t: float) -> float:
        """t_reply: how long the merged fragment p takes to reach every learner up from t."""
        to = [m for m in range(self.M) if self.state.up[m]]
        return max(self.links.fan_out(to, self.down_nbytes[p], t, book=False), default=t) - t

    def _close(self, p: int, weights: dict, wait_s: float, t: float, kind: int) -> None:
        """The sync of p closes at t with `weights`: its merge, published when the links deliver
        the last reply to the learners up; each of them is told now, the reply once merged."""
        to = tuple(m for m in range(self.M) if self.state.up[m])
        at = max(self.links.fan_out(to, self.down_nbytes[p], t), default=t)
        n = self.open[p][1]
        answers = {m: self.payloads[p][m] for m in weights}
        job = Merge(p, n, weights, to, wait_s, answers, closed_at=t, published_at=at,
                    next_ask=self.state.next_ask(p, at))
        self.open[p] = None
        self.merges.add(job)
        self.events.push(at, PUBLISH, p, job)
        for m in to:
            self.mail.send(m, self.notice(m, job))
            self.merges.tell(job, m)
        self.books.syncer(t, kind, "close", p, n, weights)
