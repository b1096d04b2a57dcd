"""Reduced FedHSSL Table-2 reproduction (the full one is benchmarks/ssl_table2.py): at 200 labeled
aligned rows and 20 % aligned rows, FedHSSL must beat FedVanilla (splitnn) on Fashion-MNIST."""

import statistics

import pytest

from securevfl.config import RunConfig
from securevfl.data import dataset_status
from securevfl.lab.compose import execute

HAVE_FMNIST = dict((n, ok) for n, ok, _ in dataset_status())["fashion-mnist"]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_FMNIST, reason="fashion-mnist not installed (apt-get install dataset-fashion-mnist)")
@pytest.mark.xfail(strict=False, reason="since the interactive layer (issue 15: tanh-bounded cut, W_P by momentum SGD) "
                   "this reduced reproduction measured splitnn 0.699 vs fedhssl 0.696 (seeds 0, 1); open finding, "
                   "see benchmarks/RESULTS.md")
def test_fedhssl_beats_splitnn_at_200_labels_on_fashion_mnist():
    acc = {}
    for method in ("splitnn", "fedhssl"):
        acc[method] = []
        for seed in (0, 1):
            cfg = RunConfig(dataset="fashion-mnist", method=method, seed=seed)
            cfg.partition.aligned_fraction, cfg.partition.n_labeled = 0.2, 200
            cfg.train.epochs, cfg.train.batch_size = 40, 64
            cfg.train.lr_grid = [0.005, 0.01, 0.03]
            cfg.optim.optimizer, cfg.model.bottom = "sgd", "mlp"
            if method == "fedhssl":
                cfg.method_params = {"ssl_epochs": 3}
            acc[method].append(execute(cfg).to_json()["utility"]["test"])
    assert statistics.mean(acc["fedhssl"]) > statistics.mean(acc["splitnn"]) + 0.01, acc
