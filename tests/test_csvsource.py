import json

import numpy as np
import pandas as pd
import pytest

from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.run import build_partition


def party_files(tmp_path, n=400, overlap=300, parquet=False):
    rng = np.random.default_rng(0)
    z = rng.normal(size=n + 100)
    ids = np.arange(1000, 1000 + n + 100)
    act = pd.DataFrame({"id": ids[:n], "a1": z[:n] + rng.normal(scale=0.5, size=n),
                        "city": np.where(z[:n] > 0, "north", "south"), "label": (z[:n] > 0.3).astype(int)})
    pas = pd.DataFrame({"id": ids[n - overlap:n + 100][::-1], "b1": z[n - overlap:n + 100][::-1] * 2,
                        "b2": rng.normal(size=overlap + 100)})
    fa = tmp_path / "active.csv"
    act.to_csv(fa, index=False)
    fp = tmp_path / ("passive.parquet" if parquet else "passive.csv")
    pas.to_parquet(fp) if parquet else pas.to_csv(fp, index=False)
    return fa, fp, act, pas


@pytest.mark.parametrize("parquet", [False, True])
def test_csv_source_psi_alignment_and_training(tmp_path, capsys, parquet):
    fa, fp, act, pas = party_files(tmp_path, parquet=parquet)
    cfg = RunConfig(dataset="csv")
    cfg.data.party_files = [str(fa), str(fp)]
    part = build_partition(cfg)
    expected = np.intersect1d(act["id"], pas["id"])
    got = np.sort(np.concatenate([part.aligned_ids, part.active.test_ids]))
    assert np.array_equal(got, expected)  # PSI found exactly the shared IDs
    assert part.meta["psi_bytes"] > 0
    assert part.active.n_numeric == 1 and len(part.active.cardinalities) == 1  # a1 numeric, city categorical
    assert part.passives[0].label_ids is None
    assert set(part.passives[0].train_ids) == set(pas["id"]) - set(part.active.test_ids)
    assert main(["train", "--dataset", "csv", "--party-file", str(fa), "--party-file", str(fp), "--epochs", "5",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["utility"]["metric"] == "auc" and r["utility"]["test"] > 0.8


def test_psi_and_plain_agree_for_files(tmp_path):
    fa, fp, *_ = party_files(tmp_path)
    out = {}
    for mode in ("psi", "plain"):
        cfg = RunConfig(dataset="csv")
        cfg.data.party_files = [str(fa), str(fp)]
        cfg.partition.alignment = mode
        out[mode] = build_partition(cfg).fingerprint()
    assert out["psi"] == out["plain"]


@pytest.mark.parametrize("problem,needle", [
    ("dup", "duplicate ID '1001' on lines [3, 4]"),
    ("missing_id", "line 5: missing ID"),
    ("label_at_passive", "has the label column 'label'"),
    ("no_label", "no label column 'label'"),
    ("no_id", "no ID column 'id'"),
])
def test_csv_source_errors(tmp_path, capsys, problem, needle):
    fa, fp, act, pas = party_files(tmp_path)
    if problem == "dup":
        act.loc[2, "id"] = 1001
        act.to_csv(fa, index=False)
    elif problem == "missing_id":
        act = act.astype(object)
        act.loc[3, "id"] = ""
        act.to_csv(fa, index=False)
    elif problem == "label_at_passive":
        pas["label"] = 0
        pas.to_csv(fp, index=False)
    elif problem == "no_label":
        act.drop(columns="label").to_csv(fa, index=False)
    elif problem == "no_id":
        pas.rename(columns={"id": "key"}).to_csv(fp, index=False)
    assert main(["train", "--dataset", "csv", "--party-file", str(fa), "--party-file", str(fp)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and needle in err


def test_csv_source_needs_files():
    cfg = RunConfig(dataset="csv")
    with pytest.raises(UserError, match="--party-file"):
        build_partition(cfg)
