"""RISA (paper Tables I–III) and Entity Augmentation (paper Tables 2 and 4)
reproductions at CPU scale.

    python benchmarks/risa_entity_aug.py --table risa --dataset fashion-mnist --train-rows 12000 \
        --out runs/risa_fmnist.jsonl
    python benchmarks/risa_entity_aug.py --table ablation --dataset uci-credit \
        --data-path ../shared/data/uci_credit_card.csv --out runs/risa_credit.jsonl
    python benchmarks/risa_entity_aug.py --table ea --dataset fashion-mnist --train-rows 12000 \
        --out runs/ea_fmnist.jsonl

``risa``: risa / splitnn / local / local-vfl / random-match at 1, 10, 50 % overlap (2 parties,
image halves or the default contiguous field split; the active party's non-overlapping rows are
labeled, the passive party's are not). ``ablation``: RISA's IMP / ST / EVFL switches at 10 %.
``ea``: a label-only host + 2 guests; aligned-only (``draw: aligned``: every party draws the same
aligned batches, also with epochs scaled up to the augmented run's step count) vs aligned +
augmented (``draw: independent``) at 5 % and 10 % aligned, and fully aligned vs fully misaligned at
100 %. ``--train-rows`` caps the training rows (a fixed draw, the same for every seed) to bound
the compute. Resumable: finished runs are appended to ``--out`` and skipped on rerun.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from runlog import append, load, mean_std

from securevfl.config import RunConfig
from securevfl.data import load_dataset
from securevfl.data.dataset import DataConfig, Dataset
from securevfl.data.registry import DATASETS, DatasetEntry
from securevfl.lab.compose import execute

KEY = ("table", "variant", "aligned", "seed")
ABLATION = {  # name: (imputation, self_training, evidential)
    "VFL (no IMP/ST/EVFL)": None,
    "IMP": (True, False, False),
    "IMP + ST": (True, True, False),
    "IMP + EVFL": (True, False, True),
    "IMP + ST + EVFL (RISA)": (True, True, True),
}


def capped(name: str, rows: int, test_rows: int) -> str:
    """Register ``NAME@rows`` = the dataset with a fixed draw of ``rows`` training rows (and at most
    ``test_rows`` test rows of a predefined test split)."""
    base = DATASETS.get(name)

    def _load(cfg: DataConfig) -> Dataset:
        ds = load_dataset(name, cfg)
        rng = np.random.default_rng(12345)
        if ds.test_mask is not None:
            tr, te = np.flatnonzero(~ds.test_mask), np.flatnonzero(ds.test_mask)
            keep = np.sort(np.concatenate([rng.choice(tr, min(rows, len(tr)), replace=False),
                                           rng.choice(te, min(test_rows, len(te)), replace=False)]))
            mask = ds.test_mask[keep]
        else:
            keep, mask = np.sort(rng.choice(len(ds.y), min(rows, len(ds.y)), replace=False)), None
        cat = None if ds.categorical is None else ds.categorical[keep]
        return Dataset(ds.name, ds.X[keep], ds.y[keep], ds.ids[keep], ds.n_classes, ds.kind, ds.feature_names, mask,
                       ds.log_transform, cat, ds.cat_names, ds.presets)

    cname = f"{name}@{rows}"
    DATASETS.register(DatasetEntry(cname, f"{name}, {rows} training rows", _load, base.locate))
    return cname


def grid(table: str, aligned: list[float] | None) -> list[tuple[str, str, float]]:
    """(variant, method, aligned fraction) cells of one table."""
    if table == "risa":
        return [(m, m, a) for a in aligned or [0.01, 0.1, 0.5]
                for m in ("local", "splitnn", "local-vfl", "random-match", "risa")]
    if table == "ablation":
        return [(v, "risa" if flags else "splitnn", a) for a in aligned or [0.1] for v, flags in ABLATION.items()]
    cells = []
    for a in aligned or [0.05, 0.1]:
        cells += [("aligned-only", "entity-aug", a), ("aligned-only, matched steps", "entity-aug", a),
                  ("aligned + augmented", "entity-aug", a)]
    return cells + [("fully aligned", "entity-aug", 1.0), ("fully misaligned", "entity-aug", 1.0)]


def configure(args, table: str, variant: str, method: str, aligned: float, seed: int) -> RunConfig:
    cfg = RunConfig(dataset=args.dataset_name, method=method, seed=seed)
    cfg.data.path = args.data_path
    cfg.partition.aligned_fraction = aligned
    cfg.train.epochs, cfg.train.batch_size = args.epochs, args.batch_size
    cfg.model.bottom = args.bottom
    if table in ("risa", "ablation"):  # paper setting: party 1's non-overlapping rows are labeled (Local uses them)
        cfg.partition.active_labels_unaligned = True
    if table in ("risa", "ablation") and method == "risa":
        flags = ABLATION.get(variant) or (True, True, True)
        cfg.method_params = dict(zip(("imputation", "self_training", "evidential"), flags, strict=True))
        cfg.method_params["self_training_epochs"] = args.st_epochs
    if table == "ea":
        cfg.partition.n_parties, cfg.partition.active_features = 3, False
        draw = "independent" if variant in ("aligned + augmented", "fully misaligned") else "aligned"
        cfg.method_params = {"draw": draw}
        if variant == "aligned-only, matched steps":  # as many steps as the augmented run takes
            cfg.train.epochs = min(args.epochs * math.ceil((1 - aligned) / 2 / aligned + 1), 400)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", choices=["risa", "ablation", "ea"], required=True)
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--data-path")
    ap.add_argument("--train-rows", type=int, help="cap the training rows (fixed draw)")
    ap.add_argument("--test-rows", type=int, default=5000)
    ap.add_argument("--aligned", nargs="+", type=float)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--st-epochs", type=int, default=20, help="RISA self-training epochs")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--bottom", default="mlp")
    ap.add_argument("--out", required=True)
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    args.dataset_name = capped(args.dataset, args.train_rows, args.test_rows) if args.train_rows else args.dataset
    done = load([args.out], KEY)
    cells = grid(args.table, args.aligned)
    for variant, method, aligned in [] if args.table_only else cells:
        for seed in args.seeds:
            if (args.table, variant, aligned, seed) in done:
                continue
            cfg = configure(args, args.table, variant, method, aligned, seed)
            r = execute(cfg, progress=False).to_json()
            row = {"table": args.table, "variant": variant, "aligned": aligned, "seed": seed, "method": method,
                   "dataset": args.dataset_name, "aligned_rows": r["partition"]["aligned"], "epochs": cfg.train.epochs,
                   "metric": r["utility"]["metric"], "test": r["utility"]["test"], "seconds": r["cost"]["seconds"],
                   "info": r["method_info"].get("risa", r["method_info"].get("entity_aug"))}
            append(args.out, row)
            done[(args.table, variant, aligned, seed)] = row
    aligned_list = sorted({a for _, _, a in cells})
    variants = list(dict.fromkeys(v for v, _, _ in cells))
    metric = next((r["metric"] for r in done.values()), "?")
    print(f"\n{args.dataset_name}: test {metric}, mean ± std over seeds {args.seeds}\n")
    print("| variant | " + " | ".join(f"{a * 100:g} % aligned" for a in aligned_list) + " |")
    print("|---|" + "---|" * len(aligned_list))
    for v in variants:
        cells_v = []
        for a in aligned_list:
            vals = [done[(args.table, v, a, s)]["test"] for s in args.seeds if (args.table, v, a, s) in done]
            cells_v.append(mean_std(vals) if vals else "")
        print(f"| {v} | " + " | ".join(cells_v) + " |")


if __name__ == "__main__":
    main()
