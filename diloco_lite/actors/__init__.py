"""Decoupled DiLoCo for real: asynchronous learners and the syncer as Ray actors.

- `learner`: one learner's program (its state on its own device; the shared inner step, wire
  format and mix);
- `agent`: one learner's rules on the wall clock (the simulated clock's
  `clock.learner_side.LearnerSide`), run in the learner's process on what the syncer told it
  ahead of time: no call at its step boundaries, but where a notice not heard yet could change
  what it does there;
- `syncer`: the syncer on the wall clock, driving the same `clock.syncer_state.SyncerState`
  as the simulated clock; its parts, an object each: `timers` (its events in order, its
  clock), `syncs` (the state machine's actions carried out), `merging` (its merges, and the
  end), `rejoins`, `roster` (where the learners are between their reports), `mailbox` (its
  numbered messages to each learner's process), `budget` (where each learner stops) and
  `booking` (the run booked on the same `Recorder`, from the learners' reports, in
  `clock.booking`'s order); `theta`: its numbers (Θ, the outer states, the merges);
- `ray_actors`: the two Ray actors (a learner's process; the syncer's: `syncer_actor`), and
  `inbox`: their numbered messages taken in order, a lost one sent again;
- `pool`: the processes of a run, with a warm spare per learner;
- `runtime`: `train_actors(config)`: starts them, kills learners at the failure windows and
  puts spares in their place, flushes at the end.

Importing this package imports neither Ray nor JAX's backend; `train_actors` needs Ray (the
`cluster` extra).
"""


def train_actors(config, **kw):
    """See `diloco_lite.actors.runtime.train_actors`."""
    from .runtime import train_actors as run

    return run(config, **kw)
