"""What the experiment groups share: the base run, the reference H, a config's one-line summary
and the lookup of the configs behind a group's histories (`experiments` re-exports them)."""

from __future__ import annotations

from ..config import DDP, ModelConfig, RunConfig

FULL_STEPS, QUICK_STEPS = 600, 40
H_SWEEP = {False: (1, 10, 50, 200), True: (1, 4, 8, 20)}
H_REF = {False: 50, True: 8}  # the DiLoCo H every other group uses
QUICK_MODEL = ModelConfig(d_model=32, n_layers=1, n_heads=2)


def base_config(quick: bool, **overrides) -> RunConfig:
    """The default run: DDP, 8 workers × 16 sequences × 64 characters, default model, default
    AdamW inner optimizer, 600 steps. Quick: 40 steps of a 1-layer d=32 model on 4 sequences
    per worker, at a higher peak lr (1e-2) with a 5-step warm-up, evaluated on 2 batches —
    smaller numbers, same code paths."""
    base = dict(algorithm=DDP(), workers=8, batch_size=16, seq_len=64, steps=FULL_STEPS)
    if quick:
        base.update(steps=QUICK_STEPS, batch_size=4, model=QUICK_MODEL, learning_rate=1e-2,
                    warmup_steps=5, eval_batches=2)
    base.update(overrides)
    return RunConfig(**base)


def describe(cfg: RunConfig) -> str:
    """A one-line summary of a config for the results table."""
    a = cfg.algorithm
    fields = {"inner_steps": "H", "fragments": "P", "fragmentation": "", "overlap": "tau",
              "mix": "alpha", "bits": "bits", "down_bits": "down_bits", "quorum": "K",
              "grace_safety": "grace", "merge": "merge", "elastic": "elastic"}
    algo = " ".join([a.name] + [f"{s}={getattr(a, f)}" if s else str(getattr(a, f))
                                for f, s in fields.items() if hasattr(a, f)])
    m = cfg.model
    lr = getattr(a, "outer_lr", None)
    algo += f" outer_lr={lr:g}" if lr is not None else ""
    text = (f"{algo}; M={cfg.workers} B={cfg.batch_size}/worker L={cfg.seq_len} "
            f"steps={cfg.steps} split={cfg.split} model d={m.d_model} layers={m.n_layers}")
    text += f"; {cfg.cluster}" if cfg.cluster is not None else ""
    if cfg.warm_start is not None:
        text += f"; warm start: {cfg.warm_start.steps} steps of [{describe(cfg.warm_start)}]"
    return text


def matching_configs(groups_of, group: str, histories: dict) -> dict[str, RunConfig]:
    """`groups_of(quick)[group]` for the mode (full, else quick) whose labels and run lengths
    match the histories', so that a results row names the config that produced it; else {}."""
    for quick in (False, True):
        cfgs = groups_of(quick)[group]
        if all(k in cfgs and abs(h.step.iloc[-1] - cfgs[k].steps) < 1e-9
               for k, h in histories.items()):
            return cfgs
    return {}
