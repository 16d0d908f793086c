"""The readable reference refuses, with a ValueError naming the field, every setting it does not
model, instead of returning a wrong answer: each Decoupled DiLoCo layer what only a later layer
adds, and every method a custom outer optimizer, elasticity, failures in lock-step, layer
fragmentation. Each refusal happens before any training (these tests take milliseconds)."""

import importlib

import optax
import pytest

import diloco_lite as dl
from diloco_lite import reference
from tests.helpers import tiny_run

layers = importlib.import_module("diloco_lite.reference.decoupled")
D = dl.DecoupledDiLoCo
PLAIN = dict(fragments=2, overlap=1, bits=32, down_bits=32, quorum=4, merge="mean")
FAIL = dl.Cluster(failures=((1, 3.0, 5.0),))
LINK = dl.Cluster(link=dl.Link(latency_s=0.1))


def run(algo, **kw):
    return tiny_run(algo, workers=4, steps=8, **kw)


# (layer that refuses it, the field named, the config) — each later layer accepts it
LAYERED = [
    ("Core", "DecoupledDiLoCo.quorum", run(D(**{**PLAIN, "quorum": 2}))),
    ("Quorum", "DecoupledDiLoCo.merge", run(D(**{**PLAIN, "merge": "rda"}))),
    ("Weighted", "Cluster.failures", run(D(**PLAIN), cluster=FAIL)),
    ("Failures", "Cluster.link", run(D(**PLAIN), cluster=LINK)),
    ("Failures", "DecoupledDiLoCo.bits", run(D(**{**PLAIN, "bits": 4}))),
    ("Failures", "DecoupledDiLoCo.bits", run(D(**{**PLAIN, "down_bits": 4}))),
]
ORDER = ["Core", "Quorum", "Weighted", "Failures", "Run"]


@pytest.mark.parametrize("layer, field, cfg", LAYERED, ids=[f"{x[0]}-{x[1]}" for x in LAYERED])
def test_each_layer_refuses_what_a_later_layer_adds(layer, field, cfg, monkeypatch):
    for name in ORDER[: ORDER.index(layer) + 1]:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            getattr(layers, name)(cfg)
    accepted = []  # the next layer takes the setting: it gets as far as its model's setup
    monkeypatch.setattr(layers, "setup", lambda *a: accepted.append(a) or (_ for _ in ()).throw(
        KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        getattr(layers, ORDER[ORDER.index(layer) + 1])(cfg)
    assert accepted


@pytest.mark.parametrize("method, field, cfg", [
    (reference.decoupled, "DecoupledDiLoCo.outer_optimizer",
     run(D(fragments=2, outer_optimizer=optax.sgd(0.7)))),
    (reference.decoupled, "DecoupledDiLoCo.fragmentation",
     run(D(fragments=2, fragmentation="layers"))),
    (reference.decoupled, "RunConfig.algorithm", run(dl.DiLoCo(inner_steps=2))),
    (reference.diloco, "DiLoCo.outer_optimizer",
     run(dl.DiLoCo(inner_steps=2, outer_optimizer=optax.sgd(0.7)))),
    (reference.diloco, "DiLoCo.elastic", run(dl.DiLoCo(inner_steps=2, elastic=True))),
    (reference.diloco, "Cluster.failures", run(dl.DiLoCo(inner_steps=2), cluster=FAIL)),
    (reference.diloco, "RunConfig.algorithm", run(dl.DDP())),
    (reference.streaming, "StreamingDiLoCo.outer_optimizer",
     run(dl.StreamingDiLoCo(inner_steps=4, outer_optimizer=optax.sgd(0.7)))),
    (reference.streaming, "StreamingDiLoCo.elastic",
     run(dl.StreamingDiLoCo(inner_steps=4, elastic=True))),
    (reference.streaming, "Cluster.failures", run(dl.StreamingDiLoCo(inner_steps=4),
                                                  cluster=FAIL)),
    (reference.streaming, "StreamingDiLoCo.fragmentation",
     run(dl.StreamingDiLoCo(inner_steps=4, fragments=2, fragmentation="layers"))),
    (reference.ddp, "DDP.elastic", run(dl.DDP(elastic=True))),
    (reference.ddp, "Cluster.failures", run(dl.DDP(), cluster=FAIL)),
], ids=lambda x: x if isinstance(x, str) else "")
def test_every_method_refuses_what_it_does_not_model(method, field, cfg):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        method(cfg)
