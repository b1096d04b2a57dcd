"""Store → tidy frames: one row per run, one per (run, attack), and the mean ± std per cell.

Everything after this module reads these frames only, never the store.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from securevfl.errors import UserError
from securevfl.lab import scores
from securevfl.lab.store import Store

_GROUP = ["dataset", "method", "defense", "family", "strength", "he", "swept"]
_ATTACK_STATS = ("value", "value_std", "prior", "baseline", "control", "control_std", "leakage", "leakage_std",
                 "attack_seeds", "inverted", "ap", "ap_std", "seconds")


def load_frames(store_path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``runs``: one row per stored run; ``attacks``: one row per (run, attack)."""
    store = Store.open_existing(store_path)
    rows = store.rows()
    store.close()
    if not rows:
        raise UserError(f"store {store_path} has no runs")
    runs, attacks = [], []
    for r in rows:
        # a store of another version or a damaged row: what cannot be read counts as absent, never a crash
        res, swept = _json_object(r["result_json"]), _json_object(r["swept_json"])
        cost: dict = res["cost"] if isinstance(res.get("cost"), dict) else {}
        he: dict = cost["he"] if isinstance(cost.get("he"), dict) else {}
        for key in ("privacy", "partition", "utility"):  # sections read below: a dict, or absent
            if not isinstance(res.get(key), dict):
                res[key] = {}
        if not isinstance(r["utility"], int | float):
            r["utility"] = None
        for key in ("dataset", "method", "defense", "defense_family", "he", "sweep"):  # group keys: text
            r[key] = None if r[key] is None else str(r[key])
        if not isinstance(r["seed"], int) or isinstance(r["seed"], bool):
            r["seed"] = -1  # a damaged row: shown, never merged with a real seed
        if not isinstance(r["strength"], int | float) or isinstance(r["strength"], bool):
            r["strength"] = None
        r["dataset"], r["method"], r["defense"] = r["dataset"] or "?", r["method"] or "?", r["defense"] or "none"
        # a worst-case search's tries are one cell: the try index leaves the cell's identity
        search_try = swept.pop("search:try", 0)
        search_try = search_try if isinstance(search_try, int) and not isinstance(search_try, bool) else 0
        config = _json_object(r["config_json"])
        base = {"run_id": r["run_id"], "sweep": r["sweep"], "dataset": r["dataset"], "method": r["method"],
                "defense": r["defense"], "family": r["defense_family"] or "none",
                "strength": r["strength"] if r["strength"] is not None else (0.0 if r["defense"] == "none"
                                                                             else np.nan),
                "seed": r["seed"], "he": r["he"] or "off", "swept": json.dumps(swept, sort_keys=True),
                "search_try": search_try, **{f"swept_{k}": v for k, v in swept.items()}}
        utility = res.get("utility") or {}
        found: dict = res["attacks"] if isinstance(res.get("attacks"), dict) else {}
        runs.append({**base, "status": r["status"], "error": r["error"], "utility": r["utility"],
                     "metric": r["utility_metric"], "utility_prior": utility.get("prior"),
                     "test_rows": res["partition"].get("test_rows"), "epsilon": r["epsilon"],
                     "seconds": r["seconds"],
                     "epsilon_audit": _dig(res, "privacy", "audit", "epsilon_lower"),
                     "bytes_sent": r["bytes_sent"], "he_seconds": he.get("seconds"),
                     "train_steps": cost.get("train_steps"),
                     "he_bytes": he.get("bytes"),
                     # statistical hiding of every mask (κ) and, under CKKS, of the slot noise (κ_f)
                     "he_hiding_bits": he.get("hiding_bits"), "he_flooding_bits": he.get("flooding_bits"),
                     "he_params": json.dumps(he["params"], sort_keys=True) if he.get("params") else None,
                     "delta": res["privacy"].get("delta"),
                     "privacy_status": res["privacy"].get("status"),
                     # a defense that runs at a passive party reports there (privacy.features): no names needed
                     "feature_side": bool(res["privacy"].get("features")),
                     "feature_epsilon": feature_epsilon(res),
                     "noise_multiplier": res["privacy"].get("noise_multiplier"),
                     "config": r["config_json"], "partition": json.dumps(res["partition"]),
                     "versions": r["versions_json"], "finished_at": r["finished_at"], "node": r.get("node"),
                     # trained beside an attack that acts during training (a backdoor): not the clean utility
                     "malicious": any(isinstance(a, dict) and a.get("malicious_training")
                                      for a in found.values())})
        for name, a in found.items():
            if not isinstance(a, dict) or isinstance(a.get("value"), bool) \
                    or not isinstance(a.get("value"), int | float):  # a damaged entry: nothing to plot
                continue
            a = {**a, **{k: _number(a.get(k)) for k in ("prior", "baseline", "control", "leakage")}}
            attacks.append({**base, "attack": name, "attack_metric": a.get("metric"), "value": a.get("value"),
                            "prior": a.get("prior"), "baseline": a.get("baseline"), "control": a.get("control"),
                            "leakage": _leakage(a), "inverted": scores.inverted(a.get("metric"), a.get("value")),
                            "kind": a.get("kind") or _declared_kind(name), "utility": r["utility"],
                            "n_aux": a.get("n_aux"), "finetunes": a.get("finetunes"),
                            "params": json.dumps(a["params"] if isinstance(a.get("params"), dict) else {},
                                                 default=str),
                            "set_params": json.dumps(_entry_params(config, name), sort_keys=True),
                            "control_kind": a.get("control_kind"), "attack_seconds": _number(a.get("seconds")),
                            "adversary": a.get("adversary") or _dig(a, "params", "adversary") or "passive1",
                            "baseline_ssl": json.dumps(a.get("baseline_ssl") or {}, default=str),
                            "examples": json.dumps(a["examples"], default=str) if a.get("examples") else None})
    return pd.DataFrame(runs), pd.DataFrame(attacks)


def load_sweeps(store_path: str | Path) -> list[dict]:
    """The sweep files recorded in the store (provenance: text, hash, command, version, commit)."""
    store = Store.open_existing(store_path)
    try:
        return store.sweeps()
    finally:
        store.close()


def _leakage(a: dict) -> float | None:
    """value − max(control, baseline); a binary score is read on the informative side first
    (max(AUC, 1 − AUC)), so a flipped AUC never shows as negative leakage."""
    v = a.get("value")
    refs = [x for x in (a.get("control"), a.get("baseline")) if isinstance(x, int | float) and not isinstance(x, bool)]
    if v is None or not refs:
        return a.get("leakage")
    if a.get("metric") == "auc":
        return max(v, 1 - v) - max(max(x, 1 - x) for x in refs)
    return a.get("leakage", v - max(refs))


def _declared_kind(name: str) -> str | None:
    """The attack type its class declares (``kind``), if this install has the attack."""
    import attacks as attack_lib  # the lab may import the attack package

    try:
        return getattr(attack_lib.ATTACKS.get(name), "kind", None)
    except UserError:
        return None


def _entry_params(config: dict, name: str) -> dict:
    """The parameters the run's configuration gave attack ``name`` (a search try's point)."""
    entries = config.get("attacks")
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and len(entry) == 1 and next(iter(entry)) == name:
            given = next(iter(entry.values()))
            return dict(given) if isinstance(given, dict) else {}
        if isinstance(entry, str) and entry.split(":", 1)[0].strip() == name:
            rest = entry.split(":", 1)[1] if ":" in entry else ""
            return dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
    return {}


def _json_object(text: object) -> dict:
    """A stored JSON column as a mapping: ``{}`` for NULL, garbage or any other JSON type."""
    if not isinstance(text, str | bytes):
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _number(x: object) -> float | None:
    """A number as stored, or None (a damaged entry's text, flag or structure)."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _dig(obj: object, *keys: str) -> object:
    """obj[k1][k2]…, or None where a level is missing or not a dict (a damaged or foreign row)."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def feature_epsilon(result: dict) -> float | None:
    """The largest feature-level ε of any passive party in a run result (None without one)."""
    features = _dig(result, "privacy", "features")
    eps = [f["epsilon"] for f in (features.values() if isinstance(features, dict) else [])
           if isinstance(f, dict) and isinstance(f.get("epsilon"), int | float) and not isinstance(f["epsilon"], bool)]
    return max(eps) if eps else None


def setting_label(defense: str) -> str:
    return "none" if defense == "none" else defense.replace(":", " ")


def summarise(runs: pd.DataFrame, attacks: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds per cell (ok runs), with each attack's mean/std/prior/baseline."""
    ok = runs[runs.status == "ok"]
    if ok.empty:
        return pd.DataFrame()
    steps = pd.to_numeric(ok.get("train_steps"), errors="coerce").where(lambda x: x > 0)
    ok = ok.assign(step_s=ok.seconds / steps, mb_step=ok.bytes_sent / steps / 1e6)
    if "epsilon_audit" not in ok:  # a frame built without audits
        ok = ok.assign(epsilon_audit=np.nan)
    # a cell's utility is one run per seed: a run trained without a malicious party where there is one (a
    # backdoor sweep into the same store scores its own runs' utility), then the first search try (the sweep
    # file's own attack parameters; the other tries repeat the same training)
    order = [c for c in ("malicious", "search_try") if c in ok]
    ok_utility = ok.sort_values(order, kind="stable").drop_duplicates([*_GROUP, "seed"]) if order else ok
    g = ok_utility.groupby(_GROUP, dropna=False)
    out = g.agg(utility=("utility", "mean"), utility_std=("utility", "std"), seeds=("seed", "nunique"),
                utility_prior=("utility_prior", "mean"), test_rows=("test_rows", "mean"),
                metric=("metric", "first"), epsilon=("epsilon", "mean"),
                epsilon_audit=("epsilon_audit", "mean"), feature_epsilon=("feature_epsilon", "mean"),
                feature_side=("feature_side", "max"),
                seconds=("seconds", "mean"),
                bytes_sent=("bytes_sent", "mean"), step_s=("step_s", "mean"), mb_step=("mb_step", "mean")).reset_index()
    if not attacks.empty:
        okat = attacks[attacks.run_id.isin(ok.run_id)]
        if "attack_seconds" not in okat:  # a frame built without timings
            okat = okat.assign(attack_seconds=np.nan)
        okat = okat.astype({c: float for c in ("value", "prior", "baseline", "control", "leakage", "inverted",
                                               "attack_seconds")})
        okat = _winning_tries(okat)
        okat = okat.assign(ap=[scores.attack_performance(m, v) for m, v in zip(okat.attack_metric, okat.value,
                                                                              strict=True)])
        ag = okat.groupby(_GROUP + ["attack"], dropna=False).agg(
            value=("value", "mean"), value_std=("value", "std"), prior=("prior", "mean"),
            baseline=("baseline", "mean"), control=("control", "mean"), control_std=("control", "std"),
            leakage=("leakage", "mean"), leakage_std=("leakage", "std"), attack_seeds=("seed", "nunique"),
            attack_metric=("attack_metric", "first"), inverted=("inverted", "mean"), ap=("ap", "mean"),
            ap_std=("ap", "std"), seconds=("attack_seconds", "mean")).reset_index()
        wide = ag.pivot_table(index=_GROUP, columns="attack", values=list(_ATTACK_STATS), dropna=False)
        wide.columns = [f"{a}_{s}" for s, a in wide.columns]
        out = out.merge(wide.reset_index(), on=_GROUP, how="left")
    out["utility_prior"] = _utility_prior(out, attacks)
    return scores.mark_cells(out.fillna({"utility_std": 0.0}))


def _winning_tries(okat: pd.DataFrame) -> pd.DataFrame:
    """Only the runs of each (cell, attack)'s worst-case search try (largest mean AP over seeds)."""
    if okat.empty or "search_try" not in okat or okat.search_try.nunique() < 2:
        return okat
    won = scores.worst_case(okat)[[*_GROUP, "attack", "params"]].rename(columns={"params": "set_params"})
    kept = okat.merge(won, on=[*_GROUP, "attack", "set_params"])
    # one row per seed: tries that repeat the winning point (another attack was searched) add no seed
    return kept.sort_values("search_try").drop_duplicates([*_GROUP, "attack", "seed"])


def _utility_prior(summary: pd.DataFrame, attacks: pd.DataFrame) -> pd.Series:
    """What guessing scores on the test task: the stored majority-class rate; for stores without it,
    AUC 0.5, or the label attacks' majority-class prior on the same dataset (accuracy)."""
    prior = pd.to_numeric(summary.utility_prior, errors="coerce").copy()
    prior[prior.isna() & (summary.metric == "auc")] = 0.5
    if not attacks.empty:
        acc = attacks[(attacks.attack_metric == "accuracy") & attacks.attack.isin(label_attacks(attacks))]
        by_ds = acc.groupby("dataset").prior.mean()
        fill = summary.dataset.map(by_ds)
        prior[prior.isna() & (summary.metric == "accuracy")] = fill
    return prior


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats: utility ≥ and attack ≤, one strictly."""
    keep = []
    for i, (u, a) in enumerate(points):
        dominated = np.any((points[:, 0] >= u) & (points[:, 1] <= a) & ((points[:, 0] > u) | (points[:, 1] < a)))
        if not dominated:
            keep.append(i)
    return np.asarray(keep, dtype=int)


def control_kinds(attacks: pd.DataFrame) -> dict[str, str]:
    """What each attack's control is, in words (from the stored results)."""
    if attacks.empty or "control_kind" not in attacks:
        return {}
    return {a: g.control_kind.dropna().iloc[0] for a, g in attacks.groupby("attack") if g.control_kind.notna().any()}


def attack_names(summary: pd.DataFrame) -> list[str]:
    return sorted({c[: -len("_value")] for c in summary.columns if c.endswith("_value")})


def _num(x: Any) -> float:
    return float("nan") if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def defense_effects(d: pd.DataFrame, attack: str) -> pd.DataFrame:
    """Each defended cell against the same method's undefended cell (same HE and swept values):
    the change of the attack value and of utility, and whether the attack moved by more than twice
    the larger of the two cells' seed std (``clear``; never with a single seed)."""
    rows = []
    for _, r in d[d.family != "none"].iterrows():
        ref = d[(d.method == r.method) & (d.he == r.he) & (d.swept == r.swept) & (d.defense == "none")]
        if ref.empty or pd.isna(r[f"{attack}_value"]):
            continue
        ref = ref.iloc[0]
        # on AP, the informative side of a binary score: an AUC going 0.17 → 0.55 leaks less, not more
        col = f"{attack}_ap" if f"{attack}_ap" in d else f"{attack}_value"
        noise = max(_num(r[f"{col}_std"]), _num(ref[f"{col}_std"]))
        delta = r[col] - ref[col]
        rows.append({"method": r.method, "defense": r.defense, "he": r.he, "delta": delta, "noise": noise,
                     "utility_cost": ref.utility - r.utility, "clear": bool(noise > 0 and abs(delta) > 2 * noise)})
    return pd.DataFrame(rows, columns=["method", "defense", "he", "delta", "noise", "utility_cost", "clear"])


def is_feature_attack(name: str, kind: object = None) -> bool:
    """Whether attack ``name`` reconstructs passive features: its stored or declared ``kind`` decides
    (a name is only the fallback for a row whose attack this install does not know)."""
    k = kind if isinstance(kind, str) and kind else _declared_kind(name)
    return k == "feature_reconstruction" if k else str(name).startswith("fr")


def feature_attacks(attacks: pd.DataFrame) -> list[str]:
    """Attacks on the passive parties' features (scored by reconstruction R² or field accuracy)."""
    if attacks.empty:
        return []
    kinds = attacks["kind"] if "kind" in attacks else pd.Series(None, index=attacks.index)
    names = {n for n, k in zip(attacks.attack, kinds, strict=True) if is_feature_attack(n, k)}
    return sorted(names)


def label_attacks(attacks: pd.DataFrame) -> list[str]:
    if attacks.empty:
        return []
    names = sorted(set(attacks.attack.unique()) - set(feature_attacks(attacks)))
    return sorted(names, key=lambda a: (not a.startswith("mc"), a))  # model completion first


def shows_encryption(summary: pd.DataFrame, attacks: pd.DataFrame, dataset: str) -> bool:
    """The encryption view applies when a feature attack ran and the sweep varies HE or a
    feature-side defense."""
    d = summary[summary.dataset == dataset]
    return bool(feature_attacks(attacks)) and (d.he.nunique() > 1 or d.feature_side.astype(bool).any())
