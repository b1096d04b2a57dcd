import numpy as np
import pytest
import torch

from securevfl.channel import MessageKind
from securevfl.config import RunConfig
from securevfl.data import PartitionSpec, load_dataset, make_partition
from securevfl.federation import OptimConfig, align, build_federation
from securevfl.lab.compose import execute
from securevfl.methods import MethodContext
from securevfl.methods import fedhssl as H
from securevfl.models import ModelConfig
from securevfl.runtime import run_in_process
from securevfl.ssl import SSLConfig, make_objective, pretrain_local
from securevfl.ssl.augment import ImageAugment, TabularCorruption


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6, 1.0])
def test_tabular_corruption_hits_the_requested_fraction(fraction):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 20)).astype(np.float32)
    aug = TabularCorruption(X, n_numeric=20, fraction=fraction)
    k = round(fraction * 20)
    assert (aug.corruption_mask((200, 20), torch.Generator().manual_seed(0)).sum(1) == k).all()
    x = torch.from_numpy(X[:200])
    changed = (aug(x, torch.Generator().manual_seed(0)) != x).sum(dim=1)
    # a marginal draw can pick the row's own value (1 in 500), so at most k and nearly always k change
    assert (changed <= k).all() and changed.float().mean() >= 0.97 * k


def test_categorical_corruption_maps_to_unknown():
    X = np.column_stack([np.random.default_rng(0).normal(size=100), np.arange(1, 101) % 7 + 1]).astype(np.float32)
    aug = TabularCorruption(X, n_numeric=1, fraction=1.0)
    out = aug(torch.from_numpy(X), torch.Generator().manual_seed(1))
    assert (out[:, 1] == 0).all()  # reserved unknown id
    assert not torch.equal(out[:, 0], torch.from_numpy(X[:, 0]))


def test_image_augment_keeps_shape_and_changes_pixels():
    x = torch.rand(16, 28, 14)
    out = ImageAugment()(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and not torch.equal(out, x)


@pytest.mark.parametrize("name", ["simsiam", "byol", "moco", "scarf"])
def test_objectives_train_and_change_the_encoder(name):
    from securevfl.models import MLPEncoder

    X = np.random.default_rng(0).normal(size=(256, 12)).astype(np.float32)
    enc = MLPEncoder(12, (16,), 8)
    before = [p.detach().clone() for p in enc.parameters()]
    obj = make_objective(enc, SSLConfig(objective=name, epochs=2, batch_size=64))
    losses = pretrain_local(obj, X, TabularCorruption(X, 12, 0.3), seed=0)
    assert len(losses) == 8 and all(np.isfinite(losses))
    assert any(not torch.equal(a, b) for a, b in zip(before, enc.parameters(), strict=True))


@pytest.fixture
def hybrid_fed():
    part = make_partition(load_dataset("digits"), PartitionSpec(aligned_fraction=0.5), 0)
    fed = build_federation(part, ModelConfig(bottom="mlp", cut_dim=16, hidden=(32,)), OptimConfig(), 0, record=True)
    align(fed, "given", part.aligned_ids)
    cfg = SSLConfig(batch_size=64, proj_dim=16, pred_hidden=8)
    for k, p in enumerate(fed.parties):
        torch.manual_seed(k)
        f_c = H.build_bottom(p.data.feature_shape, ModelConfig(bottom="mlp", cut_dim=16, hidden=(32,)))
        p.keep_method_state(H.HybridState(p, f_c, cfg, k))
    return fed


def _fedhssl() -> H.FedHSSL:
    return H.FedHSSL(MethodContext())


def test_stop_gradient_across_parties(hybrid_fed, monkeypatch):
    fed = hybrid_fed
    captured = []
    original = H._cross_update

    def spy(party, loss):
        captured.append((party.name, loss))
        others = [q for q in fed.parties if q.name != party.name]
        for q in others:  # a party's loss has no path to another party's parameters
            grads = torch.autograd.grad(loss, list(q.method_state.cross.parameters()), retain_graph=True,
                                        allow_unused=True)
            assert all(g is None for g in grads)
        own = torch.autograd.grad(loss, list(party.method_state.cross.encoder.parameters()), retain_graph=True)
        assert any(g.abs().sum() > 0 for g in own)
        original(party, loss)

    monkeypatch.setattr(H, "_cross_update", spy)
    run_in_process(fed, _fedhssl(), lambda view: H.cross_party_step(view, fed.active.aligned_ids[:64]))
    assert {n for n, _ in captured} == {"active", "passive1"}
    assert fed.channel.pending() == 0
    reps = [m for m in fed.channel.transcript if m.kind == MessageKind.SSL_REPRESENTATION]
    assert {(m.src, m.dst) for m in reps} == {("active", "passive1"), ("passive1", "active")}


def test_pma_averages_shared_parts_and_leaves_bottoms_untouched(hybrid_fed):
    fed = hybrid_fed
    for p in fed.parties:  # make the parties differ first
        H.guided_local_epoch(p, 0.5, 64, np.random.default_rng(0))
    top = {p.name: H.top_layer(p.bottom) for p in fed.parties}
    private_before = {p.name: [t.detach().clone() for m in p.bottom.modules() if isinstance(m, torch.nn.Linear)
                               and m is not top[p.name] for t in m.parameters()] for p in fed.parties}
    vecs_before = {p.name: p.method_state.shared_vector() for p in fed.parties}
    assert not torch.equal(*vecs_before.values())
    run_in_process(fed, _fedhssl(), H.pma_round)
    after = [p.method_state.shared_vector() for p in fed.parties]
    assert torch.equal(after[0], after[1])
    n = {p.name: len(p.data.train_ids) for p in fed.parties}
    w = np.array([n["active"], n["passive1"]], dtype=np.float32) / sum(n.values())
    expect = w[0] * vecs_before["active"] + w[1] * vecs_before["passive1"]
    assert torch.allclose(after[0], expect, atol=1e-6)
    for p in fed.parties:
        private_after = [t for m in p.bottom.modules() if isinstance(m, torch.nn.Linear) and m is not top[p.name]
                         for t in m.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(private_before[p.name], private_after, strict=True))
    assert torch.equal(top["active"].weight, top["passive1"].weight)


def test_iso_lambda_p_noises_only_what_the_active_party_sends():
    from defenses import parse_defense
    from securevfl.hooks import HookContext

    [iso] = parse_defense("iso:lam=0,lam_p=1")
    z = torch.randn(8, 4)
    from_active = HookContext(MessageKind.SSL_REPRESENTATION, "active", "passive1", 0, True)
    from_passive = HookContext(MessageKind.SSL_REPRESENTATION, "passive1", "active", 0, True)
    assert not torch.equal(iso(z, from_active), z)
    assert torch.equal(iso(z, from_passive), z)


@pytest.mark.parametrize("method", ["fedhssl", "fedcssl", "fedgssl", "fedlocal-simsiam", "fedlocal-byol",
                                    "fedlocal-moco", "fedlocal-scarf"])
def test_ssl_methods_run_end_to_end(method):
    cfg = RunConfig(dataset="digits", method=method, seed=0)
    cfg.partition.aligned_fraction, cfg.partition.n_labeled = 0.4, 100
    cfg.train.epochs, cfg.model.bottom = 3, "mlp"
    cfg.method_params = {"ssl_epochs": 1, "ssl_batch_size": 128}
    out = execute(cfg)
    assert 0 <= out.to_json()["utility"]["test"] <= 1
    kinds = out.to_json()["cost"]["bytes_by_kind"]
    assert (MessageKind.SSL_REPRESENTATION in kinds) == (method in ("fedhssl", "fedcssl", "fedgssl"))
    assert (MessageKind.MODEL_PARAMS in kinds) == (method == "fedhssl")
    if method in ("fedhssl", "fedgssl"):
        assert isinstance(out.federation.passives[0].bottom, H.AveragedEncoder)


def test_lr_grid_selects_by_validation(digits_cfg):
    digits_cfg.train.lr_grid = [0.0001, 0.003]
    digits_cfg.train.epochs = 2
    out = execute(digits_cfg)
    search = out.federation.meta["lr_search"]
    assert set(search["scores"]) == {"0.0001", "0.003"} and search["chosen"] in (0.0001, 0.003)
    assert search["chosen"] == max((0.0001, 0.003), key=lambda lr: search["scores"][str(lr)])
