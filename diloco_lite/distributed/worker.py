"""One process of a multi-process run: `python -m diloco_lite.distributed.worker JOB K PARENT`.

Started by `launch.launch` (never by hand) as process K; PARENT is the launcher's pid (the
process ends when the launcher does). It reads the job (a pickled `Job`), emulates its CPU
devices, joins the others with `jax.distributed.initialize` over gloo's TCP collectives
(process 0's coordination service bound to the launch's address, `Job.coordinator`; that
argument and the heartbeat's exist from jax 0.7.2, Colab's, to 0.10), and runs
`train(config)` for each config of the job (with `launch`'s `set_links`, its link rate set on
the testbed first): the worker mesh spans every process's devices,
each process builds and places only its own workers' batches. Process 0 alone evaluates and
writes the results (pickled, atomically, to `Job.out`); the others exit 0.

Any exception ends the process at once with code 1 (`os._exit`, after the traceback): waiting
for `jax.distributed.shutdown`'s barrier would hang on a peer that is gone. The launcher then
ends the other processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import pickle
import signal
import sys
import traceback
from pathlib import Path

from .job import Job, resolve_configs

EXIT_FAILED = 1


def die_with(parent: int) -> None:
    """End this process when the launcher `parent` dies (Linux `PR_SET_PDEATHSIG`; elsewhere
    the coordination service's heartbeat ends it later)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before we asked
        os._exit(EXIT_FAILED)


def main(job_path: str, process_id: int) -> int:
    job: Job = pickle.loads(Path(job_path).read_bytes())
    import diloco_lite as dl

    dl.emulate_devices(job.devices_per_process)  # before any JAX backend starts
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # process 0's coordination service listens on the launch's own address only (by default
    # JAX binds it to every interface, [::]:port, and it has no authentication)
    jax.distributed.initialize(coordinator_address=job.coordinator, num_processes=job.processes,
                               process_id=process_id, initialization_timeout=120,
                               heartbeat_timeout_seconds=job.heartbeat_s,
                               coordinator_bind_address=job.coordinator)
    configs = resolve_configs(job.configs)
    results, rate = [], None
    for c in configs:
        want = c.cluster.link.gbit_per_s if c.cluster is not None else rate
        if job.testbed_hosts is not None and want != rate and want != float("inf"):
            rate = want  # `launch`'s set_links
            if process_id == 0:
                from .testbed import set_rate

                set_rate(job.testbed_hosts, rate)
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"link at {rate} Gbit/s")  # all after it
        results.append(dl.train(c, progress=job.progress, pace_s=job.pace_s))
    if process_id == 0:
        # the launcher re-attaches the configs (a config may hold closures, e.g. optax's)
        plain = [dataclasses.replace(r, config=None) for r in results]
        tmp = Path(job.out).with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(plain))
        os.replace(tmp, job.out)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    try:
        die_with(int(sys.argv[3]))
        code = main(sys.argv[1], int(sys.argv[2]))
    except BaseException:  # noqa: BLE001 - any failure: say why, then leave at once
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
