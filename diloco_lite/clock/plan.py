"""A training run's plan: every inner step and every sync event, laid out on the simulated clock.

Nothing a method *schedules* depends on the numbers it computes, so the whole schedule is worked
out on the host before training starts: `make_plan(config, ...)` simulates the clock (the
lock-step barrier of DDP/DiLoCo/Streaming in `lockstep`, Decoupled DiLoCo's syncer in
`syncer`), which tell a `Recorder` what happens, and returns its `Plan` (`recorder` describes
the blocks and events of a plan, and how goodput is booked). The training loop then only
replays it on the device.
"""

from __future__ import annotations

from ..config import DDP, DecoupledDiLoCo
from . import Timeline
from .lockstep import plan_lockstep
from .recorder import Block, Event, Plan, Recorder
from .schedule import Schedule
from .syncer import plan_decoupled

__all__ = ["Block", "Event", "Plan", "Recorder", "make_plan"]


def make_plan(config, *, up_nbytes, down_nbytes, sizes, rejoin_nbytes: int,
              eval_at) -> Plan:
    """Simulate `config`'s clock and schedule (module docstring). `up_nbytes[p]`: one learner's
    payload for fragment p; `down_nbytes[p]`: the syncer's reply; `sizes[p]`: values in it."""
    algo = config.algorithm
    timeline = Timeline(config.cluster, config.workers)
    schedule = Schedule.of(algo)
    tokens = config.batch_size * config.seq_len
    rec = Recorder(timeline, up_nbytes=up_nbytes, down_nbytes=down_nbytes, sizes=sizes,
                   rejoin_nbytes=rejoin_nbytes, tokens_per_step=tokens,
                   mix=float(getattr(algo, "mix", 0.0)))
    if isinstance(algo, DecoupledDiLoCo):
        plan_decoupled(rec, schedule, timeline, algo, steps=config.steps, eval_at=set(eval_at),
                       tokens_per_step=tokens)
        return rec.finish()
    plan_lockstep(rec, schedule, timeline, steps=config.steps, elastic=algo.elastic,
                  ddp=isinstance(algo, DDP), eval_at=set(eval_at))
    plan = rec.finish()
    plan.hosts = None  # a lock-step exchange is a ring: `clock.exchange_cost`, not messages
    return plan
