"""One learner of Decoupled DiLoCo as its own program: its state, on its own device.

`LearnerProgram` holds one learner's θ, inner optimizer state and base (the global value it
last took), as the lock-step driver's state for M = 1 (`algorithms.learners.LearnersDriver` on a
one-learner mesh): the same compiled inner step, the same wire format, the same mix rule; and
the newest Θ_p of each fragment it has received (`receive`: a reply's bytes, Θ_p or its b-bit
update, made into Θ_p as the syncer does, `actors.theta.apply_reply`), which it takes when its
rules say so (`apply`). It has no clock and no schedule (`actors.agent` has its rules). Nothing
here imports Ray.
"""

from __future__ import annotations

import jax
import numpy as np

from ..algorithms.learners import LearnersDriver, arrive
from ..outer import put_leaves, take_leaves
from ..training import setup
from .theta import apply_reply, reply_like


class LearnerProgram:
    """Learner `m` of `config` (M = config.workers learners in all), from `params` (None: the
    model's initial parameters for `config.seed`)."""

    def __init__(self, config, m: int, params=None):
        self.config, self.m = config, m
        self.corpus, model, mesh, optimizer = setup(config, workers=1)
        params = params if params is not None else model.init(config.seed)
        self.optimizer = optimizer
        self.driver = LearnersDriver(config, model, mesh, optimizer, params, donate=False)
        self.state = self.driver.init(params)
        self.bits = self.driver.down.bits
        self.versions = self._versions(jax.tree.leaves(params), [0] * len(self.driver.frags))
        self.reply_like = [reply_like(self.bits, f[0]) for f in self.versions]
        # a new program (a new process: maybe a restart after a failure) holds no learner's
        # state until it begins the run (`begin`) or reloads (`reload`)
        self.holds_state = False
        self._on = self.driver.mesh.put(np.ones(1, bool), "workers")

    def warm_up(self) -> None:
        """Compile the step, the answer and the mix before the clock starts (a step with its
        mask off changes nothing; the answer and the mix are computed and thrown away)."""
        batch, mask = self._batch(0, on=False)
        jax.block_until_ready(self.driver.inner(self.state["local"], self.state["inner"], batch,
                                                mask))
        for p, idx in enumerate(self.driver.frags):
            self._send(p)
            theta = [np.asarray(x) for x in take_leaves(self.state["global"], idx)]  # as `apply`
            jax.block_until_ready(arrive(take_leaves(self.state["local"], idx),
                                         take_leaves(self.state["base"], idx), theta, self._on,
                                         float(self.driver.alpha)))
            zeros = np.zeros(self.driver.down_nbytes[p], np.uint8)  # a reply's bytes
            apply_reply(self.bits, self.versions[p][0], zeros, self.reply_like[p])  # thrown away

    def begin(self) -> None:
        """The run begins: its state is the learner's (the initial parameters)."""
        self.holds_state = True

    # ---- what a step boundary asks of it -------------------------------------------------------
    def step(self, k: int) -> float:
        """Its own step k (data index k, as on the simulated clock); returns the loss."""
        batch, mask = self._batch(k)
        self.state["local"], self.state["inner"], loss = self.driver.inner(
            self.state["local"], self.state["inner"], batch, mask)
        return float(np.asarray(loss).reshape(-1)[0])

    def answer(self, p: int) -> np.ndarray:
        """Δ = base − θ of fragment p through the wire format, as the bytes that travel."""
        return host_bytes(self._send(p))

    def flush_answer(self, p: int) -> np.ndarray:
        """`answer` for the end-of-run flush, refused by a program that holds no learner's
        state (a restarted process that has not rejoined: its Δ would be of the initial
        parameters)."""
        if not self.holds_state:
            raise RuntimeError(f"learner {self.m}: a restarted process that has not rejoined "
                               "holds no Δ")
        return self.answer(p)

    def receive(self, p: int, n: int, reply: np.ndarray) -> None:
        """The reply of fragment p's n-th sync (its bytes) came: version n + 1 of Θ_p, made of
        version n (the replies of a fragment are taken in order)."""
        self.versions[p][n + 1] = apply_reply(self.bits, self.versions[p][n], reply,
                                              self.reply_like[p])

    def has(self, p: int, version: int) -> bool:
        return version in self.versions[p]

    def apply(self, p: int, version: int) -> None:
        """Take version `version` of Θ_p: θ ← α·θ + (1−α)·Θ_p, base ← Θ_p."""
        idx = self.driver.frags[p]
        theta_p = self.versions[p][version]
        self.versions[p] = {v: x for v, x in self.versions[p].items() if v >= version}
        self.state["global"] = put_leaves(self.state["global"], idx, list(theta_p))
        local, base = arrive(take_leaves(self.state["local"], idx),
                             take_leaves(self.state["base"], idx),
                             take_leaves(self.state["global"], idx), self._on,
                             float(self.driver.alpha))
        self.state["local"] = put_leaves(self.state["local"], idx, local)
        self.state["base"] = put_leaves(self.state["base"], idx, base)

    def inner_state(self):
        """Its inner optimizer state, on the host (a returning peer loads it)."""
        return jax.tree.map(lambda x: np.asarray(x)[0], jax.device_get(self.state["inner"]))

    def reload(self, global_leaves: list, inner_state, versions: list) -> None:
        """Back from a failure: θ = base = Θ (its fragments at `versions`), and a healthy peer's
        inner optimizer state (None: a fresh one, when no peer was up)."""
        put = self.driver.mesh.put
        treedef = jax.tree.structure(self.state["global"])
        theta = jax.tree.unflatten(treedef, [np.asarray(x) for x in global_leaves])
        self.versions = self._versions(global_leaves, versions)
        stacked = jax.tree.map(lambda x: np.asarray(x)[None], theta)
        self.state["global"] = put(theta)
        self.state["local"] = put(stacked, "workers")
        self.state["base"] = put(stacked, "workers")
        if inner_state is None:
            inner_state = jax.device_get(jax.jit(self.optimizer.init)(theta))
        self.state["inner"] = put(jax.tree.map(lambda x: np.asarray(x)[None], inner_state),
                                  "workers")
        self.holds_state = True

    # ---- helpers --------------------------------------------------------------------------------
    def _versions(self, leaves: list, versions: list) -> list[dict]:
        return [{v: [np.asarray(x) for x in take_leaves(list(leaves), f)]}
                for f, v in zip(self.driver.frags, versions, strict=True)]

    def _send(self, p: int):
        idx = self.driver.frags[p]
        sent = list(self.state["sent"])
        sent[p] = self.driver.send(take_leaves(self.state["local"], idx),
                                   take_leaves(self.state["base"], idx), sent[p], self._on)
        self.state["sent"] = sent
        return sent[p]

    def _batch(self, k: int, on: bool = True):
        c = self.config
        rows = self.corpus.batch(c.data_offset + k, seed=c.seed, workers=c.workers,
                                 batch_size=c.batch_size, seq_len=c.seq_len, split=c.split,
                                 rows=[self.m])
        return self.driver.mesh.put((rows[:, None], np.full((1, 1), on)), "workers")


def host_bytes(payload) -> np.ndarray:
    """One learner's payload (leaves [1, ...]) as `wire.to_bytes` lays it out, on the host."""
    return np.concatenate([np.ascontiguousarray(x).view(np.uint8).reshape(-1)
                           for x in jax.tree.leaves(jax.device_get(payload))])
