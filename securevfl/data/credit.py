"""UCI "default of credit card clients" (Yeh & Lien 2009): 30,000 clients, ``ID``, 23 features,
label ``default.payment.next.month``. SEX, EDUCATION and MARRIAGE are categorical fields; the other
20 are numeric (standardised per party on its training rows; amounts get a signed log)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from securevfl.data.dataset import DataConfig, Dataset
from securevfl.data.readers import bad_line
from securevfl.data.registry import DATASETS, DatasetEntry, locate_file
from securevfl.data.tabular import hash_values
from securevfl.errors import UserError

LABEL = "default.payment.next.month"
CATEGORICAL = ["SEX", "EDUCATION", "MARRIAGE"]
PAY = ["PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6"]
BILL = [f"BILL_AMT{i}" for i in range(1, 7)]
PAY_AMT = [f"PAY_AMT{i}" for i in range(1, 7)]
NUMERIC = ["LIMIT_BAL", "AGE", *PAY, *BILL, *PAY_AMT]
PRESETS = {
    # FATE's hetero split of this file: guest (active) = first 10 features, host (passive) = last 13
    "fate": [["LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE", "PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5"],
             ["PAY_6", *BILL, *PAY_AMT]],
}


def _locate(cfg: DataConfig) -> str:
    return str(locate_file(cfg, "uci-credit", ("uci_credit_card.csv", "UCI_Credit_Card.csv",
                                               "default_of_credit_card_clients.csv"),
                           "pass --data-path FILE (the UCI default-of-credit-card-clients CSV)"))


def load_uci_credit(cfg: DataConfig) -> Dataset:
    path = Path(_locate(cfg))
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, nrows=cfg.max_rows)
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in ["ID", *NUMERIC, *CATEGORICAL, LABEL] if c not in df.columns]
    if missing:
        raise bad_line(path, 1, f"missing column {missing[0]!r}")
    if cfg.sample < 1.0:
        keep = np.random.default_rng(cfg.sample_seed).random(len(df)) < cfg.sample
        df = df[keep]
    lines = df.index.to_numpy() + 2  # header is line 1
    num = np.empty((len(df), len(NUMERIC)), dtype=np.float64)
    for j, c in enumerate([*NUMERIC, LABEL, "ID"]):
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.isnan(v) & (df[c].to_numpy() != "")
        if c in (LABEL, "ID"):
            bad |= np.isnan(v)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise bad_line(path, int(lines[i]), f"{c} is {df[c].iloc[i]!r}, expected a number")
        if j < len(NUMERIC):
            num[:, j] = v
    y = pd.to_numeric(df[LABEL]).to_numpy()
    if not np.isin(y, (0, 1)).all():
        i = int(np.flatnonzero(~np.isin(y, (0, 1)))[0])
        raise bad_line(path, int(lines[i]), f"{LABEL} is {df[LABEL].iloc[i]!r}, expected 0 or 1")
    ids = pd.to_numeric(df["ID"]).to_numpy().astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        dup = pd.Series(ids).duplicated()
        raise bad_line(path, int(lines[int(np.flatnonzero(dup)[0])]), f"duplicate ID {ids[dup.to_numpy()][0]}")
    # money amounts are heavy-tailed: signed log on all numeric fields is harmless for the small ones
    cats = np.column_stack([hash_values(df[c].to_numpy()) for c in CATEGORICAL])
    return Dataset("uci-credit", num.astype(np.float32), y.astype(np.int64), ids, 2, "tabular", tuple(NUMERIC),
                   log_transform=True, categorical=cats, cat_names=tuple(CATEGORICAL),
                   presets=PRESETS)


DATASETS.register(DatasetEntry("uci-credit", "UCI default of credit card clients, 30,000 × 23, binary",
                               load_uci_credit, _locate, takes_path=True))
