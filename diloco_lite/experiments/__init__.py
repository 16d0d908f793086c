"""The named training experiments of notebooks 02–04 and `python -m diloco_lite reproduce`.

    cfgs = groups(quick)["h_sweep"]                      # {label: RunConfig}
    histories = {label: train(cfg).history for label, cfg in cfgs.items()}
    charts = figures("h_sweep", histories)               # {figure name: altair chart}
    table = rows("h_sweep", histories)                   # results-table rows

| group                                   | notebook | module       |
|-----------------------------------------|----------|--------------|
| h_sweep, m_sweep, shards, streaming     | 02, 03   | `diloco`     |
| slow, chaos, ablations                  | 04       | `decoupled`  |
| tuning, quality, warm_start             | 04, 02   | `protocol`, `quality`: the papers' protocol |
| scaling (`make reproduce-scaling`)      | 02       | `scaling`: the scaling-law sweep, tuned |

Full mode: 8 workers × 16 sequences × 64 characters per step, 600 steps (reference H = 50).
Quick mode (`DILOCO_LITE_QUICK=1`, CI) keeps every group, label and code path but shrinks the
run: 40 steps, a 1-layer d=32 model, 4 sequences per worker (`base_config`), H scaled down
(reference H = 8) so that several syncs still happen. Every config leaves the optimizers at
their defaults (None), so `repr(config)` identifies a run (runs are cached by it).
"""

from __future__ import annotations

from ..config import RunConfig, check
from . import decoupled, diloco, protocol, quality, scaling
from .common import (  # noqa: F401  (re-exported: the notebooks use them)
    FULL_STEPS,
    H_REF,
    H_SWEEP,
    QUICK_MODEL,
    QUICK_STEPS,
    base_config,
    describe,
    matching_configs,
)

# protocol's tuning first: `make reproduce` checks its choice before the runs that use it
_MODULES = {**dict.fromkeys(diloco.GROUPS, diloco), **dict.fromkeys(decoupled.GROUPS, decoupled),
            "tuning": protocol, **dict.fromkeys(quality.GROUPS, quality),
            **dict.fromkeys(protocol.GROUPS, protocol), **dict.fromkeys(scaling.GROUPS, scaling)}
GROUPS = tuple(_MODULES)
# Groups with their own target (`make reproduce-scaling`: about 2¼ hours on 2 cores): `make
# reproduce` reads their runs from the cache when every one is there, and never trains them.
SEPARATE = scaling.GROUPS
SEPARATE_EXPERIMENTS = (scaling.EXPERIMENT,)  # the results-table experiment of their rows


def groups(quick: bool) -> dict[str, dict[str, RunConfig]]:
    """Group name -> {label: RunConfig}, for every group of every notebook."""
    out = {**diloco.groups(quick), **decoupled.groups(quick), **protocol.groups(quick),
           **quality.groups(quick), **scaling.groups(quick)}
    return {name: out[name] for name in GROUPS}


def figures(group: str, histories: dict) -> dict[str, object]:
    """Figure name -> Altair chart for `group`'s histories ({label: history or RunResult})."""
    check(group in GROUPS, "group", group, f"one of {GROUPS}")
    return _MODULES[group].figures(group, {k: getattr(v, "history", v)
                                           for k, v in histories.items()})


def rows(group: str, histories: dict) -> list[dict]:
    """Results-table rows (experiment, method, metric, value, published, config)."""
    check(group in GROUPS, "group", group, f"one of {GROUPS}")
    return _MODULES[group].rows(group, {k: getattr(v, "history", v)
                                        for k, v in histories.items()})


def streaming_label(algo) -> str:
    return diloco.streaming_label(algo)


def disagreements(group: str, histories: dict) -> list[str]:
    """Sentences for every recorded choice (`protocol.TUNED`, `scaling.CHOSEN`) that the
    group's runs no longer make; empty for the groups without choices."""
    module = {"tuning": protocol, "scaling": scaling}.get(group)
    return [] if module is None else module.disagreements(
        {k: getattr(v, "history", v) for k, v in histories.items()})
