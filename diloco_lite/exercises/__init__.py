"""Exercises that check themselves: `check_*` functions for the exercise notebooks.

Each check takes the student's function or number, compares it with a reference computed
independently (here, by the stable library pieces `outer`, `wire`, `bandwidth`,
`goodput_closed`, or by the readable reference `diloco_lite.reference`), and prints one line:
`✔ title: ...` or `✘ title: <what is wrong>`. It recognises the classic mistakes and names them
(the M× gradient of `jax.grad` inside a `check_vma=True` `shard_map`, a pseudo-gradient with
the wrong sign, a failed learner kept in the quorum, ...) and says where to look, never the
formula or the expected number; an exception in the student's code or a still-blank `...`
becomes a sentence, never a traceback. A check returns a `Result` (`ok`, `mistake`, `message`)
and never raises, so a blank notebook runs top to bottom. The references the checks compare
with are private to their modules: a student notebook imports the checks and the data they
show (`SyncerRules`, `APPLY_CASES`, ...), never an answer.

| notebook | checks |
|---|---|
| 00 devices | `check_global_max`, `check_allreduce_bytes`, `check_mean_loss` |
| 01 DDP | `check_ddp_gradient`, `check_ddp_step_bytes` |
| 02 DiLoCo | `check_pseudo_gradient`, `check_outer_step`, `check_next_round`, |
|  | `check_diloco_loop` (a whole training loop, against `reference.diloco`) |
| 03 Streaming | `check_quantizer`, `check_wire_bytes`, `check_mix`, `check_streaming_round` |
|  | (one round on stacked workers, against `reference.streaming`) |
| 04 Decoupled | `check_token_weights`, `check_close_time`, `check_syncer` (the syncer as an |
|  | event handler, driven over three runs of `reference.decoupled`: `eventloop.py`), |
|  | `check_rda_merge`, `check_run_goodput` |
| 05 bandwidth | `check_ddp_bandwidth`, `check_decoupled_bandwidth` |
| 06 goodput | `check_cluster_mtbf`, `check_young_interval`, `check_daly_interval`, |
|  | `check_domain_goodput` |
| 07 real links | `check_gather_bytes`, `check_sync_time` |
| 08 actors | `check_apply_position`, `check_kill_goodput`, `check_kill_timing` |

Solutions live in `notebooks/exercises/solutions/`; the blank notebooks in
`notebooks/exercises/` are generated from them (`blank.py`).

For teachers:

    make student-pack                       # build/student-pack/: the blank .ipynb, a README
    python -m diloco_lite.exercises grade 04_decoupled_diloco.ipynb

`grade` (`grade.py`) runs a returned notebook in a fresh kernel, in quick mode, reads each
check's verdict (a check also appends it, as a JSON line, to the file
`$DILOCO_LITE_GRADE_RECORD` names), prints one line per exercise (pass; fail and the named
mistake; not run) and a summary, and exits 0 only when every exercise passes and no cell
raised (1 otherwise, 2 when the file cannot be graded). `pack` (`pack.py`) writes the pack.
"""

from ._core import CHECKS, Result
from .actors import check_apply_position, check_kill_goodput, check_kill_timing
from .assemble import StreamingState, check_diloco_loop, check_streaming_round
from .collectives import (
    check_allreduce_bytes,
    check_ddp_gradient,
    check_ddp_step_bytes,
    check_global_max,
    check_mean_loss,
)
from .decoupled import check_close_time, check_run_goodput, check_token_weights
from .diloco import (
    check_mix,
    check_next_round,
    check_outer_step,
    check_pseudo_gradient,
    check_quantizer,
    check_rda_merge,
    check_wire_bytes,
)
from .eventloop import SyncerRules, check_syncer
from .links import check_gather_bytes, check_sync_time
from .systems import (
    check_cluster_mtbf,
    check_daly_interval,
    check_ddp_bandwidth,
    check_decoupled_bandwidth,
    check_domain_goodput,
    check_young_interval,
)

__all__ = [
    "CHECKS", "Result",
    "check_global_max", "check_allreduce_bytes", "check_mean_loss",
    "check_ddp_gradient", "check_ddp_step_bytes",
    "check_pseudo_gradient", "check_outer_step", "check_next_round", "check_diloco_loop",
    "check_quantizer", "check_wire_bytes", "check_mix", "check_streaming_round", "StreamingState",
    "check_token_weights", "check_close_time", "check_syncer", "SyncerRules", "check_rda_merge",
    "check_run_goodput",
    "check_ddp_bandwidth", "check_decoupled_bandwidth",
    "check_cluster_mtbf", "check_young_interval", "check_daly_interval", "check_domain_goodput",
    "check_gather_bytes", "check_sync_time",
    "check_apply_position", "check_kill_goodput", "check_kill_timing",
]
