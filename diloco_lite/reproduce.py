"""`python -m diloco_lite reproduce`: every experiment behind `figures/` and the results table.

- Training experiments come from `experiments.groups(quick)`. Each finished run is cached under
  `runs/` (git-ignored) as a CSV history keyed by a hash of its config *and of the training
  source code* (`run_key`), written atomically, so an interrupted `reproduce` resumes where it
  stopped without redoing finished runs, and a fix to the code never serves stale numbers.
- It trains on 2 emulated devices (`__main__.REPRODUCE_DEVICES`: 4 workers vmapped on each,
  faster on 2 cores than 8 single-worker devices); the notebooks train the same runs on 8. The
  key leaves the layout out, so the two share runs: their numbers agree to float-rounding drift
  (docs/reproduction.md, "Two commands"), and each run's `<key>.txt` records what trained it.
- The bandwidth and goodput reproductions come from `bandwidth_report` and `goodput_report`;
  the real-link measurements (`links`: processes on the testbed's throttled hosts, needs root
  and iproute2, else times on loopback) from `distributed.measure`.
- Results land in `figures/results.md` and `figures/results.json`: every number next to the
  published one (where there is one) and the config that produced it.

Quick mode (`--quick` or DILOCO_LITE_QUICK=1) shrinks steps, writes figures to the git-ignored
`figures/quick/` and caches runs in `runs/quick/`.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import __version__, paths, plots

JOBS = ("training", "bandwidth", "goodput", "links", "actors", "versus")
# A results row. `std` and `seeds` are set by the rows that average over seeds (the quality
# table: value is then the mean, std the sample standard deviation); None elsewhere.
COLUMNS = ("experiment", "method", "metric", "value", "std", "seeds", "published", "config",
           "note")


def runs_dir(quick: bool) -> Path:
    return paths.runs_dir(quick)


# What a training run's numbers depend on: every module but the figures, the reports, the
# simulators and the commands. A change to any of them makes every cached run stale.
NOT_TRAINING = ("plots", "systems", "exercises", "experiments", "reproduce.py", "bench.py",
                "profile.py", "notebook_sync.py", "paths.py", "__main__.py", "distributed",
                "actors")


@functools.cache
def source_hash(package: Path | None = None) -> str:
    """sha1 of the library's training code (`NOT_TRAINING` left out), in path order: each file's
    syntax tree without its docstrings and comments, so that editing prose keeps the cache."""
    package = Path(package) if package is not None else Path(__file__).resolve().parent
    digest = hashlib.sha1()
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in NOT_TRAINING:
            continue
        digest.update(str(rel).encode() + b"\0" + _code_only(path.read_text()).encode() + b"\0")
    return digest.hexdigest()


def _code_only(source: str) -> str:
    """The syntax tree of `source` as text, docstrings removed (comments never reach it)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                and isinstance(first.value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def run_key(config) -> str:
    """A key for a config and the code that trains it: sha1 of the version, the training source
    (`source_hash`) and the config's repr (default optimizers only, so the repr is stable)."""
    return hashlib.sha1(f"{__version__}|{source_hash()}|{config!r}".encode()).hexdigest()[:16]


def run_cached(config, directory: Path, *, progress: bool = True) -> pd.DataFrame:
    """The history of `config`, from `directory` if it already ran, else trained and saved (a
    warm-started run takes its warm start's parameters from `params_cached`)."""
    _check_cacheable(config)
    path = directory / f"{run_key(config)}.csv"
    if path.exists():
        return pd.read_csv(path)
    return _train_and_save(config, directory, progress).history


def params_cached(config, directory: Path, *, progress: bool = True) -> dict:
    """The final parameters of `config` (a warm start, trained once for every run that starts
    from it): `<key>.params.npz` beside its history, else trained and saved with it."""
    _check_cacheable(config)
    path = directory / f"{run_key(config)}.params.npz"
    if path.exists():
        with np.load(path) as z:
            return _unflatten({k: z[k] for k in z.files})
    return _train_and_save(config, directory, progress, keep_params=True).params


def _check_cacheable(config) -> None:
    while config is not None:
        if config.inner_optimizer is not None or getattr(config.algorithm, "outer_optimizer",
                                                         None):
            raise ValueError("run_cached needs default (None) optimizers so that its cache key "
                             "is stable; got a custom optimizer")
        config = config.warm_start


def _train_and_save(config, directory: Path, progress: bool, keep_params: bool = False):
    from .training import train

    init = (params_cached(config.warm_start, directory, progress=progress)
            if config.warm_start is not None else None)
    result = train(config, progress=progress, init_params=init)
    directory.mkdir(parents=True, exist_ok=True)
    key = run_key(config)
    if keep_params:
        _atomic(directory / f"{key}.params.npz",
                lambda f: np.savez(f, **_flatten(_to_numpy(result.params))))
    _atomic(directory / f"{key}.csv", lambda f: result.history.to_csv(f, index=False), "w")
    (directory / f"{key}.txt").write_text(f"{config!r}\n# trained by {_layout()}\n")
    return result


def _layout() -> str:
    """What trained a run (not in its key: the layouts agree to float-rounding drift,
    docs/reproduction.md)."""
    import jax

    devices = jax.devices()
    return f"jax {jax.__version__} on {len(devices)} {devices[0].platform} device(s)"


def _atomic(path: Path, write, mode: str = "wb") -> None:
    """Write through a temporary file and rename: a file is either whole or absent."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, mode) as f:
        write(f)
    tmp.replace(path)


def _to_numpy(tree):
    import jax

    return jax.tree.map(np.asarray, jax.device_get(tree))


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *path, last = key.split("/")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


class Session:
    """A notebook's experiments, shared with `make reproduce`: a group's runs come from the
    `runs/` cache when they already ran (trained and cached when not), and its figures are saved
    under `figures/` (quick mode: `figures/quick/`) and shown.

        session = Session(quick)
        h_sweep = session.run_group("h_sweep")     # {label: history}
        session.show("h_sweep", h_sweep)           # save every figure, display them
    """

    def __init__(self, quick: bool, progress: bool = True):
        from . import experiments

        self.quick, self.progress = quick, progress
        self.groups = experiments.groups(quick)

    def run(self, config) -> pd.DataFrame:
        """The history of one config (default optimizers), from the cache or trained."""
        return run_cached(config, runs_dir(self.quick), progress=self.progress)

    def run_group(self, name: str) -> dict[str, pd.DataFrame]:
        return {label: self.run(cfg) for label, cfg in self.groups[name].items()}

    def cached_group(self, name: str) -> dict[str, pd.DataFrame] | None:
        """The group's histories when every run is in the cache (nothing trained), else None:
        for the groups of `experiments.SEPARATE`, too long to train from a notebook."""
        paths = {label: runs_dir(self.quick) / f"{run_key(cfg)}.csv"
                 for label, cfg in self.groups[name].items()}
        if not all(p.exists() for p in paths.values()):
            return None
        return {label: pd.read_csv(p) for label, p in paths.items()}

    def config(self, **overrides):
        """This mode's base run (`RunConfig`: DDP, 8 workers; quick: a smaller model, 40 steps,
        4 sequences per worker) with `overrides`."""
        from .experiments import base_config

        return base_config(self.quick, **overrides)

    def rows(self, name: str, histories: dict) -> pd.DataFrame:
        """Group `name`'s rows of the results table (what `make reproduce` writes for it)."""
        from . import experiments

        return pd.DataFrame(experiments.rows(name, histories), columns=list(COLUMNS))

    def table(self, name: str, histories: dict) -> pd.DataFrame:
        """A group's summary: "ablations" (each one's accuracy change, beside the paper's) or
        "chaos" (goodput measured beside notebook 06's closed forms, failures met)."""
        from .experiments import decoupled
        from .validate import check

        tables = {"ablations": decoupled.ablation_table, "chaos": decoupled.chaos_table}
        check(name in tables, "name", name, f"one of {tuple(tables)}")
        return tables[name](histories)

    def show(self, name: str, histories: dict, only=None) -> None:
        """Save every figure of group `name`; display those in `only` (default: all)."""
        from IPython.display import display

        from . import experiments

        for fig, chart in experiments.figures(name, histories).items():
            plots.save(chart, fig)
            if only is None or fig in only:
                display(chart)


def training_job(figures_dir: Path, quick: bool, progress: bool = True,
                 groups: tuple[str, ...] | None = None) -> list[dict]:
    """Every training group (or those in `groups`): runs, figures, rows. The tuning group runs
    first; when its runs choose another outer lr than `protocol.TUNED` records, it says so (the
    runs after it use the recorded one). By default (`groups` None) the groups of
    `experiments.SEPARATE` are only read: from the cache when every run is there, else skipped
    (their rows stay as they are in the results table), never trained."""
    from . import experiments

    rows = []
    for group, configs in experiments.groups(quick).items():
        if groups is not None and group not in groups:
            continue
        if groups is None and group in experiments.SEPARATE:
            missing = sum(not (runs_dir(quick) / f"{run_key(c)}.csv").exists()
                          for c in configs.values())
            if missing:
                print(f"[reproduce] group '{group}' has its own target (make reproduce-"
                      f"{group}): {missing} of its {len(configs)} runs are not cached under "
                      "the current code, so its rows and figures are left as they are",
                      flush=True)
                continue
        print(f"[reproduce] training group '{group}': {len(configs)} runs", flush=True)
        start = time.perf_counter()
        histories = {label: run_cached(cfg, runs_dir(quick), progress=progress)
                     for label, cfg in configs.items()}
        for name, chart in experiments.figures(group, histories).items():
            plots.save(chart, name, figures_dir)
        rows += experiments.rows(group, histories)
        print(f"[reproduce] group '{group}' done in {time.perf_counter() - start:.0f} s",
              flush=True)
        if not quick:
            for sentence in experiments.disagreements(group, histories):
                print(f"[reproduce] WARNING: {sentence}", flush=True)
    return rows


def reproduce(*, quick: bool = False, only: tuple[str, ...] = JOBS, figures_dir=None,
              progress: bool = True, groups: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Run the selected jobs (and of the training job, the selected `groups`: default all),
    write the results table (keeping the rows of what was not re-run), return it."""
    from . import experiments
    from .config import check

    for job in only:
        check(job in JOBS, "only", job, f"a subset of {JOBS}")
    for group in groups or ():
        check(group in experiments.GROUPS, "groups", group, f"a subset of {experiments.GROUPS}")
    figures_dir = Path(figures_dir) if figures_dir else paths.figures_dir(quick)
    if "training" in only:
        from .devices import enable_compilation_cache

        enable_compilation_cache()  # a sweep recompiles the same programs: keep them on disk
    rows = []
    for job in only:
        start = time.perf_counter()
        if job == "training":
            rows += training_job(figures_dir, quick, progress, groups)
        elif job == "bandwidth":
            from .systems import bandwidth_report

            rows += bandwidth_report.reproduce_job(figures_dir, quick)
        elif job == "goodput":
            from .systems import goodput_report

            rows += goodput_report.reproduce_job(figures_dir, quick)
        elif job == "links":  # real processes over the testbed's throttled links (issue 17)
            from .distributed import measure

            rows += measure.reproduce_job(figures_dir, quick)
        elif job == "actors":  # Decoupled DiLoCo on Ray actors against the simulated clock
            from .actors import measure as actors_measure

            rows += actors_measure.reproduce_job(figures_dir, quick)
        else:  # every method over the testbed's slow links, and the decoupling rows (issue 37)
            from .actors import versus

            rows += versus.reproduce_job(figures_dir, quick)
        print(f"[reproduce] {job} done in {time.perf_counter() - start:.0f} s", flush=True)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    # a separate group that was not read keeps its rows (training_job said so)
    keep = tuple(e for e in experiments.SEPARATE_EXPERIMENTS if e not in set(table.experiment))
    write_results(table, figures_dir, merge=set(only) != set(JOBS) or groups is not None,
                  keep=keep)
    return table


def write_results(table: pd.DataFrame, figures_dir: Path, merge: bool = False,
                  keep: tuple[str, ...] = ()) -> None:
    """`results.json` and `results.md` in `figures_dir`; with `merge`, keep the rows of the
    experiments that were not re-run, and each experiment where it was in the table; without,
    keep only those of the experiments in `keep`."""
    from .experiments import published

    figures_dir.mkdir(parents=True, exist_ok=True)
    path = figures_dir / "results.json"
    if (merge or keep) and path.exists():
        old = pd.DataFrame(json.loads(path.read_text()))
        if not merge:
            old = old[old.experiment.isin(keep)]
        order = {e: i for i, e in enumerate(dict.fromkeys([*old.experiment, *table.experiment]))}
        old = old[~old.experiment.isin(table.experiment.unique())]
        table = pd.concat([old, table], ignore_index=True)
        table = table.sort_values("experiment", key=lambda e: e.map(order), kind="stable")
    table = table.reindex(columns=list(COLUMNS))  # rows of an older table lack std and seeds
    records = [{k: _clean(v) for k, v in r.items()} for r in table.to_dict("records")]
    for r in records:
        r["seeds"] = None if r["seeds"] is None else int(r["seeds"])
        r["note"] = published.note(r)  # always from the current notes, never a stale one
    path.write_text(json.dumps(records, indent=1) + "\n")
    lines = ["# Results", "",
             "Generated by `make reproduce` (`python -m diloco_lite reproduce`); do not edit.",
             "Protocol rows (experiment `quality`, `protocol …`) report the test plays; "
             "their hyperparameters were chosen on the tune plays.",
             "", "| experiment | method | metric | ours | published | note | config |",
             "|---|---|---|---:|---:|---|---|"]
    for r in records:
        ours = _fmt(r["value"])
        if r.get("std") is not None:
            ours += f" ± {_fmt(r['std'])} ({r['seeds']} seeds)"
        pub = _fmt(r["published"]) if r["published"] is not None else "none"
        lines.append(f"| {r['experiment']} | {r['method']} | {r['metric']} | {ours} "
                     f"| {pub} | {r['note']} | {r['config']} |")
    (figures_dir / "results.md").write_text("\n".join(lines) + "\n")


def _clean(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return v.item() if hasattr(v, "item") else v


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)
