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
    """Test accuracy per method over seeds 0 and 1 (≈ 2 minutes on one core; shared by both tests)."""
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


def test_both_methods_learn_at_200_labels_on_fashion_mnist(accuracy):
    """What holds today: both train far above the 0.1 prior (measured 0.65–0.73)."""
    for method, values in accuracy.items():
        assert min(values) > 0.6, (method, accuracy)


# Strict: the runs are deterministic (the same numbers on every run here), so this fails every time
# today, and an XPASS (FedHSSL ahead again) fails the suite until the marker is removed.
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="open finding since the interactive layer (issue 15: tanh-bounded cut, W_P by momentum "
                          "SGD): measured splitnn 0.6724 / 0.7257 (mean 0.699) vs fedhssl 0.6459 / 0.7204 (mean "
                          "0.683), seeds 0 and 1; before issue 15 FedHSSL led (benchmarks/RESULTS.md, 'FedHSSL "
                          "Table 2 shape')")
def test_fedhssl_beats_splitnn_at_200_labels_on_fashion_mnist(accuracy):
    assert statistics.mean(accuracy["fedhssl"]) > statistics.mean(accuracy["splitnn"]) + 0.01, accuracy
