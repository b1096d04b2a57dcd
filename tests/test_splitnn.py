import math

import numpy as np
import pytest
import torch

from securevfl.channel import MessageKind
from securevfl.channel.codec import encode_json, tensor_nbytes
from securevfl.hooks import HookContext, TensorHook
from securevfl.lab.compose import execute


def test_splitnn_digits_accuracy_and_bytes_match_derivation(digits_cfg):
    digits_cfg.train.epochs = 5
    out = execute(digits_cfg)
    r = out.to_json()
    assert r["utility"]["metric"] == "accuracy" and r["utility"]["test"] >= 0.85
    n, b, d = len(out.partition.labeled_ids), digits_cfg.train.batch_size, digits_cfg.model.cut_dim
    n_test, epochs = len(out.partition.active.test_ids), digits_cfg.train.epochs
    sizes = [min(b, n - s) for s in range(0, n, b)] * epochs  # training batches
    assert r["cost"]["train_steps"] == len(sizes)
    act = sum(tensor_nbytes((s, d)) for s in sizes) + tensor_nbytes((n_test, d))  # + one eval batch
    grad = sum(tensor_nbytes((s, d)) for s in sizes)
    ids = sum(tensor_nbytes((s,), 8) for s in sizes) + tensor_nbytes((n_test,), 8)
    control = len(sizes) + 1  # one JSON byte naming the split per request
    # and the end of the run: the active party's request, the passive party's report on itself
    report = {"party": "passive1", "steps": len(sizes), "privacy": [], "he": out.federation.cut.describe()}
    control += len(encode_json({"op": "end", "reply": True})) + len(encode_json(report))
    # and the supervised stage's size, for the passive party's progress line
    control += len(encode_json({"op": "progress", "reply": False, "desc": "train", "total": len(sizes),
                                "per_epoch": len(sizes) // epochs, "done": 0}))
    align = tensor_nbytes((len(out.partition.aligned_ids),), 8)
    by_kind = r["cost"]["bytes_by_kind"]
    assert by_kind[MessageKind.ACTIVATION] == act
    assert by_kind[MessageKind.GRADIENT] == grad
    assert by_kind[MessageKind.BATCH_IDS] == ids
    assert r["cost"]["bytes_sent"] == act + grad + ids + control + align > 0


def test_what_each_party_saw(digits_cfg):
    digits_cfg.train.epochs = 1
    digits_cfg.record = True
    out = execute(digits_cfg)
    ch = out.federation.channel
    assert ch.pending() == 0
    passive_kinds = {m.kind for m in ch.received_by("passive1")}
    active_kinds = {m.kind for m in ch.received_by("active")}
    assert passive_kinds == {MessageKind.CONTROL, MessageKind.BATCH_IDS, MessageKind.GRADIENT, MessageKind.ALIGNMENT}
    assert active_kinds == {MessageKind.ACTIVATION, MessageKind.CONTROL}  # CONTROL: the passive party's report
    assert sum(m.kind == MessageKind.CONTROL for m in ch.received_by("active")) == 1
    # the passive party never receives a label-shaped message: gradients are (b, cut_dim) floats
    from securevfl.channel.codec import decode_array
    for m in ch.received_by("passive1"):
        if m.kind == MessageKind.GRADIENT:
            arr = decode_array(m.payload)
            assert arr.dtype == np.float32 and arr.shape[1] == digits_cfg.model.cut_dim
    # and the passive party object holds no labels
    assert out.federation.passives[0].data.label_ids is None


def test_same_seed_same_metrics_different_seed_differs(digits_cfg):
    digits_cfg.train.epochs = 1
    a, b = execute(digits_cfg).to_json(), execute(digits_cfg).to_json()
    digits_cfg.seed = 1
    c = execute(digits_cfg).to_json()
    assert a["utility"] == b["utility"] and a["partition"]["fingerprint"] == b["partition"]["fingerprint"]
    assert a["partition"]["fingerprint"] != c["partition"]["fingerprint"]


def test_local_uses_no_channel_and_only_active_columns(digits_cfg):
    digits_cfg.train.epochs = 5
    digits_cfg.method = "local"
    out = execute(digits_cfg)
    assert out.federation.passives == []
    assert out.to_json()["cost"]["bytes_sent"] == 0
    assert out.to_json()["utility"]["test"] > 0.5


class ZeroGradient(TensorHook):
    acts_on = frozenset({MessageKind.GRADIENT})
    name = "zero"

    def __init__(self):
        self.calls: list[HookContext] = []

    def __call__(self, t, ctx):
        self.calls.append(ctx)
        return torch.zeros_like(t)


class BadShape(TensorHook):
    acts_on = frozenset({MessageKind.ACTIVATION})
    name = "bad"

    def __call__(self, t, ctx):
        return t[:, :1]


def test_gradient_hook_runs_at_active_before_sending(digits_cfg):
    digits_cfg.train.epochs = 1
    out = execute(digits_cfg, hooks=[ZeroGradient()])
    fed = out.federation
    hook = fed.active.hooks[0]
    assert len(hook.calls) == out.to_json()["cost"]["train_steps"]
    assert all(c.src == "active" and c.dst == "passive1" and c.training for c in hook.calls)
    assert fed.passives[0].hooks[0].calls == []  # the passive party sends no gradients
    # with every returned gradient zeroed, the passive bottom model keeps its initial weights
    from securevfl.federation import OptimConfig, build_federation
    fresh = build_federation(out.partition, digits_cfg.model, OptimConfig(), digits_cfg.seed)
    for p0, p1 in zip(fresh.passives[0].bottom.parameters(), fed.passives[0].bottom.parameters(), strict=True):
        assert torch.equal(p0, p1)
    for p0, p1 in zip(fresh.active.bottom.parameters(), fed.active.bottom.parameters(), strict=True):
        assert not torch.equal(p0, p1)


def test_hook_may_not_change_shape(digits_cfg):
    with pytest.raises(RuntimeError, match="changed"):
        execute(digits_cfg, hooks=[BadShape()])


def test_three_parties(digits_cfg):
    digits_cfg.partition.n_parties = 3
    digits_cfg.partition.aligned_fraction = 0.5
    out = execute(digits_cfg)
    assert len(out.federation.passives) == 2
    assert math.isfinite(out.to_json()["utility"]["test"])
    assert out.to_json()["partition"]["aligned"] == round(0.5 * 1438)


def test_divergence_is_a_clear_error(digits_cfg, capsys):
    from securevfl.cli import main

    code = main(["train", "--dataset", "digits", "--epochs", "2", "--optimizer", "sgd", "--lr", "1e6"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: training diverged") and len(err.splitlines()) == 1
