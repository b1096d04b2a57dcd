"""Dataset registry: one loader per name, each able to say where its data is (or why not)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from securevfl.data.dataset import Dataset
from securevfl.errors import UserError


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    description: str
    load: Callable[[Path | None], Dataset]
    locate: Callable[[Path | None], str]
    """Where the data is found, or raises UserError saying how to get it."""


_DATASETS: dict[str, DatasetEntry] = {}


def register_dataset(entry: DatasetEntry) -> DatasetEntry:
    _DATASETS[entry.name] = entry
    return entry


def dataset_names() -> list[str]:
    return sorted(_DATASETS)


def get_dataset_entry(name: str) -> DatasetEntry:
    try:
        return _DATASETS[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; available: {', '.join(dataset_names())}") from None


def load_dataset(name: str, data_dir: Path | None = None) -> Dataset:
    return get_dataset_entry(name).load(data_dir)


def dataset_status(data_dir: Path | None = None) -> list[tuple[str, bool, str]]:
    """(name, available, where-or-why) for every registered dataset."""
    rows = []
    for name in dataset_names():
        entry = _DATASETS[name]
        try:
            rows.append((name, True, entry.locate(data_dir)))
        except UserError as e:
            rows.append((name, False, str(e)))
    return rows
