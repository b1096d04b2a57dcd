import pytest
import torch

from securevfl.config import RunConfig
from securevfl.lab.compose import build_partition, execute
from securevfl.methods import METHODS, MethodContext
from securevfl.methods.vflhlp import active_pretrain, consistency_loss, first_linear_in


@pytest.fixture(scope="module")
def setup():
    cfg = RunConfig(dataset="breast-cancer", method="vflhlp")
    cfg.partition.aligned_fraction = 0.2
    part = build_partition(cfg)
    method = METHODS.get("vflhlp")(MethodContext(model=cfg.model, seed=0))
    fed = method.build(part)
    theta1, theta0, encoder = active_pretrain(fed.active, cfg.model, 2, 2, 64, 1e-3, 0)
    return fed, theta1, theta0, encoder


def test_partition_default_gives_active_party_its_unaligned_labels(setup):
    fed, *_ = setup
    assert len(fed.active.data.label_ids) == len(fed.active.data.train_ids) > len(fed.active.aligned_ids)


def test_lcons_zero_at_pretrained_point_and_touches_only_active_parts(setup):
    fed, theta1, theta0, encoder = setup
    a = fed.active
    a.bottom.load_state_dict(encoder.state_dict())
    layer = first_linear_in(a.head)
    d = a.bottom.out_dim
    with torch.no_grad():
        layer.weight[:, :d] = theta0.weight
        layer.bias.copy_(theta0.bias)
    assert consistency_loss(a.bottom, a.head, theta1, theta0, d).item() == 0.0
    with torch.no_grad():  # move away from the pre-trained point
        for p in a.bottom.parameters():
            p.add_(0.1)
        layer.weight.add_(0.1)
        layer.bias.add_(0.1)
    for p in [*a.bottom.parameters(), *a.head.parameters(), *fed.passives[0].bottom.parameters()]:
        p.grad = None
    loss = consistency_loss(a.bottom, a.head, theta1, theta0, d)
    assert loss.item() > 0
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in a.bottom.parameters())
    assert layer.weight.grad[:, :d].abs().sum() > 0 and layer.bias.grad.abs().sum() > 0
    assert layer.weight.grad[:, d:].abs().sum() == 0  # the passive parties' columns are untouched
    assert all(p.grad is None for p in fed.passives[0].bottom.parameters())
    assert all(t.grad is None for t in theta1)  # Θ is a frozen copy


@pytest.mark.parametrize("method", ["vflhlp", "vflhlp-a", "vflhlp-p"])
def test_vflhlp_variants_run(method):
    cfg = RunConfig(dataset="breast-cancer", method=method)
    cfg.partition.aligned_fraction = 0.2
    cfg.train.epochs = 3
    cfg.optim.optimizer, cfg.optim.lr = "sgd", 0.01
    cfg.method_params = {"ssl_epochs": 3, "ssl_batch_size": 64, "pretrain_epochs": 2}
    r = execute(cfg).to_json()
    assert r["utility"]["metric"] == "auc" and r["utility"]["test"] > 0.8
    # each step's counters show it acted (issue 42): the active party pre-trained on its labeled rows,
    # unaligned ones included; each passive party's SCARF loss fell
    info = r["method_info"].get("vflhlp", {})
    if method != "vflhlp-p":
        pre = info["active_pretraining"]
        assert pre["rows"] + pre["validation_rows"] > r["partition"]["labeled"]
        assert len(pre["validation_loss"]) == 2 and pre["kept_epoch"] in (0, 1)
    else:
        assert "active_pretraining" not in info
    if method != "vflhlp-a":
        scarf = info["passive_pretraining"]["passive1"]
        assert scarf["rows"] > 0 and scarf["loss_last_step"] < scarf["loss_first_step"]
        assert scarf["loss_last_epoch_mean"] < scarf["loss_first_epoch_mean"]
    else:
        assert "passive_pretraining" not in info


def test_vflhlp_without_unaligned_labels_runs_and_says_so(capsys):
    """Issue 51: no labeled row beyond the aligned ones was a refusal naming a key the csv path does not
    take; VFLHLP is defined there (its pre-training on all the active party's labeled rows), so it runs
    and says what its pre-training used and where its gain would come from."""
    from securevfl.cli import main

    cfgfile = "partition: {active_labels_unaligned: false, aligned_fraction: 0.2}\ntrain: {epochs: 1}\n"
    import pathlib
    import tempfile

    p = pathlib.Path(tempfile.mkdtemp()) / "c.yaml"
    p.write_text(cfgfile)
    assert main(["train", "--dataset", "breast-cancer", "--method", "vflhlp", "--config", str(p),
                 "--method-param", "pretrain_epochs=1,ssl_epochs=1"]) == 0
    err = capsys.readouterr().err
    assert "every labeled row of the active party is aligned" in err and "active_labels_unaligned" in err
