"""Configuration: the model, the run, and the four algorithms, as frozen dataclasses.

Every config validates itself where it enters (`__post_init__`) and raises `ValueError`
naming the field and its allowed range, so that a bad value never reaches JAX.

Math symbol -> field (docs/algorithms.md, "Symbols", has the update rules):

| symbol | meaning                          | field                                  |
|--------|----------------------------------|----------------------------------------|
| M      | workers / learners               | `RunConfig.workers`                    |
| H      | inner steps between syncs        | `inner_steps`                          |
| P      | fragments                        | `fragments`                            |
| tau    | overlap, in inner steps          | `overlap`                              |
| alpha  | mixing of the arriving fragment  | `mix`                                  |
| b      | bits per transmitted value       | `bits`                                 |
| K      | syncer quorum                    | `quorum`                               |
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .clock import Cluster
from .validate import check, check_int, check_positive  # also imported from here elsewhere

ALLOWED_BITS = (32, 16, 8, 4, 2)
DDP_BITS = (32, 16)  # DDP's gradient travels as floats: fp32 or bfloat16
SPLITS = ("iid", "by_genre")
FRAGMENTATIONS = ("balanced", "layers")


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A small decoder-only character transformer (pre-norm, learned positions, tied embeddings).

    The default (~0.1M parameters with the 76-character Shakespeare vocabulary) trains on 8
    emulated CPU devices in a few minutes.
    `vocab_size=None` means "take it from the corpus".
    """

    vocab_size: int | None = None
    context: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4

    def __post_init__(self):
        if self.vocab_size is not None:
            check_int("ModelConfig.vocab_size", self.vocab_size, 2)
        check_int("ModelConfig.context", self.context, 1)
        check_int("ModelConfig.d_model", self.d_model, 1)
        check_int("ModelConfig.n_layers", self.n_layers, 1)
        check_int("ModelConfig.n_heads", self.n_heads, 1)
        check_int("ModelConfig.mlp_ratio", self.mlp_ratio, 1)
        check(
            self.d_model % self.n_heads == 0,
            "ModelConfig.n_heads",
            self.n_heads,
            f"a divisor of d_model={self.d_model}",
        )

    @property
    def n_tensors(self) -> int:
        """Parameter tensors of the model (the leaves of `model.Transformer`'s params): the token
        and position embeddings and the final norm's scale and bias (4), and per block two
        norms (scale, bias), qkv (kernel, no bias), proj, up and down (kernel, bias): 11.
        Fragments split these tensors, so there can be no more fragments than tensors."""
        return 4 + 11 * self.n_layers


# --------------------------------------------------------------------------------------------
# Algorithms
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DDP:
    """Data-parallel training: one all-reduce of the full gradient every step (§1).

    `elastic`: when a worker fails, go on without it instead of stopping the job (`clock`).
    `bits`: the gradient's width on the network: 32 (fp32) or 16 (bfloat16: every worker rounds
    its gradient to bfloat16 and the mean comes back in bfloat16, half the bytes; what the
    bandwidth model, `systems.bandwidth`, assumes by default). Quantized integer codes (8 bits
    and fewer) are for the DiLoCo methods' pseudo-gradients, not here."""

    elastic: bool = False
    bits: int = 32
    name = "ddp"

    def __post_init__(self):
        _check_bool("DDP.elastic", self.elastic)
        _check_bits("DDP.bits", self.bits, DDP_BITS, ": fp32 or bfloat16 (the 8-, 4- and 2-bit "
                    "integer codes are the DiLoCo methods' wire formats, not DDP's)")


@dataclasses.dataclass(frozen=True)
class DiLoCo:
    """H local steps per worker, then one outer Nesterov step on the mean pseudo-gradient (§2).

    `outer_optimizer=None` means `optax.sgd(outer_lr, momentum=0.9, nesterov=True)`, the
    paper's outer Nesterov at lr 0.7 by default (`outer_lr` is what the protocol experiments
    tune; a custom `outer_optimizer` overrides both).
    """

    inner_steps: int = 50
    outer_lr: float = 0.7
    outer_optimizer: Any = None
    elastic: bool = False
    name = "diloco"

    def __post_init__(self):
        check_int("DiLoCo.inner_steps", self.inner_steps, 1)
        check_positive("DiLoCo.outer_lr", self.outer_lr)
        _check_bool("DiLoCo.elastic", self.elastic)


@dataclasses.dataclass(frozen=True)
class StreamingDiLoCo:
    """DiLoCo with P staggered fragments, overlap tau, mixing alpha and b-bit deltas (§3).

    `StreamingDiLoCo(fragments=1, overlap=0, bits=32, mix=0.0)` is DiLoCo; mind `mix`: its
    default is 0.5 (the arriving fragment is averaged with the local one), not DiLoCo's 0.
    """

    inner_steps: int = 50
    fragments: int = 2
    overlap: int = 1
    mix: float = 0.5
    bits: int = 4
    fragmentation: str = "balanced"
    outer_lr: float = 0.7
    outer_optimizer: Any = None
    elastic: bool = False
    name = "streaming_diloco"

    def __post_init__(self):
        _check_bool("StreamingDiLoCo.elastic", self.elastic)
        check_int("StreamingDiLoCo.inner_steps", self.inner_steps, 1)
        check_positive("StreamingDiLoCo.outer_lr", self.outer_lr)
        check_int("StreamingDiLoCo.fragments", self.fragments, 1)
        check_int("StreamingDiLoCo.overlap", self.overlap, 0, self.inner_steps - 1)
        _check_mix("StreamingDiLoCo.mix", self.mix)
        _check_bits("StreamingDiLoCo.bits", self.bits)
        check(
            self.fragmentation in FRAGMENTATIONS,
            "StreamingDiLoCo.fragmentation",
            self.fragmentation,
            f"one of {FRAGMENTATIONS}",
        )


@dataclasses.dataclass(frozen=True)
class DecoupledDiLoCo:
    """Asynchronous learners and a central syncer per fragment (§4, `clock.syncer`).

    The learners are `RunConfig.workers`. Paper defaults (second-hand): P=24, H=24, tau=2,
    K=1, int4 outer gradients. `quorum` is K; `grace_safety` scales the adaptive grace window
    (0 disables it); `merge` is "rda" (Radial-Directional Averaging; embeddings by the weighted
    mean) or "mean" (the ablation). `bits` is the learners' upload; `down_bits` the syncer's
    reply, the outer update of the fragment (32: exact; fewer bits: the syncer applies the same
    rounded update to its own copy, so every copy stays equal).
    """

    inner_steps: int = 24
    fragments: int = 24
    overlap: int = 2
    bits: int = 4
    down_bits: int = 32
    quorum: int = 1
    mix: float = 0.0
    grace_safety: float = 0.5
    merge: str = "rda"
    fragmentation: str = "balanced"
    outer_lr: float = 0.7
    outer_optimizer: Any = None
    name = "decoupled_diloco"

    def __post_init__(self):
        check_int("DecoupledDiLoCo.inner_steps", self.inner_steps, 1)
        check_positive("DecoupledDiLoCo.outer_lr", self.outer_lr)
        check_int("DecoupledDiLoCo.fragments", self.fragments, 1)
        check_int("DecoupledDiLoCo.overlap", self.overlap, 0, self.inner_steps - 1)
        _check_bits("DecoupledDiLoCo.bits", self.bits)
        _check_bits("DecoupledDiLoCo.down_bits", self.down_bits)
        check_int("DecoupledDiLoCo.quorum", self.quorum, 1)
        _check_mix("DecoupledDiLoCo.mix", self.mix)
        gs = self.grace_safety
        ok = isinstance(gs, (int, float)) and not isinstance(gs, bool) and 0 <= gs <= 1
        check(ok, "DecoupledDiLoCo.grace_safety", gs, "a number in [0, 1]")
        check(self.merge in ("rda", "mean"), "DecoupledDiLoCo.merge", self.merge, "'rda' or 'mean'")
        check(self.fragmentation in FRAGMENTATIONS, "DecoupledDiLoCo.fragmentation",
              self.fragmentation, f"one of {FRAGMENTATIONS}")


Algorithm = DDP | DiLoCo | StreamingDiLoCo | DecoupledDiLoCo


def _check_bits(field: str, bits: Any, allowed: tuple = ALLOWED_BITS, why: str = "") -> None:
    ok = isinstance(bits, int) and not isinstance(bits, bool) and bits in allowed  # not 4.0
    check(ok, field, bits, f"one of {allowed}{why}")


def _check_bool(field: str, value: Any) -> None:
    check(isinstance(value, bool), field, value, "True or False")


def _check_mix(field: str, mix: Any) -> None:
    ok = isinstance(mix, (int, float)) and not isinstance(mix, bool) and 0.0 <= mix <= 1.0
    check(ok, field, mix, "a number in [0, 1]")


# --------------------------------------------------------------------------------------------
# Run
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One training run. `batch_size` is per worker; the global batch is `workers * batch_size`.

    `inner_optimizer=None` means AdamW with linear warm-up and cosine decay
    (`steps.default_inner_optimizer`, peak `learning_rate`, `warmup_steps`).
    `eval_every=None` evaluates about 20 times per run (and always at the last step).
    `cluster` (a `clock.Cluster`): step times, link and failures on the simulated clock;
    None means one second per step for every worker and a free link.
    `warm_start` (a RunConfig of the same model, usually DDP): the run starts from that run's
    final parameters (the DiLoCo paper's protocol: a shared data-parallel pre-training phase),
    with a fresh inner optimizer; `seed` then sets only the batches (and the failure draw), and
    the batches continue where the pre-training's stopped (`data_offset`), so no sequence drawn
    for the pre-training is drawn again.
    """

    algorithm: Any = dataclasses.field(default_factory=DDP)
    workers: int = 8
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 64
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    inner_optimizer: Any = None
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    split: str = "iid"
    corpus: str = "shakespeare"
    eval_every: int | None = None
    eval_batches: int = 8
    seed: int = 0
    cluster: Any = None
    warm_start: Any = None

    def __post_init__(self):
        check(
            isinstance(self.algorithm, (DDP, DiLoCo, StreamingDiLoCo, DecoupledDiLoCo)),
            "RunConfig.algorithm",
            self.algorithm,
            "an instance of DDP, DiLoCo, StreamingDiLoCo or DecoupledDiLoCo",
        )
        check_int("RunConfig.workers", self.workers, 1)
        check_int("RunConfig.steps", self.steps, 1)
        check_int("RunConfig.batch_size", self.batch_size, 1)
        check(isinstance(self.model, ModelConfig), "RunConfig.model", self.model, "a ModelConfig")
        check_int("RunConfig.seq_len", self.seq_len, 1, self.model.context)
        check_positive("RunConfig.learning_rate", self.learning_rate)
        check_int("RunConfig.warmup_steps", self.warmup_steps, 0)
        check(self.split in SPLITS, "RunConfig.split", self.split, f"one of {SPLITS}")
        check(self.corpus == "shakespeare", "RunConfig.corpus", self.corpus, "'shakespeare'")
        if self.eval_every is not None:
            check_int("RunConfig.eval_every", self.eval_every, 1)
        check_int("RunConfig.eval_batches", self.eval_batches, 1)
        check_int("RunConfig.seed", self.seed, 0)
        if isinstance(self.algorithm, (StreamingDiLoCo, DecoupledDiLoCo)):
            n = self.model.n_tensors
            check(self.algorithm.fragments <= n, f"{type(self.algorithm).__name__}.fragments",
                  self.algorithm.fragments, f"an integer in [1, {n}] (the model has {n} "
                  "tensors: RunConfig.model.n_tensors)")
        if isinstance(self.algorithm, DecoupledDiLoCo):
            k = self.algorithm.quorum
            check(k <= self.workers, "DecoupledDiLoCo.quorum", k,
                  f"an integer in [1, {self.workers}] (K <= M = RunConfig.workers)")
        if self.cluster is not None:
            check(isinstance(self.cluster, Cluster), "RunConfig.cluster", self.cluster,
                  "a diloco_lite.Cluster or None")
            self.cluster.check_learners(self.workers)
        if self.warm_start is not None:
            check(isinstance(self.warm_start, RunConfig), "RunConfig.warm_start",
                  type(self.warm_start).__name__, "a RunConfig or None")
            check(self.warm_start.model == self.model, "RunConfig.warm_start",
                  f"model {self.warm_start.model}", f"a run of the same model ({self.model})")

    @property
    def data_offset(self) -> int:
        """The data step of this run's first step: the steps of its warm-start chain."""
        w = self.warm_start
        return 0 if w is None else w.data_offset + w.steps

    @property
    def global_batch(self) -> int:
        return self.workers * self.batch_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len
