"""Reduced FedHSSL Table-2 setting on Fashion-MNIST (200 labeled aligned rows, 20 % aligned): the paper
reports FedHSSL > FedSimSiam > FedVanilla at 200 labels. What we measure instead (issue 42; on real
Avazu rows in reports/methods, here on the image stand-in) is asserted as the truth, so a change that
moves it fails here and the docs are updated with it."""

import statistics

import pytest

from securevfl.config import RunConfig
from securevfl.data import dataset_status
from securevfl.lab.compose import execute

HAVE_FMNIST = dict((n, ok) for n, ok, _ in dataset_status())["fashion-mnist"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not HAVE_FMNIST,
                                 reason="fashion-mnist not installed (apt-get install dataset-fashion-mnist)")]


@pytest.fixture(scope="module")
def accuracy() -> dict[str, list[float]]:
    """Test accuracy per method over seeds 0 and 1 (≈ 2 minutes on 2 cores; shared by both tests)."""
    acc: dict[str, list[float]] = {}
    for method in ("splitnn", "fedlocal-simsiam", "fedhssl"):
        acc[method] = []
        for seed in (0, 1):
            cfg = RunConfig(dataset="fashion-mnist", method=method, seed=seed)
            cfg.partition.aligned_fraction, cfg.partition.n_labeled = 0.2, 200
            cfg.train.epochs, cfg.train.batch_size = 40, 64
            cfg.train.lr_grid = [0.005, 0.01, 0.03]
            cfg.optim.optimizer, cfg.model.bottom = "sgd", "mlp"
            if method != "splitnn":
                cfg.method_params = {"ssl_epochs": 3}
            acc[method].append(execute(cfg).to_json()["utility"]["test"])
    return acc


def test_every_method_learns_at_200_labels_on_fashion_mnist(accuracy):
    """All three train far above the 0.1 prior (measured 0.67–0.73)."""
    for method, values in accuracy.items():
        assert min(values) > 0.6, (method, accuracy)


def test_fedhssl_does_not_lead_its_baselines_at_200_labels_on_fashion_mnist(accuracy):
    """The paper's lead (+0.041 over FedSimSiam on Avazu at 200 labels, +0.028 at 1,000) does not
    reproduce. Measured here (the suite's one torch thread): splitnn 0.6724 / 0.7257 (mean 0.699),
    fedlocal-simsiam 0.6971 / 0.7254 (0.711), fedhssl 0.6459 / 0.7204 (0.683), seeds 0 and 1 at
    e2d24ce; with two threads the SSL arms move by up to 0.03 (fedlocal-simsiam 0.698, fedhssl
    0.696). On real Avazu rows, 5 seeds: FedHSSL − FedSimSiam = −0.000 [−0.035, +0.035]
    (reports/methods). Asserted: FedHSSL leads neither baseline by more than 0.01, so a change that
    restores the paper's lead fails here and the docs move with it."""
    means = {m: statistics.mean(v) for m, v in accuracy.items()}
    assert means["fedhssl"] < means["fedlocal-simsiam"] + 0.01, accuracy
    assert means["fedhssl"] < means["splitnn"] + 0.01, accuracy
