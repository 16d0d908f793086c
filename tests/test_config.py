"""Bad input gets a ValueError naming the field and its range; valid input runs."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diloco_lite as dl
from diloco_lite import outer
from diloco_lite.model import build_model, count_params
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
    (lambda: dl.StreamingDiLoCo(fragmentation="random"), "StreamingDiLoCo.fragmentation"),
    (lambda: dl.DecoupledDiLoCo(quorum=0), "DecoupledDiLoCo.quorum"),
    (lambda: dl.DecoupledDiLoCo(bits=3), "DecoupledDiLoCo.bits"),
    (lambda: dl.DecoupledDiLoCo(down_bits=1), "DecoupledDiLoCo.down_bits"),
    (lambda: dl.DiLoCo(elastic=1), "DiLoCo.elastic"),
    (lambda: dl.ModelConfig(d_model=30, n_heads=4), "ModelConfig.n_heads"),
])
def test_algorithm_configs_reject_bad_values(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_messages_name_the_allowed_range():
    with pytest.raises(ValueError, match=r"overlap=7 is invalid: must be an integer in \[0, 4\]"):
        dl.StreamingDiLoCo(inner_steps=5, overlap=7)


@pytest.mark.parametrize("model", [TINY, dl.ModelConfig(), dl.ModelConfig(n_layers=5),
                                   dl.ModelConfig(d_model=8, n_layers=3, n_heads=1)])
def test_n_tensors_counts_the_models_parameter_tensors(model):
    params = build_model(dataclasses.replace(model, vocab_size=80)).init(0)
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
    logits = model.apply(params, jnp.zeros((3, 16), jnp.int32))
    assert logits.shape == (3, 16, 80)


def test_model_is_causal():
    model = build_model(dataclasses.replace(TINY, vocab_size=80))
    params = model.init(1)
    a = jnp.arange(16)[None] % 80
    b = a.at[0, 10].set(79)
    la, lb = model.apply(params, a), model.apply(params, b)
    assert jnp.allclose(la[0, :10], lb[0, :10], atol=1e-6)
    assert not jnp.allclose(la[0, 10:], lb[0, 10:], atol=1e-6)


algorithms = st.one_of(
    st.just(dl.DDP()),
    st.builds(dict, inner_steps=st.integers(-2, 4)).map(lambda k: ("DiLoCo", k)),
    st.builds(dict, inner_steps=st.integers(0, 4), fragments=st.integers(0, 3),
              overlap=st.integers(-1, 4), mix=st.floats(-0.5, 1.5), bits=st.sampled_from(
                  [2, 4, 8, 16, 32])).map(lambda k: ("StreamingDiLoCo", k)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(algo=algorithms, workers=st.integers(-1, 17), steps=st.integers(-1, 3),
       batch=st.integers(-1, 2), seq_len=st.integers(-1, 20),
       split=st.sampled_from(["iid", "by_genre", "shuffled"]))
def test_any_config_either_runs_or_raises_value_error(algo, workers, steps, batch, seq_len, split):
    try:
        if isinstance(algo, tuple):
            algo = getattr(dl, algo[0])(**algo[1])
        cfg = tiny_run(algo, workers=workers, steps=steps, batch_size=batch, seq_len=seq_len,
                       split=split, eval_every=None)
        result = dl.train(cfg, progress=False)
    except ValueError as e:
        assert "is invalid: must be" in str(e)
        return
    assert len(result.history) >= 1 and result.history.step.iloc[-1] == steps
    assert jnp.isfinite(result.history.val_loss.iloc[-1])
