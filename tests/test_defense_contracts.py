"""The defense contracts (securevfl/hooks.py) take a new kind of defense without a core edit
(issue 26): hook point (d) — an extra loss term at the passive party (dCor / NoPeek's shape) and a
model wrap at the active party (MID's shape) — defined only here, registered through the ordinary
registry and run through the ordinary pipeline."""

from __future__ import annotations

import torch
from torch import nn

from defenses.base import DEFENSES, Defense
from securevfl.channel import MessageKind
from securevfl.config import RunConfig
from securevfl.hooks import ExtraLoss, ModelWrap, StepView
from securevfl.lab.compose import execute
from securevfl.roles import ACTIVE, PASSIVE

CALLS: list[tuple[int, int]] = []  # (rows, width) of every step the loss term saw, over all party copies


class ShrinkRepresentation(Defense, ExtraLoss):
    """Test-only: λ · mean ‖z‖² added to the passive party's objective (a stand-in for dCor)."""

    name = "test-shrink"
    primary = "lam"
    defaults = {"lam": 1.0}
    runs_at = frozenset({PASSIVE})
    acts_on = frozenset({MessageKind.ACTIVATION})  # it changes what the passive party sends

    def loss_term(self, view: StepView) -> torch.Tensor:
        CALLS.append(tuple(view.output.shape))
        assert len(view.features) == len(view.ids) == len(view.output)
        return self.config["lam"] * view.output.pow(2).sum(1).mean()


class Bottleneck(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.out_dim = inner, inner.out_dim
        self.proj = nn.Linear(inner.out_dim, inner.out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.inner(x))


class WrapBottom(Defense, ModelWrap):
    """Test-only: a trainable layer on the active party's bottom output (a stand-in for MID's layer)."""

    name = "test-wrap"
    runs_at = frozenset({ACTIVE})
    acts_on = frozenset({MessageKind.GRADIENT})  # it changes the gradients the active party returns

    def wrap_bottom(self, bottom: nn.Module) -> nn.Module:
        return Bottleneck(bottom)


class Bottleneck1(Defense, ModelWrap):
    """Test-only: a trainable layer on each passive party's delivery at the active party (MID's place)."""

    name = "test-mid"
    runs_at = frozenset({ACTIVE})
    acts_on = frozenset({MessageKind.GRADIENT})

    def wrap_received(self, passive: str, width: int) -> nn.Module:
        return nn.Sequential(nn.Linear(width, 2), nn.Linear(2, width))  # a 2-wide bottleneck


def _run(monkeypatch, defense: str):
    for cls in (ShrinkRepresentation, WrapBottom, Bottleneck1):  # registered for this test only
        monkeypatch.setitem(DEFENSES._items, cls.name, cls)
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, defense=defense)
    cfg.train.epochs = 1
    cfg.model.bottom = "mlp"
    return execute(cfg, progress=False)


def test_a_passive_loss_term_defense_plugs_in_without_a_core_edit(monkeypatch):
    CALLS.clear()
    base = _run(monkeypatch, "none")
    assert CALLS == []  # control: not installed, never called
    run = _run(monkeypatch, "test-shrink:5")
    p = run.federation.passives[0]
    assert len(CALLS) == p.step > 0  # once per passive training step, on that party's own tensors
    assert "test-shrink" in [h.name for h in p.hooks]
    assert "test-shrink" not in [h.name for h in run.federation.active.hooks]  # runs where it declares
    shrunk, plain = list(p.bottom.parameters()), list(base.federation.passives[0].bottom.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(shrunk, plain, strict=True))  # the term trained the bottom
    # and in the direction it pulls: smaller representations than the undefended run's
    x = p.features(p.data.train_ids[:64], "train")
    assert p.bottom(x).pow(2).sum(1).mean() < base.federation.passives[0].bottom(x).pow(2).sum(1).mean()


def test_an_active_model_wrap_defense_plugs_in_and_its_layer_is_trained(monkeypatch):
    run = _run(monkeypatch, "test-wrap")
    a = run.federation.active
    assert isinstance(a.bottom, Bottleneck)  # wrapped when the party was built
    assert not isinstance(run.federation.passives[0].bottom, Bottleneck)  # runs at the active party only
    proj = a.bottom.proj.weight
    assert any(proj is q for q in a.parameters())  # its parameters are the party's own, so trained
    assert any(proj is q for g in a.optimizer.param_groups for q in g["params"])
    # control: the same run without it has the plain bottom
    assert not isinstance(_run(monkeypatch, "none").federation.active.bottom, Bottleneck)


def test_a_layer_on_each_delivery_plugs_in_where_mid_goes(monkeypatch):
    """MID's shape: a layer at the active party on what each passive party delivers; the passive
    party's gradient flows back through it, and the layer is the party's own (trained, snapshotted)."""
    run = _run(monkeypatch, "test-mid")
    a, p = run.federation.active, run.federation.passives[0]
    layer = a.extra_modules[f"test-mid/{p.name}"]
    assert all(any(q is r for r in a.parameters()) for q in layer.parameters())
    assert "test-mid/passive1" in a.snapshot()
    # the head reads the bottleneck's output: the delivery passes a rank-2 map before the head
    r = torch.randn(5, layer[0].in_features)
    assert torch.linalg.matrix_rank(layer(r) - layer(torch.zeros_like(r))) <= 2
    assert p.step > 0 and run.to_json()["utility"]["test"] > 0.1  # it trains end to end
    # control: without the defense the party owns no such module
    assert not _run(monkeypatch, "none").federation.active.extra_modules


def test_every_defense_declares_where_it_runs_what_it_observes_and_whether_it_carries_epsilon():
    """The declarations the core reads instead of names: each registered defense implements at least
    one hook point, runs at a known role and observes only known things; a typo is refused."""
    import pytest

    from defenses import DEFENSES
    from securevfl.hooks import (
        OBSERVABLES,
        ActiveStep,
        GradientCheck,
        LabelTransform,
        MessageTransform,
        PartyHook,
        PassiveStep,
    )

    points = (MessageTransform, ActiveStep, PassiveStep, LabelTransform, ModelWrap, ExtraLoss, GradientCheck)
    for name in DEFENSES.names():
        cls = DEFENSES.get(name)
        assert any(issubclass(cls, p) for p in points), name
        assert cls.runs_at and cls.runs_at <= {ACTIVE, PASSIVE} and cls.observes <= OBSERVABLES, name
        assert isinstance(cls.carries_epsilon, bool)
    assert {n for n in DEFENSES.names() if DEFENSES.get(n).carries_epsilon} == {"dp", "rr", "embedding-dp"}
    with pytest.raises(TypeError, match="unknown observables"):  # control: a claim the contract does not know
        type("Typo", (PartyHook,), {"observes": frozenset({"lables"})})
