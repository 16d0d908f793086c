"""Exercises that check themselves: every check passes the right answer, names each planted
classic mistake, and turns blanks and crashes into a sentence; the solution notebooks pass
every check and the blank notebooks fail each one with its TODO hint, without a traceback."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import diloco_lite as dl
from diloco_lite import exercises as ex
from diloco_lite import outer
from diloco_lite.exercises import actors as aex
from diloco_lite.exercises import assemble as asm
from diloco_lite.exercises import blank
from diloco_lite.exercises import decoupled as dex
from diloco_lite.exercises._core import ERROR, FAIL_MARK, PASS_MARK, TODO
from diloco_lite.exercises.collectives import on_mesh
from tests.helpers import TINY

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "notebooks" / "exercises"
P = jax.P


@functools.cache
def _ddp_setup():
    from diloco_lite.model import build_model

    corpus = dl.load_corpus()
    model = build_model(dataclasses.replace(TINY, vocab_size=corpus.vocab_size))
    mesh = dl.worker_mesh(8)
    params = jax.device_put(model.init(0), mesh.sharding())
    batch = jax.device_put(corpus.batch(0, seed=0, workers=8, batch_size=2, seq_len=16),
                           mesh.sharding("workers"))

    def grad_fn(reduce, check_vma=False):
        def device(params, batch_1xBxL1):
            loss, grads = jax.value_and_grad(model.loss)(params, batch_1xBxL1[0])
            return reduce((loss, grads), "workers")
        return jax.jit(jax.shard_map(device, mesh=mesh.mesh, in_specs=(P(), P("workers")),
                                     out_specs=P(), check_vma=check_vma))

    return model.loss, params, batch, grad_fn


def _pmax(b):
    return jax.lax.pmax(jnp.max(b), "workers")


def _quantize(x, q=7):
    s = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / q
    return jnp.clip(jnp.round(x / s), -q, q) * s


def _rda(deltas, w):
    norms = jax.vmap(outer.tree_norm)(deltas)
    r = jnp.sum(w * norms) / jnp.sum(w)
    u = jax.tree.map(lambda d: jnp.tensordot(w / norms, d, axes=1) / jnp.sum(w), deltas)
    return jax.tree.map(lambda x: r * x / outer.tree_norm(u), u)


def _outer(sign=1, from_workers=False, keep_state=True):
    def step(theta, state, local, opt):
        delta = jax.tree.map(lambda t, loc: sign * jnp.mean(t[None] - loc, 0), theta, local)
        start = jax.tree.map(lambda x: x.mean(0), local) if from_workers else theta
        updates, new_state = opt.update(delta, state, start)
        return optax.apply_updates(start, updates), new_state if keep_state else state
    return step


def _next_round(reset=False, keep_local=False):
    def fn(theta, local, state, opt):
        new = local if keep_local else jax.tree.map(
            lambda x: jnp.broadcast_to(x, (4, *x.shape)), theta)
        return new, jax.vmap(opt.init)(new) if reset else state
    return fn


def _diloco_with(run, M, steps, H, lr, mistake):
    return asm._diloco(run, M, steps, H, lr, mistake)


def _syncer_with(events, quorum, tau, t_ref, safety, mistake):
    return asm.syncer(events, quorum, tau, t_ref, safety, mistake=mistake)


def _goodput(recovery=True):
    def g(lam, work, commit, absorbed, exposed):
        w = (absorbed + -math.expm1(-lam * exposed) / lam) * math.exp(lam * exposed)
        return work / (math.expm1(lam * (work + commit)) * (1 / lam + (w if recovery else 0)))
    return g


def _apply(due, publish=True):
    """A learner's apply rule: the first boundary ≥ due(ask, boundaries, publish, τ) (steps done,
    from 1) and at or after the publish (when `publish`)."""
    def fn(ask, b, pub, tau):
        d = due(ask, b, pub, tau)
        return next(i for i, t in enumerate(b, 1) if i >= d and (t >= pub or not publish))
    return fn


def _first(b, after, strict=False):
    return next(i for i, t in enumerate(b, 1) if (t > after if strict else t >= after))


def _kill(variant):
    """(detection, downtime) from a log, right or with one classic mistake."""
    def fn(log, m, window):
        def at(kind, who):
            return min(t for t, e, q, _ in log if e == kind and (who is None or q == who))
        (kill, end), fail, back = window, at("fail", m), at("rejoin", m)
        return {"right": (fail - kill, back - kill), "from_detection": (fail - kill, back - fail),
                "window": (fail - kill, end - kill), "past_window": (fail - kill, back - end),
                "absolute": (fail, back),
                "other_learner": (at("fail", None) - kill, at("rejoin", None) - kill)}[variant]
    return fn


YOUNG = dict(checkpoint_s=1.0, mtbf_s=26.3)
NUMBERS = {"check_allreduce_bytes", "check_ddp_step_bytes", "check_wire_bytes",
           "check_ddp_bandwidth", "check_decoupled_bandwidth", "check_cluster_mtbf",
           "check_young_interval", "check_daly_interval", "check_gather_bytes",
           "check_sync_time", "check_kill_goodput"}  # the others take a function
# (check name, its answer, the mistake it must name; None: it must pass)
PLANTED = [
    ("check_global_max", _pmax, None),
    ("check_global_max", lambda b: jax.lax.psum(jnp.max(b), "workers"), "psum"),
    ("check_global_max", lambda b: jax.lax.pmean(jnp.max(b), "workers"), "pmean"),
    ("check_global_max", lambda b: jnp.max(b), "no_collective"),
    ("check_allreduce_bytes", (64 * 64 + 100) * 4, None),
    ("check_allreduce_bytes", 64 * 64 + 100, "values"),
    ("check_allreduce_bytes", 8 * (64 * 64 + 100) * 4, "all_devices"),
    ("check_allreduce_bytes", 64 * 64 * 4, "one_array"),
    ("check_mean_loss", lambda w: jax.lax.pmean(jnp.mean(jax.vmap(jnp.sum)(w)), "workers"), None),
    ("check_mean_loss", lambda w: jax.lax.psum(jnp.mean(jax.vmap(jnp.sum)(w)), "workers"), "psum"),
    ("check_mean_loss", lambda w: jax.lax.pmean(jnp.sum(jax.vmap(jnp.sum)(w)), "workers"),
     "local_sum"),
    ("check_mean_loss", lambda w: jnp.mean(jax.vmap(jnp.sum)(w)), "no_collective"),
    ("check_ddp_gradient", dict(reduce=jax.lax.pmean), None),
    ("check_ddp_gradient", dict(reduce=jax.lax.pmean, check_vma=True), "times_devices"),
    ("check_ddp_gradient", dict(reduce=jax.lax.psum), "times_devices"),
    ("check_ddp_gradient", dict(reduce=lambda x, axis: x), "one_worker"),
    ("check_ddp_step_bytes", "ref", None),
    ("check_ddp_step_bytes", "ref-4", "no_loss"),
    ("check_ddp_step_bytes", "ref*8", "all_workers"),
    ("check_pseudo_gradient", lambda g, loc: jax.tree.map(jnp.subtract, g, loc), None),
    ("check_pseudo_gradient", lambda g, loc: jax.tree.map(jnp.subtract, loc, g), "sign"),
    ("check_pseudo_gradient", lambda g, loc: loc, "local"),
    ("check_outer_step", _outer(), None),
    ("check_outer_step", _outer(sign=-1), "sign"),
    ("check_outer_step", _outer(from_workers=True), "workers"),
    ("check_outer_step", _outer(keep_state=False), "stale"),
    ("check_outer_step", lambda t, s, loc, o: (jax.tree.map(lambda x: x.mean(0), loc), s),
     "average"),
    ("check_outer_step", lambda t, s, loc, o: t, "structure"),
    ("check_next_round", _next_round(), None),
    ("check_next_round", _next_round(reset=True), "reset_state"),
    ("check_next_round", _next_round(keep_local=True), "kept_local"),
    ("check_rda_merge", _rda, None),
    ("check_rda_merge", outer.mean_merge, "mean"),
    ("check_rda_merge", lambda d, w: _rda(d, jnp.ones_like(w)), "unweighted"),
    ("check_rda_merge", lambda d, w: jax.tree.map(lambda x: _rda(x, w), d), "per_leaf"),
    ("check_diloco_loop", lambda run, M, steps, H, lr: asm._diloco(run, M, steps, H, lr), None),
    *[("check_diloco_loop", functools.partial(_diloco_with, mistake=k), k)
      for k in ("reset_state", "sign", "no_outer", "kept_local", "no_flush", "outer_flush")],
    ("check_streaming_round", asm._streaming_round(), None),
    *[("check_streaming_round", asm._streaming_round(k), k)
      for k in ("swapped", "no_overlap", "base", "sign", "no_outer")],
    ("check_streaming_round", lambda t, s, *a: "state", "structure"),
    ("check_syncer", lambda ev, k, tau, tr, sf: asm.syncer(ev, k, tau, tr, sf), None),
    ("check_syncer", lambda *a: (asm.syncer(*a)[0], dict.fromkeys(asm.syncer(*a)[1], 1.0)),
     "other"),  # equal weights
    *[("check_syncer", functools.partial(_syncer_with, mistake=k), k)
      for k, _ in asm.MISTAKES],
    ("check_quantizer", _quantize, None),
    ("check_quantizer", lambda x: jnp.clip(jnp.round(x), -7, 7), "no_scale"),
    ("check_quantizer", lambda x: _quantize(x) / (jnp.max(jnp.abs(x), -1, keepdims=True) / 7),
     "codes"),
    ("check_quantizer", lambda x: _quantize(x.ravel()).reshape(x.shape), "tensor_scale"),
    ("check_quantizer", lambda x: _quantize(x, 8), "q_max"),
    ("check_quantizer", lambda x: x, "no_round"),
    ("check_wire_bytes", 76 * 32 + 76 * 4, None),
    ("check_wire_bytes", 76 * 32, "no_scales"),
    ("check_wire_bytes", 76 * 32 + 4, "tensor_scale"),
    ("check_mix", lambda loc, new, a: a * loc + (1 - a) * new, None),
    ("check_mix", lambda loc, new, a: a * new + (1 - a) * loc, "swapped"),
    ("check_token_weights", lambda t, s: np.where(s > 0, t * t / np.where(s > 0, s, 1), 0), None),
    ("check_token_weights", lambda t, s: 3 * np.where(s > 0, t * t / np.where(s > 0, s, 1), 0),
     None),  # any common scale
    ("check_token_weights", lambda t, s: np.divide(t * t, s, out=np.full_like(t, np.nan),
                                                   where=s > 0), "zero"),
    ("check_token_weights", lambda t, s: t, "tokens"),
    ("check_token_weights", lambda t, s: np.where(s > 0, t / np.where(s > 0, s, 1), 0), "ratio"),
    ("check_token_weights", lambda t, s: s, "steps"),
    ("check_token_weights", lambda t, s: (s > 0).astype(float), "equal"),
    ("check_close_time", dex.close_time, None),
    ("check_close_time", lambda a, t, k, *_: float(np.sort(t)[k - 1]), "no grace"),
    ("check_close_time", lambda a, t, *_: float(np.max(t)), "everyone"),
    ("check_close_time", lambda a, t, *_: float(np.min(t)), "first"),
    ("check_run_goodput", lambda p, lost, e, ts: (p - lost) / np.sum(e / ts), None),
    ("check_run_goodput", lambda p, lost, e, ts: p / np.sum(e / ts), "lost"),
    ("check_run_goodput", lambda p, lost, e, ts: (p - lost) / p, "processed"),
    ("check_ddp_bandwidth", 10e9 * 16 * 1.75 / (1.6 / 9 + 3.2 / 3 * 31 / 32) / 1e9, None),
    ("check_ddp_bandwidth", 10e9 * 16 / (1.6 / 9 + 3.2 / 3 * 31 / 32) / 1e9, "no_ring"),
    ("check_ddp_bandwidth", 10e9 * 16 * 1.75 / (1.6 / 9) / 1e9, "no_hiding"),
    ("check_ddp_bandwidth", 10e9 * 2 * 1.75 / (1.6 / 9 + 3.2 / 3 * 31 / 32) / 1e9, "bytes"),
    ("check_decoupled_bandwidth", 0.9 * 10e9 * 4 / 24 / 1.6 / 1e9, None),
    ("check_decoupled_bandwidth", 0.9 * 10e9 * 4 / 1.6 / 1e9, "whole_model"),
    ("check_decoupled_bandwidth", 0.9 * 10e9 * 4 / 24 / 1.6 / 1e9 * 1.75, "ring"),
    ("check_cluster_mtbf", 365.25 * 86400 / 1.2e6, None),
    ("check_cluster_mtbf", 365 * 86400 / 1.2e6, None),  # a 365-day year is close enough
    ("check_cluster_mtbf", 365.25 * 24 / 1.2e6, "hours"),
    ("check_cluster_mtbf", 365.25 * 86400, "per_chip"),
    ("check_young_interval", math.sqrt(2 * 26.3), None),
    ("check_young_interval", math.sqrt(26.3), "no_two"),
    ("check_young_interval", 2 * 26.3, "no_sqrt"),
    ("check_daly_interval", "daly", None),
    ("check_daly_interval", math.sqrt(2 * 26.3), "young"),
    ("check_daly_interval", math.sqrt(2 * 26.3) - 1, "no_factor"),
    ("check_domain_goodput", _goodput(), None),
    ("check_domain_goodput", _goodput(recovery=False), "no_recovery"),
    # 4 hosts, 434,688-byte payloads, 100 Mbit/s, 5 ms per hop (the checks' defaults)
    ("check_gather_bytes", 3 * 434_688, None),
    ("check_gather_bytes", 1.5 * 434_688, "allreduce"),
    ("check_gather_bytes", 4 * 434_688, "all_payloads"),
    ("check_gather_bytes", 434_688, "one_payload"),
    ("check_sync_time", 3 * 434_688 * 8 / 1e8 + 3 * 0.005, None),
    ("check_sync_time", 3 * 434_688 * 8 / 1e8, "no_hops"),
    ("check_sync_time", 3 * 434_688 * 8 / 1e8 + 0.005, "one_latency"),
    ("check_sync_time", 1.5 * 434_688 * 8 / 1e8 + 6 * 0.005, "allreduce"),
    ("check_sync_time", 3 * 434_688 / 1e8 + 3 * 0.005, "bytes"),
    # notebook 08's recorded kill run: five applies, its final row, two logs
    ("check_apply_position", aex.apply_position, None),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a) + t), None),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, p) + t), "from_publish"),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a) + t, publish=False),
     "ignores_publish"),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a, strict=True) + t),
     "strict_ask"),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a) - 1 + t), "from_ask"),
    ("check_apply_position", lambda *a: aex.apply_position(*a) - 1, "zero_based"),
    ("check_apply_position", lambda *a: aex.apply_position(*a) + 1, "one_late"),
    ("check_apply_position", lambda a, b, p, t: b[aex.apply_position(a, b, p, t) - 1], "time"),
    ("check_kill_goodput", 143.5 / (4 * 18.017 / 0.2), None),
    ("check_kill_goodput", 143.5 / 320, "done"),
    ("check_kill_goodput", 143.5 / (3 * 18.017 / 0.2), "learners_up"),
    ("check_kill_goodput", 320 / (4 * 18.017 / 0.2), "lost"),
    ("check_kill_goodput", 143.5 / (18.017 / 0.2), "one_learner"),
    ("check_kill_goodput", 100 * 143.5 / (4 * 18.017 / 0.2), "percent"),
    ("check_kill_timing", aex.kill_timing, None),
    ("check_kill_timing", _kill("right"), None),
    ("check_kill_timing", _kill("from_detection"), "from_detection"),
    ("check_kill_timing", _kill("window"), "window"),
    ("check_kill_timing", _kill("past_window"), "past_window"),
    ("check_kill_timing", _kill("absolute"), "absolute"),
    ("check_kill_timing", _kill("other_learner"), "other_learner"),
]


def _call(name, answer, capsys):
    check = getattr(ex, name)
    if name == "check_ddp_gradient":
        loss, params, batch, grad_fn = _ddp_setup()
        fn = grad_fn(**answer) if isinstance(answer, dict) else answer
        result = check(fn, loss, params, batch)
    elif name == "check_ddp_step_bytes":
        params = _ddp_setup()[1]
        ref = sum(x.size for x in jax.tree.leaves(params)) * 4 + 4
        value = {"ref": ref, "ref-4": ref - 4, "ref*8": 8 * ref}.get(answer, answer)
        result = check(value, params)
    elif name in ("check_young_interval", "check_daly_interval"):
        from diloco_lite.systems.goodput_closed import daly_interval

        value = daly_interval(**YOUNG) if answer == "daly" else answer
        result = check(value, **YOUNG)
    else:
        result = check(answer)
    line = capsys.readouterr().out.strip()
    assert line == str(result) and "Traceback" not in line
    return result


@pytest.mark.parametrize(("name", "answer", "mistake"), PLANTED,
                         ids=[f"{n}-{m or 'right'}" for n, _, m in PLANTED])
def test_each_planted_mistake_is_named(name, answer, mistake, capsys):
    result = _call(name, answer, capsys)
    assert result.mistake == mistake, result.message
    assert result.ok is (mistake is None)
    assert str(result).startswith(PASS_MARK if mistake is None else FAIL_MARK)


def test_every_check_has_a_right_answer_and_a_named_mistake():
    names = {n for n, _, m in PLANTED}
    assert names == set(ex.CHECKS)
    for name in names:
        kinds = {m for n, _, m in PLANTED if n == name}
        assert None in kinds and len(kinds - {None}) >= 1, name


@pytest.mark.parametrize("name", sorted(ex.CHECKS))
def test_blank_and_crashing_answers_become_sentences(name, capsys):
    title, todo = ex.CHECKS[name]
    answers = (..., None) if name in NUMBERS else (..., None, lambda *a: None)
    for answer in answers:
        result = _call(name, answer, capsys)
        assert (result.ok, result.mistake) == (False, TODO)
        assert str(result) == f"{FAIL_MARK} {title}: not done yet: {todo}"
    if name in NUMBERS:
        return
    result = _call(name, lambda *a: 1 / 0, capsys)
    assert (result.ok, result.mistake) == (False, ERROR)
    assert "ZeroDivisionError" in result.message


@pytest.mark.slow  # two runs of the readable reference, as the reference against the library
def test_the_syncer_exercise_replays_the_reference():
    """STREAMS[0] is notebook 04's worked example: its first sync, read from the reference's own
    run of that config, closes where the exercise's syncer says, with the same learners; and a
    planted change of the stream (learner 3 a little slower) moves both."""
    from diloco_lite import reference

    def first_close(step_times):
        cfg = dl.RunConfig(algorithm=dl.DecoupledDiLoCo(inner_steps=4, fragments=1, overlap=2,
                                                        quorum=2, grace_safety=0.5),
                           workers=5, steps=8, cluster=dl.Cluster(step_time_s=step_times),
                           batch_size=4, seq_len=64, model=dl.ModelConfig(d_model=32,
                           n_layers=1, n_heads=2))
        log = []
        reference.decoupled(cfg, log=log)
        return next((t, who) for t, what, who, _ in log if what == "close")

    t, weights = asm.syncer(**asm.STREAMS[0])
    assert first_close((1, 1, 1, 1.5, 3)) == (t, tuple(weights)) == (5.0, (0, 1, 2, 3))
    assert weights[3] / weights[0] == (3 * 256) ** 2 / 3 / ((4 * 256) ** 2 / 4)
    assert first_close((1, 1, 1, 1.7, 3)) == (5.0, (0, 1, 2))  # 3 steps at 5.1 s: too late


def test_a_check_on_the_library_mesh_runs_on_many_workers_per_device():
    """The mean-loss check uses 16 workers on 8 devices: the vmapped layout is exercised."""
    assert dl.worker_mesh(16).workers_per_device == 2
    mesh = dl.worker_mesh(8)
    x = jax.device_put(jnp.arange(8.0), mesh.sharding("workers"))
    assert float(on_mesh(_pmax, mesh)(x)) == 7


# ---- the notebooks --------------------------------------------------------------------------


def test_blank_notebooks_are_generated_from_the_solutions():
    solutions = sorted((EXERCISES / "solutions").glob("*.py"))
    assert [p.name[:2] for p in solutions] == ["00", "01", "02", "03", "04", "05", "06",
                                                "07", "08"]
    for solution in solutions:
        text = solution.read_text()
        assert blank.blank_source(text) == (EXERCISES / solution.name).read_text(), (
            f"{solution.name}: run `make notebooks-sync`")
        assert "BEGIN SOLUTION" in text


def _check_lines(notebook: Path) -> tuple[list[str], list[str]]:
    """Run a notebook; return its printed check lines and its error outputs."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    lines, errors = [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "error" or out.get("name") == "stderr" and "Traceback" in (
                    out.get("text") or ""):
                errors.append(f"{out.get('ename')}: {out.get('evalue')}")
            text = out.get("text") or ""
            lines += [line for line in text.splitlines()
                      if line.startswith((PASS_MARK, FAIL_MARK))]
    return lines, errors


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in EXERCISES.glob("*.ipynb")))
def test_notebook_solutions_pass_and_blanks_fail_with_their_hints(name):
    solved, errors = _check_lines(EXERCISES / "solutions" / name)
    assert not errors, errors
    assert solved and all(line.startswith(PASS_MARK) for line in solved), solved
    hints = {f"{FAIL_MARK} {title}: not done yet: {todo}" for title, todo in ex.CHECKS.values()}
    blank, errors = _check_lines(EXERCISES / name)
    assert not errors, errors  # a blank exercise prints hints, never a traceback
    assert len(blank) == len(solved)
    assert all(line in hints for line in blank), blank
    titles = [line.split(":")[0][2:] for line in solved]
    assert titles == [line.split(":")[0][2:] for line in blank]
