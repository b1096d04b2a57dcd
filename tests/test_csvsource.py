import json

import numpy as np
import pandas as pd
import pytest

from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import build_partition


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
    expected = np.intersect1d(act["id"], pas["id"]).astype(str)  # IDs are exact strings by default
    got = np.sort(np.concatenate([part.aligned_ids, part.active.test_ids]))
    assert np.array_equal(got, expected)  # PSI found exactly the shared IDs
    assert part.meta["psi_bytes"] > 0
    assert part.active.n_numeric == 1 and len(part.active.cardinalities) == 1  # a1 numeric, city categorical
    assert part.passives[0].label_ids is None
    assert set(part.passives[0].train_ids) == set(pas["id"].astype(str)) - set(part.active.test_ids)
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


def fate_files(tmp_path, n=300, shared=240):
    """FATE's layout: guest (active) file with id column 'id' and label 'y', host file keyed 'uid', an
    extra row-counter column in the host file, and only part of the IDs in common."""
    rng = np.random.default_rng(1)
    z = rng.normal(size=n)
    guest = pd.DataFrame({"id": [f"u{i:05d}" for i in range(n)], "x0": z + rng.normal(scale=0.3, size=n),
                          "y": (z > 0).astype(int)})
    host_ids = [f"u{i:05d}" for i in range(n - shared, n)] + [f"v{i:05d}" for i in range(40)]
    host = pd.DataFrame({"row": np.arange(len(host_ids)), "uid": host_ids,
                         "h0": np.concatenate([z[n - shared:], rng.normal(size=40)]) * 2})
    fg, fh = tmp_path / "guest.csv", tmp_path / "host.csv"
    guest.to_csv(fg, index=False)
    host.to_csv(fh, index=False)
    return fg, fh, guest, host


def test_fate_style_files_train_with_a_true_summary(tmp_path, capsys):
    fg, fh, guest, host = fate_files(tmp_path)
    args = ["train", "--dataset", "csv", "--party-file", str(fg), "--party-file", str(fh), "--id-column", "id",
            "--id-column", "uid", "--label-column", "y", "--drop-columns", "row", "--epochs", "5", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    guest_info, host_info = r["partition"]["ingest"]
    assert (guest_info["rows_read"], guest_info["rows_matched"], guest_info["rows_unmatched"]) == (300, 240, 60)
    assert (host_info["rows_read"], host_info["rows_matched"], host_info["rows_unmatched"]) == (280, 240, 40)
    assert host_info["id_column"] == "uid" and host_info["dropped_columns"] == ["row"]
    assert host_info["numeric_columns"] == ["h0"]  # the row counter did not become a feature
    assert "240 matched, 60 unmatched" in captured.err and "240 matched, 40 unmatched" in captured.err
    assert r["utility"]["test"] > 0.8
    # without --drop-columns the counter is a feature: the summary says so and a warning names it
    assert main(args[:-5] + ["--epochs", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["partition"]["ingest"][1]["numeric_columns"] == ["row", "h0"]
    assert "column 'row' looks like a row counter" in captured.err and "--drop-columns row" in captured.err


@pytest.mark.parametrize("change,needle", [
    ("junk", "column 'x0': line 4: value 'oops' is not a number"),
    ("frac_label", "fractional values (e.g. 0.5)"),
    ("many_labels", "300 distinct values"),
    ("no_label", "no label column 'label' (columns: id, x0, y; use --label-column)"),
    ("id_count", "--id-column given 3 times for 2 party files"),
    ("unknown_drop", "column 'nosuch' (--drop-columns/--categorical/--numeric) is in no party file"),
])
def test_csv_mistakes_are_one_line_errors(tmp_path, capsys, change, needle):
    fg, fh, guest, host = fate_files(tmp_path)
    extra = ["--id-column", "id", "--id-column", "uid", "--label-column", "y"]
    if change == "junk":
        guest = guest.astype({"x0": object})
        guest.loc[2, "x0"] = "oops"
    elif change == "frac_label":
        guest["y"] = guest["y"] * 0.5
        extra += ["--task", "classification"]  # auto would train a regression on it (test_predict.py)
    elif change == "many_labels":
        guest["y"] = np.arange(len(guest))
    elif change == "no_label":
        extra = extra[:-2]
    elif change == "id_count":
        extra = ["--id-column", "id", "--id-column", "uid", "--id-column", "x", "--label-column", "y"]
    elif change == "unknown_drop":
        extra += ["--drop-columns", "nosuch"]
    guest.to_csv(fg, index=False)
    assert main(["train", "--dataset", "csv", "--party-file", str(fg), "--party-file", str(fh), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error:") and needle in err


def test_missing_cells_junk_overrides_and_text_labels(tmp_path):
    fg, fh, guest, host = fate_files(tmp_path)
    guest = guest.astype({"x0": object})
    guest.loc[[3, 7], "x0"] = ["NaN", ""]
    guest.loc[5, "x0"] = "oops"
    guest["y"] = np.where(guest["y"] == 1, "yes", "no")
    guest.to_csv(fg, index=False)
    cfg = RunConfig(dataset="csv")
    cfg.data.party_files, cfg.data.id_columns, cfg.data.label_column = [str(fg), str(fh)], ["id", "uid"], "y"
    cfg.data.numeric = ["x0"]  # the user says x0 is numeric: 'oops' becomes a missing value
    part = build_partition(cfg)
    info = part.meta["ingest"][0]
    assert info["numeric_columns"] == ["x0"] and info["missing_cells"] == {"x0": 2}
    assert part.meta["classes"] == ["no", "yes"] and part.n_classes == 2
    cfg.data.numeric, cfg.data.categorical = [], ["x0"]
    assert build_partition(cfg).meta["ingest"][0]["categorical_columns"] == ["x0"]


def test_ids_are_exact_strings_unless_numeric_matching_is_asked(tmp_path):
    a = pd.DataFrame({"id": ["00133", "7", "8", "9", "10", "11"], "x": range(6), "label": [0, 1] * 3})
    b = pd.DataFrame({"id": ["133", "7", "8", "9", "10", "11"], "z": range(6)})
    fa, fb = tmp_path / "a.csv", tmp_path / "b.csv"
    a.to_csv(fa, index=False)
    b.to_csv(fb, index=False)
    cfg = RunConfig(dataset="csv")
    cfg.data.party_files = [str(fa), str(fb)]
    cfg.partition.test_fraction = 0.4
    assert build_partition(cfg).meta["ingest"][0]["rows_matched"] == 5  # "00133" ≠ "133"
    cfg.data.numeric_ids = True
    assert build_partition(cfg).meta["ingest"][0]["rows_matched"] == 6


@pytest.mark.parametrize("mode", ["psi", "plain"])
def test_the_record_says_which_alignment_ran_and_counts_its_bytes(tmp_path, capsys, mode):
    fa, fp, *_ = party_files(tmp_path)
    args = ["train", "--dataset", "csv", "--party-file", str(fa), "--party-file", str(fp), "--epochs", "1", "--json"]
    assert main(args + (["--alignment", mode] if mode == "plain" else [])) == 0
    r = json.loads(capsys.readouterr().out)
    p, cost = r["partition"], r["cost"]
    assert p["spec"]["alignment"] == p["aligned_by"] == mode  # no "given" beside "psi"
    assert p["psi_bytes"] > 0 and cost["bytes_by_kind"]["alignment"] >= p["psi_bytes"]
    assert cost["bytes_sent"] == sum(cost["bytes_by_kind"].values())
