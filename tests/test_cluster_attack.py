"""``cluster``: clustering label inference (Liu & Lyu 2022) by a passive party with no labeled rows."""

from __future__ import annotations

import numpy as np

from attacks.gradient.cluster import best_permutation_accuracy, last_epoch, name_clusters
from securevfl.config import RunConfig
from securevfl.lab.compose import execute


def _run(dataset: str, epochs: int, defense: str = "none") -> dict:
    cfg = RunConfig(dataset=dataset, method="splitnn", seed=0, defense=defense, attacks=["cluster"])
    cfg.train.epochs = epochs
    return execute(cfg, progress=False).to_json()["attacks"]["cluster"]


def test_cluster_names_every_breast_cancer_label_without_a_labeled_row():
    """Binary: the gradients of one epoch split into the two classes and the larger-norm cluster is
    the minority class (measured: accuracy 1.000, control 0.558 on random rows)."""
    a = _run("breast-cancer", 3)
    assert a["value"] >= 0.95 and a["value"] > a["control"] + 0.3 and a["best_permutation_accuracy"] >= 0.95


def test_cluster_separates_ten_classes_and_says_what_naming_costs():
    """Digits: the clusters are the classes (best naming 0.98, measured) though names from sizes alone
    are a guess on balanced classes; random rows cluster into nothing (the control: the test fails
    where the gradients carry no label structure)."""
    a = _run("digits", 10)
    assert a["best_permutation_accuracy"] > 0.9 and a["value"] > a["control"] + 0.1
    noisy = _run("digits", 10, "iso:5")  # heavy isotropic noise on the gradients: structure gone
    assert noisy["best_permutation_accuracy"] < 0.3


def test_last_epoch_and_naming_rules():
    pairs = [(np.array([1, 2]), np.ones((2, 3))), (np.array([3, 1]), 2 * np.ones((2, 3))),
             (np.array([2, 3]), 3 * np.ones((2, 3)))]
    ids, g = last_epoch(pairs)
    assert sorted(ids.tolist()) == [1, 2, 3] and ids.tolist() == [1, 2, 3] and g[0, 0] == 2
    g2 = np.array([[3.0, 0], [2.9, 0], [0, 0.1]])
    assert name_clusters(np.array([0, 0, 1]), g2, 2, np.array([0.7, 0.3])).tolist() == [1, 0]  # large norm: minority
    assert name_clusters(np.array([2, 2, 2, 0, 0, 1]), np.ones((6, 2)), 3,
                         np.array([0.2, 0.5, 0.3])).tolist() == [2, 0, 1]  # sizes follow the prior's order
    assert best_permutation_accuracy(np.array([1, 1, 0]), np.array([0, 0, 1]), 2) == 1.0
