"""Notebooks 02–03's experiments: DDP, DiLoCo and Streaming DiLoCo at equal tokens.

Groups (full mode: 8 workers × 16 sequences × 64 characters per step, 600 steps):

- `h_sweep`: DDP and DiLoCo H ∈ {1, 10, 50, 200}, all at equal tokens;
- `m_sweep`: DiLoCo (H=50) on M ∈ {1, 2, 4, 8} workers with the **global batch held fixed**
  **(choice)**, so that every run sees the same tokens and does the same compute; the question
  is what it costs to split one job over more workers that talk less, not whether more data
  helps. DDP (same global batch) for reference. These are the protocol's runs (`protocol`:
  32 sequences per step, 2,400 steps, 48 outer steps), the default-model cell of its scaling
  sweep;
- `shards`: DDP and DiLoCo (H=50) on i.i.d. vs by-genre (non-i.i.d.) shards;
- `streaming`: DDP, DiLoCo H=50 and Streaming DiLoCo with P=4 fragments (balanced vs layers),
  overlap τ ∈ {0, 1, 5}, mixing α ∈ {0, 0.5} and bits ∈ {32, 4}.

Quick mode: H ∈ {1, 4, 8, 20}, reference H = 8 (see the package docstring).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from ..config import DiLoCo, RunConfig, StreamingDiLoCo
from .common import H_REF, H_SWEEP, base_config, describe, matching_configs

GROUPS = ("h_sweep", "m_sweep", "shards", "streaming")

# Published figures (docs/algorithms.md §7) the rows are compared with.
PUBLISHED = {
    "diloco_ppl_vs_dp": 15.02 / 15.30,  # DiLoCo 150M, M=8, H=500 vs 8x-batch data-parallel
    "diloco_noniid_vs_iid": 15.02 / 15.08,  # final perplexity, non-i.i.d. vs i.i.d. shards
    "streaming_bytes_reduction": 4418 / 11,  # 400x fewer bytes than data-parallel (1B, Dolma)
    "streaming_loss_vs_dp": 2.45 / 2.45,  # same loss as data-parallel
    "streaming_peak_reduction": 8.0,  # peak bandwidth about 8x lower than DiLoCo
    "overlap_cost_pct": 0.2,  # tau <= 5 inner steps costs < 0.2%
    "four_bit_loss_ratio": 1.0,  # 4-bit outer gradients: no measurable regression
}


def groups(quick: bool) -> dict[str, dict[str, RunConfig]]:
    """Group name -> {label: RunConfig} (see the module docstring)."""
    base = base_config(quick)
    h = H_REF[quick]
    ddp = base
    diloco = dataclasses.replace(base, algorithm=DiLoCo(inner_steps=h))

    h_sweep = {"DDP": ddp}
    for k in H_SWEEP[quick]:
        h_sweep[f"DiLoCo H={k}"] = dataclasses.replace(base, algorithm=DiLoCo(inner_steps=k))

    from .protocol import m_sweep as protocol_m_sweep

    m_sweep = protocol_m_sweep(quick)

    shards = {
        "DDP": ddp,
        "DDP by genre": dataclasses.replace(ddp, split="by_genre"),
        f"DiLoCo H={h} iid": diloco,
        f"DiLoCo H={h} by genre": dataclasses.replace(diloco, split="by_genre"),
    }

    variants = [  # (fragments, fragmentation, overlap, mix, bits)
        (4, "balanced", 0, 0.0, 32),
        (4, "layers", 0, 0.0, 32),
        (4, "balanced", 1, 0.0, 32),
        (4, "balanced", 5, 0.0, 32),
        (4, "balanced", 1, 0.5, 32),
        (4, "balanced", 1, 0.5, 4),
    ]
    streaming = {"DDP": ddp, f"DiLoCo H={h}": diloco}
    for p, how, tau, alpha, bits in variants:
        algo = StreamingDiLoCo(inner_steps=h, fragments=p, fragmentation=how, overlap=tau,
                               mix=alpha, bits=bits)
        streaming[streaming_label(algo)] = dataclasses.replace(base, algorithm=algo)
    return {"h_sweep": h_sweep, "m_sweep": m_sweep, "shards": shards, "streaming": streaming}


def streaming_label(algo: StreamingDiLoCo) -> str:
    """A short label such as `Streaming P=4 τ=1 α=0.5 4-bit`; "layers" appears for the layer-wise
    fragmentation, α only when it is not 0 (plain replacement)."""
    parts = ["Streaming", f"P={algo.fragments}"]
    parts += ["layers"] if algo.fragmentation == "layers" else []
    parts += [f"τ={algo.overlap}"] + ([f"α={algo.mix:g}"] if algo.mix else [])
    return " ".join(parts + [f"{algo.bits}-bit"])


def figures(group: str, histories: dict[str, pd.DataFrame]) -> dict[str, object]:
    """Figure name -> Altair chart for `group`'s histories ({label: RunResult.history})."""
    from ..plots import diloco as dp

    if group == "h_sweep":
        return {
            "diloco_h_sweep": dp.curves(histories, "DDP vs DiLoCo at equal tokens: the H sweep"),
            "diloco_accuracy_vs_bytes": dp.accuracy_vs_bytes(histories),
            "diloco_cosine": dp.cosine(histories, "Do the workers' pseudo-gradients agree? (H)"),
        }
    if group == "m_sweep":
        return {
            "diloco_m_sweep": dp.curves(histories, "DiLoCo on M workers, same global batch"),
            "diloco_m_sweep_cosine": dp.cosine(histories, "Pseudo-gradient agreement vs M"),
        }
    if group == "shards":
        return {
            "diloco_shards": dp.curves(histories, "i.i.d. vs by-genre shards"),
            "diloco_shards_cosine": dp.cosine(histories, "Pseudo-gradient agreement vs shards"),
        }
    return {
        "streaming_loss": dp.curves(histories, "Streaming DiLoCo: fragments, overlap, 4 bits"),
        "streaming_peak_bytes": dp.peak_bytes(histories),
        "streaming_accuracy_vs_bytes": dp.accuracy_vs_bytes(histories),
    }


def rows(group: str, histories: dict[str, pd.DataFrame]) -> list[dict]:
    """Results-table rows (experiment, method, metric, value, published, config): final
    held-out accuracy and loss, total and peak bytes per method, and the ratios that a
    published figure speaks about."""
    configs = _configs(group, histories)
    final = {k: h.iloc[-1] for k, h in histories.items()}
    out = []

    def add(label, metric, value, published=None):
        out.append({"experiment": group, "method": label, "metric": metric,
                    "value": float(value), "published": published,
                    "config": describe(configs[label]) if label in configs else ""})

    for label, f in final.items():
        add(label, "final val accuracy", f.val_accuracy)
        add(label, "final val loss", f.val_loss)
        add(label, "total bytes sent", f.comm_bytes)
        add(label, "peak bytes per step", f.peak_step_bytes)
    ddp = final.get("DDP")
    for label, f in final.items():
        if ddp is None or label == "DDP" or label.startswith("DDP "):
            continue
        add(label, "bytes reduction vs DDP (x)", ddp.comm_bytes / f.comm_bytes,
            PUBLISHED["streaming_bytes_reduction"] if _is_headline(label) else None)
        ref = _paper_claim(group, label)
        add(label, "perplexity / DDP perplexity", _ppl_ratio(f, ddp), ref)
    if group == "shards":
        iid, non = (next(k for k in final if k.startswith("DiLoCo") and k.endswith(end))
                    for end in (" iid", " by genre"))
        add(non, "perplexity / iid perplexity", _ppl_ratio(final[non], final[iid]),
            PUBLISHED["diloco_noniid_vs_iid"])
    if group == "streaming":
        _streaming_rows(final, add)
    return out


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _configs(group: str, histories: dict[str, pd.DataFrame]) -> dict[str, RunConfig]:
    """The group's configs (full or quick: whichever matches the histories' lengths)."""
    return matching_configs(groups, group, histories)


def _ppl_ratio(f: pd.Series, ref: pd.Series) -> float:
    import math

    return math.exp(f.val_loss - ref.val_loss)


def _is_headline(label: str) -> bool:
    """The streaming variant closest to the paper's setting (overlap, mixing, 4 bits)."""
    return label.startswith("Streaming") and "τ=1" in label and "4-bit" in label


def _paper_claim(group: str, label: str) -> float | None:
    if group == "h_sweep" and label == f"DiLoCo H={H_REF[False]}":
        return PUBLISHED["diloco_ppl_vs_dp"]
    if group == "streaming" and _is_headline(label):
        return PUBLISHED["streaming_loss_vs_dp"]
    return None


def _streaming_rows(final: dict[str, pd.Series], add) -> None:
    diloco = next(f for k, f in final.items() if k.startswith("DiLoCo"))
    for label, f in final.items():
        if label.startswith("Streaming"):
            add(label, "peak bytes reduction vs DiLoCo (x)",
                diloco.peak_step_bytes / f.peak_step_bytes,
                PUBLISHED["streaming_peak_reduction"] if _is_headline(label) else None)
    tau0 = final.get("Streaming P=4 τ=0 32-bit")
    if tau0 is not None:
        for label, f in final.items():
            if label.startswith("Streaming P=4 τ=") and "α" not in label and f is not tau0:
                add(label, "val loss change vs τ=0 (%)", 100 * (f.val_loss / tau0.val_loss - 1),
                    PUBLISHED["overlap_cost_pct"] if "τ=5" in label else None)
    b32, b4 = (final.get(f"Streaming P=4 τ=1 α=0.5 {b}-bit") for b in (32, 4))
    if b32 is not None and b4 is not None:
        add("Streaming P=4 τ=1 α=0.5 4-bit", "val loss 4-bit / 32-bit",
            b4.val_loss / b32.val_loss, PUBLISHED["four_bit_loss_ratio"])
