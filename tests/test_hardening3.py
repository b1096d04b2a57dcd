"""Hardening, round 3 (issue 40): each case the audit found, with the behaviour it has now. Every test
here failed on main before the fix (a silent run, a traceback or a hang); docs/limits.md lists them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from securevfl.cli import main
from securevfl.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1] if err else ""
    assert last.startswith("error:") and all(n in last for n in needles), err
    assert "Traceback" not in err, err
    return last


def frames(n: int = 160, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) > 0.5).astype(int)
    a = pd.DataFrame({"id": np.arange(n), "y": y, "x0": rng.normal(size=n) + y, "x1": rng.normal(size=n)})
    b = pd.DataFrame({"id": np.arange(n), "z0": rng.normal(size=n) + y, "z1": rng.normal(size=n)})
    return a, b


def train(tmp_path: Path, a: pd.DataFrame | str, b: pd.DataFrame | str | None = None, *extra: str) -> list[str]:
    fa, fb = tmp_path / "a.csv", tmp_path / "b.csv"
    if isinstance(a, pd.DataFrame):
        a.to_csv(fa, index=False)
    else:
        fa = tmp_path / a
    if b is None:
        b = frames()[1]
    if isinstance(b, pd.DataFrame):
        b.to_csv(fb, index=False)
    else:
        fb = tmp_path / b
    return ["train", "--dataset", "csv", "--party-file", str(fa), "--party-file", str(fb), "--label-column", "y",
            "--epochs", "1", "--quiet", "--json", *extra]


# ------------------------------------------------------------------ input schema (worst case 1)
def test_duplicated_label_column_is_refused_not_a_feature(tmp_path, capsys):
    a, _ = frames()
    (tmp_path / "dup.csv").write_text("id,y,y,x0\n" + "".join(f"{i},{v},{v},{x}\n" for i, v, x in
                                                             zip(a.id, a.y, a.x0, strict=True)))
    assert main(train(tmp_path, "dup.csv")) == 2
    one_line_error(capsys, "column name 'y' appears more than once", "columns 2 and 3")


@pytest.mark.parametrize("header", ["id,id,y,x0", "id,y,x0,x0"], ids=["id", "feature"])
def test_duplicated_id_or_feature_column_is_refused(tmp_path, capsys, header):
    a, _ = frames()
    (tmp_path / "dup.csv").write_text(header + "\n" + "".join(f"{i},{i},{v},{x}\n" if header.startswith("id,id")
                                                              else f"{i},{v},{x},{x}\n"
                                                              for i, v, x in zip(a.id, a.y, a.x0, strict=True)))
    assert main(train(tmp_path, "dup.csv")) == 2
    one_line_error(capsys, "appears more than once")


def test_duplicate_names_in_parquet_are_refused(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a, _ = frames()
    table = pa.Table.from_arrays([pa.array(a.id), pa.array(a.y), pa.array(a.y), pa.array(a.x0)],
                                 names=["id", "y", "y", "x0"])
    pq.write_table(table, tmp_path / "dup.parquet")
    assert main(train(tmp_path, "dup.parquet")) == 2
    one_line_error(capsys, "'y' appears more than once")


def test_parquet_float_label_with_nan_is_read_as_unlabeled(tmp_path, capsys):
    a, _ = frames()
    a = a.astype({"y": float})
    a.loc[[3, 7], "y"] = np.nan
    a.to_parquet(tmp_path / "a.parquet")
    assert main(train(tmp_path, "a.parquet")) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["partition"]["ingest"][0]["unlabeled_rows"] == 2 and r["partition"]["classes"] == ["0", "1"]


@pytest.mark.parametrize("cell, needle", [("inf", "is not a finite number"), ("-inf", "is not a finite number"),
                                          ("cat", "is text among numbers")])
def test_stray_label_values_are_refused_not_a_class(tmp_path, capsys, cell, needle):
    a, _ = frames()
    a = a.astype({"y": object})
    a.loc[5, "y"] = cell
    assert main(train(tmp_path, a)) == 2
    one_line_error(capsys, needle, "line 7")


def test_constant_regression_label_is_refused(tmp_path, capsys):
    a, _ = frames()
    a["y"] = 2.5
    assert main(train(tmp_path, a, None, "--task", "regression")) == 2
    one_line_error(capsys, "has one value", "varies")


@pytest.mark.parametrize("flag", ["--drop-columns", "--categorical", "--numeric"])
def test_label_named_as_a_feature_column_is_refused(tmp_path, capsys, flag):
    a, _ = frames()
    assert main(train(tmp_path, a, None, flag, "y")) == 2
    one_line_error(capsys, flag, "label column 'y'")


def test_parquet_nested_columns_are_refused_by_name(tmp_path, capsys):
    _, b = frames()
    b["tags"] = [[1, 2]] * len(b)
    b.to_parquet(tmp_path / "b.parquet")
    assert main(train(tmp_path, frames()[0], "b.parquet")) == 2
    one_line_error(capsys, "column 'tags' has type list")


def test_control_clean_files_train(tmp_path, capsys):
    """Control: the same files without the damage train (the checks above are not blanket refusals)."""
    a, b = frames()
    assert main(train(tmp_path, a, b)) == 0
    assert json.loads(capsys.readouterr().out)["utility"]["test"] > 0.5


# ------------------------------------------------------------------ specs and flags
@pytest.mark.parametrize("args, needle", [
    (["--defense", ""], "--defense is empty"),
    (["--defense", "iso:5+"], "empty part"),
    (["--defense", "dp:clip=1,noise=1,noise=2"], "'noise' given more than once"),
    (["--attack", "mc:steps=5,steps=6"], "'steps' given more than once"),
    (["--timeout", "5"], "--timeout goes with --peer"),
    (["--max-message-mb", "5"], "--max-message-mb goes with --peer"),
    (["--peer", "passive1=127.0.0.1:99999", "--insecure"], "must be ≤ 65535"),
    (["--peer", "passive1=127.0.0.1:-1", "--insecure"], "must be ≥ 0"),
    (["--peer", "passive1=127.0.0.1:0", "--insecure"], "port 0"),
    (["--peer", "passive1=127.0.0.1:5000", "--insecure", "--timeout", "nan"], "--timeout must be a finite number"),
    (["--peer", "passive1=127.0.0.1:5000", "--insecure", "--timeout", "inf"], "--timeout must be a finite number"),
    (["--peer", "passive1=127.0.0.1:5000", "--insecure", "--max-message-mb", "nan"], "--max-message-mb must be a fin"),
    (["--peer", "passive1=127.0.0.1:5000", "--insecure", "--max-message-mb", "-1"], "--max-message-mb must be >"),
])
def test_bad_flags_are_one_line_errors(capsys, args, needle):
    assert main(["train", "--dataset", "digits", "--epochs", "1", *args]) == 2
    one_line_error(capsys, needle)


@pytest.mark.parametrize("text, ok", [("nan", False), ("inf", False), ("-1", False), ("0", False), ("1e9", False),
                                      ("2.5", True), ("3", True), ("x", False)])
def test_one_validator_for_numbers(text, ok):
    from securevfl.configuration.validate import number

    if ok:
        assert number("--timeout", text, gt=0, le=7 * 86400) == float(text)
    else:
        with pytest.raises(UserError, match="--timeout must be"):
            number("--timeout", text, gt=0, le=7 * 86400)


@pytest.mark.parametrize("args, needle", [
    (["--listen", "127.0.0.1:99999"], "must be ≤ 65535"),
    (["--listen", "127.0.0.1:5000", "--timeout", "nan"], "finite"),
    (["--listen", "127.0.0.1:5000", "--party-file", "/nonexistent/b.csv"], "--party-file /nonexistent/b.csv: no such"),
    (["--listen", "127.0.0.1:5000", "--defense", "iso:5"], "runs at the active party"),
    (["--listen", "127.0.0.1:5000", "--mechanism-seed", "nan"], "--mechanism-seed must be"),
    (["--listen", "127.0.0.1:5000", "--he-param", "seeded_shares=true"], "test fixture"),
])
def test_party_refuses_before_listening(tmp_path, capsys, args, needle):
    frames()[1].to_csv(tmp_path / "b.csv", index=False)
    base = ["party", "--role", "passive1", "--insecure", "--party-file", str(tmp_path / "b.csv")]
    assert main([*base, *args]) == 2
    one_line_error(capsys, needle)


@pytest.mark.parametrize("where", ["in-use", "unresolvable"])
def test_party_cannot_listen_is_one_line_error(tmp_path, where):
    frames()[1].to_csv(tmp_path / "b.csv", index=False)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    addr = f"127.0.0.1:{s.getsockname()[1]}" if where == "in-use" else "no-such-host.invalid:5000"
    r = subprocess.run([sys.executable, "-m", "securevfl", "party", "--role", "passive1", "--listen", addr,
                        "--party-file", str(tmp_path / "b.csv"), "--insecure"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    s.close()
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: --listen {addr}: cannot listen there")


# ------------------------------------------------------------------ sweeps
def test_huge_sweep_is_refused_before_expanding(tmp_path, capsys):
    f = tmp_path / "big.yaml"
    f.write_text(yaml.safe_dump({"name": "big", "dataset": {"name": "digits"}, "methods": ["splitnn", "fedhssl"],
                                 "defenses": ["none", {"iso": [1, 2, 3, 4]}], "seeds": list(range(30_000))}))
    assert main(["sweep", str(f), "--store", str(tmp_path / "s.sqlite")]) == 2
    one_line_error(capsys, "300,000 cells", "max_cells: 300000")
    assert not (tmp_path / "s.sqlite").exists()


def test_max_cells_lets_a_large_sweep_expand():
    from securevfl.lab.sweep import parse_sweep

    doc = {"name": "big", "dataset": {"name": "digits"}, "methods": ["splitnn"], "seeds": list(range(6000))}
    with pytest.raises(UserError, match="6,000 cells"):
        parse_sweep(doc)
    assert len(parse_sweep({**doc, "max_cells": 6000}).cells) == 6000


# ------------------------------------------------------------------ certificates
def test_certs_out_naming_a_file_is_one_line_error(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["certs", "--parties", "active,passive1", "--out", str(tmp_path / "f")]) == 2
    one_line_error(capsys, "exists and is not a directory")


def test_certs_never_write_through_a_planted_link(tmp_path, capsys):
    out, victim = tmp_path / "c", tmp_path / "victim"
    victim.mkdir()
    out.mkdir()
    (out / "active").symlink_to(victim)
    assert main(["certs", "--parties", "active,passive1", "--out", str(out)]) == 2
    one_line_error(capsys, "already exists")
    assert list(victim.iterdir()) == []


def test_certs_modes_ignore_a_permissive_umask(tmp_path, capsys):
    old = os.umask(0)
    try:
        assert main(["certs", "--parties", "active,passive1", "--out", str(tmp_path / "c")]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    mode = {p.relative_to(tmp_path / "c").as_posix(): stat.S_IMODE(p.stat().st_mode)
            for p in (tmp_path / "c").rglob("*")}
    assert mode["ca"] == mode["active"] == mode["passive1"] == 0o700
    assert mode["ca/ca.key"] == mode["active/active.key"] == 0o600
    assert mode["active/active.pem"] == mode["ca/ca.pem"] == 0o644


def test_open_new_refuses_links_and_existing_files(tmp_path):
    from securevfl.storage.files import open_new

    target = tmp_path / "target"
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UserError, match="already exists"):
        open_new(tmp_path / "link")
    assert not target.exists()
    with open_new(tmp_path / "new") as f:
        f.write("ok")
    with pytest.raises(UserError, match="already exists"):
        open_new(tmp_path / "new")


# ------------------------------------------------------------------ predict trusts nothing in its folder
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    a, b = frames(200)
    a.to_csv(d / "a.csv", index=False)
    b.to_csv(d / "b.csv", index=False)
    base = ["train", "--dataset", "csv", "--party-file", str(d / "a.csv"), "--party-file", str(d / "b.csv"),
            "--label-column", "y", "--epochs", "1", "--quiet", "--json"]
    assert main([*base, "--save", str(d / "m")]) == 0
    assert main([*base, "--save", str(d / "other"), "--seed", "1"]) == 0
    return d


def rehash(folder: Path) -> None:
    """What a careful forger does: make the manifest's hashes agree with the altered files."""
    from securevfl.storage.saved import MANIFEST, _manifest_digest, _sha256

    m = json.loads((folder / MANIFEST).read_text())
    m["sha256"] = {n: _sha256(folder / n) for n in ("model.pt", "preprocessing.json")}
    m["sha256"][MANIFEST] = _manifest_digest(m)
    (folder / MANIFEST).write_text(json.dumps(m))


class Boom:
    def __reduce__(self):
        return (os.system, (f"touch {Path(os.environ.get('BOOM_MARK', '/tmp/boom'))}",))


def _pickle(f: Path) -> None:
    torch.save({"modules": Boom(), "cut_ends": []}, f)


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:100])


def _manifest(edit):
    def apply(folder: Path) -> None:
        m = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps(edit(m)))
    return apply


DAMAGE = {
    "code-executing pickle": (lambda d: (_pickle(d / "model.pt"), rehash(d)), "model.pt cannot be loaded"),
    "truncated model.pt": (lambda d: (_truncate(d / "model.pt"), rehash(d)), "model.pt cannot be loaded"),
    "invalid preprocessing.json": (lambda d: ((d / "preprocessing.json").write_text("{nope"), rehash(d)),
                                   "preprocessing.json cannot be read as JSON"),
    "preprocessing.json not a mapping": (lambda d: ((d / "preprocessing.json").write_text("[1]"), rehash(d)),
                                         "preprocessing.json lacks"),
    "manifest without sha256": (_manifest(lambda m: {k: v for k, v in m.items() if k != "sha256"}),
                                "'sha256' is missing"),
    "list manifest": (_manifest(lambda m: [m]), "not a JSON object"),
    "sha256 {}": (_manifest(lambda m: {**m, "sha256": {}}), "must hold the SHA-256"),
    "manifest not JSON": (lambda d: (d / "manifest.json").write_text("{"), "cannot be read as JSON"),
    "model.pt missing": (lambda d: (d / "model.pt").unlink(), "model.pt is missing or does not match"),
    "model.pt altered": (lambda d: (d / "model.pt").write_bytes((d / "model.pt").read_bytes() + b"\0"),
                         "does not match its manifest's hash"),
    "class names swapped": (_manifest(lambda m: {**m, "classes": m.get("classes", [])[::-1]}),
                            "manifest.json was changed after saving"),
    "label facts in a passive folder": (_manifest(lambda m: {**m, "n_classes": 2}), "label facts"),
    # found by the fuzz test: consistent hashes, inconsistent fields (an IndexError while writing predictions)
    "class names emptied, hashes redone": (lambda d: (_manifest(lambda m: {**m, "classes": []})(d), rehash(d)),
                                           "does not match its 0 class names"),
    "position out of range, hashes redone": (lambda d: (_manifest(lambda m: {**m, "index": 5})(d), rehash(d)),
                                             "do not fit"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_model_folder_is_one_line_error_and_runs_no_code(saved, tmp_path, capsys, monkeypatch, case):
    m = tmp_path / "m"
    shutil.copytree(saved / "m", m)
    damage, needle = DAMAGE[case]
    party = "passive1" if case == "label facts in a passive folder" else "active"
    mark = tmp_path / "boom"
    monkeypatch.setenv("BOOM_MARK", str(mark))
    damage(m / party)
    assert main(["predict", "--model", str(m), "--party-file", str(saved / "a.csv"), "--party-file",
                 str(saved / "b.csv"), "--out", str(tmp_path / "p.csv")]) == 2
    one_line_error(capsys, needle)
    assert not mark.exists() and not (tmp_path / "p.csv").exists()


def test_intact_folder_predicts(saved, tmp_path, capsys):
    """Control: the undamaged copy scores every row."""
    m = tmp_path / "m"
    shutil.copytree(saved / "m", m)
    assert main(["predict", "--model", str(m), "--party-file", str(saved / "a.csv"), "--party-file",
                 str(saved / "b.csv"), "--out", str(tmp_path / "p.csv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_scored"] == 200


def test_passive_folder_from_another_run_is_refused(saved, tmp_path, capsys):
    m = tmp_path / "m"
    shutil.copytree(saved / "m", m)
    shutil.rmtree(m / "passive1")
    shutil.copytree(saved / "other" / "passive1", m / "passive1")  # same shapes, another run's weights
    assert main(["predict", "--model", str(m), "--party-file", str(saved / "a.csv"), "--party-file",
                 str(saved / "b.csv"), "--out", str(tmp_path / "p.csv")]) == 2
    one_line_error(capsys, "passive1 is from another training run")


def test_predict_refuses_non_finite_rows_and_unknown_out_suffix(saved, tmp_path, capsys):
    b = pd.read_csv(saved / "b.csv").astype({"z0": object})
    b.loc[4, "z0"] = "inf"
    b.to_csv(tmp_path / "b_inf.csv", index=False)
    args = ["predict", "--model", str(saved / "m"), "--party-file", str(saved / "a.csv")]
    assert main([*args, "--party-file", str(tmp_path / "b_inf.csv"), "--out", str(tmp_path / "p.csv")]) == 2
    one_line_error(capsys, "column 'z0': line 6", "not a finite number")
    assert main([*args, "--party-file", str(saved / "b.csv"), "--out", str(tmp_path / "o.txt")]) == 2
    one_line_error(capsys, "--out", ".csv or .parquet")
    assert not (tmp_path / "o.txt").exists()


def test_passive_folder_holds_nothing_about_labels(saved):
    text = (saved / "m" / "passive1" / "manifest.json").read_text()
    m = json.loads(text)
    assert not {"task", "n_classes", "classes", "label_scale"} & set(m)
    assert not {"label_column", "task"} & set(m["config"]["data"])
    assert '"y"' not in (saved / "m" / "passive1" / "preprocessing.json").read_text()


# ------------------------------------------------------------------ a party's own privacy settings
def hello(**over) -> dict:
    from securevfl.passive_own import PassiveOwn

    owned = PassiveOwn().as_dict()  # the model, optimiser and columns a default passive party owns (issue 60)
    base = {"defense": "none", "mechanism_seed": None, "he": "off", "he_params": {}, **owned,
            "model": {**owned["model"], "interactive_mixing": "auto"}}
    if "model" in over:
        over = {**over, "model": {**base["model"], **over["model"]}}
    return {**base, **over}


REFUSED = {  # what the active party asks → this party's own settings → refused
    "mechanism seed for this party's noise": (hello(defense="embedding-dp:noise=1", mechanism_seed=7), {},
                                              "fixed mechanism seed"),
    "mechanism seed other than its own": (hello(defense="embedding-dp:noise=1", mechanism_seed=7),
                                          {"mechanism_seed": 8}, "fixed mechanism seed"),
    "HE off when it requires HE": (hello(he="off"), {"he": "ckks"}, "requires --he ckks"),
    "another HE scheme": (hello(he="ckks"), {"he": "bfv"}, "requires --he bfv"),
    "fewer mask bits": (hello(he="bfv", he_params={"mask_bits": 12}), {"he": "bfv", "he_params": {"mask_bits": 40}},
                        "requires mask_bits=40"),
    "default mask bits when it requires more": (hello(he="bfv"), {"he_params": {"mask_bits": 64}},
                                                "requires mask_bits=64"),
    "HE seeded shares": (hello(he="ckks", he_params={"seeded_shares": True}), {}, "seeded_shares"),
    "mixing off": (hello(he="ckks", model={"interactive_mixing": "off"}), {"interactive_mixing": "on"},
                   "requires on"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_party_refuses_settings_that_weaken_its_protection(case):
    from securevfl.party_settings import PartySettings, reconcile

    asked, own, needle = REFUSED[case]
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        reconcile(asked, PartySettings(**own))


def test_party_overrides_the_strength_of_its_own_defense():
    """The active party asks for a weaker feature DP than this party set: this party runs its own, says so,
    and keeps the active party's own (label) defense."""
    from securevfl.party_settings import PartySettings, reconcile

    got, notes = reconcile(hello(defense="iso:5+embedding-dp:clip=1,noise=0.01"),
                           PartySettings(defense="embedding-dp:clip=1,noise=2"))
    assert got["defense"] == "iso:5+embedding-dp:clip=1,noise=2"
    assert any("runs its own --defense embedding-dp:clip=1,noise=2 instead" in n for n in notes)
    got, notes = reconcile(hello(defense="embedding-dp:clip=1,noise=0.01"), PartySettings(defense="none"))
    assert got["defense"] == "none" and any("no defense runs at this party" in n for n in notes)


def test_party_accepts_and_states_what_it_did_not_decide():
    """Control: settings that match this party's own are accepted; what it left to the active party, and
    every weak setting, is stated (a seed that seeds nothing here is dropped, not used)."""
    from securevfl.party_settings import PartySettings, reconcile

    got, notes = reconcile(hello(defense="embedding-dp:noise=1", mechanism_seed=7), PartySettings(mechanism_seed=7))
    assert got["mechanism_seed"] == 7 and any("not private" in n for n in notes)
    got, notes = reconcile(hello(defense="iso:5", mechanism_seed=7), PartySettings())
    assert got["mechanism_seed"] is None and got["defense"] == "iso:5"  # iso runs at the active party
    assert any("no defense runs at this party" in n for n in notes) and any("--he off" in n for n in notes)
    got, notes = reconcile(hello(defense="dcor:0.5", he="ckks", he_params={"mask_bits": 12},
                                 model={"interactive_mixing": "off"}),
                           PartySettings(he="ckks", he_params={"mask_bits": 12}, interactive_mixing="off"))
    assert got["defense"] == "dcor:0.5" and any("the active party chose for this party: dcor:0.5" in n for n in notes)
    assert any("--interactive-mixing off" in n for n in notes)


def test_mixing_auto_is_compared_as_what_it_resolves_to():
    """``auto`` means on under HE: a party requiring mixing on accepts it, and refuses an explicit off."""
    from securevfl.party_settings import PartySettings, reconcile

    reconcile(hello(he="ckks", model={"interactive_mixing": "auto"}), PartySettings(interactive_mixing="on"))
    with pytest.raises(UserError, match="requires on"):
        reconcile(hello(he="ckks", model={"interactive_mixing": "off"}), PartySettings(interactive_mixing="on"))


@pytest.mark.parametrize("flag", [["--aligned-fraction", "0.2"], ["--aligned-count", "50"]])
def test_overlap_flags_with_party_files_are_refused(tmp_path, capsys, flag):
    """Issue 42: with --dataset csv, --aligned-fraction was ignored without a word (the files decide)."""
    assert main(train(tmp_path, frames()[0], None, *flag)) == 2
    one_line_error(capsys, flag[0], "does not apply to dataset csv")
