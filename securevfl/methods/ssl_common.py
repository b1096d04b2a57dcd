"""Shared plumbing for methods with an SSL pre-training stage: SSL hyperparameters as method
parameters, each party's augmentation, and the party-local pre-training step."""

from __future__ import annotations

from securevfl.federation import seeded_build
from securevfl.parties import Party
from securevfl.ssl import SSLConfig, make_augmentation, make_objective, pretrain_local
from securevfl.ssl.augment import Augmentation

# method parameter → SSLConfig field (paper defaults: 30 % corruption, batch 512)
SSL_PARAMS = {"ssl_epochs": 10, "ssl_batch_size": 512, "ssl_lr": 1e-3, "corruption": 0.3, "proj_dim": 128,
              "pred_hidden": 32, "temperature": 0.1, "ema": 0.99, "queue": 2048}


def ssl_config(params: dict, objective: str) -> SSLConfig:
    return SSLConfig(objective=objective, epochs=int(params["ssl_epochs"]), batch_size=int(params["ssl_batch_size"]),
                     lr=float(params["ssl_lr"]), corruption=float(params["corruption"]),
                     proj_dim=int(params["proj_dim"]), pred_hidden=int(params["pred_hidden"]),
                     temperature=float(params["temperature"]), ema=float(params["ema"]), queue=int(params["queue"]))


def party_augmentation(party: Party, cfg: SSLConfig) -> Augmentation:
    kind = "image" if party.data.X_train.ndim == 3 else "tabular"
    return make_augmentation(kind, party.data.X_train, party.data.n_numeric, cfg.corruption)


def pretrain_party_locally(party: Party, cfg: SSLConfig, seed: int) -> list[float]:
    """One party pre-trains its own bottom model on all its local training rows (no channel). The
    objective's heads are initialised from ``seed`` too, so a party in its own process draws the same."""
    objective = seeded_build(seed, lambda: make_objective(party.bottom, cfg))
    return pretrain_local(objective, party.data.X_train, party_augmentation(party, cfg), seed)
