"""Backdoors (backdoor-gr, backdoor-villain) and robustness attacks (noisy-sample, missing-feature):
each beats its control on digits, the backdoors keep the main task, and bad parameters are
one-line errors (issue 27, items 4 and 5)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attacks import ATTACKS, parse_attack
from attacks.backdoor.gr import GradientReplacement
from attacks.base import KINDS
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import execute

GR = "backdoor-gr:trigger_size=16"
VILLAIN = "backdoor-villain:poison=0.1,beta=2"
"""The CPU-scale settings of RESULTS.md (digits, 5 epochs): a 16-cell patch; Villain poisoning ~ every
target row with β = 2 (its default β 0.4 is too faint for a 5-epoch head to learn)."""


def digits(attacks: list[str], seed: int = 0, parties: int = 2, epochs: int = 5) -> dict:
    cfg = RunConfig(dataset="digits", method="splitnn", seed=seed, attacks=attacks)
    cfg.train.epochs = epochs
    cfg.partition.n_parties = parties
    out = execute(cfg, progress=False)
    return {"utility": out.utility["test"], **out.attacks}


@pytest.fixture(scope="module")
def runs() -> dict:
    # poison=0 is each backdoor's control: honest training, the same trigger at inference; the
    # robustness attacks run on that honest federation too (the backdoor leaves it honest after scoring)
    return {"gr": digits([GR]), "gr0": digits([GR + ",poison=0", "noisy-sample:noise_rate=1", "missing-feature"]),
            "villain": digits([VILLAIN]), "villain0": digits([VILLAIN.replace("poison=0.1", "poison=0")])}


def test_backdoors_beat_their_control_and_keep_the_main_task(runs):
    for name, key, attack in (("gr", "gr", "backdoor-gr"), ("villain", "villain", "backdoor-villain")):
        hit, ctrl = runs[key][attack], runs[key + "0"][attack]
        # seeds 0–2 in RESULTS.md: gr 0.53 / 0.20 / 0.23 vs 0.00; villain 0.98 / 1.00 / 0.98 vs 0.00 / 0.12 / 0.04
        assert hit["metric"] == "asr" and hit["value"] >= 0.15 and ctrl["value"] <= 0.05, (name, hit, ctrl)
        assert hit["value"] >= 5 * max(ctrl["value"], hit["prior"], 0.01)
        assert runs[key]["utility"] >= runs[key + "0"]["utility"] - 0.05  # main-task drop ≤ 0.05
        assert hit["malicious_training"] == [attack] and hit["adversary"] == "passive1"
    assert runs["gr"]["backdoor-gr"]["replaced_gradients"] > 0 and runs["gr0"]["backdoor-gr"]["replaced_gradients"] == 0
    # Villain's label inference: the rows it poisons are target rows
    assert runs["villain"]["backdoor-villain"]["inference_precision"] >= 0.9


def test_robustness_attacks_drop_utility_against_the_clean_evaluation(runs):
    noisy, missing = runs["gr0"]["noisy-sample"], runs["gr0"]["missing-feature"]
    for a in (noisy, missing):
        assert a["metric"] == "utility_drop" and a["prior"] == 0.0
        assert a["clean"] == pytest.approx(runs["gr0"]["utility"])  # the control: the same federation, clean
        assert a["value"] == pytest.approx(a["clean"] - a["attacked"])
    assert noisy["value"] > 0.3 and noisy["rows_attacked"] == noisy["rows_attacked"] > 0
    assert 0.03 < missing["value"] < noisy["value"]  # a quarter of the rows lose the adversary's half


def test_adversary_can_be_another_passive_party():
    out = digits(["noisy-sample:noise_rate=1,adversary=passive2", VILLAIN + ",adversary=passive2"], parties=3, epochs=2)
    a, v = out["noisy-sample"], out["backdoor-villain"]
    assert a["adversary"] == "passive2" and a["value"] > 0.1
    # the backdoor acted as passive2 (its effect there is small at this scale: RESULTS.md)
    assert v["adversary"] == "passive2" and v["poisoning_started"] and v["poisoned_sends"] > 0


def test_gradient_replacement_swaps_in_amplified_target_gradients():
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = SimpleNamespace(X_train=rows, n_numeric=0, cardinalities=(), train_ids=np.arange(3),
                           rows=lambda ids, split: rows[ids])
    party = SimpleNamespace(name="passive1", data=data)
    gr = GradientReplacement(frozenset({"bottom_model", "received_gradients", "own_rows", "aux_labels"}),
                             gamma=3.0, trigger_size=2)
    gr.party, gr.rng, gr.known, gr.n_poison, gr.triggering = party, np.random.default_rng(0), np.array([0]), 1, False
    gr.setup(np.arange(3))
    poisoned = int(gr.poisoned[0])
    grad = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    out = gr.gradient(grad, np.arange(3))
    assert torch.equal(out[poisoned], 3.0 * grad[0]) and torch.equal(out[0], grad[0])
    # trigger: the last two cells at their training max and min; the known row's slot carries a poisoned row
    x = gr.features(torch.from_numpy(rows.copy()), np.arange(3), "train", True)
    assert x[poisoned, 2:].tolist() == [10.0, 3.0]
    assert x[0].tolist() == [rows[poisoned, 0], rows[poisoned, 1], 10.0, 3.0]
    assert torch.equal(gr.features(torch.from_numpy(rows), np.arange(3), "test", False), torch.from_numpy(rows))
    # upload: own (default) sends the poisoned row's output; zero sends 0 there, yet the bottom model
    # still gets the (replaced) gradient as if its output had been sent
    z = torch.ones(3, 2, requires_grad=True)
    assert gr.output(z, np.arange(3), "train", True) is z
    gr.config["upload"] = "zero"
    sent = gr.output(z, np.arange(3), "train", True)
    assert sent[poisoned].tolist() == [0.0, 0.0] and sent[[i for i in range(3) if i != poisoned]].eq(1).all()
    sent.backward(out)
    assert torch.equal(z.grad, out)
    assert gr.output(z, np.arange(3), "test", False) is z  # inference is untouched


def test_kinds_are_declared():
    kinds = {name: ATTACKS.get(name).kind for name in ATTACKS.names()}
    assert set(kinds.values()) <= KINDS, kinds  # every attack says what it is
    assert kinds["backdoor-gr"] == kinds["backdoor-villain"] == "backdoor"
    assert kinds["noisy-sample"] == kinds["missing-feature"] == "untargeted"
    assert kinds["mc"] == kinds["norm"] == "label_inference" and kinds["fr"] == "feature_reconstruction"


@pytest.mark.parametrize("spec, needle", [
    ("backdoor-gr:poison=2", "poison is a fraction"), ("backdoor-gr:gamma=-1", "gamma must be ≥ 0"),
    ("backdoor-gr:trigger_size=0", "trigger_size must be ≥ 1"), ("backdoor-gr:upload=noise", "upload must be own"),
    ("backdoor-villain:dropout=1", "dropout must be in"),
    ("backdoor-villain:adversary=active", "adversary must name a passive party"),
    ("noisy-sample:noise_rate=1.5", "noise_rate is a fraction"), ("missing-feature:missing_rate=x", "missing_rate"),
])
def test_bad_parameters_are_one_line_errors(spec, needle):
    with pytest.raises(UserError, match=needle):
        parse_attack(spec)


def test_bad_parameters_exit_2_from_the_cli(capsys):
    for spec, needle in (("backdoor-gr:poison=2", "poison"), ("backdoor-gr:target=10", "classes 0..9"),
                         ("missing-feature:adversary=passive3", "is not a passive party")):
        assert main(["train", "--dataset", "digits", "--epochs", "1", "--attack", spec]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
