"""Property-based tests (hypothesis) of the readers a user's files reach: the config and sweep parsers,
the CSV reader and the report's store reader. Every input ends in success or a UserError (the CLI's
one-line ``error:`` with exit 2), never another exception. Example counts are small, to keep the
suite fast; the generators aim at the shapes real files have, with hostile values mixed in."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from securevfl.cli import main
from securevfl.errors import UserError

FAST = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["digits", "splitnn", "iso:5", "dp:clip=1,noise=1", "off",
                                                           "paillier", "mc", "csv", "1e999", "\x00", "../x"]))
KEYS = ["name", "dataset", "method", "methods", "defense", "defenses", "attacks", "he", "he_params", "seeds", "seed",
        "train", "model", "optim", "data", "partition", "epochs", "cut_dim", "aligned_fraction", "parties",
        "labeled", "max_rows", "party_files", "columns", "noise", "iso", "dp", "record", "mechanism_seed", "x"]
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                      max_leaves=12)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=6)


def _write(text: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix="securevfl-fuzz-"))
    f = d / "f.yaml"
    f.write_text(text)
    return f


def _dump(doc: object) -> str:
    return yaml.safe_dump(doc, allow_unicode=True)


@FAST
@given(st.one_of(documents.map(_dump), st.text(max_size=200)))
def test_config_files_parse_or_fail_cleanly(text):
    from securevfl.config import RunConfig, apply_dict, load_config_file
    from securevfl.configuration.validate import validate_config

    try:
        cfg = RunConfig()
        apply_dict(cfg, load_config_file(_write(text)))
        validate_config(cfg)
    except UserError as e:
        assert "\n" not in str(e).strip() or len(str(e)) < 2000


@FAST
@given(documents)
def test_sweep_files_parse_or_fail_cleanly(doc):
    from securevfl.configuration.validate import validate_config
    from securevfl.lab.sweep import config_from_dict, load_sweep

    doc = {"name": "f", "dataset": {"name": "digits"}, **doc}
    try:
        sweep = load_sweep(_write(_dump(doc)))
        for cell in sweep.cells[:20]:
            validate_config(config_from_dict(cell.config))
    except UserError:
        pass


@settings(max_examples=6, deadline=None)
@given(documents)
def test_sweep_command_is_one_line_error_or_runs_nothing_extra(doc):
    # through the CLI: a store path that is refused, so a valid sweep stops after parsing (no cell runs)
    f = _write(_dump({"name": "f", **doc}))
    bad = f.parent / "bad.sqlite"
    bad.write_bytes(b"not a store" * 20)
    assert main(["sweep", str(f), "--store", str(bad), "--quiet"]) == 2


cells = st.one_of(st.integers(-10, 10).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                  st.sampled_from(["", "na", "a", "b", "1e999", "9223372036854775808", "-0", " 1", '"x,y"']),
                  st.text(alphabet="ab,\"\n", max_size=3))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 30), st.lists(cells, min_size=60, max_size=60), st.booleans(), st.booleans())
def test_csv_files_read_or_fail_cleanly(n, pool, drop_header_name, dup_ids):
    from securevfl.config import RunConfig
    from securevfl.lab.compose import build_partition

    d = Path(tempfile.mkdtemp(prefix="securevfl-fuzz-"))
    ids = [str(i % 3 if dup_ids else i) for i in range(n)]
    header = "a1,label" if drop_header_name else "id,a1,label"
    rows = [f"{ids[i]},{pool[i % 60]},{pool[(i * 7 + 1) % 60] if i % 4 else i % 2}" for i in range(n)]
    (d / "a.csv").write_text("\n".join([header, *rows]) + "\n")
    (d / "p.csv").write_text("\n".join(["id,b1", *[f"{ids[i]},{pool[(i * 3) % 60]}" for i in range(n)]]) + "\n")
    cfg = RunConfig(dataset="csv")
    cfg.data.party_files = [str(d / "a.csv"), str(d / "p.csv")]
    try:
        build_partition(cfg)
    except UserError:
        pass


json_texts = st.one_of(st.none(), st.text(max_size=30), values.map(lambda v: json.dumps(v, default=str)),
                       st.just('{"attacks": {"mc": {"value": 0.5, "prior": 0.1}}, "cost": {"he": 3}}'))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({
    "run_id": st.text(min_size=1, max_size=6), "dataset": st.one_of(st.none(), st.text(max_size=8)),
    "method": st.one_of(st.none(), st.sampled_from(["splitnn", "local", "x'<"])),
    "defense": st.one_of(st.none(), st.sampled_from(["none", "iso:5", "dp:clip=1,noise=1"])),
    "strength": st.one_of(st.none(), st.floats(allow_nan=True)), "seed": st.one_of(st.none(), st.integers(0, 3)),
    "status": st.sampled_from(["ok", "failed", None, "weird"]), "result_json": json_texts, "swept_json": json_texts,
    "utility": st.one_of(st.none(), st.floats(allow_nan=True), st.text(max_size=3)),
}), min_size=1, max_size=4))
def test_store_rows_load_or_fail_cleanly(rows):
    from securevfl.lab.report import load_frames, summarise
    from securevfl.lab.store import Store

    d = Path(tempfile.mkdtemp(prefix="securevfl-fuzz-"))
    store = Store(d / "s.sqlite")
    store.close()
    with sqlite3.connect(d / "s.sqlite") as db:
        for r in rows:
            db.execute(f"INSERT OR REPLACE INTO runs ({', '.join(r)}) VALUES ({', '.join('?' * len(r))})",
                       list(r.values()))
    try:
        runs, attacks = load_frames(d / "s.sqlite")
        summarise(runs, attacks)
    except UserError:
        pass


def test_store_rows_with_damaged_sections_load():
    """Sections of the wrong type at every depth the report reads (CI found ``privacy.audit`` = 3 once):
    each counts as absent, the row still loads and summarises."""
    from securevfl.lab.report import load_frames, summarise
    from securevfl.lab.store import Store

    damaged = [
        {"privacy": {"audit": 3, "features": [1]}, "partition": "x", "utility": 7},
        {"privacy": [], "attacks": {"mc": {"value": 0.5, "params": [1], "control": "x", "baseline": True,
                                           "leakage": "high", "prior": {}}}},
        {"privacy": {"features": {"p1": 3, "p2": {"epsilon": "x"}}}, "attacks": {"mc": {"value": 0.4}}},
    ]
    d = Path(tempfile.mkdtemp(prefix="securevfl-fuzz-"))
    Store(d / "s.sqlite").close()
    with sqlite3.connect(d / "s.sqlite") as db:
        for i, res in enumerate(damaged):
            db.execute("INSERT INTO runs (run_id, status, result_json, config_json, utility) VALUES (?, ?, ?, ?, ?)",
                       [f"r{i}", "ok", json.dumps(res), json.dumps({"attacks": 5 if i else [{"mc": [1]}]}), 0.5])
    runs, attacks = load_frames(d / "s.sqlite")
    assert len(runs) == 3 and runs.epsilon_audit.isna().all() and not runs.feature_side.iloc[1]
    assert len(attacks) == 2 and attacks.control.isna().all() and attacks.leakage.isna().all()
    summarise(runs, attacks)


# ---------------------------------------------------------------- issue 40: party files, flags, model folders
# Each property has a fast run (few examples) and a slow one (many): ``pytest -m slow`` runs the latter.
MANY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.sampled_from(["id", "label", "label", "id", "x", "x", "y.1", "", " id", "lab\"el", "a,b"])


def _party_files_property(n: int, header_a: list[str], header_p: list[str], pool: list[str]) -> None:
    """Headers with repeated, empty, quoted and ID/label-copying names: success, or one UserError."""
    import csv as csvmod
    import io

    from securevfl.config import RunConfig
    from securevfl.lab.compose import build_partition

    def table(header: list[str]) -> str:
        buf = io.StringIO()
        w = csvmod.writer(buf)
        w.writerow(header)
        for i in range(n):
            w.writerow([str(i) if h.strip() == "id" else pool[(i * 7 + j) % len(pool)] for j, h in enumerate(header)])
        return buf.getvalue()

    d = Path(tempfile.mkdtemp(prefix="securevfl-fuzz-"))
    (d / "a.csv").write_text(table(header_a))
    (d / "p.csv").write_text(table(header_p))
    cfg = RunConfig(dataset="csv")
    cfg.data.party_files = [str(d / "a.csv"), str(d / "p.csv")]
    try:
        part = build_partition(cfg)
    except UserError:
        return
    cols = [c for p in part.parties for c in (p.column_names or ())]
    assert "label" not in cols and not any(c.startswith(("label.", "id.")) for c in cols)  # no label as a feature


party_file_args = (st.integers(4, 30), st.lists(names, min_size=2, max_size=5).map(lambda h: ["id", "label", *h]),
                   st.lists(names, min_size=1, max_size=4).map(lambda h: ["id", *h]),
                   st.lists(cells, min_size=5, max_size=20))


@FAST
@given(*party_file_args)
def test_party_file_headers_read_or_fail_cleanly(n, header_a, header_p, pool):
    _party_files_property(n, header_a, header_p, pool)


@pytest.mark.slow
@MANY
@given(*party_file_args)
def test_party_file_headers_read_or_fail_cleanly_many(n, header_a, header_p, pool):
    _party_files_property(n, header_a, header_p, pool)


flag_values = st.one_of(st.sampled_from(["nan", "NaN", "inf", "-inf", "1e999", "0", "-1", "65536", "99999", "",
                                         " 5", "5.5", "0x10", "1_000"]),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-2**40, 2**40).map(str),
                        st.text(max_size=8))


def _flags_property(listen_port: str, timeout: str, mb: str) -> None:
    """``party``'s numeric flags: every value is checked before anything listens (the file is missing, so
    even a valid line ends in an error — never a listening server, a hang or a traceback)."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["party", "--role", "passive1", "--insecure", "--listen", f"127.0.0.1:{listen_port}",
                     "--timeout", timeout, "--max-message-mb", mb, "--party-file", "/nonexistent/p.csv"])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err.getvalue()


@FAST
@given(flag_values, flag_values, flag_values)
def test_numeric_flags_are_checked_or_refused(listen_port, timeout, mb):
    _flags_property(listen_port, timeout, mb)


@pytest.mark.slow
@MANY
@given(flag_values, flag_values, flag_values)
def test_numeric_flags_are_checked_or_refused_many(listen_port, timeout, mb):
    _flags_property(listen_port, timeout, mb)


@given(flag_values)
@FAST
def test_number_validator_returns_finite_in_range_or_refuses(text):
    import math

    from securevfl.configuration.validate import number, port

    try:
        v = number("x", text, gt=0, le=1e6)
        assert math.isfinite(v) and 0 < v <= 1e6
    except UserError:
        pass
    try:
        assert 0 <= port("p", text) <= 65535
    except UserError:
        pass


_SAVED: dict[str, Path] = {}


def _saved_folder() -> Path:
    """One saved federation per session (trained once), copied for each example."""
    if "m" not in _SAVED:
        import numpy as np
        import pandas as pd

        d = Path(tempfile.mkdtemp(prefix="securevfl-fuzz-saved-"))
        rng = np.random.default_rng(0)
        y = (rng.random(80) > 0.5).astype(int)
        pd.DataFrame({"id": range(80), "label": y, "a": rng.normal(size=80) + y}).to_csv(d / "a.csv", index=False)
        pd.DataFrame({"id": range(80), "b": rng.normal(size=80)}).to_csv(d / "p.csv", index=False)
        assert main(["train", "--dataset", "csv", "--party-file", str(d / "a.csv"), "--party-file", str(d / "p.csv"),
                     "--epochs", "1", "--quiet", "--json", "--save", str(d / "m")]) == 0
        _SAVED["m"] = d
    return _SAVED["m"]


folder_edits = st.lists(st.tuples(
    st.sampled_from(["active", "passive1"]),
    st.sampled_from(["manifest-key", "manifest-drop", "truncate", "flip", "prep"]),
    st.sampled_from(["format", "index", "n_parties", "run_id", "party", "role", "config", "model", "sha256", "classes",
                     "task", "n_classes", "columns", "passives"]),
    values, st.integers(0, 10_000), st.booleans()), min_size=1, max_size=3)


def _folder_property(edits: list) -> None:
    """A saved folder damaged anywhere (a manifest field replaced or dropped, a file truncated or flipped,
    with or without the hashes made to agree): ``predict`` scores or says one ``error:`` line."""
    import contextlib
    import io
    import shutil

    src = _saved_folder()
    d = Path(tempfile.mkdtemp(prefix="securevfl-fuzz-"))
    shutil.copytree(src / "m", d / "m")
    for party, how, key, value, at, fix_hashes in edits:
        folder = d / "m" / party
        m = folder / "manifest.json"
        if how in ("manifest-key", "manifest-drop"):
            doc = json.loads(m.read_text())
            if isinstance(doc, dict):
                if how == "manifest-key":
                    doc[key] = value
                else:
                    doc.pop(key, None)
            m.write_text(json.dumps(doc, default=str))
        else:
            f = folder / ("preprocessing.json" if how == "prep" else "model.pt")
            data = bytearray(f.read_bytes())
            if how == "truncate":
                data = data[: at % max(len(data), 1)]
            elif data:
                data[at % len(data)] ^= 0xFF
            f.write_bytes(bytes(data))
        if fix_hashes:
            from securevfl.storage.saved import MANIFEST, _manifest_digest, _sha256

            with contextlib.suppress(Exception):
                doc = json.loads(m.read_text())
                doc["sha256"] = {n: _sha256(folder / n) for n in ("model.pt", "preprocessing.json")}
                doc["sha256"][MANIFEST] = _manifest_digest(doc)
                m.write_text(json.dumps(doc, default=str))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["predict", "--model", str(d / "m"), "--party-file", str(src / "a.csv"), "--party-file",
                     str(src / "p.csv"), "--out", str(d / "p.csv")])
    text = err.getvalue()
    assert "Traceback" not in text
    assert code == 0 or (code == 2 and text.strip().splitlines()[-1].startswith("error:")), text


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(folder_edits)
def test_model_folders_predict_or_fail_cleanly(edits):
    _folder_property(edits)


@pytest.mark.slow
@MANY
@given(folder_edits)
def test_model_folders_predict_or_fail_cleanly_many(edits):
    _folder_property(edits)
