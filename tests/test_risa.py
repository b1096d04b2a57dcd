import math

import numpy as np
import pytest
import torch

from securevfl.channel import MessageKind
from securevfl.channel.codec import decode_json
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import execute
from securevfl.methods.evidential import (
    alpha_from_opinion,
    edl_loss,
    fuse,
    kl_annealing,
    kl_to_uniform,
    opinion_from_evidence,
    reduced_yager,
    uncertainty_threshold,
)
from securevfl.methods.risa import EvidentialHeads, ImputingView, imputation_vector


def _random_opinion(gen: torch.Generator, n: int, c: int):
    return opinion_from_evidence(torch.rand(n, c, generator=gen, dtype=torch.float64) * 20)


def test_yager_masses_nonnegative_and_sum_to_one():
    gen = torch.Generator().manual_seed(0)
    o1, o2, o3 = (_random_opinion(gen, 500, 5) for _ in range(3))
    for b, u in (reduced_yager(o1, o2), fuse([o1, o2, o3])):
        assert (b >= 0).all() and (u >= 0).all()
        assert torch.allclose(b.sum(-1) + u, torch.ones_like(u), atol=1e-12)
    # commutative; not associative (conflict moved to Θ is not redistributed), so K parties fold in order
    ba, ua = reduced_yager(o1, o2)
    bb, ub = reduced_yager(o2, o1)
    assert torch.allclose(ba, bb) and torch.allclose(ua, ub)
    b12_3, _ = fuse([o1, o2, o3])
    b1_23, _ = reduced_yager(o1, reduced_yager(o2, o3))
    assert not torch.allclose(b12_3, b1_23)


def test_yager_conflict_goes_to_uncertainty():
    # two confident opinions on different classes: Dempster would renormalise, reduced Yager does not
    b1, b2 = torch.tensor([[0.9, 0.0, 0.0]]), torch.tensor([[0.0, 0.9, 0.0]])
    u1 = u2 = torch.tensor([0.1])
    b, u = reduced_yager((b1, u1), (b2, u2))
    conflict = 0.9 * 0.9
    assert u.item() == pytest.approx(0.1 * 0.1 + conflict)
    assert torch.allclose(b, torch.tensor([[0.09, 0.09, 0.0]]))
    # agreeing opinions lower the uncertainty instead
    b_same, u_same = reduced_yager((b1, u1), (b1, u1))
    assert u_same.item() == pytest.approx(0.01) and b_same[0, 0].item() == pytest.approx(0.81 + 0.09 + 0.09)
    # fully dogmatic and contradictory: everything is uncertainty
    _, u_full = reduced_yager((torch.tensor([[1.0, 0.0]]), torch.tensor([0.0])),
                              (torch.tensor([[0.0, 1.0]]), torch.tensor([0.0])))
    assert u_full.item() == pytest.approx(1.0)


def test_yager_vacuous_opinion_is_identity():
    gen = torch.Generator().manual_seed(1)
    b1, u1 = _random_opinion(gen, 50, 4)
    vacuous = opinion_from_evidence(torch.zeros(50, 4, dtype=torch.float64))
    assert torch.equal(vacuous[1], torch.ones(50, dtype=torch.float64))
    for b, u in (reduced_yager((b1, u1), vacuous), reduced_yager(vacuous, (b1, u1))):
        assert torch.allclose(b, b1) and torch.allclose(u, u1)
    # and α round-trips: α = b·C/u + 1 = e + 1
    e = torch.rand(7, 4, generator=gen, dtype=torch.float64) * 9
    assert torch.allclose(alpha_from_opinion(*opinion_from_evidence(e)), e + 1)


def test_edl_loss_matches_hand_computation():
    alpha = torch.tensor([[2.0, 1.0, 1.0], [2.0, 1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    euler = 0.5772156649015329
    psi = {1: -euler, 2: 1 - euler, 4: 1 + 1 / 2 + 1 / 3 - euler}
    # row 0, true class has the evidence: ψ(4) − ψ(2); α̃ = (1, 1, 1) so the KL term is 0
    # row 1: ψ(4) − ψ(1) + λ·KL(Dir(2,1,1) ‖ Dir(1,1,1)), KL = ln Γ(4) − ln Γ(3) + (ψ(2) − ψ(4))
    kl = math.log(6) - math.log(2) + (psi[2] - psi[4])
    expected = [psi[4] - psi[2], psi[4] - psi[1] + 0.5 * kl]
    out = edl_loss(alpha, y, kl_weight=0.5)
    assert out.tolist() == pytest.approx(expected, rel=1e-12)
    assert kl_to_uniform(torch.ones(1, 3, dtype=torch.float64)).item() == pytest.approx(0.0, abs=1e-12)
    assert edl_loss(alpha, y, 0.0).tolist() == pytest.approx([psi[4] - psi[2], psi[4] - psi[1]])


def test_schedules():
    assert [kl_annealing(t, 10) for t in (0, 5, 10, 20)] == [0.0, 0.5, 1.0, 1.0]
    taus = [uncertainty_threshold(t, 11, 0.3) for t in range(11)]
    assert taus[0] == 1.0 and taus[-1] == pytest.approx(0.3)
    assert all(a > b for a, b in zip(taus, taus[1:], strict=False))
    # checks every 2 epochs of 10 (t = 2, 4, 6, 8): the last check uses τ_final itself
    assert [uncertainty_threshold(t, 10, 0.5, 2) for t in (2, 4, 6, 8)] == pytest.approx([0.875, 0.75, 0.625, 0.5])


def _risa_with_flipped_labels(tau_final: float, flip_share: float = 0.4, tau_scale: str = "absolute"):
    """breast-cancer, 10 % aligned, the active party's own rows imputed, ``flip_share`` of their labels
    wrong (the label noise RISA's selection is for); returns (drops, dropped IDs, flipped IDs, candidates)."""
    from securevfl.cutlayer import make_cut_layer
    from securevfl.ids import difference, member
    from securevfl.lab import compose
    from securevfl.methods import METHODS, MethodContext

    cfg = RunConfig()
    cfg.dataset, cfg.method, cfg.seed = "breast-cancer", "risa", 0
    cfg.partition.aligned_fraction = 0.1
    cfg.train.epochs, cfg.train.batch_size = 20, 32
    cfg.method_params = {"self_training": False, "tau_final": tau_final, "tau_scale": tau_scale}
    cfg = compose.resolve_config(cfg)
    part = compose.build_partition(cfg)
    a = part.active
    own = difference(a.label_ids, part.aligned_ids)
    flipped = np.random.default_rng(0).choice(own, size=int(flip_share * len(own)), replace=False)
    a.y_labels[member(a.label_ids, flipped)] ^= 1  # two classes
    method = METHODS.get("risa")(MethodContext(train=cfg.train, model=cfg.model, optim=cfg.optim, seed=cfg.seed,
                                               params=cfg.method_params))
    fed = method.build(part, make_cut_layer("off", interactive=method.interactive_layer))
    compose.train_and_evaluate(method, fed)
    return fed.meta["risa"]["drops"], method.trainer.dropped_ids(), flipped, own


def test_selection_drops_noisy_imputed_rows():
    """RISA's selection acts (issue 42): with 10 % aligned rows, label noise on the imputed rows and
    enough steps, their uncertainty rises above the falling threshold and rows leave, wrong labels
    more often than right ones; labeled aligned rows never do."""
    drops, dropped, flipped, own = _risa_with_flipped_labels(0.5)
    assert sum(d["dropped"] for d in drops) > 0
    assert drops[-1]["tau"] == pytest.approx(0.5)  # the schedule reaches τ_final at its last check
    assert set(dropped) <= set(own)  # only imputed rows
    share = np.isin(dropped, flipped).mean()
    assert share > len(flipped) / len(own)  # wrong labels are over-represented among the dropped
    for d in drops:  # the scales the threshold met are reported
        assert d["u_droppable_q10_50_90"] is not None and d["u_labeled_aligned_q10_50_90"] is not None
    # control: a threshold no uncertainty reaches (u ≤ 1) drops nothing (the test can fail)
    drops_off, _, _, _ = _risa_with_flipped_labels(1.0)
    assert sum(d["dropped"] for d in drops_off) == 0


def test_rank_selection_keeps_the_tau_share_of_droppable_rows():
    from securevfl.methods.risa import selection_cut

    u = np.array([0.1, 0.2, 0.3, 0.4])
    assert selection_cut(0.5, u, 4, "absolute") == 0.5
    assert selection_cut(1.0, u, 4, "rank") == float("inf")  # τ = 1 keeps every row
    cut = selection_cut(0.5, u, 4, "rank")
    assert list(u > cut) == [False, False, True, True]  # the more uncertain half leaves
    # 1 of 4 already gone: τ = 0.5 of the 4 leaves one more, the most uncertain of those left
    assert list(u[:3] > selection_cut(0.5, u[:3], 4, "rank")) == [False, False, True]


def test_rank_selection_acts_where_the_absolute_threshold_does_not():
    """``rank`` ends with ⌈τ_final · n⌉ of the n imputed rows kept, whatever the scale of u (on real
    Criteo rows the absolute reading drops none: reports/methods)."""
    drops, dropped, _, own = _risa_with_flipped_labels(0.5, flip_share=0.0, tau_scale="rank")
    assert len(dropped) == len(own) - int(np.ceil(0.5 * len(own)))
    assert set(dropped) <= set(own)


def test_evidential_heads_split_blocks_and_are_nonnegative():
    from securevfl.models import ModelConfig
    heads = EvidentialHeads([3, 2], 4, ModelConfig())
    x = torch.randn(5, 5)
    e = heads(x)
    assert e.shape == (5, 2, 4) and (e >= 0).all()
    x2 = x.clone()
    x2[:, 3:] += 10.0  # changing party 2's block leaves party 1's evidence unchanged
    assert torch.equal(heads(x2)[:, 0], e[:, 0])


@pytest.fixture
def risa_cfg(digits_cfg):
    digits_cfg.method = "risa"
    digits_cfg.partition.aligned_fraction = 0.2
    digits_cfg.train.epochs = 4
    digits_cfg.method_params = {"confidence": 0.3, "self_training_epochs": 30, "drop_every": 1, "tau_final": 0.2}
    digits_cfg.record = True
    return digits_cfg


def test_risa_end_to_end_and_what_each_party_saw(risa_cfg):
    out = execute(risa_cfg)
    r, fed, part = out.to_json(), out.federation, out.partition
    info = r["method_info"]["risa"]
    assert r["utility"]["test"] > 0.5
    st = info["self_training"]
    n_passive_only = len(part.passives[0].train_ids) - len(part.aligned_ids)
    n_active_only = len(part.active.train_ids) - len(part.aligned_ids)
    assert st["candidates"] == n_passive_only and 0 < st["pseudo_labeled"] <= st["candidates"]
    assert info["training_rows"] == len(part.labeled_ids) + n_active_only + st["pseudo_labeled"]
    # the lab scores the pseudo-labels against the truth no party holds (issue 42)
    truth = r["method_info"]["against_truth"]
    assert truth["pseudo_labels_scored"] == st["pseudo_labeled"] and 0.0 <= truth["pseudo_label_accuracy"] <= 1.0
    assert truth["dropped_pseudo_labeled"] + truth["kept_pseudo_labeled"] == st["pseudo_labeled"]
    assert info["evidential"] and isinstance(fed.active.head, EvidentialHeads)
    # rows dropped on the decreasing schedule; labeled aligned rows are never dropped
    assert len(info["drops"]) == 3 and [d["tau"] for d in info["drops"]] == sorted(
        [d["tau"] for d in info["drops"]], reverse=True)
    assert info["drops"][-1]["kept"] >= len(part.labeled_ids)
    ch = fed.channel
    assert ch.pending() == 0
    assert {m.kind for m in ch.received_by("passive1")} == {MessageKind.CONTROL, MessageKind.BATCH_IDS,
                                                             MessageKind.GRADIENT, MessageKind.ALIGNMENT}
    # the active party gets activations and the passive party's non-overlapping IDs, and at the end
    # the passive party's report on itself (its step count, its defenses' privacy reports), nothing else
    active_view = ch.received_by("active")
    assert {m.kind for m in active_view} == {MessageKind.ACTIVATION, MessageKind.ALIGNMENT, MessageKind.CONTROL}
    [report] = [decode_json(m.payload) for m in active_view if m.kind == MessageKind.CONTROL]
    assert set(report) == {"party", "steps", "privacy", "he"}
    assert sum(m.kind == MessageKind.ALIGNMENT for m in active_view) == 1
    # the parties are back on their plain rows after training (attacks see the real PartyData)
    assert all(not isinstance(p.data, ImputingView) for p in fed.parties)


def test_risa_ablation_flags(risa_cfg):
    risa_cfg.record = False
    risa_cfg.method_params = {"evidential": False, "self_training": False}
    out = execute(risa_cfg)
    info, part = out.to_json()["method_info"]["risa"], out.partition
    assert not info["evidential"] and "self_training" not in info and info["drops"] == []
    assert isinstance(out.federation.active.head, torch.nn.Sequential)
    assert info["training_rows"] == len(part.active.label_ids)  # labeled aligned + active-only (imputed)
    risa_cfg.method_params = {"imputation": False, "self_training": False, "evidential": False}
    info = execute(risa_cfg).to_json()["method_info"]["risa"]
    assert info["training_rows"] == len(part.labeled_ids)  # = splitnn's rows
    with pytest.raises(UserError, match="true or false"):
        risa_cfg.method_params = {"evidential": "yes"}
        execute(risa_cfg)


def test_imputation_view_uses_own_aligned_mean(risa_cfg):
    from securevfl.data import load_dataset, make_partition
    part = make_partition(load_dataset("digits"), risa_cfg.partition, 0)
    passive = part.passives[0]
    fill = imputation_vector(passive, part.aligned_ids, "mean")
    assert np.allclose(fill, passive.rows(part.aligned_ids).mean(0))
    view = ImputingView(passive, fill)
    missing = np.setdiff1d(part.active.train_ids, part.aligned_ids)[:3]
    held = part.aligned_ids[:2]
    rows = view.rows(np.concatenate([held, missing]))
    assert np.array_equal(rows[:2], passive.rows(held)) and np.allclose(rows[2:], fill)
    assert np.array_equal(imputation_vector(passive, part.aligned_ids, "zero"), np.zeros_like(fill))
    with pytest.raises(KeyError):
        ImputingView(passive, None).rows(missing)


def test_local_vfl_and_random_match(risa_cfg):
    risa_cfg.record = False
    risa_cfg.method_params = {}
    risa_cfg.method = "local-vfl"
    out = execute(risa_cfg)
    info, part = out.to_json()["method_info"]["risa"], out.partition
    assert info["training_rows"] == len(part.active.label_ids) and not info["evidential"]
    risa_cfg.method = "random-match"
    info = execute(risa_cfg).to_json()["method_info"]["risa"]
    n_pairs = min(len(part.active.train_ids), len(part.passives[0].train_ids)) - len(part.aligned_ids)
    assert info["random_pairs"] == n_pairs and info["training_rows"] == len(part.labeled_ids) + n_pairs
    risa_cfg.partition.n_parties = 3
    with pytest.raises(UserError, match="--parties 2"):
        execute(risa_cfg)


def test_risa_with_unlabeled_active_rows_and_three_parties(risa_cfg):
    risa_cfg.record = False
    risa_cfg.partition.n_parties = 3
    risa_cfg.partition.unaligned_label_fraction = 0.5
    out = execute(risa_cfg)
    info, part = out.to_json()["method_info"]["risa"], out.partition
    n_own = len(part.active.train_ids) - len(part.aligned_ids)
    n_passive_only = sum(len(p.train_ids) - len(part.aligned_ids) for p in part.passives)
    assert info["self_training"]["candidates"] == n_passive_only + (n_own - round(0.5 * n_own))
    assert out.federation.active.head.widths == [64, 64, 64]


def test_model_completion_attack_runs_on_risa(risa_cfg):
    from securevfl.lab.compose import execute
    risa_cfg.record = False
    risa_cfg.method_params = {"self_training": False}
    risa_cfg.attacks = ["mc-plain"]
    r = execute(risa_cfg).to_json()
    assert 0.0 <= r["attacks"]["mc-plain"]["value"] <= 1.0


@pytest.mark.parametrize("method", ["risa", "random-match"])
def test_every_row_aligned_leaves_nothing_to_impute_and_runs(method):
    """With all rows aligned there are no non-overlapping rows to pair or impute (was an IndexError)."""
    from securevfl.lab.compose import execute

    cfg = RunConfig(dataset="digits", method=method, seed=0)
    cfg.train.epochs = 1
    assert execute(cfg).to_json()["utility"]["test"] > 0.3


def test_rows_only_the_active_party_holds_are_scored_through_the_trainers_own_proba():
    """``predict_proba_alone`` maps the head's output through the overridable ``proba`` (RISA's
    evidential map), as ``predict_proba`` does; it used to hard-code softmax."""
    from securevfl.data import PartitionSpec, load_dataset, make_partition
    from securevfl.federation import OptimConfig, build_federation
    from securevfl.models import ModelConfig
    from securevfl.training import SplitTrainer, TrainConfig

    class HalfMap(SplitTrainer):  # any map other than softmax tells them apart
        def proba(self, out: torch.Tensor) -> torch.Tensor:
            return torch.full_like(out, 0.5)

    fed = build_federation(make_partition(load_dataset("digits"), PartitionSpec(), 0), ModelConfig(bottom="mlp"),
                           OptimConfig(), 0)
    ids = fed.active.data.test_ids[:5]
    custom, plain = HalfMap(fed, TrainConfig(), 0), SplitTrainer(fed, TrainConfig(), 0)
    assert np.all(custom.predict_proba_alone(ids) == 0.5)
    # control: the plain trainer's softmax rows are not the constant map's
    assert not np.allclose(plain.predict_proba_alone(ids), 0.5)
    np.testing.assert_allclose(plain.predict_proba_alone(ids).sum(1), 1.0, rtol=1e-5)
