"""Property-based tests (hypothesis) of the readers a user's files reach: the config and sweep parsers,
the CSV reader and the report's store reader. Every input ends in success or a UserError (the CLI's
one-line ``error:`` with exit 2), never another exception. Example counts are small, to keep the
suite fast; the generators aim at the shapes real files have, with hostile values mixed in."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

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
    from securevfl.validate import validate_config

    try:
        cfg = RunConfig()
        apply_dict(cfg, load_config_file(_write(text)))
        validate_config(cfg)
    except UserError as e:
        assert "\n" not in str(e).strip() or len(str(e)) < 2000


@FAST
@given(documents)
def test_sweep_files_parse_or_fail_cleanly(doc):
    from securevfl.lab.sweep import config_from_dict, load_sweep
    from securevfl.validate import validate_config

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
