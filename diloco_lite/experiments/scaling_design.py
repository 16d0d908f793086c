"""The scaling-law sweep (Charles et al. 2025, arXiv 2503.09799) at classroom scale, tuned.

Three model sizes, 10.6k to 109k parameters (10×), each trained on **40 tokens per parameter**
(`TOKENS_PER_PARAM`), at a global batch fixed per size (`SIZES`' third field, grown with the
model so that every size takes about the same number of steps: 24–27 outer steps at H = 32).
For each size: DDP, and DiLoCo with M ∈ {1, 2, 4, 8} workers sharing that global batch (M × B).

Why 40 and not the paper's 20: at 20 our smallest model would see 211k characters, 412 steps of
8 sequences (the fewest 8 workers can share), 13 outer steps at H = 32: too few syncs for DiLoCo
to say anything. 40 gives every size 24–27 outer steps, and the default model (109k) 4.4M
characters, about what the quality runs give it (4.9M). H = 32, not the paper's 30: it divides
by 4, for the batch runs below.

Every learning rate is chosen on the **tune plays**, every number reported on the **test plays**:
- DDP's inner lr from `INNER_LRS`, per size (seed 0);
- DiLoCo's outer lr from `OUTER_LRS`, per size and M, at DDP's inner lr (seed 0);
- whether DiLoCo's inner lr matters: M = 1 and 8 at the grid's neighbours of DDP's (×½, ×2);
- the chosen settings then run with seeds 1 and 2 too (`SEEDS`): the table reports the mean
  and standard deviation over the three, the gap to DDP paired by seed.
The choices are recorded in `CHOSEN` (what the seed runs use, so that the group stays static);
`disagreements` says when the grid's runs choose otherwise, and `reproduce-scaling` warns.

The batch finding (`LARGE_BATCH`): on every size, DDP and DiLoCo (every M on the two smaller
sizes, M = 8 on the largest) at 4× the global batch, on the same tokens, so a quarter of the
steps — and DiLoCo at H / 4, so that it takes the same number of outer steps: the batch is the
only change. Every lr is tuned again at that batch, DiLoCo's inner lr checked as at 1×.

The cause checks (`cause_cells`), on the two smaller sizes: 4× the outer steps on the same
tokens, and 4× the tokens at the same H (every lr chosen again, `CHOSEN_LONGER`), the batch
finding included. And the batch finding on the largest size from a smaller global batch
(`SMALL_BASE`, `CHOSEN_SMALL_BASE`): 3 sequences per worker at M = 8, not 10.

This group is not part of `make reproduce` (`SEPARATE`): its 362 runs took 133 min of training
on 2 cores (`make reproduce-scaling`). Quick mode keeps every code path on two tiny models.

This module is the design (sizes, grids, recorded choices, the runs); `scaling_findings` reads
the runs (the choices, the gaps, the batch rises, the cause checks), `scaling_report` turns them
into the paper's findings, figures and rows; `experiments.scaling` is all three.
"""

from __future__ import annotations

import dataclasses

from ..config import DDP, DiLoCo, ModelConfig, RunConfig

GROUPS = ("scaling",)
EXPERIMENT = "scaling law"  # the results table's experiment of its rows
SEQ_LEN = 64
# size -> (model, parameters, global batch in sequences). The counts are the model's with the
# corpus's 76-character vocabulary (tests/test_scaling.py checks them against the model).
SIZES = {
    False: {"11k": (ModelConfig(d_model=24, n_layers=1, n_heads=2), 10_560, 8),
            "30k": (ModelConfig(d_model=32, n_layers=2, n_heads=2), 29_760, 24),
            "109k": (ModelConfig(), 108_672, 80)},
    True: {"2k": (ModelConfig(d_model=8, n_layers=1, n_heads=2), 1_984, 8),
           "6k": (ModelConfig(d_model=16, n_layers=1, n_heads=2), 5_504, 16)},
}
TOKENS_PER_PARAM = {False: 40, True: 4}
H = {False: 32, True: 4}
INNER_LRS = {False: (1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2, 9.6e-2), True: (3e-3, 1e-2)}
OUTER_LRS = {False: (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2), True: (0.4, 1.0)}
SEEDS = {False: (0, 1, 2), True: (0, 1)}
WORKERS = (1, 2, 4, 8)
CHECK_INNER = (1, 8)  # the M whose inner lr is checked
LARGE_BATCH = 4
EVAL_BATCHES = {False: 16, True: 2}
# The causes (`cause_cells`): on the smaller sizes, 4× the outer steps, and 4× the tokens.
CAUSES = {False: ("11k", "30k"), True: ("2k",)}
MORE = 4
CAUSE_INNER_LRS = {False: (6e-3, 1.2e-2, 2.4e-2, 4.8e-2), True: (3e-3, 1e-2)}
CAUSE_OUTER_LRS = {False: (0.1, 0.2, 0.4, 0.6, 0.8), True: (0.4, 1.0)}
# The batch finding's cause: the largest size from a smaller global batch, that of a smaller
# size (30k's 24 sequences: 3 per worker at M = 8, where 109k's own 80 give 10).
SMALL_BASE = {False: 24, True: 8}

# The choices on the tune plays (`choices`), per (size, batch factor): DDP's inner lr ("DDP")
# and DiLoCo's outer lr per M. The seed runs, and the grids after DDP's, use these.
CHOSEN = {
    False: {("11k", 1): {"DDP": 2.4e-2, 1: 0.6, 2: 0.4, 4: 0.4, 8: 0.4},
            ("30k", 1): {"DDP": 2.4e-2, 1: 0.4, 2: 0.6, 4: 0.6, 8: 0.6},
            ("109k", 1): {"DDP": 4.8e-2, 1: 0.2, 2: 0.6, 4: 0.8, 8: 0.8},
            ("11k", 4): {"DDP": 2.4e-2, 1: 0.2, 2: 0.2, 4: 0.2, 8: 0.2},
            ("30k", 4): {"DDP": 2.4e-2, 1: 0.2, 2: 0.2, 4: 0.2, 8: 0.2},
            ("109k", 4): {"DDP": 2.4e-2, 8: 0.2}},
    True: {("2k", 1): {"DDP": 1e-2, 1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0},
           ("6k", 1): {"DDP": 1e-2, 1: 0.4, 2: 0.4, 4: 0.4, 8: 0.4},
           ("2k", 4): {"DDP": 1e-2, 1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0},
           ("6k", 4): {"DDP": 1e-2, 8: 1.0}},
}

# The same at 4× the tokens (160 per parameter), per size: DDP's inner lr and DiLoCo's outer lr.
# The last size also at 4× the batch (the batch finding in longer runs).
CHOSEN_LONGER = {False: {("11k", 1): {"DDP": 1.2e-2, 1: 0.4, 8: 0.6},
                         ("30k", 1): {"DDP": 1.2e-2, 1: 0.4, 8: 0.6},
                         ("30k", 4): {"DDP": 2.4e-2, 8: 0.4}},
                 True: {("2k", 1): {"DDP": 1e-2, 1: 1.0, 8: 0.4},
                        ("2k", 4): {"DDP": 1e-2, 8: 1.0}}}

# The same from `SMALL_BASE` (the batch finding's cause), on the largest size.
CHOSEN_SMALL_BASE = {False: {("109k", 1): {"DDP": 6e-3, 8: 0.8},
                             ("109k", 4): {"DDP": 2.4e-2, 8: 0.4}},
                     True: {("6k", 1): {"DDP": 1e-2, 8: 0.4},
                            ("6k", 4): {"DDP": 1e-2, 8: 1.0}}}


RECORDS = {"CHOSEN": CHOSEN, "CHOSEN_LONGER": CHOSEN_LONGER,
           "CHOSEN_SMALL_BASE": CHOSEN_SMALL_BASE}


def record_name(more_tokens: int = 1, base: int = 0) -> str:
    """Which record holds a run's choices: the sweep's (`CHOSEN`), at `MORE`× the tokens
    (`CHOSEN_LONGER`) or from `SMALL_BASE` (`CHOSEN_SMALL_BASE`)."""
    return "CHOSEN_LONGER" if more_tokens != 1 else "CHOSEN_SMALL_BASE" if base else "CHOSEN"


def recorded(quick: bool, size: str, factor: int, more_tokens: int = 1, base: int = 0) -> dict:
    """The recorded choices of a size at `factor`× its batch (`record_name` says which)."""
    return RECORDS[record_name(more_tokens, base)][quick][(size, factor)]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the sweep; `label` and `parse` are inverse (the histories are keyed by it)."""

    size: str
    factor: int  # the global batch, × the size's
    m: int  # 0: DDP
    inner_lr: float
    outer_lr: float | None
    seed: int
    more_syncs: int = 1  # H / more_syncs: that many times the outer steps, on the same tokens
    more_tokens: int = 1  # that many times the steps (and tokens), at the same H
    base: int = 0  # the global batch at 1× (sequences) when not the size's: `SMALL_BASE`

    @property
    def method(self) -> str:
        return "DDP" if self.m == 0 else f"M={self.m}"

    @property
    def label(self) -> str:
        outer = f" · outer lr {self.outer_lr:g}" if self.m else ""
        syncs = f" · outer steps ×{self.more_syncs}" if self.more_syncs != 1 else ""
        syncs += f" · tokens ×{self.more_tokens}" if self.more_tokens != 1 else ""
        syncs += f" · base batch {self.base}" if self.base else ""
        return (f"{self.size} · {self.factor}× batch · {self.method} · lr {self.inner_lr:g}"
                f"{outer}{syncs} · seed {self.seed}")

    @classmethod
    def parse(cls, label: str) -> Cell:
        size, factor, method, *knobs = label.split(" · ")
        values = {k: v for k, _, v in (p.rpartition(" ") for p in knobs)}
        return cls(size=size, factor=int(factor.split("×")[0]),
                   m=0 if method == "DDP" else int(method.split("=")[1]),
                   inner_lr=float(values["lr"]),
                   outer_lr=float(values["outer lr"]) if "outer lr" in values else None,
                   seed=int(values["seed"]),
                   more_syncs=int(values.get("outer steps", "×1").lstrip("×")),
                   more_tokens=int(values.get("tokens", "×1").lstrip("×")),
                   base=int(values.get("base batch", 0)))


def steps(quick: bool, size: str, base: int = 0) -> int:
    """The run length at the size's global batch (or `base`): `TOKENS_PER_PARAM` × parameters,
    in whole outer steps of H (the nearest)."""
    _, n_params, batch = SIZES[quick][size]
    batch, h = base or batch, H[quick]
    return h * max(1, round(TOKENS_PER_PARAM[quick] * n_params / (batch * SEQ_LEN * h)))


def config(quick: bool, cell: Cell) -> RunConfig:
    """The RunConfig of a cell: at `factor`× the batch, 1/factor of the steps and DiLoCo's H
    (the same tokens, the same outer steps); warm-up 1/16 of the run, 8 evaluations."""
    model, _, batch = SIZES[quick][cell.size]
    batch = cell.base or batch
    n = steps(quick, cell.size, cell.base) * cell.more_tokens // cell.factor
    workers = cell.m or 8
    algorithm = (DDP() if cell.m == 0
                 else DiLoCo(inner_steps=H[quick] // cell.factor // cell.more_syncs,
                             outer_lr=cell.outer_lr))
    return RunConfig(algorithm=algorithm, workers=workers,
                     batch_size=batch * cell.factor // workers, seq_len=SEQ_LEN, steps=n,
                     model=model, learning_rate=cell.inner_lr, warmup_steps=max(1, n // 16),
                     eval_every=max(1, n // 8), eval_batches=EVAL_BATCHES[quick], seed=cell.seed)


def cells(quick: bool) -> list[Cell]:
    """Every run, in the order that lets each stage use the choices of the one before: DDP's
    grids, DiLoCo's outer-lr grids, the inner-lr check, the seeds; then the same at 4× batch
    (every M on the cause sizes, M = 8 on the largest)."""
    out: list[Cell] = []
    sizes = list(SIZES[quick])
    for size, factor in [(s, 1) for s in sizes] + [(s, LARGE_BATCH) for s in sizes]:
        chosen = CHOSEN[quick][(size, factor)]
        ms = WORKERS if factor == 1 or size in CAUSES[quick] else (8,)
        out += [Cell(size, factor, 0, lr, None, 0) for lr in INNER_LRS[quick]]
        out += [Cell(size, factor, m, chosen["DDP"], o, 0) for m in ms for o in OUTER_LRS[quick]]
        out += [Cell(size, factor, m, lr, chosen[m], 0) for m in CHECK_INNER if m in ms
                for lr in neighbours(INNER_LRS[quick], chosen["DDP"])]
        for seed in SEEDS[quick][1:]:
            out += [Cell(size, factor, 0, chosen["DDP"], None, seed)]
            out += [Cell(size, factor, m, chosen["DDP"], chosen[m], seed) for m in ms]
    return out + cause_cells(quick)


def cause_cells(quick: bool) -> list[Cell]:
    """The checks of why DiLoCo trails DDP at our scale, on the smaller sizes (`CAUSES`), for M
    in `CHECK_INNER`: `MORE`× the outer steps on the same tokens (H / 4; seed 0, the outer lr
    chosen on the tune plays), and `MORE`× the tokens at the same H (every lr chosen again,
    recorded in `CHOSEN_LONGER`; seeds 0 and 1); on the last of them, the batch finding again
    at `MORE`× the tokens (DDP and M = 8 at `LARGE_BATCH`× the batch, H / 4). And the batch
    finding on the largest size from `SMALL_BASE` (1× and `LARGE_BATCH`×, DDP's inner lr and
    M = 8's outer lr chosen again from the sweep's grids, recorded in `CHOSEN_SMALL_BASE`;
    seeds 0 and 1)."""
    out: list[Cell] = []
    keys = [(size, 1) for size in CAUSES[quick]] + [(CAUSES[quick][-1], LARGE_BATCH)]
    for size, factor in keys:
        if factor == 1:
            inner = CHOSEN[quick][(size, 1)]["DDP"]
            out += [Cell(size, 1, m, inner, o, 0, more_syncs=MORE) for m in CHECK_INNER
                    for o in CAUSE_OUTER_LRS[quick]]
        longer = CHOSEN_LONGER[quick][(size, factor)]
        ms = CHECK_INNER if factor == 1 else (8,)
        out += [Cell(size, factor, 0, lr, None, 0, more_tokens=MORE)
                for lr in CAUSE_INNER_LRS[quick]]
        out += [Cell(size, factor, m, longer["DDP"], o, 0, more_tokens=MORE) for m in ms
                for o in CAUSE_OUTER_LRS[quick]]
        out += [Cell(size, factor, m, longer["DDP"], longer[m] if m else None, 1,
                     more_tokens=MORE) for m in (0, *ms)]
    size, base = list(SIZES[quick])[-1], SMALL_BASE[quick]
    for factor in (1, LARGE_BATCH):
        rec = CHOSEN_SMALL_BASE[quick][(size, factor)]
        out += [Cell(size, factor, 0, lr, None, 0, base=base) for lr in INNER_LRS[quick]]
        out += [Cell(size, factor, 8, rec["DDP"], o, 0, base=base) for o in OUTER_LRS[quick]]
        out += [Cell(size, factor, m, rec["DDP"], rec[m] if m else None, 1, base=base)
                for m in (0, 8)]
    return out


def neighbours(grid, value) -> list[float]:
    i = list(grid).index(value)
    return [grid[j] for j in (i - 1, i + 1) if 0 <= j < len(grid)]


def groups(quick: bool) -> dict[str, dict[str, RunConfig]]:
    return {"scaling": {c.label: config(quick, c) for c in cells(quick)}}


def quick_of(histories: dict) -> bool:
    """Whether `histories` are of the quick sweep (its sizes)."""
    size = Cell.parse(next(iter(histories))).size
    return size in SIZES[True] and size not in SIZES[False]
