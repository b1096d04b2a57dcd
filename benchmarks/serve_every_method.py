"""Every method serves after training (issue 63), on FATE's breast files (docs/deploy-example/): the guest
(active party) holds all 569 rows, the host the 455 whose ``id`` is not a multiple of 5 (80 %). Per
method: ``train --save`` on the guest's first 500 rows (and the host's among them), then ``predict``
(in process) (a) on the training run's own test rows, whose AUC must equal the one ``train``
reported, and (b) on the guest's 69 held-out rows, every one scored: those the host holds
``federated``, the others by the method's path for them.

    python benchmarks/serve_every_method.py [--epochs 10] [--methods splitnn fedud ...]

Prints one Markdown row per method: reported AUC, AUC of the saved model's predictions on the same
rows, held-out AUC, rows per path, and the seconds of train and predict."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from securevfl.config import RunConfig
from securevfl.lab.compose import execute
from securevfl.lab.predict import predict
from securevfl.methods import METHODS

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "deploy-example"
SMALL = {"ssl_epochs": 2}
PARAMS = {"fedhssl": SMALL, "fedcssl": SMALL, "fedgssl": SMALL, "vflhlp": {**SMALL, "pretrain_epochs": 2}}
METHODS_SHOWN = ["local", "splitnn", "fedhssl", "fedcssl", "fedgssl", "vflhlp", "fedud", "risa", "local-vfl",
                 "random-match", "entity-aug"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--methods", nargs="*", default=METHODS_SHOWN)
    args = ap.parse_args()
    guest = pd.read_csv(EXAMPLE / "breast_hetero_guest.csv")
    host = pd.read_csv(EXAMPLE / "breast_hetero_host.csv")
    host = host[host["id"] % 5 != 0]
    print("| method | reported AUC | saved model, same rows | held-out AUC | held-out rows by path | train s | "
          "predict s |\n|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        fg, fh, ng, nh = root / "guest.csv", root / "host.csv", root / "guest_new.csv", root / "host_new.csv"
        guest.iloc[:500].to_csv(fg, index=False)
        host[host["id"] < 500].to_csv(fh, index=False)  # (entity-aug's host must hold every guest row's label)
        host.to_csv(nh, index=False)
        guest.iloc[500:].to_csv(ng, index=False)
        for method in args.methods:
            assert method in METHODS.names(), method
            cfg = RunConfig(dataset="csv", method=method, seed=0)
            cfg.data.party_files = [str(fg), str(fh)]
            cfg.data.label_column = "y"
            cfg.train.epochs = args.epochs
            cfg.method_params = dict(PARAMS.get(method, {}))
            t0 = time.perf_counter()
            res = execute(cfg, progress=False, save=root / method)
            t_train = time.perf_counter() - t0
            test_ids = np.asarray(res.partition.active.test_ids)
            tg, th = root / f"{method}-tg.csv", root / f"{method}-th.csv"
            guest[guest["id"].astype(str).isin(test_ids)].to_csv(tg, index=False)
            host[host["id"].astype(str).isin(test_ids)].to_csv(th, index=False)
            files = [str(tg)] if method == "local" else [str(tg), str(th)]
            predict(root / method, files, root / f"{method}-same.csv")
            same = pd.read_csv(root / f"{method}-same.csv").merge(guest[["id", "y"]], on="id")
            t0 = time.perf_counter()
            summary = predict(root / method, [str(ng)] if method == "local" else [str(ng), str(nh)],
                              root / f"{method}-new.csv")
            t_pred = time.perf_counter() - t0
            new = pd.read_csv(root / f"{method}-new.csv").merge(guest[["id", "y"]], on="id")
            paths = ", ".join(f"{k} {v}" for k, v in summary["scored_by"].items())
            print(f"| {method} | {res.utility['auc']:.4f} | {roc_auc_score(same.y, same.proba_1):.4f} | "
                  f"{roc_auc_score(new.y, new.proba_1):.4f} | {paths} | {t_train:.1f} | {t_pred:.2f} |", flush=True)


if __name__ == "__main__":
    main()
