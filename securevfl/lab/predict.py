"""``securevfl predict``: scores new rows with a federation ``train --save`` kept
(:func:`securevfl.lab.compose.save_run`).

:func:`predict` rebuilds the federation from the saved folders: each party reads its own new file
through the preprocessing it saved, the parties align their IDs by PSI through a counted channel as
training did, every party lays out its models as the method's training ended them and loads its own
folder, and the active party scores every row of its file (:mod:`securevfl.scoring`): the aligned
rows through the same message exchange (and cut-layer protocol) as evaluation at the end of training,
the others by the method's own path for them or the active party's part alone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from securevfl.config import RunConfig, apply_dict
from securevfl.cutlayer import make_cut_layer
from securevfl.data.csvsource import align_ids, encode_file_rows, read_party_file
from securevfl.data.partition import Partition
from securevfl.errors import UserError
from securevfl.federation import build_federation
from securevfl.pipeline import defense_hooks
from securevfl.runtime import run_in_process
from securevfl.scoring import FEDERATED, ScoringOps, method_for, path_counts, score_rows
from securevfl.storage.saved import MANIFEST, party_rows, read_manifest, read_party_folder


def _party_folders(model_dir: Path) -> list[Path]:
    """The saved parties' folders in party order, after checking that they are one run's: one run id,
    positions 0..n−1 once each, the active party first."""
    if not model_dir.is_dir():
        raise UserError(f"--model {model_dir}: no such directory")
    folders = sorted(p for p in model_dir.iterdir() if (p / MANIFEST).is_file())
    if not folders:
        raise UserError(f"--model {model_dir}: no saved party folders (train with --save {model_dir})")
    manifests = {f: read_manifest(f) for f in folders}
    folders.sort(key=lambda f: manifests[f]["index"])
    first = manifests[folders[0]]
    if first["role"] != "active":
        raise UserError(f"--model {model_dir}: no active party's folder (the one with the head and the labels)")
    for f in folders:
        m = manifests[f]
        if m["run_id"] != first["run_id"]:
            raise UserError(f"--model {model_dir}: {f.name} is from another training run than {folders[0].name} "
                            f"(run id {m['run_id'][:12]} vs {first['run_id'][:12]}); use the folders one --save wrote")
    got = [manifests[f]["index"] for f in folders]
    if got != list(range(first["n_parties"])):
        raise UserError(f"--model {model_dir}: holds parties at positions {got}, the run had {first['n_parties']} "
                        "parties; a folder is missing or extra")
    return folders


def predict(model_dir: str | Path, party_files: list[str], out: str | Path, federated_only: bool = False) -> dict:
    """Score every row of the active party's new file with the saved federation in ``model_dir``.

    Args:
        model_dir: the ``train --save`` folder (one sub-folder per party).
        party_files: one new file per party, in the training order (active party first).
        out: the predictions file (``.parquet``/``.pq``: Parquet, else CSV): the ID column, then
            ``prediction``, for classes one ``proba_<class>`` column per class, and ``scored_by``, the
            path that scored the row (:mod:`securevfl.scoring`).
        federated_only: score only the rows every party holds.

    Returns:
        A summary (rows read, scored, by path, output path).

    Raises:
        UserError: a folder or file that does not match, in one line."""
    check_out(out)
    folders = _party_folders(Path(model_dir))
    if len(party_files) != len(folders):
        raise UserError(f"--model {model_dir} holds {len(folders)} parties but {len(party_files)} --party-file were "
                        "given (one per party, active party first)")
    loaded = [read_party_folder(f) for f in folders]
    active_manifest = loaded[0][0]
    cfg = RunConfig()
    apply_dict(cfg, active_manifest["config"])
    method = method_for(cfg)
    id_sets, rows, names = [], [], None  # names: the active file's own IDs for the rows written out
    for (_, _, prep), path in zip(loaded, party_files, strict=True):
        frame = read_party_file(path)
        ids, X = encode_file_rows(frame, path, prep, cfg.data.numeric_ids, cfg.data.hashed_ids)
        if names is None:
            names = _original_ids(frame, prep, ids, cfg.data.hashed_ids)
        id_sets.append(ids)
        rows.append(X)
    if len(id_sets) > 1:
        aligned, _ = align_ids(id_sets, "plain" if cfg.partition.alignment == "plain" else "psi")
    else:
        aligned = id_sets[0]
    parties = [party_rows(manifest, prep, ids, X, None if k == 0 else aligned)
               for k, ((manifest, _, prep), ids, X) in enumerate(zip(loaded, id_sets, rows, strict=True))]
    regression = active_manifest["task"] == "regression"
    n_classes = int(active_manifest["n_classes"])
    partition = Partition("csv", cfg.partition, cfg.seed, n_classes, "tabular", parties,
                          aligned, aligned[:0], regression=regression)
    cut = make_cut_layer(cfg.he, interactive=bool(active_manifest["interactive"]), mixing=cfg.model.interactive_mixing,
                         **cfg.he_params)
    fed = build_federation(partition, cfg.model, cfg.optim, cfg.seed, cut, defense_hooks(cfg),
                           with_passives=len(folders) > 1, models=method.models)
    for k, (party, folder) in enumerate(zip(fed.parties, folders, strict=True)):
        method.serving_layout(party, n_classes if k == 0 else 0)
        party.load_own(folder)
    ids = id_sets[0]  # the active file's rows, in its order
    scored, scores, paths = run_in_process(fed, ScoringOps(method),
                                           lambda view: score_rows(method, view, ids, aligned, federated_only))
    assert names is not None  # the active party's file is read first
    _write(_predictions(active_manifest, loaded[0][2]["id_column"], names(scored), scores, paths), Path(out))
    return _summary(party_files[0], ids, paths, out, federated_only, [len(i) for i in id_sets], len(folders) > 1)


def predict_deployed(model_dir: str | Path, party_file: str, out: str | Path, channel: Any,
                     peers: dict[str, str], federated_only: bool = False) -> dict:
    """``securevfl predict --peer``: score new rows as the active party while each passive party, in its
    own process (``securevfl party --model``), reads its own new file and serves its own saved part.

    Args:
        model_dir: the folder holding this (the active) party's saved part, ``model_dir/active``.
        party_file: this party's new file.
        out: the predictions file.
        channel: a connected :class:`~securevfl.channel.grpc.GrpcChannel` for party ``active``.
        peers: passive party name → address.
        federated_only: score only the rows every party holds.
    Returns:
        A summary (rows read, scored, by path, output path)."""
    from securevfl.deploy import align_over, open_run
    from securevfl.federation import build_active
    from securevfl.models import for_head
    from securevfl.roles import ACTIVE
    from securevfl.runtime import PROTOCOL, remote_federation

    check_out(out)
    folder = Path(model_dir) / ACTIVE
    if not (folder / MANIFEST).is_file():
        raise UserError(f"--model {model_dir}: no saved active party's folder ({folder}); the active party's "
                        "train --save writes it")
    manifest, _, prep = read_party_folder(folder)
    names = list(manifest["passives"])
    if sorted(peers) != sorted(names):
        raise UserError(f"--model {model_dir} was trained with {', '.join(names)}: give one --peer for each")
    cfg = RunConfig()
    apply_dict(cfg, manifest["config"])
    method = method_for(cfg)
    n_classes = int(manifest["n_classes"])
    cfg.model = for_head(cfg.model, n_classes)  # the models as training built them (agg: logits per party)
    frame = read_party_file(party_file)
    ids, X = encode_file_rows(frame, party_file, prep, cfg.data.numeric_ids, cfg.data.hashed_ids)
    originals = _original_ids(frame, prep, ids, cfg.data.hashed_ids)
    del frame
    ep = channel.endpoint(ACTIVE)
    channel.wait_ready()
    mode = "plain" if cfg.partition.alignment == "plain" else "psi"
    # the steps of every active party's set-up over a channel (securevfl/deploy.py), as training takes them
    open_run(ep, {name: {"op": "predict", "protocol": PROTOCOL, "party": name, "run_id": manifest["run_id"],
                         "alignment": mode, "cut_dim": cfg.model.cut_dim} for name in names})
    aligned = align_over(ep, names, ids, mode, progress=False)
    data = party_rows(manifest, prep, ids, X, None)
    cut = make_cut_layer(cfg.he, interactive=bool(manifest["interactive"]), mixing=cfg.model.interactive_mixing,
                         **cfg.he_params)

    def build() -> Any:
        active = build_active(data, ep, defense_hooks(cfg), cfg.model, cfg.optim, cut, names, n_classes, cfg.seed,
                              features=cfg.partition.active_features is not False)
        method.serving_layout(active, n_classes)
        active.load_own(folder)
        return active

    fed = remote_federation(channel, build, names, cut, n_classes, manifest["task"] == "regression", ready=False)
    scored, scores, paths = score_rows(method, fed, ids, aligned, federated_only)
    for h in fed.passives:
        h.end()  # type: ignore[attr-defined]
    _write(_predictions(manifest, prep["id_column"], originals(scored), scores, paths), Path(out))
    return _summary(party_file, ids, paths, out, federated_only, int(len(ids)))


def _original_ids(frame: pd.DataFrame, prep: dict, ids: np.ndarray, hashed: bool) -> Any:
    """The map from the IDs scoring works on back to the file's own (``--hashed-ids``: its 64-bit hashes
    → the strings, read back for the rows written out); the identity otherwise."""
    if not hashed:
        return lambda scored: scored
    original = frame[prep["id_column"]].astype(str).str.strip().to_numpy(dtype=object)
    index = pd.Index(ids)
    return lambda scored: original[index.get_indexer(scored)]


def _summary(party_file: str, ids: np.ndarray, paths: np.ndarray, out: str | Path, federated_only: bool,
             rows_read: object, federated: bool = True) -> dict:
    """What the run scored, by path; a note on stderr of the rows that another path scored or none did
    (``federated`` False: a single-party model, whose every row is its own)."""
    counts = path_counts(paths)
    others = len(ids) - counts.get(FEDERATED, 0)
    if not federated:
        pass
    elif others and federated_only:
        print(f"note: {others} rows of {party_file} are not in every party's file and were not scored "
              "(--federated-only)", file=sys.stderr)
    elif others:
        print(f"note: {others} rows of {party_file} are not in every party's file; scored by "
              + ", ".join(f"{k} ({v})" for k, v in counts.items() if k != FEDERATED)
              + " (column scored_by; --federated-only leaves them out)", file=sys.stderr)
    return {"rows_read": rows_read, "rows_scored": int(len(paths)), "scored_by": counts, "out": str(out)}


def _predictions(manifest: dict, id_column: str, ids: np.ndarray, scores: np.ndarray,
                 paths: np.ndarray) -> pd.DataFrame:
    frame = pd.DataFrame({id_column: ids})
    if manifest["task"] == "regression":
        frame["prediction"] = scores[:, 0]
    else:
        classes = list(manifest["classes"])
        frame["prediction"] = np.asarray(classes, dtype=object)[scores.argmax(1)]
        for j, c in enumerate(classes):
            frame[f"proba_{c}"] = scores[:, j]
    frame["scored_by"] = paths
    return frame


OUT_SUFFIXES = (".csv", ".parquet", ".pq")


def check_out(out: str | Path) -> Path:
    """``--out`` names a CSV or Parquet file (its suffix says which); anything else is refused before work."""
    out = Path(out)
    if out.suffix.lower() not in OUT_SUFFIXES:
        raise UserError(f"--out {out}: name a .csv or .parquet file (the suffix chooses the format)")
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory")
    return out


def _write(frame: pd.DataFrame, out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix.lower() in (".parquet", ".pq"):
            frame.to_parquet(out, index=False)
        else:
            frame.to_csv(out, index=False, float_format="%.9g")
    except OSError as e:
        raise UserError(f"--out {out}: cannot write ({e.strerror or e})") from None
