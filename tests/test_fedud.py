import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from securevfl.channel import MessageKind, codec
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import execute
from securevfl.methods.fedud import FedUD, distillation_loss


def fedud_cfg(**partition) -> RunConfig:
    cfg = RunConfig(dataset="breast-cancer", method="fedud", record=True)
    cfg.partition.aligned_fraction = 0.3
    cfg.partition.unaligned = "active"
    for k, v in partition.items():
        setattr(cfg.partition, k, v)
    cfg.train.epochs = 3
    return cfg


@pytest.fixture(scope="module")
def fedud_run(monkeypatch_module):
    """One FedUD run, with Rep's state captured when each step starts."""
    starts: list[dict] = []
    orig = FedUD.finetune

    def spy(self, fed, ids, **kw):
        rep = fed.active.extra_modules["rep"]
        starts.append({"state": copy.deepcopy(rep.state_dict()),
                       "in_optimizer": any(q is r for g in fed.active.optimizer.param_groups for q in g["params"]
                                           for r in rep.parameters())})
        return orig(self, fed, ids, **kw)

    monkeypatch_module.setattr(FedUD, "finetune", spy)
    out = execute(fedud_cfg())
    return out, starts


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_rep_trains_in_step1_and_is_frozen_in_step2(fedud_run):
    out, starts = fedud_run
    rep = out.federation.active.extra_modules["rep"]
    assert len(starts) == 2
    step1_start, step2_start = starts[0]["state"], starts[1]["state"]
    assert starts[0]["in_optimizer"] and not starts[1]["in_optimizer"]
    assert any(not torch.equal(step1_start[k], step2_start[k]) for k in step1_start)  # learnt in step 1
    assert all(torch.equal(step2_start[k], v) for k, v in rep.state_dict().items())  # untouched in step 2
    assert not any(q.requires_grad for q in rep.parameters())
    # the steps' counters (issue 42): in step 1 Rep's imitation of the guest's representation improved
    # (R² up; 3 steps here); step 2 trained on the host's unaligned rows, each once per epoch
    info = out.to_json()["method_info"]["fedud"]
    assert info["distillation_r2_last_step"] > info["distillation_r2_first_step"]
    assert info["unaligned_rows_trained"] == info["unaligned_rows"] * out.config.train.epochs


def test_unaligned_test_rows_never_reach_the_guest(fedud_run):
    out, _ = fedud_run
    fed, part = out.federation, out.partition
    guest = fed.passives[0]
    unaligned_test = np.setdiff1d(part.active.test_ids, part.test_aligned_ids)
    assert len(unaligned_test) > 0
    assert not np.isin(unaligned_test, guest.data.test_ids).any()  # the guest cannot even hold them
    assert np.array_equal(np.sort(guest.data.train_ids), np.sort(part.aligned_ids))  # guest: aligned rows only
    seen = np.concatenate([codec.decode_ids(m.payload) for m in fed.channel.received_by(guest.name)
                           if m.kind == MessageKind.BATCH_IDS])
    assert not np.isin(unaligned_test, seen).any()
    unaligned_train = np.setdiff1d(part.active.train_ids, part.aligned_ids)
    assert not np.isin(unaligned_train, seen).any()  # nor the host's unaligned training rows
    util = out.to_json()["utility"]
    assert util["unaligned"]["rows"] == len(unaligned_test)
    assert util["aligned"]["rows"] + util["unaligned"]["rows"] == len(part.active.test_ids)
    assert {"auc", "logloss"} <= util["unaligned"].keys() and util["test"] > 0.9


def test_distillation_loss_stops_gradient_at_the_guest_representation(fedud_run):
    out, _ = fedud_run
    a = out.federation.active
    rep = copy.deepcopy(a.extra_modules["rep"]).requires_grad_(True)
    ids = a.aligned_ids[:16]
    recv = torch.randn(16, a.passive_widths[0], requires_grad=True)
    # the host as the loss reads it (a party's own attributes are set only by its own methods)
    host = SimpleNamespace(own_output=a.bottom(a.features(ids, "train")), received=[recv])
    loss = distillation_loss(rep, host)
    loss.backward()
    assert recv.grad is None  # nothing of loss2 flows back towards the guest
    assert all(q.grad is not None for q in rep.parameters())
    expected = ((torch.cat(rep(host.own_output), 1) - recv) ** 2).sum(1).mean()
    assert loss.item() == pytest.approx(expected.item())


def test_fedud_needs_unaligned_labeled_rows():
    cfg = fedud_cfg(active_labels_unaligned=False)
    with pytest.raises(UserError, match="unaligned"):
        execute(cfg)
