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
from securevfl.lab.store import Store

_GROUP = ["dataset", "method", "defense", "family", "strength", "he", "swept"]
_ATTACK_STATS = ("value", "value_std", "prior", "baseline", "control", "control_std", "leakage", "leakage_std",
                 "attack_seeds")


def load_frames(store_path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``runs``: one row per stored run; ``attacks``: one row per (run, attack)."""
    store = Store.open_existing(store_path)
    rows = store.rows()
    store.close()
    if not rows:
        raise UserError(f"store {store_path} has no runs")
    runs, attacks = [], []
    for r in rows:
        res = json.loads(r["result_json"]) if r["result_json"] else {}
        swept = json.loads(r["swept_json"] or "{}")
        cost = res.get("cost", {})
        he = cost.get("he") or {}
        base = {"run_id": r["run_id"], "sweep": r["sweep"], "dataset": r["dataset"], "method": r["method"],
                "defense": r["defense"], "family": r["defense_family"] or "none",
                "strength": r["strength"] if r["strength"] is not None else (0.0 if r["defense"] == "none"
                                                                             else np.nan),
                "seed": r["seed"], "he": r["he"] or "off", "swept": json.dumps(swept, sort_keys=True),
                **{f"swept_{k}": v for k, v in swept.items()}}
        runs.append({**base, "status": r["status"], "error": r["error"], "utility": r["utility"],
                     "metric": r["utility_metric"], "epsilon": r["epsilon"], "seconds": r["seconds"],
                     "epsilon_audit": ((res.get("privacy") or {}).get("audit") or {}).get("epsilon_lower"),
                     "bytes_sent": r["bytes_sent"], "he_seconds": he.get("seconds"),
                     "train_steps": cost.get("train_steps"),
                     "he_bytes": he.get("bytes"),
                     "he_params": json.dumps(he["params"], sort_keys=True) if he.get("params") else None,
                     "delta": (res.get("privacy") or {}).get("delta"),
                     "privacy_status": (res.get("privacy") or {}).get("status"),
                     # a defense that runs at a passive party reports there (privacy.features): no names needed
                     "feature_side": bool((res.get("privacy") or {}).get("features")),
                     "feature_epsilon": feature_epsilon(res),
                     "noise_multiplier": (res.get("privacy") or {}).get("noise_multiplier"),
                     "config": r["config_json"], "partition": json.dumps(res.get("partition") or {})})
        for name, a in (res.get("attacks") or {}).items():
            refs = [x for x in (a.get("control"), a.get("baseline")) if x is not None]
            leakage = a.get("leakage", a["value"] - max(refs) if refs and a.get("value") is not None else None)
            attacks.append({**base, "attack": name, "attack_metric": a.get("metric"), "value": a.get("value"),
                            "prior": a.get("prior"), "baseline": a.get("baseline"), "control": a.get("control"),
                            "leakage": leakage, "utility": r["utility"], "n_aux": a.get("n_aux"),
                            "finetunes": a.get("finetunes"), "params": json.dumps(a.get("params") or {}),
                            "control_kind": a.get("control_kind"),
                            "baseline_ssl": json.dumps(a.get("baseline_ssl") or {}),
                            "examples": json.dumps(a["examples"]) if a.get("examples") else None})
    return pd.DataFrame(runs), pd.DataFrame(attacks)


def feature_epsilon(result: dict) -> float | None:
    """The largest feature-level ε of any passive party in a run result (None without one)."""
    features = (result.get("privacy") or {}).get("features") or {}
    eps = [f["epsilon"] for f in features.values() if f.get("epsilon") is not None]
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
    g = ok.groupby(_GROUP, dropna=False)
    out = g.agg(utility=("utility", "mean"), utility_std=("utility", "std"), seeds=("seed", "nunique"),
                metric=("metric", "first"), epsilon=("epsilon", "mean"),
                epsilon_audit=("epsilon_audit", "mean"), feature_epsilon=("feature_epsilon", "mean"),
                feature_side=("feature_side", "max"),
                seconds=("seconds", "mean"),
                bytes_sent=("bytes_sent", "mean"), step_s=("step_s", "mean"), mb_step=("mb_step", "mean")).reset_index()
    if not attacks.empty:
        okat = attacks[attacks.run_id.isin(ok.run_id)]
        okat = okat.astype({c: float for c in ("value", "prior", "baseline", "control", "leakage")})
        ag = okat.groupby(_GROUP + ["attack"], dropna=False).agg(
            value=("value", "mean"), value_std=("value", "std"), prior=("prior", "mean"),
            baseline=("baseline", "mean"), control=("control", "mean"), control_std=("control", "std"),
            leakage=("leakage", "mean"), leakage_std=("leakage", "std"), attack_seeds=("seed", "nunique"),
            attack_metric=("attack_metric", "first")).reset_index()
        wide = ag.pivot_table(index=_GROUP, columns="attack", values=list(_ATTACK_STATS), dropna=False)
        wide.columns = [f"{a}_{s}" for s, a in wide.columns]
        out = out.merge(wide.reset_index(), on=_GROUP, how="left")
    return out.fillna({"utility_std": 0.0})


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
        noise = max(_num(r[f"{attack}_value_std"]), _num(ref[f"{attack}_value_std"]))
        delta = r[f"{attack}_value"] - ref[f"{attack}_value"]
        rows.append({"method": r.method, "defense": r.defense, "he": r.he, "delta": delta, "noise": noise,
                     "utility_cost": ref.utility - r.utility, "clear": bool(noise > 0 and abs(delta) > 2 * noise)})
    return pd.DataFrame(rows, columns=["method", "defense", "he", "delta", "noise", "utility_cost", "clear"])


def feature_attacks(attacks: pd.DataFrame) -> list[str]:
    """Attacks on the passive parties' features (scored by reconstruction R² or field accuracy)."""
    if attacks.empty:
        return []
    feat = attacks[attacks.attack.str.startswith("fr")]
    return sorted(feat.attack.unique())


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
