"""Exercises that check themselves: every check passes the right answer, names each planted
classic mistake, and turns blanks and crashes into a sentence; the solution notebooks pass
every check and the blank notebooks fail each one with its TODO hint, without a traceback."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
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
from diloco_lite.exercises import eventloop as el
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


def _diloco_with(run, M, steps, H, opt, mistake):
    return asm._diloco(run, M, steps, H, opt, mistake)


def _closes_at_once(state, event, rules):
    """A syncer that closes every sync the moment it opens: no named mistake."""
    return [("close", event[2], {})] if event[0] == "ask" else []


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
    ("check_diloco_loop", lambda run, M, steps, H, opt: asm._diloco(run, M, steps, H, opt), None),
    *[("check_diloco_loop", functools.partial(_diloco_with, mistake=k), k)
      for k in ("reset_state", "sign", "no_outer", "kept_local", "no_flush", "outer_flush")],
    ("check_streaming_round", asm._streaming_round(), None),
    *[("check_streaming_round", asm._streaming_round(k), k)
      for k in ("swapped", "no_overlap", "base", "sign", "no_outer")],
    ("check_streaming_round", lambda t, s, *a: "state", "structure"),
    ("check_syncer", el._handler(), None),
    *[("check_syncer", el._handler(k), k) for k in el.MISTAKE_KEYS],
    ("check_syncer", _closes_at_once, "other"),
    ("check_syncer", lambda state, event, rules: "close", "structure"),
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
    ("check_close_time", dex._close_time, None),
    ("check_close_time", lambda a, t, k, *_: float(np.sort(t)[k - 1]), "no grace"),
    ("check_close_time", lambda a, t, *_: float(np.max(t)), "everyone"),
    ("check_close_time", lambda a, t, *_: float(np.min(t)), "first"),
    ("check_close_time", lambda a, t, k, tau, tr, reply, s: dex._close_time(a, t, k, tau, tr, 0, s),
     "no reply"),
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
    ("check_apply_position", aex._apply_position, None),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a) + t), None),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, p) + t), "from_publish"),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a) + t, publish=False),
     "ignores_publish"),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a, strict=True) + t),
     "strict_ask"),
    ("check_apply_position", _apply(lambda a, b, p, t: _first(b, a) - 1 + t), "from_ask"),
    ("check_apply_position", lambda *a: aex._apply_position(*a) - 1, "zero_based"),
    ("check_apply_position", lambda *a: aex._apply_position(*a) + 1, "one_late"),
    ("check_apply_position", lambda a, b, p, t: b[aex._apply_position(a, b, p, t) - 1], "time"),
    ("check_kill_goodput", 143.5 / (4 * 18.017 / 0.2), None),
    ("check_kill_goodput", 143.5 / 320, "done"),
    ("check_kill_goodput", 143.5 / (3 * 18.017 / 0.2), "learners_up"),
    ("check_kill_goodput", 320 / (4 * 18.017 / 0.2), "lost"),
    ("check_kill_goodput", 143.5 / (18.017 / 0.2), "one_learner"),
    ("check_kill_goodput", 100 * 143.5 / (4 * 18.017 / 0.2), "percent"),
    ("check_kill_timing", aex._kill_timing, None),
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
    if mistake is not None:  # what it says names the mistake, never the formula
        assert formulas(result.message, name) == [], result.message


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
        assert formulas(result.message, name) == []
    if name in NUMBERS:
        return
    result = _call(name, lambda *a: 1 / 0, capsys)
    assert (result.ok, result.mistake) == (False, ERROR)
    assert "ZeroDivisionError" in result.message


def test_the_event_loop_scenarios_hold_what_the_exercise_promises():
    """The check's expected decisions come from the reference's own logs: scenario 1 is
    notebook 04's worked example (its first sync closes at 5 s with learners 0-3, weights in
    proportion to their steps 4, 4, 4, 3, as the notebook works out by hand); together the
    scenarios hold late and stale answers, a failure after an answer arrived, an answer that
    arrives from a learner already down, a learner down for a whole sync, a rejoin, a grace
    window cut short by its deadline and end-of-run flushes that leave a learner out."""
    rules, events, expected = el._scenario(0)
    t, kind_p, weights = expected[0][1], expected[0][2], expected[0][3]
    assert (expected[0][0], t, kind_p, sorted(weights)) == ("close", 5.0, 0, [0, 1, 2, 3])
    assert [weights[m] / weights[0] for m in range(4)] == [1, 1, 1, 3 / 4]
    late = stale = 0
    for n in range(len(el.SCENARIOS)):
        _, events, expected = el._scenario(n)
        closes = [d for d in expected if d[0] == "close"]
        latest = {}
        for e in events:
            if e[0] == "ask":
                latest[e[2]] = e[1]
            elif e[0] == "arrive":
                _, t, m, p, asked, _, _ = e
                own = next((d for d in closes if d[2] == p and d[1] >= asked), None)
                late += own is not None and own[1] < t
                stale += asked != latest[p]
    assert late >= 3 and stale >= 1
    # scenario 2: learner 0's answer arrives at 4.3 s, it fails at 4.6 s, before the close
    _, events, expected = el._scenario(1)
    assert ("fail", 4.6, 0) in events and any(
        e[:4] == ("arrive", 4.3, 0, 0) for e in events)
    assert expected[0][0] == "close" and expected[0][1] > 4.6 and 0 not in expected[0][3]
    # ... and learner 1's answer is on its way when it fails at 12.1 s: it arrives while down
    assert ("fail", 12.1, 1) in events and any(
        e[0] == "arrive" and e[2] == 1 and 12.1 < e[1] < 14.0 for e in events)
    assert all(1 not in d[3] for d in expected if d[0] == "close" and 12.1 < d[1] < 14.0)
    kinds = [e[0] for n in range(3) for e in el._scenario(n)[1]]
    assert kinds.count("rejoin") >= 2 and kinds.count("fail") >= 2
    flushes = [(n, d) for n in range(3) for d in el._scenario(n)[2] if d[0] == "flush"]
    assert flushes and all(d[3:] == ("mean", False) for _, d in flushes)
    n, flush = flushes[0]
    report = next(e for e in el._scenario(n)[1] if e[0] == "end")[2]
    worked = {m for m, r in report.items() if r[flush[1]][2] >= 1}
    assert set(flush[2]) < worked  # a learner with work since an older base is left out


def test_the_event_loop_is_driven_in_the_references_order():
    """At equal times an arrival comes before a timer (the reference's ANSWER < DEADLINE), a
    timer set for now still goes off, and a handler's actions are read as decisions."""
    rules = el.SyncerRules(learners=3, fragments=1, quorum=1, tau=1, t_ref=1.0, safety=0.0,
                           t_reply=0.0)
    events = [("ask", 1.0, 0), ("arrive", 1.0, 0, 0, 1.0, 8, 1), ("arrive", 1.0, 1, 0, 1.0, 8, 1),
              ("end", 2.0, {})]
    decisions = el.drive(el._handler(), events, rules)
    assert [(d[0], d[1], sorted(d[3])) for d in decisions] == [("close", 1.0, [0, 1])]


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


# ---- no student notebook imports an answer ----------------------------------------------------

SOLUTIONS = sorted((EXERCISES / "solutions").glob("*.py"))
# What a student notebook may take from diloco_lite: the package itself (as `dl`, and of it only
# the set-up helpers below), the checks, the data they show, and two helpers of notebooks 00
# and 01 (counting a model's parameters, measuring a compiled program's collectives); nothing
# that computes an exercise's answer (the references of the checks, `diloco_lite.reference`,
# `wire`, `systems`, `clock`, `outer`, ...).
DATA = {"SyncerRules", "StreamingState", "APPLY_CASES", "KILL_LOG", "KILL_ROW"}
ALLOWED_FROM = {"diloco_lite.comm": {"collective_bytes"},
                "diloco_lite.model": {"build_model", "count_params"}}
DL_ATTRIBUTES = {"emulate_devices", "enable_compilation_cache", "worker_mesh", "load_corpus",
                 "ModelConfig"}


def solution_names(solution: Path) -> set[str]:
    """The names a student writes: functions with a solution block, and the names a top-level
    solution block assigns."""
    lines, names, current = solution.read_text().splitlines(), set(), None
    for line in lines:
        if m := re.match(r"def (\w+)\(", line):
            current = m[1]
        if line.strip() == blank.BEGIN and line.startswith(" ") and current:
            names.add(current)
    inside = False
    for line in lines:  # names assigned inside top-level blocks
        if line.strip() == blank.BEGIN and not line.startswith(" "):
            inside = True
        elif line.strip() == blank.END:
            inside = False
        elif inside and (m := blank._ASSIGNED.match(line)):
            names.update(n.strip() for n in m[1].split(","))
    return names


def answer_imports(source: str, answers: set[str]) -> list[str]:
    """What `source` (a notebook's code) imports or uses of diloco_lite beyond what a student
    notebook may, and any name it imports that is one of `answers`."""
    import ast

    found, aliases = [], set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "diloco_lite":
                    aliases.add(a.asname or a.name)
                elif a.name.startswith("diloco_lite."):
                    found.append(a.name)
                if (a.asname or a.name) in answers:
                    found.append(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for a in node.names:
                if module == "diloco_lite" or module.startswith("diloco_lite."):
                    if module == "diloco_lite.exercises" or module.startswith(
                            "diloco_lite.exercises."):
                        ok = a.name.startswith("check_") or a.name in DATA
                    else:
                        ok = a.name in ALLOWED_FROM.get(module, set())
                    if not ok:
                        found.append(f"{module}.{a.name}")
                if (a.asname or a.name) in answers:
                    found.append(a.asname or a.name)
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr not in DL_ATTRIBUTES):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def _code(notebook_py: Path) -> str:
    import jupytext

    nb = jupytext.read(notebook_py)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_no_student_notebook_imports_an_answer(solution):
    assert len(SOLUTIONS) == 9
    answers = solution_names(solution)
    assert answers, "every exercise notebook has answers to write"
    assert answer_imports(_code(EXERCISES / solution.name), answers) == []


def test_the_import_audit_finds_the_leaks_it_was_written_for():
    """The leaks the review found, planted back one at a time, and a few more."""
    answers = solution_names(EXERCISES / "solutions" / "04_decoupled_diloco.py")
    assert {"token_weights", "close_time", "handle", "rda_merge", "run_goodput"} <= answers
    planted = {
        "from diloco_lite.exercises.assemble import syncer":
            "diloco_lite.exercises.assemble.syncer",
        "from diloco_lite.reference.common import quantize":
            "diloco_lite.reference.common.quantize",
        "from diloco_lite.systems import bandwidth as bw": "diloco_lite.systems.bandwidth",
        "from diloco_lite.systems.goodput_closed import daly_interval":
            "diloco_lite.systems.goodput_closed.daly_interval",
        "from diloco_lite.clock import exchange_cost": "diloco_lite.clock.exchange_cost",
        "from diloco_lite.exercises.actors import _apply_position":
            "diloco_lite.exercises.actors._apply_position",
        "import diloco_lite.outer": "diloco_lite.outer",
        "import diloco_lite as dl\ndl.reference.decoupled(x)": "dl.reference",
        "from mylib import token_weights": "token_weights",
    }
    for source, leak in planted.items():
        assert answer_imports(source, answers) == [leak], source
    fine = ("import diloco_lite as dl\ndl.emulate_devices(8)\nfrom diloco_lite.exercises import "
            "check_syncer, SyncerRules\nfrom diloco_lite.model import count_params\n")
    assert answer_imports(fine, answers) == []


def test_the_exercises_package_exposes_no_answer():
    """The checks keep their references private: no module of diloco_lite.exercises has a
    public name a student writes, and the package exports checks and data only."""
    import importlib
    import pkgutil

    answers = set().union(*(solution_names(p) for p in SOLUTIONS))
    for info in pkgutil.iter_modules(ex.__path__):
        if info.name == "__main__":
            continue
        module = importlib.import_module(f"diloco_lite.exercises.{info.name}")
        public = {n for n in vars(module) if not n.startswith("_")}
        assert not public & answers, (info.name, public & answers)
    assert all(n.startswith("check_") or n in DATA | {"CHECKS", "Result"} for n in ex.__all__)


# ---- a wrong answer names the mistake, never the formula ------------------------------------

_OPS = {"+", "-", "*", "/", "**"}
_UNITS = re.compile(r"\b(?:[GMk]?bits?|[GMk]?B|Gbit|Mbit|kbit)/s\b")


def _tokens(text: str) -> list[tuple[str, str, bool]]:
    """(kind, text, glued to the previous token) of a message, math signs normalised."""
    text = _UNITS.sub(" UNIT ", text)
    for a, b in {"·": "*", "×": "*", "⋅": "*", "−": "-", "÷": "/", "^": "**", "√": " sqrt ",
                 "Σ": " sum ", "∑": " sum ", "‖": " ", "|": " "}.items():
        text = text.replace(a, b)
    text = re.sub(r"(?<=[^\W_])-(?=[^\W\d_])", "_", text)  # end-of-run, 4-bit: words
    out, end = [], 0
    for m in re.finditer(r"[^\W\d][\w′']*|\d+(?:[.,]\d+)*|\*\*|[-+*/=()]|\S", text):
        kind = ("name" if m[0][0].isalpha() or m[0][0] == "_" else
                "num" if m[0][0].isdigit() else m[0])
        out.append((kind, m[0], m.start() == end))
        end = m.end()
    return out


def _runs(text: str) -> list[str]:
    """The math-looking runs of a message as Python expressions (names renamed n0, n1, ...):
    operand (operator operand)*, an operand a name, a number, a call or a parenthesised run;
    a number glued to a name or a bracket multiplies it."""
    toks = _tokens(text)
    names: dict[str, str] = {}

    def operand(i):
        if i >= len(toks):
            return None
        kind, word, _ = toks[i]
        if kind == "name" and word == "sqrt" and i + 1 < len(toks):
            inner = operand(i + 1)
            return (f"sqrt({inner[0]})", inner[1]) if inner else None
        if kind == "(":
            inner = run(i + 1)
            if inner and inner[1] < len(toks) and toks[inner[1]][0] == ")":
                return (f"({inner[0]})", inner[1] + 1)
            return None
        if kind == "num":
            text_, j = word.replace(",", ""), i + 1
            if j < len(toks) and toks[j][2] and toks[j][0] in ("name", "("):
                rest = operand(j)
                if rest:
                    return (f"{text_}*{rest[0]}", rest[1])
            return (text_, j)
        if kind == "name" and word != "UNIT":
            name = names.setdefault(word, f"n{len(names)}")
            j = i + 1
            if j < len(toks) and toks[j][0] == "(" and toks[j][2]:  # a call: f(x)
                inner = run(j + 1)
                if inner and inner[1] < len(toks) and toks[inner[1]][0] == ")":
                    return (f"{name}({inner[0]})", inner[1] + 1)
            return (name, j)
        return None

    def run(i):
        first = operand(i)
        if not first:
            return None
        expr, j = first
        while j + 1 < len(toks) and toks[j][0] in _OPS | {"="}:
            nxt = operand(j + 1)
            if not nxt:
                break
            expr, j = f"{expr} {toks[j][1] if toks[j][0] != '=' else '=='} {nxt[0]}", nxt[1]
        return expr, j

    found, i = [], 0
    while i < len(toks):
        r = run(i)
        if r and any(op in r[0] for op in (" + ", " - ", " * ", " / ", " ** ", " == ")):
            found.append(r[0])
            i = r[1]
        else:
            i += 1
    return found


def _shape(node, names) -> str:
    """A canonical form of an expression: names by order of appearance, calls by function."""
    import ast

    if isinstance(node, ast.BinOp):
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**",
              ast.FloorDiv: "/"}.get(type(node.op), "?")
        return f"({_shape(node.left, names)}{op}{_shape(node.right, names)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return f"-{_shape(node.operand, names)}"
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return repr(float(node.value))
    if isinstance(node, ast.Call):
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", "f")
        if func in {"sqrt", "exp", "expm1", "sum", "mean", "max", "min", "round", "clip",
                    "abs", "log"}:
            return f"{func}(" + ",".join(_shape(a, names) for a in node.args) + ")"
    key = ast.dump(node)
    if isinstance(node, ast.Name):
        key = node.id
    elif isinstance(node, ast.Attribute):
        key = node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = str(node.slice.value)
    return names.setdefault(key, f"v{len(names)}")


def _binop_shapes(tree) -> set[str]:
    """The shapes of every arithmetic sub-expression with two different variables or more."""
    import ast

    shapes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            names: dict = {}
            shape = _shape(node, names)
            if len(names) >= 2:
                shapes.add(shape)
    return shapes


def solution_shapes(solution: Path) -> dict[str, set[str]]:
    """check name -> the shapes of the expressions in the solution blocks it checks (a block
    belongs to the first check called after it)."""
    import ast
    import textwrap

    text = solution.read_text()
    shapes: dict[str, set[str]] = {}
    for block in re.finditer(rf"{re.escape(blank.BEGIN)}\n(.*?)\n\s*{re.escape(blank.END)}",
                             text, re.S):
        check = re.search(r"\b(check_\w+)\(", text[block.end():])[1]
        code = textwrap.dedent(block[1])
        try:
            tree = ast.parse(code)
        except SyntaxError:  # a fragment of a function: parse it as one
            tree = ast.parse("def _():\n" + textwrap.indent(code, "    "))
        shapes.setdefault(check, set()).update(_binop_shapes(tree))
    return shapes


SHAPES: dict[str, set[str]] = {}
for _solution in SOLUTIONS:
    SHAPES.update(solution_shapes(_solution))


def formulas(message: str, check: str | None = None) -> list[str]:
    """The formulas in a message: a run with an equals sign and an operator, or with two
    operators over two different names or more; or any run with an expression of the
    solution `check` checks (every solution's, if None), up to the names."""
    import ast

    shapes = SHAPES.get(check, set()) if check else set().union(*SHAPES.values())
    found = []
    for expr in _runs(message):
        ops = sum(expr.count(f" {op} ") for op in ("+", "-", "*", "/", "**"))
        names = set(re.findall(r"\bn\d+\b", expr))
        if (" == " in expr and ops >= 1 and names) or (ops >= 2 and len(names) >= 2):
            found.append(expr)
            continue
        for side in expr.split(" == "):
            try:
                tree = ast.parse(side.strip(), mode="eval")
            except SyntaxError:
                continue
            if _binop_shapes(tree) & shapes:
                found.append(expr)
                break
    return found


def failure_strings(module_path: Path) -> list[str]:
    """Every string a check module can print on a failure: all its string literals (an
    f-string's fields read as a number) but docstrings and what passes (`success=`,
    `passed(...)`)."""
    import ast

    tree = ast.parse(module_path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            skip.add(id(node.body[0].value))
        if isinstance(node, ast.Call):
            parts = [k.value for k in node.keywords if k.arg == "success"]
            if getattr(node.func, "id", "") == "passed":
                parts += node.args
            for part in parts:
                skip.update(id(n) for n in ast.walk(part))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
            out.append("".join(v.value if isinstance(v, ast.Constant) else " 7 "
                               for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


CHECK_MODULES = sorted(p for p in (ROOT / "diloco_lite" / "exercises").glob("*.py")
                       if p.stem not in {"__init__", "__main__", "blank", "grade", "pack"})


@pytest.mark.parametrize("module", CHECK_MODULES, ids=lambda p: p.stem)
def test_no_failure_message_prints_a_formula(module):
    """Read from the source: every message a check of this module can print when an answer
    is wrong (the named mistakes, the catch-all, the hints, the errors)."""
    strings = failure_strings(module)
    assert len(strings) >= 5
    assert [(s, f) for s in strings if (f := formulas(s))] == []


OLD_MESSAGES = [  # formulas the checks used to print, and a few more
    "expected w_m = tokens_m · tokens_m / steps_m (up to a common scale)",
    "weigh quantity × quality, tokens · tokens/steps (learners with bigger batches took better "
    "steps)",
    "expected the later of the quorum time and min(t_quorum + grace, the last answer)",
    "expected (processed − lost) / Σ_m elapsed / step_time_m",
    "Δ should be θ − θ_m, leaf by leaf",
    "a ring all-reduce moves 2(R−1)/R = 1.75 times the payload through each link",
    "compare your formula with G = T_work / ((e^(λ(T_work+δ)) − 1)·(1/λ + W))",
    "Young's rule has a factor 2 under the root: √(2δ·MTBF)",
    "expected s = max|row|/7, codes clip(round(x/s), −7, 7), result codes·s",
    "RDA: r = Σ w‖Δ_m‖/Σ w, u = Σ w Δ_m/‖Δ_m‖, result r·u/‖u‖",
    "got 5, expected useful / (M × elapsed / step time) = 0.4",
]


def test_the_formula_detector_finds_formulas_and_spares_prose():
    for message in OLD_MESSAGES:
        assert formulas(message), message
    # the solution's own expression, in the message's notation, for the check it belongs to
    assert formulas("weigh each answer by its tokens · tokens / steps", "check_token_weights")
    assert formulas("each learner offers elapsed / its step time", "check_run_goodput")
    prose = ["the end-of-run flush is not merged like a sync: reread `flush`",
             "that is in GB/s: links are rated in Gbit/s", "your mean is 8× too large",
             "scenario 2 (failures): your decision 1 is a close of fragment 0 at 4.3 s with "
             "{0: 0.50, 1: 0.50}", "a 4-bit code, α = 0 is plain replacement, K = 2",
             "the ring's sequential hops: 3 of them (M = 4)"]
    for message in prose:
        assert formulas(message) == [], message


def test_putting_a_formula_back_into_a_check_fails_the_message_test(tmp_path):
    """The old catch-all of the token-weights check, put back into a copy of its module."""
    source = (ROOT / "diloco_lite" / "exercises" / "decoupled.py").read_text()
    current = 'other="your weights do not grow with the tokens per step as the notebook\'s "'
    assert current in source
    planted = tmp_path / "decoupled.py"
    planted.write_text(source.replace(current, 'other="expected w_m = tokens_m · tokens_m / '
                                               'steps_m (up to a common scale); "'))
    assert [s for s in failure_strings(planted) if formulas(s)]
    assert not [s for s in failure_strings(ROOT / "diloco_lite/exercises/decoupled.py")
                if formulas(s)]
