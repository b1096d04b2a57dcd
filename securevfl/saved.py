"""One party's saved folder: its own models (a ``state_dict`` in ``model.pt``, read back with
``torch.load(..., weights_only=True)``), its preprocessing (``preprocessing.json``: columns, scaler,
vocabularies) and ``manifest.json`` (configuration, versions, the columns and dtypes the party expects,
and the SHA-256 of both files). A party writes and reads only its own folder (:meth:`Party.save_own`,
:meth:`Party.load_own`); nothing here knows about any other party."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl.errors import UserError
from securevfl.provenance import git_commit, version

FORMAT = "securevfl-party/1"
MODEL, PREPROCESSING, MANIFEST = "model.pt", "preprocessing.json", "manifest.json"
_INTS = "__int_array__"  # an object array of Python ints (HE shares), stored as a list


def storable(obj: Any) -> Any:
    """``obj`` in types ``torch.load(weights_only=True)`` reads back on any machine: numpy float arrays
    as tensors, object arrays of (big) integers as lists, tensors on the CPU."""
    if isinstance(obj, dict):
        return {k: storable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [storable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            return {_INTS: [int(v) for v in obj.ravel()], "shape": list(obj.shape)}
        return torch.from_numpy(obj.copy())
    if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":  # trained on a --device: saved from the CPU
        return obj.detach().cpu()
    return obj


def restored(obj: Any, numpy: bool = False) -> Any:
    """The inverse of :func:`storable`; ``numpy``: tensors back to arrays (cut-layer ends keep numpy)."""
    if isinstance(obj, dict):
        if _INTS in obj:
            out = np.empty(len(obj[_INTS]), dtype=object)
            out[:] = obj[_INTS]
            return out.reshape(obj["shape"])
        return {k: restored(v, numpy) for k, v in obj.items()}
    if isinstance(obj, list):
        return [restored(v, numpy) for v in obj]
    if numpy and isinstance(obj, torch.Tensor):
        return obj.numpy()
    return obj


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_columns(prep: dict) -> list[dict]:
    """The columns (name, dtype) a party's file must hold, from its preprocessing."""
    return ([{"name": prep["id_column"], "dtype": "id"}]
            + [{"name": c, "dtype": "float64"} for c in prep["numeric_columns"]]
            + [{"name": c, "dtype": "category"} for c in prep["categorical_columns"]])


def write_party_folder(folder: Path, state: dict, preprocessing: dict, manifest: dict) -> Path:
    """Write one party's folder (created; refused if it already holds a saved party)."""
    if (folder / MANIFEST).exists():
        raise UserError(f"--save: {folder} already holds a saved model; choose an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(storable(state), folder / MODEL)
    (folder / PREPROCESSING).write_text(json.dumps(_jsonable(preprocessing), indent=1))
    full = {"format": FORMAT, **manifest, "columns": expected_columns(preprocessing),
            "versions": {"securevfl": version(), "commit": git_commit(), "torch": torch.__version__},
            "sha256": {name: _sha256(folder / name) for name in (MODEL, PREPROCESSING)}}
    (folder / MANIFEST).write_text(json.dumps(_jsonable(full), indent=1))
    return folder


def read_manifest(folder: Path) -> dict:
    """A saved party's manifest (the folder is checked to be one)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"--model: {folder} is not a saved party folder ({MANIFEST}: {e})") from None
    if manifest.get("format") != FORMAT:
        raise UserError(f"--model: {folder / MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def read_party_folder(folder: Path) -> tuple[dict, dict, dict]:
    """(manifest, model state, preprocessing) of one saved party, after checking the files' hashes.

    Raises:
        UserError: a missing or altered file."""
    manifest = read_manifest(folder)
    for name, digest in manifest["sha256"].items():
        path = folder / name
        if not path.is_file() or _sha256(path) != digest:
            raise UserError(f"--model: {path} is missing or does not match its manifest's hash")
    state = torch.load(folder / MODEL, weights_only=True)
    prep = json.loads((folder / PREPROCESSING).read_text())
    if "numeric" in prep:
        prep["numeric"] = {k: np.asarray(v, dtype=np.float64) if isinstance(v, list) else v
                           for k, v in prep["numeric"].items()}
    prep["vocab"] = [np.asarray(v, dtype=np.int64) for v in prep.get("vocab", [])]
    return manifest, state, prep
