"""What HE and the passive party's own defenses change for a malicious active party's two attacks of
issue 60, in the simulator (benchmarks/RESULTS.md, "A malicious active party steers the passive model").

- ``probe``: the sign probe (``--attack sign-probe``) after training on breast-cancer with a linear
  bottom (``hidden: []``, ``cut_dim: 1``), 1 epoch, seed 1: mean best R² over the passive party's 15
  features, and its control.
- ``columns``: the passive party holds one column (as ``--drop-columns`` all but one did); the best
  affine read-out of it from the first training batch the active party receives (400 rows; fitted on
  half, scored on the other half). HE off: the released t itself (atanh on a linear bottom); under HE:
  the decrypted a_P = t·W_P, all the active party gets.

Usage: ``python benchmarks/malicious_active.py probe|columns HE DEFENSE [linear|default]``; one line
each. A deployed passive party on its defaults refuses both before any of its data moves
(tests/test_malicious_active.py)."""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from securevfl import runtime
from securevfl.config import RunConfig
from securevfl.lab import compose
from securevfl.parties import ActiveParty


def probe(he: str, defense: str, rows: int = 128) -> str:
    cfg = RunConfig()
    cfg.dataset, cfg.method, cfg.seed, cfg.he, cfg.defense = "breast-cancer", "splitnn", 1, he, defense
    cfg.train.epochs, cfg.model.hidden, cfg.model.cut_dim = 1, (), 1
    cfg.attacks = [f"sign-probe:rows={rows},probes=1500"]
    t0 = time.perf_counter()
    a = compose.execute(cfg, progress=False).to_json()["attacks"]["sign-probe"]
    return (f"probe {he} {defense}: R² {a['value']:.3f} (control {a['control']:.3f}), {a['probes']} probes, "
            f"{time.perf_counter() - t0:.0f} s")


def columns(he: str, defense: str, model: str) -> str:
    got: dict = {}
    real_forward, real_request, real_train = (runtime.ActiveOnlyCut.complete_forward, ActiveParty.request,
                                              compose.train_and_evaluate)

    def forward(self, p_end, a_end):  # type: ignore[no-untyped-def]
        out = real_forward(self, p_end, a_end)
        if torch.is_grad_enabled() and "received" not in got and a_end.passive == "passive1":
            got["received"] = out.detach().double().cpu().numpy()
        return out

    def request(self, ids, split, training):  # type: ignore[no-untyped-def]
        if training and "ids" not in got:
            got["ids"] = np.asarray(ids)
        return real_request(self, ids, split, training)

    def train(method, fed):  # type: ignore[no-untyped-def]
        got["fed"] = fed
        return real_train(method, fed)

    runtime.ActiveOnlyCut.complete_forward = forward  # type: ignore[method-assign]
    ActiveParty.request = request  # type: ignore[method-assign]
    compose.train_and_evaluate = train
    cfg = RunConfig()
    cfg.dataset, cfg.method, cfg.seed, cfg.he, cfg.defense = "breast-cancer", "splitnn", 1, he, defense
    cfg.record = True
    cfg.train.epochs, cfg.train.batch_size = 1, 400
    cfg.partition.columns = [[c for c in range(30) if c != 3], [3]]
    if model == "linear":
        cfg.model.hidden, cfg.model.cut_dim = (), 1
    t0 = time.perf_counter()
    compose.execute(cfg, progress=False)
    fed, ids, A = got["fed"], got["ids"], got["received"]
    if he == "off":  # the active party receives t itself: the first activation message of its own view
        from attacks.feature.init_inversion import first_training_batch

        ids, t = first_training_batch(fed.channel.transcript, "active", "passive1")
        A = np.arctanh(np.clip(t.astype(np.float64), -1 + 1e-7, 1 - 1e-7))
    A = np.asarray(A, dtype=np.float64).reshape(len(ids), -1)
    x = np.asarray(fed.party("passive1").data.rows(ids, "train"), dtype=np.float64).reshape(len(ids), -1)[:, 0]
    n = len(ids) // 2
    F = np.c_[A, np.ones(len(A))]
    pred = F[n:] @ np.linalg.lstsq(F[:n], x[:n], rcond=None)[0]
    r2 = 1 - float(((pred - x[n:]) ** 2).sum() / ((x[n:] - x[n:].mean()) ** 2).sum())
    return (f"columns {he} {defense} {model}: R² {r2:.3f} (first batch {len(ids)} rows, received width "
            f"{A.shape[1]}), {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    what, he, defense = sys.argv[1:4]
    print(probe(he, defense) if what == "probe" else columns(he, defense, sys.argv[4]), flush=True)
