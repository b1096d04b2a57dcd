"""Datasets that ship with scikit-learn and the IDX image sets (Fashion-MNIST, MNIST)."""

from __future__ import annotations

import dataclasses
import gzip
import struct
from pathlib import Path
from typing import cast

import numpy as np

from securevfl.data.dataset import DataConfig, Dataset
from securevfl.data.registry import DATASETS, DatasetEntry, search_dirs
from securevfl.errors import UserError


def subsample(ds: Dataset, cfg: DataConfig) -> Dataset:
    """``sample`` / ``max_rows`` for in-memory datasets: a seeded uniform subset (``sample_seed``),
    so a predefined test split keeps its proportion. File readers apply these while streaming."""
    n = len(ds.y)
    rng = np.random.default_rng(cfg.sample_seed)
    keep = np.flatnonzero(rng.random(n) < cfg.sample) if cfg.sample < 1.0 else np.arange(n)
    if cfg.max_rows is not None and cfg.max_rows < len(keep):
        keep = np.sort(rng.choice(keep, cfg.max_rows, replace=False))
    if len(keep) == n:
        return ds
    return dataclasses.replace(ds, X=ds.X[keep], y=ds.y[keep], ids=ds.ids[keep],
                               test_mask=None if ds.test_mask is None else ds.test_mask[keep],
                               categorical=None if ds.categorical is None else ds.categorical[keep])


def _sklearn_locate(_: DataConfig) -> str:
    return "bundled with scikit-learn"


def _breast_cancer(cfg: DataConfig) -> Dataset:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return subsample(Dataset(
        name="breast-cancer",
        X=d.data.astype(np.float32),
        y=d.target.astype(np.int64),
        ids=np.arange(len(d.target), dtype=np.int64),
        n_classes=2,
        kind="tabular",
        feature_names=tuple(d.feature_names),
    ), cfg)


def _digits(cfg: DataConfig) -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    return subsample(Dataset(
        name="digits",
        X=(d.images / 16.0).astype(np.float32),  # 8×8, pixel range is fixed: no data-dependent scaling
        y=d.target.astype(np.int64),
        ids=np.arange(len(d.target), dtype=np.int64),
        n_classes=10,
        kind="image",
    ), cfg)


DATASETS.register(DatasetEntry("breast-cancer", "569 × 30 tabular, binary (scikit-learn)", _breast_cancer,
                               _sklearn_locate))
DATASETS.register(DatasetEntry("digits", "1,797 × 8×8 images, 10 classes (scikit-learn)", _digits,
                               _sklearn_locate))

# ---------------------------------------------------------------------------------------------- IDX
_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _find_idx_file(folder: Path, stem: str) -> Path | None:
    for cand in (folder / stem, folder / f"{stem}.gz"):
        if cand.is_file():
            return cand
    return None


def _idx_locate_factory(name: str, how: str):
    def locate(cfg: DataConfig) -> str:
        tried = search_dirs(cfg, name)
        for folder in tried:
            if all(_find_idx_file(folder, s) for s in _IDX_FILES):
                return str(folder)
        raise UserError(
            f"{name} not found (looked in {', '.join(map(str, tried))}); {how}"
        )

    return locate


def read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file (optionally gzipped) into a numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
        zero, dtype_code, ndim = struct.unpack_from(">HBB", raw, 0)
        if zero != 0 or dtype_code != 0x08:
            raise ValueError("bad magic number")
        shape = struct.unpack_from(f">{ndim}I", raw, 4)
        data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
        if data.size != int(np.prod(shape)):
            raise ValueError(f"expected {int(np.prod(shape))} values, found {data.size}")
        return data.reshape(shape)
    except (OSError, EOFError, ValueError, struct.error) as e:
        raise UserError(f"{path}: not a valid IDX file ({e})") from None


def _idx_loader_factory(name: str, locate):
    def load(cfg: DataConfig) -> Dataset:
        folder = Path(locate(cfg))
        # locate returned a folder that holds all four files (_idx_locate_factory)
        xs = [read_idx(cast(Path, _find_idx_file(folder, s))) for s in _IDX_FILES]
        x_tr, y_tr, x_te, y_te = xs
        X = (np.concatenate([x_tr, x_te]).astype(np.float32) / 255.0)
        y = np.concatenate([y_tr, y_te]).astype(np.int64)
        test_mask = np.zeros(len(y), dtype=bool)
        test_mask[len(y_tr):] = True
        return subsample(Dataset(name=name, X=X, y=y, ids=np.arange(len(y), dtype=np.int64), n_classes=10,
                                 kind="image", test_mask=test_mask), cfg)

    return load


for _name, _how in [
    ("fashion-mnist", "install the Debian package dataset-fashion-mnist "
     "(apt-get install dataset-fashion-mnist), or put the four IDX files in $SECUREVFL_DATA/fashion-mnist "
     "or pass --data-dir"),
    ("mnist", "put the four MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in $SECUREVFL_DATA/mnist "
     "or pass --data-dir"),
]:
    _loc = _idx_locate_factory(_name, _how)
    DATASETS.register(DatasetEntry(_name, "70,000 × 28×28 images, 10 classes (IDX files)",
                                   _idx_loader_factory(_name, _loc), _loc))
