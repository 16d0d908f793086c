"""Decoupled DiLoCo for real: asynchronous learners and the syncer as Ray actors.

- `learner`: one learner's program (its state on its own device; the shared inner step, wire
  format and mix);
- `syncer`: the syncer on the wall clock, driving the same `clock.syncer_state.SyncerState`
  and `clock.learner_rules.LearnerRules` as the simulated clock, booking with the same
  `Recorder`; `theta`: its numbers (Θ, the outer states, the merges);
- `ray_actors`: the two Ray actors (a learner's process, the syncer's);
- `runtime`: `train_actors(config)`: starts them, kills and restarts learners at the failure
  windows, flushes at the end.

Importing this package imports neither Ray nor JAX's backend; `train_actors` needs Ray (the
`cluster` extra).
"""


def train_actors(config, **kw):
    """See `diloco_lite.actors.runtime.train_actors`."""
    from .runtime import train_actors as run

    return run(config, **kw)
