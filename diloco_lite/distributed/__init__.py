"""The same runs on several processes and real links (issue 17).

- `launch.launch(configs, processes, devices_per_process)`: N local processes joined by
  `jax.distributed` (gloo collectives on CPU), one worker mesh over all their devices, one
  `train(config)` each; process 0's results come back. How to run the same code on a real
  multi-host machine: `launch`'s docstring and docs/systems.md.
- `worker`: what each of those processes runs.
- `testbed.Testbed`: each process in its own network namespace behind a throttled link, with
  the bytes that really left each host counted.

Importing this package starts no JAX backend and no process.
"""

from .launch import LaunchError, launch

__all__ = ["LaunchError", "launch"]
