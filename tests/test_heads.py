"""The agg head (aggVFL), the label-inference attacks it exposes (dli, bli), adversary=passiveK, and
the head / adversary refusals (issue 27)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attacks import ATTACKS, parse_attack
from attacks.gradient.bli import permuted_accuracy, reconstruct_labels
from attacks.gradient.dli import sign_labels, vote
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.lab.compose import execute
from securevfl.models import ModelConfig, SumHead, build_head


def agg_run(attacks: list, defense: str = "none", parties: int = 2, epochs: int = 1):
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, defense=defense, attacks=attacks)
    cfg.model.head = "agg"
    cfg.train.epochs = epochs
    cfg.partition.n_parties = parties
    return execute(cfg, progress=False)


@pytest.fixture(scope="module")
def agg_digits():
    return agg_run(["dli", "bli:batches=2"], epochs=2)


def test_agg_head_sums_logits_and_bottoms_output_one_logit_per_class(agg_digits):
    head = build_head(30, 10, ModelConfig(head="agg"))
    assert isinstance(head, SumHead) and not list(head.parameters())  # no trainable top model
    x = torch.randn(4, 30)
    assert torch.allclose(head(x), x[:, :10] + x[:, 10:20] + x[:, 20:])
    fed = agg_digits.federation
    assert all(p.bottom.out_dim == fed.n_classes for p in fed.parties)  # the cut width is the class count
    assert agg_digits.utility["test"] >= 0.75  # trains: 2 epochs of digits (split head: 0.80 here)


def test_dli_reads_every_label_and_its_control_sits_at_the_prior(agg_digits):
    dli = agg_digits.attacks["dli"]
    assert dli["value"] >= 0.9 and dli["batch_accuracy"] >= 0.9
    assert abs(dli["control"] - 0.1) < 0.05 and dli["control"] <= dli["prior"] + 0.03  # 10 balanced classes
    assert dli["rows"] == len(agg_digits.federation.passives[0].data.train_ids)


def test_bli_beats_its_control(agg_digits):
    bli = agg_digits.attacks["bli"]
    assert bli["value"] >= 0.8 and bli["control"] <= bli["prior"] + 0.1 and bli["batches"] == 2


def test_dli_falls_to_the_prior_under_label_rr():
    dli = agg_run(["dli"], defense="rr:0.1").attacks["dli"]  # the gradients carry RR's labels at ε 0.1
    assert dli["value"] <= dli["prior"] + 0.05


def test_adversary_can_be_any_passive_party():
    res = agg_run(["dli:adversary=passive2", {"bli": {"adversary": "passive2", "batches": 1, "steps": 60}}],
                  parties=3)
    assert res.attacks["dli"]["adversary"] == res.attacks["bli"]["adversary"] == "passive2"
    assert res.attacks["dli"]["value"] >= 0.9 and res.attacks["bli"]["value"] > res.attacks["bli"]["control"]


def test_sign_rule_vote_and_gradient_matching_on_known_gradients():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 64)
    logits = torch.randn(64, 5, dtype=torch.float64)
    g = ((F.softmax(logits, 1) - F.one_hot(torch.from_numpy(y), 5)) / 64).numpy()
    assert (sign_labels(g, rng) == y).all()
    assert (sign_labels(np.zeros((3, 5)), rng) < 5).all()  # no negative entry: a random guess
    rows, labels = vote([np.array([3, 1]), np.array([1])], [np.array([2, 0]), np.array([0])], 5)
    assert rows.tolist() == [1, 3] and labels.tolist() == [0, 2]
    own = torch.randn(64, 5)  # the adversary's logits; the rest of the sum is unknown to it
    guess = reconstruct_labels(own, torch.tensor(g, dtype=torch.float32), 5, False, 100, 0.05,
                               torch.Generator().manual_seed(0))
    assert (guess == y).mean() >= 0.9
    assert permuted_accuracy([(y + 1) % 5], [y], 5) == 1.0  # a relabelling of the classes is matched


def test_attack_parameters_from_spec_and_mapping():
    cls, params = parse_attack("bli:steps=7,adversary=passive2")
    assert cls.name == "bli" and params == {"steps": 7, "adversary": "passive2"}
    assert parse_attack({"dli": {"adversary": "passive3"}})[1] == {"adversary": "passive3"}
    assert all("adversary" in ATTACKS.get(n).parameters() for n in ATTACKS.names())


@pytest.mark.parametrize("args, needle", [
    (["--attack", "dli"], "cannot run with --head split"),
    (["--head", "agg", "--attack", "dli:adversary=passive3"], "adversary passive3 is not a passive party"),
    (["--head", "agg", "--attack", "dli:adversary=active"], "adversary must name a passive party"),
    (["--head", "agg", "--method", "fedhssl"], "--head agg: method fedhssl"),
    (["--head", "agg", "--he", "ckks"], "the agg head has no top model"),
    (["--head", "sum"], "--head"),
])
def test_head_and_adversary_refusals_exit_2_with_one_line(args, needle, capsys):
    assert main(["train", "--dataset", "digits", "--epochs", "1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.startswith("error:") and len(err.splitlines()) == 1


def test_attacks_listing_states_threat_model_and_heads(capsys):
    assert main(["attacks"]) == 0
    out = capsys.readouterr().out
    for name in ATTACKS.names():
        assert f"\n{name}: " in f"\n{out}"
    dli = out.split("\ndli: ")[1].split("\n\n")[0]
    assert "heads: agg\n" in dli and "attacker: passive party" in dli and "adversary=passive1" in dli


def test_the_head_setting_at_its_default_keeps_run_ids():
    import hashlib
    import json

    from securevfl.lab.sweep import HASH_EXEMPT_DEFAULTS, run_id

    split, agg = RunConfig().to_dict(), RunConfig().to_dict()
    agg["model"]["head"] = "agg"
    before = json.loads(json.dumps(split))  # as recorded before these settings existed
    for *path, leaf in HASH_EXEMPT_DEFAULTS:
        node = before
        for key in path:
            node = node[key]
        node.pop(leaf)
    want = hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:20]
    assert run_id(split) == want and run_id(agg) != want and split["model"]["head"] == "split"
