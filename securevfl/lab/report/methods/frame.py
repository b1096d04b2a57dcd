"""The methods report's tidy frame: one row per run with its arm, swept values and step counters."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from securevfl.errors import UserError
from securevfl.lab.report.frame import load_frames
from securevfl.lab.report.methods.claims import REFERENCE_SUFFIX
from securevfl.lab.store import Store
from securevfl.lab.sweep import parse_sweep


def _flat(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, int | float):
        out[prefix] = float(value)
    elif prefix.endswith("_q10_50_90") and isinstance(value, list) and len(value) == 3:  # quantile triples
        for name, v in zip(("q10", "q50", "q90"), value, strict=True):
            _flat(f"{prefix.removesuffix('_q10_50_90')}_{name}", v, out)


def counters(method_info: dict, truth: dict | None = None) -> dict[str, float]:
    """The numeric step counters of one run, flattened (``risa.self_training.pseudo_labeled``), plus
    totals of the per-check lists a reader wants in one number (RISA's rows dropped over all checks,
    the last check's τ and uncertainty quantiles)."""
    out: dict[str, float] = {}
    info = {k: v for k, v in method_info.items() if k != "lr_search"}
    _flat("", info, out)
    risa = info.get("risa") if isinstance(info.get("risa"), dict) else None
    if risa and isinstance(risa.get("drops"), list) and risa["drops"]:
        drops = risa["drops"]
        out["risa.dropped_total"] = float(sum(d.get("dropped", 0) for d in drops if isinstance(d, dict)))
        if isinstance(drops[-1], dict):
            _flat("risa.last_check", {k: v for k, v in drops[-1].items() if k != "epoch"}, out)
    hist = info.get("pretrain_history")
    if isinstance(hist, list) and hist and isinstance(hist[0], dict) and isinstance(hist[-1], dict):
        _flat("ssl_loss.first_epoch", hist[0], out)  # FedHSSL: each SSL loss before and after pre-training
        _flat("ssl_loss.last_epoch", hist[-1], out)
    _flat("against_truth", truth or {}, out)
    # one step's loss is no measure where epoch means exist (VFLHLP's SCARF: a last step of 4 rows sits near
    # InfoNCE's ln(batch) at chance): the epoch means stand for them
    for key in [k for k in out if k.endswith((".loss_first_step", ".loss_last_step"))]:
        if key.rsplit(".", 1)[0] + ".loss_first_epoch_mean" in out:
            del out[key]
    return out


def method_frame(store_path: str | Path) -> pd.DataFrame:
    """One row per ok run: sweep, method, seed, swept keys, utility overall / on aligned / on
    unaligned test rows, and every counter (``c:`` columns)."""
    runs, _ = load_frames(store_path)
    store = Store.open_existing(store_path)
    try:
        results = {r["run_id"]: r["result_json"] for r in store.rows()}
        members = sweep_members(store.sweeps())
    finally:
        store.close()
    rows = []
    for _, r in runs[runs.status == "ok"].iterrows():
        cell = str(r.run_id).removesuffix(REFERENCE_SUFFIX)
        for sweep, swept in members.get(cell, [(r.sweep, None)]):
            rows.append(_row(r, runs, results, sweep, swept))
    return pd.DataFrame(rows)


def sweep_members(recorded: list[dict]) -> dict[str, list[tuple[str, dict]]]:
    """run id → every recorded sweep whose grid holds that cell, with the cell's swept values there.
    A cell two sweeps share is stored once, under the sweep that ran it first (the store skips done
    cells); it belongs to both, with the swept values of each."""
    out: dict[str, list[tuple[str, dict]]] = {}
    for sw in recorded:
        try:
            parsed = parse_sweep(yaml.safe_load(sw["text"]), sw.get("path") or "sweep")
        except (UserError, yaml.YAMLError, TypeError, ValueError):
            continue  # a sweep this version cannot expand: its rows keep the stored sweep name
        for cell in parsed.cells:
            entry = (parsed.name, {k: v for k, v in cell.swept.items() if k != "search:try"})
            if entry not in out.setdefault(cell.run_id, []):
                out[cell.run_id].append(entry)
    return out


def _row(r: pd.Series, runs: pd.DataFrame, results: dict, sweep: str, swept: dict | None) -> dict:
    """One run as a row of ``sweep``, with that sweep's swept values (None: as stored)."""
    try:
        res = json.loads(results.get(r.run_id) or "{}")
    except json.JSONDecodeError:
        res = {}
    u = res.get("utility") if isinstance(res.get("utility"), dict) else {}
    info = res.get("method_info") if isinstance(res.get("method_info"), dict) else {}
    truth = info.get("against_truth") if isinstance(info.get("against_truth"), dict) else None
    given = ({c: r[c] for c in runs.columns if c.startswith("swept_")} if swept is None
             else {f"swept_{k}": v for k, v in swept.items()})
    return {"sweep": sweep, "method": arm(r.method, r.config), "sample": sample(r.config),
            "seed": int(r.seed), "metric": r.metric,
            "utility": r.utility, "utility_aligned": _sub(u.get("aligned")),
            "utility_unaligned": _sub(u.get("unaligned")), "seconds": r.seconds,
            "train_total": _training_rows(res.get("partition")), **given,
            **{f"c:{k}": v for k, v in counters(info, truth).items()}}


def _training_rows(part: Any) -> float:
    """Training entities of a run (every party's, counted once) from its partition summary: a label-only
    host or ``unaligned: all`` party holds them all; else the aligned rows plus each party's own."""
    if not isinstance(part, dict) or not isinstance(part.get("train_rows"), dict):
        return math.nan
    rows = [float(v) for v in part["train_rows"].values() if isinstance(v, int | float)]
    spec = part.get("spec")
    if not rows:
        return math.nan
    if isinstance(spec, dict) and (spec.get("unaligned") == "all" or spec.get("active_features") is False):
        return max(rows)
    given = part.get("aligned")
    aligned = float(given) if isinstance(given, int | float) else 0.0
    return aligned + sum(v - aligned for v in rows)


def sample(config_json: str | None) -> str:
    """The rows a run drew on: its dataset and, for a file, the file's name (``criteo: criteo_sample10k.txt``)."""
    try:
        cfg = json.loads(config_json or "{}")
    except json.JSONDecodeError:
        return "?"
    if not isinstance(cfg, dict):
        return "?"
    data = cfg.get("data")
    path = data.get("path") if isinstance(data, dict) else None
    name = str(cfg.get("dataset", "?"))
    return f"{name}: {Path(str(path)).name}" if path else name


def arm(method: str, config_json: str | None) -> str:
    """The arm's name: the method, with its parameters when the sweep set any (two ``entity-aug``
    entries with ``draw: aligned`` / ``independent`` are two arms): ``entity-aug{draw=aligned}``."""
    try:
        params = json.loads(config_json or "{}").get("method_params") or {}
    except (json.JSONDecodeError, AttributeError):
        params = {}
    if not isinstance(params, dict) or not params:
        return method
    return method + "{" + ",".join(f"{k}={params[k]}" for k in sorted(params)) + "}"


def _sub(v: Any) -> float | None:
    """A subset's utility: a number, or a dict with the metric's value under ``test``/``auc``."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, dict):
        for key in ("test", "auc", "accuracy"):
            if isinstance(v.get(key), int | float):
                return float(v[key])
    return None


# --- paired differences ----------------------------------------------------------------------------

