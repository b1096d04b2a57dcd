"""Dataset registry: one loader per name, each able to say where its data is (or why not)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from securevfl.data.dataset import DataConfig, Dataset
from securevfl.errors import UserError
from securevfl.registry import Registry


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset. To add one: write ``locate`` and ``load`` and call
    ``DATASETS.register(DatasetEntry(...))`` in a module imported by ``securevfl/data/__init__.py``."""

    name: str
    """The ``--dataset`` name."""
    description: str
    """One line for ``securevfl datasets``."""
    load: Callable[[DataConfig], Dataset] | None
    """Args: the loader options (``--data-dir``, ``--data-path``, ``sample``, ``max_rows``…).
    Returns: the whole table as a :class:`Dataset` (rows, labels, IDs, optional test mask). None for
    sources built from per-party files (``partition`` instead)."""
    locate: Callable[[DataConfig], str]
    """Args: the loader options. Returns: where the data is found (for ``securevfl datasets``), or
    raises a one-line UserError saying how to get it."""
    partition: Callable | None = None
    """Sources whose parties come from separate files build their partition themselves:
    ``(DataConfig, PartitionSpec, seed) → Partition``."""
    takes_path: bool = False
    """A single-file dataset that reads ``--data-path``; for any other, the flag is refused (not ignored)."""


DATASETS: Registry[DatasetEntry] = Registry("dataset")
"""Every dataset by name; a source module registers its entries with ``DATASETS.register(DatasetEntry(...))``."""

# the run path and the CLI look datasets up by these two names

_CACHE: dict[str, Dataset] = {}
DEBIAN_DATASETS = Path("/usr/share/datasets")
"""Where Debian's ``dataset-*`` packages install data (searched last)."""


def as_config(source: DataConfig | str | Path | None) -> DataConfig:
    if isinstance(source, DataConfig):
        return source
    return DataConfig(dir=None if source is None else str(source))


def load_dataset(name: str, source: DataConfig | str | Path | None = None) -> Dataset:
    """Load (and memoise, two entries) a dataset by name with the given loader options."""
    cfg = as_config(source)
    entry = DATASETS.get(name)
    if entry.load is None:
        raise UserError(f"dataset {name} is built from per-party files, not loaded as one table")
    where = entry.locate(cfg)
    key = json.dumps([name, where, asdict(cfg)], sort_keys=True, default=str)
    if key not in _CACHE:
        if len(_CACHE) >= 2:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = entry.load(cfg)
    return _CACHE[key]


def dataset_status(source: DataConfig | str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(name, available, where-or-why) for every registered dataset."""
    cfg = as_config(source)
    rows = []
    for name in DATASETS.names():
        try:
            rows.append((name, True, DATASETS.get(name).locate(cfg)))
        except UserError as e:
            rows.append((name, False, str(e)))
    return rows


_FILE_OPTIONS = {"party_files": "--party-file", "id_column": "--id-column", "id_columns": "--id-column",
                 "drop_columns": "--drop-columns", "categorical": "--categorical", "numeric": "--numeric",
                 "numeric_ids": "--numeric-ids", "hashed_ids": "--hashed-ids"}
"""Options only the per-party-file sources read: given with another dataset they would be ignored."""


def check_data_options(dataset: str, cfg: DataConfig, spec: object) -> None:
    """Refuse options the chosen dataset would silently ignore or resolve by a hidden rule: file
    options with a built-in dataset, ``--max-rows`` or ``--data-path`` with per-party files, a column
    both numeric and categorical, ``aligned_fraction`` beside ``aligned_count``, ``--parties`` unlike
    the number of party files. ``spec`` is the run's PartitionSpec."""
    entry = DATASETS.get(dataset)  # an unknown name is refused here, before any cell or file is read
    defaults = DataConfig()
    if entry.partition is None:
        given = [flag for key, flag in _FILE_OPTIONS.items() if getattr(cfg, key) != getattr(defaults, key)]
        if given:
            raise UserError(f"{given[0]} is for per-party files (--dataset csv); dataset {dataset} does not read it")
    else:
        if cfg.max_rows is not None:
            raise UserError(f"--max-rows is not read by dataset {dataset} (per-party files are read whole); "
                            "cut the files instead")
        ignored = [flag for key, flag, default in (("aligned_fraction", "--aligned-fraction", 1.0),
                                                   ("aligned_count", "--aligned-count", None))
                   if getattr(spec, key, default) != default]
        if ignored:  # the files decide who holds which IDs: a fraction would be ignored without a word
            raise UserError(f"{ignored[0]} does not apply to dataset {dataset}: the party files define which IDs "
                            "every party holds (PSI finds them); cut the files to change the overlap")
        n_parties = getattr(spec, "n_parties", None)
        if cfg.party_files and n_parties not in (None, 2, len(cfg.party_files)):  # 2: the default
            raise UserError(f"--parties {n_parties} but {len(cfg.party_files)} party files: the files are the "
                            "parties; drop --parties or give one file per party")
    if cfg.path is not None and not entry.takes_path:
        raise UserError(f"--data-path is not read by dataset {dataset} (only by single-file datasets: "
                        f"{', '.join(n for n in DATASETS.names() if DATASETS.get(n).takes_path)})")
    both = sorted(set(cfg.numeric) & set(cfg.categorical))
    if both:
        raise UserError(f"column {both[0]!r} is given as both --numeric and --categorical; choose one")
    if getattr(spec, "aligned_count", None) is not None and getattr(spec, "aligned_fraction", 1.0) != 1.0:
        raise UserError("give aligned_count or aligned_fraction, not both (aligned_count would win silently)")


def search_dirs(cfg: DataConfig, name: str) -> list[Path]:
    """Folders a file dataset is looked for in: --data-dir (and its ``name`` subfolder), then
    ``$SECUREVFL_DATA/name``, then Debian's ``/usr/share/datasets/name``."""
    out = []
    if cfg.dir is not None:
        if not Path(cfg.dir).is_dir():
            raise UserError(f"data dir {cfg.dir} does not exist")
        out += [Path(cfg.dir) / name, Path(cfg.dir)]
    if os.environ.get("SECUREVFL_DATA"):
        out += [Path(os.environ["SECUREVFL_DATA"]) / name, Path(os.environ["SECUREVFL_DATA"])]
    out.append(DEBIAN_DATASETS / name)
    return out


def locate_file(cfg: DataConfig, name: str, filenames: tuple[str, ...], how: str) -> Path:
    """A single-file dataset: ``--data-path`` wins, else the first ``filenames`` match in search_dirs."""
    if cfg.path is not None:
        p = Path(cfg.path)
        if not p.is_file():
            raise UserError(f"--data-path {p}: no such file")
        return p
    tried = search_dirs(cfg, name)
    for folder in tried:
        for fn in filenames:
            if (folder / fn).is_file():
                return folder / fn
    raise UserError(f"{name} not found (looked for {'/'.join(filenames)} in {', '.join(map(str, tried))}); {how}")
