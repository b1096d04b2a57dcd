"""Feature-side defenses at the passive party: ``noise`` (heuristic) and ``embedding-dp``
(feature-level DP of every release the active party sees from that passive party)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from defenses import parse_defense
from defenses.accounting import epsilon
from defenses.functional import per_example_norms
from securevfl.channel import MessageKind
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.hooks import HookContext
from securevfl.lab.compose import execute


def ctx(ids, training=True):
    return HookContext(MessageKind.ACTIVATION, "passive1", "active", 0, training, np.asarray(ids))


def test_released_rows_are_clipped_then_noised_and_counted():
    [d] = parse_defense("embedding-dp:clip=0.5,noise=0")
    z = torch.randn(16, 8) * 3
    out = d(z, ctx(np.arange(16)))
    assert (per_example_norms(out) <= 0.5 + 1e-6).all()
    [d] = parse_defense("embedding-dp:clip=0.5,noise=2")
    assert d(z, ctx(np.arange(16))).shape == z.shape
    draws = torch.stack([d(torch.zeros(4, 8), ctx([0, 1, 2, 3])) for _ in range(400)])
    assert draws.std().item() == pytest.approx(2 * 2 * 0.5, rel=0.05)  # Z · 2C
    assert d.privacy()["max_releases_per_entity"] == 401  # every release of entity 0 is charged


@pytest.fixture(scope="module")
def run():
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, defense="embedding-dp:noise=2")
    cfg.train.epochs = 2
    return execute(cfg)


def test_the_passive_bottom_steps_only_on_the_private_update_and_every_release_is_charged(run):
    p = run.to_json()["privacy"]["features"]["passive1"]
    # two training epochs, a release and an update per epoch (test rows are other entities, released once)
    assert p["max_releases_per_entity"] == 2 * 2
    assert p["epsilon"] == pytest.approx(epsilon(p["ledger"], p["delta"]))
    assert run.to_json()["privacy"]["epsilon"] is None  # no label mechanism: nothing about labels is claimed


def test_passive_optimizer_applies_only_the_noised_sum():
    from securevfl.lab.compose import build_partition
    from securevfl.methods import METHODS, MethodContext

    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, defense="embedding-dp:noise=1")
    cfg.train.epochs = 1
    hooks = parse_defense(cfg.defense, mechanism_seed=0)
    method = METHODS.get("splitnn")(MethodContext(train=cfg.train, model=cfg.model, optim=cfg.optim, seed=0,
                                                 hooks=hooks))
    fed = method.build(build_partition(cfg))
    p = fed.passives[0]
    rule = next(h for h in p.hooks if h.name == "embedding-dp")  # the party's own copy: its step rule
    seen, real_update, real_step = {}, rule.update, p.optimizer.step
    checked = []

    def update(per, b, ids):
        assert all(g.shape[0] == len(ids) for g in per)  # one gradient per example
        seen["out"] = real_update(per, b, ids)
        return seen["out"]

    def step(*a, **k):
        for q, s in zip(p.parameters(), seen.pop("out"), strict=True):
            assert torch.equal(q.grad, s)
        checked.append(1)
        return real_step(*a, **k)
    rule.update, p.optimizer.step = update, step
    method.fit(fed)
    assert len(checked) == p.step > 0


def test_methods_using_passive_features_outside_the_loop_refuse_it(capsys):
    assert main(["train", "--dataset", "digits", "--method", "fedhssl", "--defense", "embedding-dp:noise=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "outside it" in err


def test_noise_defense_reports_no_epsilon():
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, defense="noise:0.5")
    cfg.train.epochs = 1
    r = execute(cfg).to_json()
    assert r["privacy"]["features"]["passive1"]["epsilon"] is None
    assert r["privacy"]["epsilon"] is None
