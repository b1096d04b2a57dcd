"""Issue 25: ε holds against an adversary who knows the code, the configuration and the public seed.

The adversary's best try at regenerating a mechanism's randomness is to re-run the same configuration
with the same public seed (it knows everything else) and read off that run's noise, flips and
choices. Each test compares the adversary's regeneration with the real run: agreement must be at the
level of chance. Control: with ``mechanism_seed`` fixed (the debugging opt-in) the same procedure
regenerates everything, so each test can fail.

The second hole: a passive party sees which IDs are train and test and every batch's IDs, so none of
that may depend on the labels. Flipping one label changes nothing it observes before the first step
that samples that row (asserted on the recorded transcript); control: a label-stratified split.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import numpy as np
import pytest
import torch
import yaml

from defenses import parse_defense
from securevfl import pipeline
from securevfl.channel import MessageKind
from securevfl.channel.codec import decode_array
from securevfl.config import RunConfig
from securevfl.data import partition as partition_mod
from securevfl.data.registry import load_dataset
from securevfl.lab.compose import execute
from securevfl.result import NOT_PRIVATE
from tests.golden_runs import pinned_threads


def cancer(defense: str, mechanism_seed: int | None = None, epochs: int = 1, **train) -> RunConfig:
    cfg = RunConfig(dataset="breast-cancer", method="splitnn", seed=3, defense=defense, mechanism_seed=mechanism_seed)
    cfg.train.epochs = epochs
    for k, v in train.items():
        setattr(cfg.train, k, v)
    return cfg


class NoiseLog:
    """Every Gaussian draw a defense makes from its own generator (``torch.randn(..., generator=g)``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.draws: list[torch.Tensor] = []
        real = torch.randn

        def randn(*args, **kwargs):
            out = real(*args, **kwargs)
            if kwargs.get("generator") is not None:
                self.draws.append(out.detach().flatten().clone())
            return out

        monkeypatch.setattr(torch, "randn", randn)

    def take(self) -> torch.Tensor:
        out, self.draws = torch.cat(self.draws), []
        return out


def regenerate(cfg: RunConfig, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The real run's noise and the adversary's re-run's noise (same configuration and public seed)."""
    log = NoiseLog(monkeypatch)
    execute(cfg, progress=False)
    real = log.take()
    execute(cfg, progress=False)
    return real, log.take()


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Correlation of the regenerated noise with the real noise (1: regenerated, ≈ 0: chance)."""
    assert a.shape == b.shape and a.numel() > 500
    return float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])


def chance(n: int) -> float:
    """|correlation| of n independent pairs stays below this but with probability ≈ 6e-7 (5 σ)."""
    return 5 / n**0.5


@pytest.mark.parametrize("defense", ["dp:noise=1", "iso:3", "embedding-dp:noise=1", "noise:0.5"])
def test_a_seed_knowing_adversary_cannot_regenerate_the_noise(defense, monkeypatch):
    real, regen = regenerate(cancer(defense), monkeypatch)
    assert abs(agreement(real, regen)) < chance(real.numel())
    # control: a fixed mechanism seed is regenerated exactly
    real, regen = regenerate(cancer(defense, mechanism_seed=7), monkeypatch)
    assert agreement(real, regen) == pytest.approx(1.0) and torch.equal(real, regen)


def flips(result) -> np.ndarray:
    """Which of the active party's training labels RR changed in this run."""
    a = result.federation.active.data
    return a.y_labels != result.partition.true_labels(a.label_ids)


def test_a_seed_knowing_adversary_cannot_regenerate_the_rr_flips():
    cfg = cancer("rr:1")
    real, regen = flips(execute(cfg, progress=False)), flips(execute(cfg, progress=False))
    p_flip = 1 / (1 + np.e)  # binary RR at ε = 1 changes a label with probability 1/(1 + e^ε)
    assert abs(real.mean() - p_flip) < 0.08
    # among the rows the real run flipped, the re-run flipped about p of them, not all
    assert regen[real].mean() < 0.45, regen[real].mean()
    control = cancer("rr:1", mechanism_seed=7)
    real, regen = flips(execute(control, progress=False)), flips(execute(control, progress=False))
    assert regen[real].mean() == 1.0 and (real == regen).all()


def selection_stream(result) -> np.ndarray:
    """The next draws of the active party's private learning-rate selection stream after the run."""
    [dp] = [h for h in result.federation.active.hooks if h.name == "dp"]
    return dp.select_rng.random(2000)


def test_a_seed_knowing_adversary_cannot_regenerate_the_private_lr_choice():
    cfg = cancer("dp:noise=1", lr_grid=[0.001, 0.01])
    a, b = selection_stream(execute(cfg, progress=False)), selection_stream(execute(cfg, progress=False))
    assert abs(np.corrcoef(a, b)[0, 1]) < chance(len(a))
    control = cancer("dp:noise=1", mechanism_seed=7, lr_grid=[0.001, 0.01])
    a, b = selection_stream(execute(control, progress=False)), selection_stream(execute(control, progress=False))
    assert (a == b).all()


def test_parties_never_share_a_mechanism_stream():
    """Each party's copy of a defense draws its own stream, also under a fixed mechanism seed."""
    for seed in (None, 7):
        [d] = parse_defense("iso:1", mechanism_seed=seed)
        a, b = d.for_party("active"), d.for_party("passive1")
        draws = [torch.randn(5000, generator=x.generator) for x in (a, b)]
        assert abs(agreement(*draws)) < chance(5000)


def test_the_mark_is_in_the_json_the_store_and_the_report(tmp_path):
    from securevfl.lab.engine import run_sweep
    from securevfl.lab.report import write_report

    private = execute(cancer("rr:1"), progress=False).to_json()["privacy"]
    assert private["randomness"] == "private (OS CSPRNG)" and "status" not in private
    fixed = execute(cancer("rr:1", mechanism_seed=7), progress=False).to_json()["privacy"]
    assert fixed["status"] == NOT_PRIVATE and fixed["epsilon"] == 1.0
    sweep = {"name": "marked", "dataset": {"name": "breast-cancer"}, "methods": ["splitnn"],
             "defenses": [{"rr": [1, 4]}], "seeds": [0, 1], "train": {"epochs": 1}, "mechanism_seed": 11}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    run_sweep(str(tmp_path / "s.yaml"), str(tmp_path / "s.sqlite"), workers=1, progress=False)
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        rows = db.execute("SELECT privacy_status, config_json FROM runs").fetchall()
    assert len(rows) == 4 and {r[0] for r in rows} == {NOT_PRIVATE}
    # cells never share mechanism noise: each cell's mechanism seed is its own
    assert len({json.loads(c)["mechanism_seed"] for _, c in rows}) == 4
    out = tmp_path / "report"
    write_report(str(tmp_path / "s.sqlite"), str(out))
    assert "not private (mechanism seed fixed)" in (out / "report.md").read_text()


# ------------------------------------------------------------------ the label-independent view
def stratified_split(n_rows: int, frac: float, rng: np.random.Generator, y: np.ndarray) -> np.ndarray:
    """The split this module used before issue 25 (per-class draws): it reads the labels."""
    mask = np.zeros(n_rows, dtype=bool)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        mask[idx[: int(round(frac * len(idx)))]] = True
    return mask


def passive_view(monkeypatch, flip_row: int | None, stratify: bool) -> tuple[list, np.ndarray, np.ndarray]:
    """passive1's transcript of a recorded run on breast-cancer, with one dataset label flipped."""
    ds = load_dataset("breast-cancer")
    if flip_row is not None:
        y = ds.y.copy()
        y[flip_row] = 1 - y[flip_row]
        ds = dataclasses.replace(ds, y=y)
    monkeypatch.setattr(pipeline, "load_dataset", lambda *a, **k: ds)
    if stratify:
        monkeypatch.setattr(partition_mod, "label_free_test_split", lambda n, f, rng: stratified_split(n, f, rng, ds.y))
    cfg = RunConfig(dataset="breast-cancer", method="splitnn", seed=5, record=True)
    cfg.train.epochs = 2
    with pinned_threads():
        result = execute(cfg, progress=False)
    view = [(m.kind, m.payload) for m in result.federation.channel.received_by("passive1")]
    p = result.partition.passives[0]
    return view, p.train_ids, p.test_ids


def first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("stratify", [False, True], ids=["label-free split", "control: stratified split"])
def test_flipping_one_label_changes_nothing_the_passive_party_sees_before_that_row_is_sampled(stratify, monkeypatch):
    view_a, train_a, test_a = passive_view(monkeypatch, None, stratify)
    row = int(train_a[len(train_a) // 2])  # a training row of the unflipped run
    view_b, train_b, test_b = passive_view(monkeypatch, row, stratify)
    same_split = np.array_equal(train_a, train_b) and np.array_equal(test_a, test_b)
    ids_a = [m for m in view_a if m[0] in (MessageKind.BATCH_IDS, MessageKind.CONTROL)]
    ids_b = [m for m in view_b if m[0] in (MessageKind.BATCH_IDS, MessageKind.CONTROL)]
    # the first message that may depend on the flipped label: the gradient of the first batch holding it
    holding = next(i for i, (k, p) in enumerate(view_a) if k == MessageKind.BATCH_IDS and row in decode_array(p))
    first_gradient = next(i for i in range(holding, len(view_a)) if view_a[i][0] == MessageKind.GRADIENT)
    unchanged_before = first_difference(view_a, view_b) >= first_gradient
    if stratify:  # control: the label-reading split moves train/test IDs, batches and everything after
        assert not (same_split and ids_a == ids_b and unchanged_before)
    else:
        assert same_split
        assert ids_a == ids_b  # every batch's IDs and order, over the whole run (evaluation included)
        assert unchanged_before
        assert view_a[first_gradient] != view_b[first_gradient]  # the flip is really there
