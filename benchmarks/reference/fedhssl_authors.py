"""FedHSSL's authors' code as an arm of the methods report (issue 52): their pre-training and fine-tuning,
run on the rows, aligned set, labeled rows and seeds of one of our sweeps, scored into our store.

    git clone https://github.com/jorghyq2016/FedHSSL /tmp/FedHSSL && git -C /tmp/FedHSSL checkout 78904f1a
    python benchmarks/reference/fedhssl_authors.py /tmp/FedHSSL sweeps/methods/fedhssl-avazu.yaml \\
        --store runs/methods.sqlite [--labeled 200 --seeds 0 1]

The clone is theirs (no licence: run here, never copied into this tree). For each ``fedhssl`` cell of
the sweep (labeled count × seed), this script builds our partition of the cell and writes the rows the
authors' loader reads (``train_10W.txt``, ``test_2W.txt``: the raw Avazu rows, our train/test split),
the training rows ordered labeled first, then the other aligned rows, then the rest, so that their
"first ``aligned_label_percent`` of the rows are aligned, the first ``label_percent`` labeled" selects
exactly our aligned and labeled rows. Every party's local SSL runs on every training row, as in their
code and in our sweep (``unaligned: all``).

Their code runs unchanged but for these runtime edits (their files are read, edited in memory and
executed; nothing is written into the clone):

1. ``data/ctr_dataset.py``: the train/test cut ``iloc[:100000]`` → the number of our training rows.
2. ``prepare_experiments.py``: ``random.shuffle(train_indices)`` → kept in our order (the order above
   is our partition's draw, from the cell's seed).
3. ``prepare_experiments.py``: fine-tuning on ``ctr_avazu2party`` reads ``train_dataset_aug``, which only
   pre-training assigns (UnboundLocalError at their commit): it is built there too, as pre-training
   builds it (vocabulary + 1, so the embeddings match the checkpoints).
4. Modules their start-up imports but Avazu never uses are stubs: ``tensorboardX`` (a no-op writer),
   and the BHI, ModelNet and NUS-WIDE loaders (which need cv2 and torchvision).
5. Paths: each stage runs in its own folder ``<work>/<stage>/a/b`` (their data path is
   ``./../../dataset/avazu``), so runs never share their checkpoint files.

Their settings, from their README and the paper (App. C): ``--model dnnfm --input_size 32 --k 2
--batch_size 512 --pretrain_method simsiam --local_ssl 1 --aggregation_mode pma``, ``--epochs`` = the
sweep's ``ssl_epochs`` (40), γ = ``--constraint_ratio 0.5`` (the paper's value; their default is 0),
columns: theirs (their fixed Avazu party split, not our ``columns: fedhssl`` preset — recorded). Fine-
tuning: ``--local_ssl 1`` (their README omits it, which would fine-tune f_c alone), ``--epochs`` = the
sweep's ``train.epochs``, Adagrad (theirs), the learning rate chosen from the sweep's grid *our* way:
trained on the labeled rows but our validation split (``securevfl.training.validation_split``), scored
on that split, the best rate retrained on all labeled rows. The score is the **final epoch's** test AUC
(their log's last ``Valid: [E/E]`` line); their own figure, the best test AUC over epochs, is kept as
``best_over_epochs`` (it selects on the test rows).

Each cell becomes one store row: method ``fedhssl-authors``, the cell's seed and data axes, the result
JSON (``utility.test``, the clone's commit, the edits, γ, the chosen rate).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

COMMIT = "78904f1abb74e5d58e81487cf073c6f119c051a8"
ARMS = {  # --arm: (our method whose cells it runs on, its store name, pre-training flags, fine-tuning flags)
    "fedhssl": ("fedhssl", "fedhssl-authors",
                ["--local_ssl", "1", "--aggregation_mode", "pma", "--constraint_ratio", "0.5"], []),
    # FedSimSiam (paper §4.1): local SimSiam only, no cross-party SSL, no aggregation, fine-tuning f_l alone;
    # their flags: no cross-party stage (comm_mode none), γ = 0, no PMA, the cross-party encoder unused
    "fedsimsiam": ("fedlocal-simsiam", "fedsimsiam-authors",
                   ["--local_ssl", "1", "--aggregation_mode", "none", "--constraint_ratio", "0", "--comm_mode", "none"],
                   ["--use_cross_model", "0"]),
}

DRIVER = r'''
import os, sys, types, runpy
clone, stage = sys.argv[1], sys.argv[2]
sys.argv = [stage + ".py", *sys.argv[3:]]
sys.path.insert(0, clone)

class _Writer:
    def __init__(self, *a, **k): pass
    def __getattr__(self, name): return lambda *a, **k: None
sys.modules["tensorboardX"] = types.SimpleNamespace(SummaryWriter=_Writer)
for name, classes in {"data.bhi_dataset": ("BHIDataset2Party", "BHIAugDataset2Party"),
                      "data.modelnet_dataset": ("MultiViewAlignedDataset4Party", "MultiViewAlignedAugDataset4Party"),
                      "data.nuswide_dataset_multi": ("NUSWIDEDataset2Party", "NUSWIDEAugDataset2Party")}.items():
    mod = types.ModuleType(name)
    for c in classes:
        setattr(mod, c, type(c, (), {}))
    sys.modules[name] = mod

def patched(name, path, edits):
    src = open(os.path.join(clone, path)).read()
    for old, new, count in edits:
        assert src.count(old) == count, (path, old, src.count(old))
        src = src.replace(old, new)
    mod = types.ModuleType(name)
    mod.__file__ = os.path.join(clone, path)
    sys.modules[name] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)

import data  # their package (its __init__ only)
n_train = os.environ["FEDHSSL_N_TRAIN"]
patched("data.ctr_dataset", "data/ctr_dataset.py",
        [("data.iloc[:100000]", f"data.iloc[:{n_train}]", 2), ("data.iloc[100000:]", f"data.iloc[{n_train}:]", 2)])
CLS = ("        if args.exp_type == 'cls':\n"
       "            train_dataset = Avazu2party(DATA_DIR, 'Train', 2, args.input_size)\n")
patched("prepare_experiments", "prepare_experiments.py",
        [("    random.shuffle(train_indices)\n", "    pass  # securevfl: the rows come in our partition's order\n", 1),
         (CLS, CLS + "            train_dataset_aug = AvazuAug2party(DATA_DIR, 'Train', 2, args.input_size)\n", 1)])
import torch
torch.set_num_threads(int(os.environ.get("FEDHSSL_THREADS", "1")))
runpy.run_path(os.path.join(clone, stage + ".py"), run_name="__main__")
'''

VALID = re.compile(r"Valid: \[\s*(\d+)/(\d+)\].*Prec@\(1,5\) \(([0-9.]+)\)")


def check_clone(clone: Path) -> str:
    """The pinned commit, checked out, and nothing changed: its commit object exists (a folder whose
    ``.git/HEAD`` merely names it is no clone), HEAD is that commit, and the work tree matches it (no
    edited, deleted or added tracked file: a result of other code would be stored as the authors')."""
    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(clone), *a], capture_output=True, text=True)

    where = f"{clone} is not a clean clone of jorghyq2016/FedHSSL at {COMMIT[:8]}"
    if git("cat-file", "-e", f"{COMMIT}^{{commit}}").returncode:
        raise SystemExit(f"error: {where}: it holds no commit {COMMIT[:8]} (clone their repository and check it out)")
    head = git("rev-parse", "HEAD")
    if head.returncode or head.stdout.strip() != COMMIT:
        raise SystemExit(f"error: {where} (HEAD is {head.stdout.strip() or head.stderr.strip()})")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    if dirty.returncode or dirty.stdout.strip():
        first = dirty.stdout.strip().splitlines()[0] if dirty.stdout.strip() else dirty.stderr.strip()
        raise SystemExit(f"error: {where}: its tracked files differ from that commit ({first.strip()}; "
                         "git -C CLONE checkout -- . restores them)")
    return COMMIT


def write_rows(raw: pd.DataFrame, order: np.ndarray, test: np.ndarray, folder: Path) -> None:
    d = folder / "dataset" / "avazu"
    d.mkdir(parents=True, exist_ok=True)
    (folder / "a" / "b").mkdir(parents=True, exist_ok=True)
    raw.iloc[order].to_csv(d / "train_10W.txt", index=False)
    raw.iloc[test].to_csv(d / "test_2W.txt", index=False)


def stage(clone: Path, folder: Path, which: str, args: list[str], n_train: int, log: Path) -> list[float]:
    """Run their ``which`` (main_pretrain / main_cls) in ``folder``; the per-epoch test AUCs it logged."""
    env = {**os.environ, "FEDHSSL_N_TRAIN": str(n_train)}
    with open(log, "w") as out:
        r = subprocess.run([sys.executable, "-c", DRIVER, str(clone), which, *args], cwd=folder / "a" / "b",
                           env=env, stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text()
    if r.returncode:
        raise SystemExit(f"error: their {which} failed ({log}): {text.strip().splitlines()[-1]}")
    return [float(m.group(3)) for m in VALID.finditer(text)]


def cell_rows(cell, raw: pd.DataFrame) -> dict:
    """Our partition of ``cell``: rows in their order, test rows, counts."""
    from securevfl.lab.compose import build_partition
    from securevfl.lab.sweep import config_from_dict

    cfg = config_from_dict(cell.config)
    part = build_partition(cfg)
    active = part.active
    assert active.label_ids is not None
    labeled = np.asarray(active.label_ids)
    aligned = np.asarray(part.aligned_ids)
    train = np.unique(np.concatenate([np.asarray(p.train_ids) for p in part.parties]))
    rest_aligned = aligned[~np.isin(aligned, labeled)]
    rest = train[~np.isin(train, aligned)]
    order = np.concatenate([labeled, rest_aligned, rest]).astype(np.int64)
    test = np.asarray(active.test_ids, dtype=np.int64)
    # our entity IDs are the file's row numbers: the labels must agree
    clicks = raw["click"].astype(int).to_numpy()
    assert np.array_equal(clicks[test], np.asarray(active.y_test)), "our entity IDs are not the file's row numbers"
    return {"order": order, "test": test, "labeled": labeled, "y_labeled": np.asarray(active.y_labels),
            "n_aligned": len(aligned), "cfg": cfg}


def validation_rows(labeled: np.ndarray, y_labeled: np.ndarray, seed: int) -> np.ndarray | str:
    """The rows our arms hold out to choose a learning rate: :func:`securevfl.training.validation_split`
    of the labeled aligned rows *sorted*, as our fine-tuning passes them (``labeled_aligned_ids`` is a sorted
    intersection); the split draws positions, so the partition's order would hold out other rows (issue 65:
    5–8 of 40 rows shared)."""
    from securevfl.training import validation_split

    order = np.argsort(np.asarray(labeled), kind="stable")
    return validation_split(np.asarray(labeled)[order], np.asarray(y_labeled)[order], seed)


def run_cell(clone: Path, cell, raw: pd.DataFrame, work: Path, threads: int, arm: str = "fedhssl") -> dict:

    rows = cell_rows(cell, raw)
    cfg = rows["cfg"]
    order, n_train, n_lab = rows["order"], len(rows["order"]), len(rows["labeled"])
    params = dict(cell.config.get("method_params") or {})
    ssl_epochs = int(os.environ.get("FEDHSSL_SSL_EPOCHS") or params.get("ssl_epochs", 40))
    epochs = int(os.environ.get("FEDHSSL_EPOCHS") or cfg.train.epochs)
    grid = list(cfg.train.lr_grid or [0.01])
    common = ["--dataset", "ctr_avazu2party", "--model", "dnnfm", "--input_size", str(cfg.model.emb_dim or 32),
              "--k", "2", "--batch_size", "512", "--seed", str(cell.seed), "--workers", "0",
              "--aligned_label_percent", repr((rows["n_aligned"] + 0.5) / n_train)]
    os.environ["FEDHSSL_THREADS"] = str(threads)
    t0 = time.perf_counter()
    pre = work / "pretrain"
    write_rows(raw, order, rows["test"], pre)
    _, _, pre_flags, cls_flags = ARMS[arm]
    stage(clone, pre, "main_pretrain", [*common, "--epochs", str(ssl_epochs), "--pretrain_method", "simsiam",
                                        *pre_flags], n_train, pre / "log.txt")
    models = os.path.relpath(pre / "a" / "b" / "premodels", work / "x" / "a" / "b")

    def finetune(name: str, train_order: np.ndarray, n_labeled: int, test: np.ndarray, lr: float) -> list[float]:
        folder = work / name
        write_rows(raw, train_order, test, folder)
        return stage(clone, folder, "main_cls", [*common, "--pretrained_path", "dnnfm", "--pretrain_model_dir",
                                                 models, "--local_ssl", "1", "--label_percent", str(n_labeled),
                                                 "--learning_rate", str(lr), "--epochs", str(epochs), *cls_flags],
                     len(train_order), folder / "log.txt")

    # the learning rate our way: held-out labeled rows (the same split our arms use), scored at the last epoch
    held = validation_rows(rows["labeled"], rows["y_labeled"], cell.seed)
    chosen, scores = grid[len(grid) // 2], {}
    if isinstance(held, np.ndarray):
        keep = rows["labeled"][~np.isin(rows["labeled"], held)]
        # the test rows go last in the training file (never among the first labeled rows): their loader fits
        # its vocabularies and scaler on train + test, which must be the rows the checkpoints saw
        val_order = np.concatenate([keep, order[~np.isin(order, held)][len(keep):], rows["test"]])
        for lr in grid:
            scores[lr] = finetune(f"lr{lr}", val_order, len(keep), held.astype(np.int64), lr)[-1]
        chosen = max(grid, key=lambda lr: scores[lr])
    aucs = finetune("final", order, n_lab, rows["test"], chosen)
    return {"auc": aucs[-1], "best_over_epochs": max(aucs), "lr": chosen, "lr_scores": scores,
            "fallback": None if isinstance(held, np.ndarray) else held, "seconds": time.perf_counter() - t0,
            "n_train": n_train, "n_aligned": rows["n_aligned"], "n_labeled": n_lab, "ssl_epochs": ssl_epochs,
            "epochs": epochs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("clone", type=Path)
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--store", type=Path, default=Path("runs/methods.sqlite"))
    ap.add_argument("--labeled", type=int, nargs="*", default=None, help="only these labeled counts")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="only these seeds")
    ap.add_argument("--work", type=Path, default=Path("runs/fedhssl-authors"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arm", choices=sorted(ARMS), default="fedhssl", help="their FedHSSL, or their FedSimSiam "
                    "baseline (run on the sweep's fedlocal-simsiam cells)")
    ap.add_argument("--smoke", action="store_true", help="1 SSL epoch and 1 fine-tuning epoch (a check that it "
                    "runs; use another --store)")
    args = ap.parse_args()
    if args.smoke:
        os.environ.update(FEDHSSL_SSL_EPOCHS="1", FEDHSSL_EPOCHS="1")
    commit = check_clone(args.clone)
    from securevfl.lab.engine import cell_row
    from securevfl.lab.report.methods import REFERENCE_SUFFIX
    from securevfl.lab.store import Store
    from securevfl.lab.sweep import load_config_file, parse_sweep

    data = load_config_file(args.sweep, "sweep file")
    sweep = parse_sweep(data, str(args.sweep))
    raw = pd.read_csv(Path(data["dataset"]["path"]), dtype=str, keep_default_na=False)
    store = Store(args.store)
    try:
        done = store.completed()
        ours, method = ARMS[args.arm][:2]
        for cell in sweep.cells:
            if cell.method != ours:
                continue
            labeled = cell.config["partition"].get("n_labeled")
            if (args.labeled and labeled not in args.labeled) or (args.seeds and cell.seed not in args.seeds):
                continue
            row = cell_row(cell, sweep.name)
            row["run_id"] = row["run_id"] + REFERENCE_SUFFIX  # the report counts it in every sweep holding the cell
            if row["run_id"] in done:
                continue
            work = args.work / f"{args.arm}-l{labeled}-s{cell.seed}"
            r = run_cell(args.clone, cell, raw, work, args.threads, args.arm)
            result = {"utility": {"test": r["auc"], "metric": "auc"}, "method": method,
                      "reference": {"repository": "jorghyq2016/FedHSSL", "commit": commit, "columns": "theirs",
                                    "flags": ARMS[args.arm][2] + ARMS[args.arm][3],
                                    "edits": "benchmarks/reference/fedhssl_authors.py", **r}}
            store.put({**row, "method": method, "node": "authors' code", "status": "ok", "error": None,
                       "result_json": result, "utility": r["auc"], "utility_metric": "auc",
                       "seconds": r["seconds"]})
            print(f"labeled {labeled} seed {cell.seed}: AUC {r['auc']:.4f} (best over epochs "
                  f"{r['best_over_epochs']:.4f}, lr {r['lr']}, {r['seconds']:.0f} s)", flush=True)
    finally:
        store.close()
    print(json.dumps({"store": str(args.store)}))


if __name__ == "__main__":
    main()
