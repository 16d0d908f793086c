"""Bad input gets a ValueError naming the field and its range; valid input runs."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import diloco_lite as dl
from diloco_lite import outer
from diloco_lite.clock import Cluster, FailureRate, Link
from diloco_lite.model import build_model, count_params
from diloco_lite.training import run_label
from tests.helpers import TINY, tiny_run


@pytest.mark.parametrize("kwargs, field", [
    (dict(workers=0), "RunConfig.workers"),
    (dict(workers=-3), "RunConfig.workers"),
    (dict(steps=0), "RunConfig.steps"),
    (dict(batch_size=0), "RunConfig.batch_size"),
    (dict(seq_len=17), "RunConfig.seq_len"),  # TINY.context is 16
    (dict(seq_len=0), "RunConfig.seq_len"),
    (dict(split="by_play"), "RunConfig.split"),
    (dict(corpus="tolstoy"), "RunConfig.corpus"),
    (dict(learning_rate=-1.0), "RunConfig.learning_rate"),
    (dict(workers=2.5), "RunConfig.workers"),
    (dict(algorithm="ddp"), "RunConfig.algorithm"),
])
def test_run_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        tiny_run(**{"algorithm": dl.DDP(), **kwargs})


@pytest.mark.parametrize("make, field", [
    (lambda: dl.DiLoCo(inner_steps=0), "DiLoCo.inner_steps"),
    (lambda: dl.StreamingDiLoCo(inner_steps=0), "StreamingDiLoCo.inner_steps"),
    (lambda: dl.StreamingDiLoCo(fragments=0), "StreamingDiLoCo.fragments"),
    (lambda: dl.StreamingDiLoCo(inner_steps=5, overlap=5), "StreamingDiLoCo.overlap"),
    (lambda: dl.StreamingDiLoCo(overlap=-1), "StreamingDiLoCo.overlap"),
    (lambda: dl.StreamingDiLoCo(mix=1.5), "StreamingDiLoCo.mix"),
    (lambda: dl.StreamingDiLoCo(mix=-0.1), "StreamingDiLoCo.mix"),
    (lambda: dl.StreamingDiLoCo(bits=3), "StreamingDiLoCo.bits"),
    (lambda: dl.StreamingDiLoCo(bits=4.0), "StreamingDiLoCo.bits"),  # equal to 4, not an int
    (lambda: dl.DecoupledDiLoCo(down_bits=8.0), "DecoupledDiLoCo.down_bits"),
    (lambda: dl.StreamingDiLoCo(fragmentation="random"), "StreamingDiLoCo.fragmentation"),
    (lambda: dl.DecoupledDiLoCo(quorum=0), "DecoupledDiLoCo.quorum"),
    (lambda: dl.DecoupledDiLoCo(bits=3), "DecoupledDiLoCo.bits"),
    (lambda: dl.DecoupledDiLoCo(down_bits=1), "DecoupledDiLoCo.down_bits"),
    (lambda: dl.DiLoCo(elastic=1), "DiLoCo.elastic"),
    (lambda: dl.DDP(bits=8), "DDP.bits"),  # DDP: fp32 or bfloat16 only
    (lambda: dl.DDP(bits=4), "DDP.bits"),
    (lambda: dl.DDP(bits=True), "DDP.bits"),
    (lambda: dl.DDP(bits=16.0), "DDP.bits"),
    (lambda: dl.ModelConfig(d_model=30, n_heads=4), "ModelConfig.n_heads"),
])
def test_algorithm_configs_reject_bad_values(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_messages_name_the_allowed_range():
    with pytest.raises(ValueError, match=r"overlap=7 is invalid: must be an integer in \[0, 4\]"):
        dl.StreamingDiLoCo(inner_steps=5, overlap=7)
    with pytest.raises(ValueError, match=r"DDP.bits=8 is invalid: must be one of \(32, 16\)"):
        dl.DDP(bits=8)


def test_ddp_in_bfloat16_is_named_so():
    assert dl.DDP().bits == 32 and dl.DDP(bits=16).bits == 16
    assert run_label(tiny_run(dl.DDP(bits=16))) == "DDP bf16 M=8"
    assert run_label(tiny_run(dl.DDP())) == "DDP M=8"


@pytest.mark.parametrize("model", [TINY, dl.ModelConfig(), dl.ModelConfig(n_layers=5),
                                   dl.ModelConfig(d_model=8, n_layers=3, n_heads=1)])
def test_n_tensors_counts_the_models_parameter_tensors(model):
    built = build_model(dataclasses.replace(model, vocab_size=80))
    params = jax.eval_shape(lambda: built.init(0))  # the shapes: initializing took seconds
    assert model.n_tensors == len(jax.tree.leaves(params))
    outer.fragments(params, model.n_tensors)  # one tensor a fragment: the most there can be
    with pytest.raises(ValueError, match="fragments"):
        outer.fragments(params, model.n_tensors + 1)


@pytest.mark.parametrize("algo", [dl.StreamingDiLoCo, dl.DecoupledDiLoCo])
def test_more_fragments_than_tensors_fails_when_the_run_is_configured(algo):
    """Not inside `train` after loading the corpus: the RunConfig names the field and the
    model's tensor count (the default model has 4 + 11 · 2 = 26, TINY 4 + 11 = 15)."""
    name = algo.__name__
    with pytest.raises(ValueError, match=rf"^{name}.fragments=99 .*\[1, 26\].*26 tensors"):
        dl.RunConfig(algorithm=algo(fragments=99))
    with pytest.raises(ValueError, match=rf"^{name}.fragments=16 .*\[1, 15\]"):
        dl.RunConfig(algorithm=algo(fragments=16), model=TINY, seq_len=16)
    dl.RunConfig(algorithm=algo(fragments=15), model=TINY, seq_len=16)
    dl.RunConfig(algorithm=algo(fragments=26))
    with pytest.raises(ValueError, match=r"^DecoupledDiLoCo.fragments=24 .*\[1, 15\]"):
        dl.RunConfig(algorithm=dl.DecoupledDiLoCo(), model=TINY, seq_len=16)  # default P = 24


def test_workers_not_divisible_by_devices():
    with pytest.raises(ValueError, match=r"workers=12 is invalid: must be a multiple of the 8"):
        dl.worker_mesh(12)
    assert dl.worker_mesh(3).devices == 3  # fewer workers than devices: one device each
    assert dl.worker_mesh(24).workers_per_device == 3


def test_model_shapes_and_parameter_count():
    cfg = dataclasses.replace(TINY, vocab_size=80)
    model = build_model(cfg)
    params = model.init(0)
    d, f = cfg.d_model, cfg.d_model * cfg.mlp_ratio
    assert params["embed"]["embedding"].shape == (80, d)
    assert params["pos"].shape == (cfg.context, d)
    assert params["block_0"]["qkv"]["kernel"].shape == (d, 3 * d)
    per_block = (d * 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
    assert count_params(params) == 80 * d + cfg.context * d + per_block * cfg.n_layers + 2 * d
    logits = jax.jit(model.apply)(params, jnp.zeros((3, 16), jnp.int32))  # op by op: seconds
    assert logits.shape == (3, 16, 80)


def test_model_is_causal():
    model = build_model(dataclasses.replace(TINY, vocab_size=80))
    params = model.init(1)
    a = jnp.arange(16)[None] % 80
    b = a.at[0, 10].set(79)
    apply = jax.jit(model.apply)  # one program: op by op, each op compiled took seconds
    la, lb = apply(params, a), apply(params, b)
    assert jnp.allclose(la[0, :10], lb[0, :10], atol=1e-6)
    assert not jnp.allclose(la[0, 10:], lb[0, 10:], atol=1e-6)


# --------------------------------------------------------------------------------------------
# Any config: every field valid (it constructs), or one made invalid (the error names it)
# --------------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
NOT_INT = st.sampled_from([2.5, True, False, "3"])
POSITIVE = st.floats(1e-3, 10.0)
NOT_POSITIVE = st.one_of(st.floats(-10.0, 0.0), st.sampled_from([NAN, INF, True, "0.7"]))
UNIT = st.floats(0.0, 1.0)
NOT_UNIT = st.one_of(st.floats(1.0, 10.0, exclude_min=True),
                     st.floats(-10.0, 0.0, exclude_max=True), st.sampled_from([NAN, True, "0.5"]))
BITS, NOT_BITS = st.sampled_from([32, 16, 8, 4, 2]), st.sampled_from([0, 1, 3, 5, 64, -4, True,
                                                                       4.0, "4"])


def int_in(lo, hi=None):
    return st.integers(lo, lo + 40 if hi is None else hi)


def int_not_in(lo, hi=None):
    outside = [st.integers(lo - 40, lo - 1)] + ([] if hi is None else [st.integers(hi + 1,
                                                                                   hi + 40)])
    return st.one_of(*outside, NOT_INT)


def valid_h(kw):
    """The inner steps drawn so far, or 1 where they were made invalid (overlap's range)."""
    h = kw.get("inner_steps")
    return h if isinstance(h, int) and not isinstance(h, bool) and h >= 1 else 1


def field(name, valid, invalid, prefix=None):
    """One field of a config: (keyword, the error's field, valid(kw, ctx), invalid(kw, ctx)),
    the strategies as functions of the fields drawn before and of the run around it."""
    return name, prefix, valid, invalid


def always(strategy):
    return lambda kw, ctx: strategy


def _divisors(d):
    return [k for k in range(1, d + 1) if d % k == 0] if isinstance(d, int) and d >= 1 else [1]


def _windows(draws):
    """Failure windows from (learner, gap, length) draws: sorted, disjoint per learner."""
    last, out = {}, []
    for m, gap, length in draws:
        down = last.get(m, 0.0) + gap
        out.append((m, down, down + length))
        last[m] = down + length
    return tuple(out)


H = field("inner_steps", always(int_in(1, 60)), always(int_not_in(1)))
LR = field("outer_lr", always(POSITIVE), always(NOT_POSITIVE))
ELASTIC = field("elastic", always(st.booleans()), always(st.sampled_from([0, 1, "yes", None])))
FRAGMENTS = field("fragments", lambda kw, ctx: int_in(1, ctx["tensors"]),
                  always(int_not_in(1)))
OVERLAP = field("overlap", lambda kw, ctx: int_in(0, valid_h(kw) - 1),
                lambda kw, ctx: int_not_in(0, valid_h(kw) - 1))
HOW = field("fragmentation", always(st.sampled_from(["balanced", "layers"])),
            always(st.sampled_from(["random", "Layers", None])))
SPECS = {
    "DDP": [ELASTIC, field("bits", always(st.sampled_from([32, 16])),
                           always(st.sampled_from([8, 4, 2, 64, 0, True, 16.0, "16", None])))],
    "DiLoCo": [H, LR, ELASTIC],
    "StreamingDiLoCo": [H, LR, FRAGMENTS, OVERLAP, field("mix", always(UNIT), always(NOT_UNIT)),
                        field("bits", always(BITS), always(NOT_BITS)), HOW, ELASTIC],
    "DecoupledDiLoCo": [
        H, LR, FRAGMENTS, OVERLAP, field("bits", always(BITS), always(NOT_BITS)),
        field("down_bits", always(BITS), always(NOT_BITS)),
        field("quorum", lambda kw, ctx: int_in(1, ctx["workers"]), always(int_not_in(1))),
        field("mix", always(UNIT), always(NOT_UNIT)),
        field("grace_safety", always(UNIT), always(NOT_UNIT)),
        field("merge", always(st.sampled_from(["rda", "mean"])),
              always(st.sampled_from(["RDA", "median", None]))), HOW],
    "ModelConfig": [
        field("vocab_size", always(st.one_of(st.none(), int_in(2, 200))),
              always(st.one_of(st.integers(-5, 1), st.sampled_from([2.5, True, "80"])))),
        field("context", always(int_in(1, 128)), always(int_not_in(1))),
        field("d_model", always(st.sampled_from([4, 6, 8, 12, 16, 32])), always(int_not_in(1))),
        field("n_layers", always(int_in(1, 4)), always(int_not_in(1))),
        field("n_heads",  # a divisor of d_model (or a number that is not)
              lambda kw, ctx: st.sampled_from(_divisors(kw["d_model"])),
              lambda kw, ctx: st.one_of(int_not_in(1), st.sampled_from(
                  [k for k in range(1, 2 * kw["d_model"] + 2) if kw["d_model"] % k]))),
        field("mlp_ratio", always(int_in(1, 8)), always(int_not_in(1)))],
    "Cluster": [
        field("step_time_s", always(st.one_of(st.floats(0.01, 10.0), st.lists(
            st.floats(0.01, 10.0), min_size=1, max_size=4).map(tuple))),
            always(st.one_of(st.floats(-10.0, 0.0), st.sampled_from([NAN, INF, True, "1", ()]),
                             st.tuples(st.floats(0.01, 10.0),
                                       st.sampled_from([0.0, -1.0, NAN, INF, True]))))),
        field("speed_spread", always(st.floats(0.0, 2.0)), always(st.one_of(
            st.floats(-5.0, 0.0, exclude_max=True), st.sampled_from([NAN, INF, True])))),
        field("jitter", always(st.floats(0.0, 1.0, exclude_max=True)), always(NOT_UNIT | st.just(
            1.0))),
        field("link", always(st.builds(Link, gbit_per_s=st.one_of(st.floats(0.1, 100.0),
                                                                  st.just(INF)),
                                       latency_s=st.floats(0.0, 1.0))),
              always(st.sampled_from(["fast", 1.0, None]))),
        field("failures", always(st.one_of(
            st.just(()), st.builds(FailureRate, mtbf_s=st.floats(1.0, 100.0),
                                   down_s=st.floats(0.1, 10.0)),
            st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 50.0), st.floats(0.1, 50.0)),
                     max_size=4).map(_windows))),
            always(st.sampled_from([((0, 5.0, 3.0),), ((0, 1.0, 5.0), (0, 4.0, 6.0)),
                                    ((-1, 1.0, 2.0),), ((0, 1.0),), "often",
                                    ((0, -1.0, 2.0),), ((0, 1.0, NAN),)]))),
        field("seed", always(int_in(0, 100)), always(int_not_in(0)))],
}


def draw_fields(data, spec, bad, ctx):
    """The keywords of one config: each field drawn valid, except the `bad`-th, invalid."""
    kw = {}
    for i, (name, _, valid, invalid) in enumerate(spec):
        if i == bad:
            kw[name] = data.draw(invalid(kw, ctx), label=name)
        elif name not in kw:
            kw[name] = data.draw(valid(kw, ctx), label=name)
    return kw


@st.composite
def valid_algorithm(draw, ctx):
    name = draw(st.sampled_from(["DDP", "DiLoCo", "StreamingDiLoCo", "DecoupledDiLoCo"]))
    return getattr(dl, name)(**draw_fields(draw(st.data()), SPECS[name], None, ctx))


def run_ctx(kw):
    model = kw["model"] if isinstance(kw.get("model"), dl.ModelConfig) else TINY
    workers = kw["workers"] if isinstance(kw.get("workers"), int) and kw["workers"] >= 1 else 8
    return {"tensors": model.n_tensors, "workers": workers, "context": model.context}


RUN = [
    field("workers", always(int_in(1, 16)), always(int_not_in(1))),
    field("model", always(st.sampled_from([TINY, dl.ModelConfig(), dl.ModelConfig(
        d_model=16, n_layers=3, n_heads=2, context=32)])),
        always(st.sampled_from(["tiny", None, {"d_model": 16}]))),
    field("algorithm", lambda kw, ctx: valid_algorithm(run_ctx(kw)),
          always(st.sampled_from(["ddp", dl.DDP, None]))),
    # the algorithm valid on its own, but not for this run: K > M, more fragments than tensors
    field("algorithm", None, lambda kw, ctx: int_in(run_ctx(kw)["workers"] + 1).map(
        lambda k: dl.DecoupledDiLoCo(quorum=k, fragments=1)), prefix="DecoupledDiLoCo.quorum"),
    *[field("algorithm", None, lambda kw, ctx, a=a: int_in(run_ctx(kw)["tensors"] + 1).map(
        lambda p, a=a: a(fragments=p)), prefix=f"{a.__name__}.fragments")
      for a in (dl.StreamingDiLoCo, dl.DecoupledDiLoCo)],
    field("steps", always(int_in(1, 1000)), always(int_not_in(1))),
    field("batch_size", always(int_in(1, 64)), always(int_not_in(1))),
    field("seq_len", lambda kw, ctx: int_in(1, run_ctx(kw)["context"]),
          lambda kw, ctx: int_not_in(1, run_ctx(kw)["context"])),
    field("learning_rate", always(POSITIVE), always(NOT_POSITIVE)),
    field("warmup_steps", always(int_in(0, 100)), always(int_not_in(0))),
    field("split", always(st.sampled_from(["iid", "by_genre"])),
          always(st.sampled_from(["by_play", "IID", None]))),
    field("corpus", always(st.just("shakespeare")), always(st.sampled_from(["tolstoy", None]))),
    field("eval_every", always(st.one_of(st.none(), int_in(1, 100))), always(int_not_in(1))),
    field("eval_batches", always(int_in(1, 16)), always(int_not_in(1))),
    field("seed", always(int_in(0, 100)), always(int_not_in(0))),
    field("cluster", lambda kw, ctx: st.one_of(
        st.none(), st.just(Cluster(jitter=0.1)),
        st.just(Cluster(step_time_s=(1.0,) * run_ctx(kw)["workers"])),
        st.just(Cluster(failures=((run_ctx(kw)["workers"] - 1, 1.0, 2.0),)))),
        always(st.sampled_from(["fast", Link()]))),
    # a cluster valid on its own, but not for these workers
    field("cluster", None, lambda kw, ctx: st.just(Cluster(
        step_time_s=(1.0,) * (run_ctx(kw)["workers"] + 1))), prefix="Cluster.step_time_s"),
    field("cluster", None, lambda kw, ctx: st.just(Cluster(
        failures=((run_ctx(kw)["workers"], 1.0, 2.0),))), prefix="Cluster.failures"),
    field("warm_start", lambda kw, ctx: st.none() if not isinstance(kw["model"], dl.ModelConfig)
          else st.one_of(st.none(), st.just(dl.RunConfig(model=kw["model"], steps=5,
                                                         seq_len=kw["model"].context))),
        lambda kw, ctx: st.sampled_from(["ddp", dl.RunConfig(model=dl.ModelConfig(
            n_layers=4))])),
]
CLASSES = {**{name: getattr(dl, name) for name in SPECS}, "RunConfig": dl.RunConfig}
SPECS["RunConfig"] = RUN


@settings(max_examples=1500, deadline=None)
@given(data=st.data())
def test_a_bad_field_is_named_and_a_good_config_constructs(data):
    """Every config (the four algorithms, the model, the cluster, the run) drawn with valid
    fields constructs; with one field made invalid it raises a ValueError that begins with
    that field's name (`DecoupledDiLoCo.quorum=...`), also when the field is valid alone but
    not in the run (K > M, P > the model's tensors, a cluster of other M)."""
    name = data.draw(st.sampled_from(sorted(CLASSES)), label="config")
    spec = SPECS[name]
    bad = data.draw(st.one_of(st.none(), st.sampled_from(range(len(spec)))), label="bad")
    kw = draw_fields(data, spec, bad, {"tensors": 40, "workers": 40})
    if bad is None:
        CLASSES[name](**kw)
        return
    with pytest.raises(ValueError) as error:
        CLASSES[name](**kw)
    what = spec[bad][1] or f"{name}.{spec[bad][0]}"
    message = str(error.value)
    assert re.match(rf"{re.escape(what)}[=\[ ]", message) and "is invalid: must be" in message, (
        what, message)


def _invalid_fields(kind, a, workers, steps, batch, seq_len, split, cluster):
    """The fields of a drawn run that are out of range, worked out here from the ranges."""
    bad = set()
    bad |= {"RunConfig.workers"} if workers < 1 else set()
    bad |= {"workers"} if workers > 8 and workers % 8 else set()  # the 8 devices (worker_mesh)
    bad |= {"RunConfig.steps"} if steps < 1 else set()
    bad |= {"RunConfig.batch_size"} if batch < 1 else set()
    bad |= {"RunConfig.seq_len"} if not 1 <= seq_len <= TINY.context else set()
    bad |= {"RunConfig.split"} if split not in ("iid", "by_genre") else set()
    if kind != "DDP":
        bad |= {f"{kind}.inner_steps"} if a["inner_steps"] < 1 else set()
    if kind in ("StreamingDiLoCo", "DecoupledDiLoCo"):
        bad |= {f"{kind}.fragments"} if not 1 <= a["fragments"] <= 15 else set()
        bad |= {f"{kind}.overlap"} if not 0 <= a["overlap"] < a["inner_steps"] else set()
        bad |= {f"{kind}.mix"} if not 0 <= a["mix"] <= 1 else set()
    if kind == "DecoupledDiLoCo":
        bad |= {"DecoupledDiLoCo.quorum"} if not 1 <= a["quorum"] <= max(workers, 1) else set()
    if cluster is not None and len(cluster.step_time_s) != workers:
        bad |= {"Cluster.step_time_s"}
    return bad


def mostly(valid, invalid):
    """`valid` 4 times in 5 (the first four choices: shrinking goes to valid values), so that
    some of the runs, which have up to 10 fields, are valid and train."""
    return st.sampled_from(range(5)).flatmap(lambda r: invalid if r == 4 else valid)


@st.composite
def runs(draw):
    kind = draw(st.sampled_from(["DecoupledDiLoCo", "StreamingDiLoCo", "DiLoCo", "DDP"]))
    workers = draw(mostly(st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([-1, 0, 12, 17])))
    fields = {}
    if kind != "DDP":
        fields["inner_steps"] = h = draw(mostly(st.integers(1, 4), st.integers(-1, 0)))
    if kind in ("StreamingDiLoCo", "DecoupledDiLoCo"):
        fields.update(
            fragments=draw(mostly(st.integers(1, 15), st.sampled_from([0, 16, 17]))),
            overlap=draw(mostly(st.integers(0, max(h - 1, 0)), st.sampled_from([-1, max(h, 1)]))),
            mix=draw(mostly(st.floats(0.0, 1.0), st.sampled_from([-0.5, 1.5]))),
            bits=draw(st.sampled_from([2, 4, 8, 16, 32])))
    if kind == "DecoupledDiLoCo":
        fields["quorum"] = draw(mostly(st.integers(1, max(workers, 1)),
                                       st.sampled_from([0, max(workers, 1) + 1])))
    return dict(
        kind=kind, fields=fields, workers=workers,
        steps=draw(mostly(st.integers(1, 3), st.integers(-1, 0))),
        batch=draw(mostly(st.integers(1, 2), st.integers(-1, 0))),
        seq_len=draw(mostly(st.integers(1, 16), st.sampled_from([-1, 0, 17, 20]))),
        split=draw(mostly(st.sampled_from(["iid", "by_genre"]), st.just("shuffled"))),
        cluster=draw(st.one_of(st.none(), mostly(st.just(max(workers, 1)), st.integers(1, 17)).map(
            lambda m: Cluster(step_time_s=tuple(1.0 + (i % 2) for i in range(m)))))))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs())
def test_any_run_either_trains_or_names_a_field_out_of_range(run):
    """A run drawn over valid and invalid values of several fields at once: when none is out
    of range (by the ranges written here), it trains to its last step; otherwise it raises a
    ValueError naming one of the fields that are, before or inside `train`."""
    kind, fields, workers, steps, batch, seq_len, split, cluster = run.values()
    bad = _invalid_fields(kind, fields, workers, steps, batch, seq_len, split, cluster)
    try:
        cfg = tiny_run(getattr(dl, kind)(**fields), workers=workers, steps=steps,
                       batch_size=batch, seq_len=seq_len, split=split, eval_every=None,
                       cluster=cluster)
        result = dl.train(cfg, progress=False)
    except ValueError as e:
        event("raised")
        named = str(e).split("=", 1)[0].split("[", 1)[0]
        assert named in bad and "is invalid: must be" in str(e), (str(e), bad)
        return
    assert not bad, f"{bad} are out of range, but the run trained"
    event(f"trained {kind}")
    assert len(result.history) >= 1 and result.history.step.iloc[-1] == steps
    assert jnp.isfinite(result.history.val_loss.iloc[-1])
