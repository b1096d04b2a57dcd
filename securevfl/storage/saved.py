"""One party's saved folder: its own models (a ``state_dict`` in ``model.pt``, read back with
``torch.load(..., weights_only=True)``), its preprocessing (``preprocessing.json``: columns, scaler,
vocabularies) and ``manifest.json`` (configuration, versions, the columns and dtypes the party expects,
and the SHA-256 of both files). A party writes and reads only its own folder (:meth:`Party.save_own`,
:meth:`Party.load_own`); nothing here knows about any other party."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from securevfl.errors import UserError
from securevfl.operations.provenance import versions
from securevfl.storage.files import make_private_dir, open_new

if TYPE_CHECKING:
    from securevfl.data.partition import PartyData

FORMAT = "securevfl-party/2"  # 2: run id, the manifest's own hash, no label facts in a passive folder
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


def _manifest_digest(manifest: dict) -> str:
    """The manifest's own hash: every field but ``sha256``, as canonical JSON (so the class names, the
    run id and the configuration are covered as the two files are)."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def expected_columns(prep: dict) -> list[dict]:
    """The columns (name, dtype) a party's file must hold, from its preprocessing."""
    return ([{"name": prep["id_column"], "dtype": "id"}]
            + [{"name": c, "dtype": "float64"} for c in prep["numeric_columns"]]
            + [{"name": c, "dtype": "category"} for c in prep["categorical_columns"]])


def write_party_folder(folder: Path, state: dict, preprocessing: dict, manifest: dict) -> Path:
    """Write one party's folder (created; refused if it already holds a saved party). Files are made
    new (never through a link planted in the folder) and readable by the owner only."""
    if (folder / MANIFEST).exists():
        raise UserError(f"--save: {folder} already holds a saved model; choose an empty folder")
    make_private_dir(folder)
    with open_new(folder / MODEL, "wb") as f:
        torch.save(storable(state), f)
    with open_new(folder / PREPROCESSING, "w") as f:
        f.write(json.dumps(_jsonable(preprocessing), indent=1))
    full = _jsonable({"format": FORMAT, **manifest, "columns": expected_columns(preprocessing),
                      "versions": versions()})
    full["sha256"] = {**{name: _sha256(folder / name) for name in (MODEL, PREPROCESSING)},
                      MANIFEST: _manifest_digest(full)}
    with open_new(folder / MANIFEST, "w") as f:
        f.write(json.dumps(full, indent=1))
    return folder


_HEX64 = re.compile(r"[0-9a-f]{64}")
_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "format": str, "index": int, "n_parties": int, "run_id": str, "party": str, "role": str, "config": dict,
    "model": dict, "columns": list, "sha256": dict}
_ACTIVE_SCHEMA: dict[str, type | tuple[type, ...]] = {"task": str, "n_classes": int, "classes": list,
                                                      "passives": list}
_LABEL_FIELDS = ("task", "n_classes", "classes", "label_scale")
"""What only the active party's manifest may hold (a passive folder holds nothing about the labels)."""


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:200]


def _bad(folder: Path, why: str) -> UserError:
    return UserError(f"--model: {folder} is not an intact saved party folder: {why}")


def read_manifest(folder: Path) -> dict:
    """A saved party's manifest, verified whole: its schema, and its own hash (so an edited field,
    e.g. swapped class names, is refused like an edited file)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise _bad(folder, f"{MANIFEST} cannot be read as JSON ({_first_line(e)})") from None
    if not isinstance(manifest, dict):
        raise _bad(folder, f"{MANIFEST} is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise _bad(folder, f"{MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT} (save it again "
                           "with this version's train --save)")
    schema = {**_SCHEMA, **(_ACTIVE_SCHEMA if manifest.get("role") == "active" else {})}
    for key, typ in schema.items():
        v = manifest.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise _bad(folder, f"{MANIFEST} field {key!r} is missing or not a {getattr(typ, '__name__', typ)}")
    if manifest["role"] not in ("active", "passive"):
        raise _bad(folder, f"{MANIFEST} role {manifest['role']!r} is neither active nor passive")
    facts = [k for k in _LABEL_FIELDS if k in manifest]
    if manifest["role"] == "passive" and facts:
        raise _bad(folder, f"a passive manifest holds label facts ({', '.join(facts)})")
    why = _semantics(manifest)
    if why:
        raise _bad(folder, f"{MANIFEST} {why}")
    digests = manifest["sha256"]
    if set(digests) != {MODEL, PREPROCESSING, MANIFEST} or not all(
            isinstance(d, str) and _HEX64.fullmatch(d) for d in digests.values()):
        raise _bad(folder, f"{MANIFEST} field 'sha256' must hold the SHA-256 of {MODEL}, {PREPROCESSING} and "
                           f"{MANIFEST}")
    if _manifest_digest(manifest) != digests[MANIFEST]:
        raise _bad(folder, f"{MANIFEST} was changed after saving (its hash does not match)")
    return manifest


def _ints(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def _semantics(m: dict) -> str:
    """What the fields must say together (a manifest with consistent hashes can still be inconsistent)."""
    if not (m["n_parties"] >= 1 and 0 <= m["index"] < m["n_parties"]):  # 1: local, the active party alone
        return f"positions index {m['index']} of n_parties {m['n_parties']} do not fit"
    model = m["model"]
    if not (_ints(model.get("feature_shape")) and _ints(model.get("cardinalities"))
            and isinstance(model.get("n_numeric"), int) and not isinstance(model.get("n_numeric"), bool)):
        return "field 'model' lacks the feature shape, numeric count or cardinalities"
    if m["role"] != "active":
        return ""
    task, n, classes = m["task"], m["n_classes"], m["classes"]
    if task == "regression":
        scale = m.get("label_scale")
        ok = n == 1 and (scale is None or (isinstance(scale, list) and len(scale) == 2
                                           and all(isinstance(x, int | float) for x in scale)))
        return "" if ok else "says regression with class facts or a malformed label scale"
    if task not in ("binary", "multiclass") or n < 2 or len(classes) != n or len(set(map(str, classes))) != n:
        return f"task {task!r} with {n} classes does not match its {len(classes)} class names"
    return ""


def read_party_folder(folder: Path) -> tuple[dict, dict, dict]:
    """(manifest, model state, preprocessing) of one saved party, verified whole before any tensor is
    read: the manifest (:func:`read_manifest`), then every file's hash, then the files themselves.

    Raises:
        UserError: a missing, altered or unreadable file, in one line."""
    manifest = read_manifest(folder)
    for name in (MODEL, PREPROCESSING):
        path = folder / name
        if path.is_symlink() or not path.is_file() or _sha256(path) != manifest["sha256"][name]:
            raise _bad(folder, f"{name} is missing or does not match its manifest's hash")
    try:  # weights_only: tensors and plain containers, never code
        state = torch.load(folder / MODEL, weights_only=True)
    except Exception as e:  # noqa: BLE001 - a file that matches its hash but does not load
        raise _bad(folder, f"{MODEL} cannot be loaded ({type(e).__name__}: {_first_line(e)})") from None
    try:
        prep = json.loads((folder / PREPROCESSING).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise _bad(folder, f"{PREPROCESSING} cannot be read as JSON ({_first_line(e)})") from None
    if not isinstance(state, dict) or not isinstance(state.get("modules"), dict) \
            or not isinstance(state.get("cut_ends"), list):
        raise _bad(folder, f"{MODEL} does not hold a party's models")
    need = {"id_column": str, "numeric_columns": list, "categorical_columns": list, "ignored_columns": list}
    if not isinstance(prep, dict) or any(not isinstance(prep.get(k), t) for k, t in need.items()):
        raise _bad(folder, f"{PREPROCESSING} lacks {', '.join(need)}")
    if "numeric" in prep:
        prep["numeric"] = {k: np.asarray(v, dtype=np.float64) if isinstance(v, list) else v
                           for k, v in prep["numeric"].items()}
    prep["vocab"] = [np.asarray(v, dtype=np.int64) for v in prep.get("vocab", [])]
    return manifest, state, prep


def party_rows(manifest: dict, prep: dict, ids: np.ndarray, X: np.ndarray, aligned: np.ndarray | None) -> PartyData:
    """One party's new rows as its test split (what scoring reads): the ``aligned`` ones (a passive
    party), or every row (``aligned`` None: the active party, which scores each of its rows)."""
    import pandas as pd

    from securevfl.data.partition import PartyData

    rows = ids if aligned is None else aligned
    pos = pd.Index(ids).get_indexer(rows)
    scale = manifest.get("label_scale")
    return PartyData(manifest["party"], np.arange(X.shape[1]), ids[:0], X[:0], rows, X[pos],
                     n_numeric=int(manifest["model"]["n_numeric"]),
                     cardinalities=tuple(manifest["model"]["cardinalities"]),
                     label_scale=None if scale is None else (float(scale[0]), float(scale[1])), preprocessing=prep)
