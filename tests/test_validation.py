"""Property tests of the one validation layer: any config or CLI argument list either runs or is a
one-line user error (exit 2) — never a traceback — and whatever passes validation is in range."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from securevfl.cli import main
from securevfl.config import RunConfig, apply_dict
from securevfl.configuration.settings import by_key, in_range
from securevfl.configuration.validate import validate_config
from securevfl.errors import UserError

SECTIONS = ("data", "partition", "train", "model", "optim")
SKIP = {"columns", "party_files", "dir", "path", "attacks", "he_params", "method_params", "preset"}


def leaf_keys() -> list[str]:
    cfg, keys = RunConfig(), []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(value) if g.name not in SKIP]
        elif f.name not in SKIP:
            keys.append(f.name)
    return keys


ANY = st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                st.text(max_size=6), st.none(), st.lists(st.one_of(st.integers(-3, 300), st.text(max_size=3),
                                                                  st.floats(-1, 2)), max_size=3))


def as_nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        section, _, name = key.rpartition(".")
        (out.setdefault(section, {}) if section else out)[name] = value
    return out


SETTINGS = by_key(RunConfig)


def holds(key: str, value: object) -> bool:
    """The bounds and choices the field of ``key`` declares, checked independently of the validator."""
    s = SETTINGS[key].setting
    if s is None or value is None or isinstance(value, str) and not s.choices:
        return True
    if s.choices:
        return value in s.choices
    if (s.ge, s.gt, s.le, s.lt) == (None, None, None, None):
        return True
    vals = value if isinstance(value, list | tuple) else [value]
    return all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and in_range(s, v)
               for v in vals)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.dictionaries(st.sampled_from(leaf_keys()), ANY, min_size=1, max_size=4))
def test_any_config_is_valid_or_a_user_error_and_valid_means_in_range(flat):
    cfg = RunConfig()
    try:
        apply_dict(cfg, as_nested(flat))
        validate_config(cfg)
    except UserError as e:
        assert "\n" not in str(e)
        return
    for key in flat:
        section, _, name = key.rpartition(".")
        value = getattr(getattr(cfg, section) if section else cfg, name)
        assert holds(key, value), (key, value)


FLAGS = {"--epochs": st.sampled_from(["1", "0", "-2", "x", "1.5"]),
         "--batch-size": st.sampled_from(["64", "0", "nan"]),
         "--lr": st.sampled_from(["0.01", "nan", "inf", "-1", "0"]),
         "--seed": st.sampled_from(["0", "-1", "3", "99999999999"]),
         "--cut-dim": st.sampled_from(["8", "0", "-4"]),
         "--aligned-fraction": st.sampled_from(["0.5", "1.5", "nan", "-0.1"]),
         "--labeled": st.sampled_from(["50", "0", "100000"]),
         "--parties": st.sampled_from(["2", "3", "1", "40"]),
         "--optimizer": st.sampled_from(["adam", "sgd", "rmsprop"]),
         "--sample": st.sampled_from(["0", "1", "2", "nan"]),
         "--max-rows": st.sampled_from(["400", "0", "-3"]),
         "--defense": st.sampled_from(["none", "iso:1", "dp:noise=1", "dp:noise=nan", "rr:0", "rr:1", "x:1"]),
         "--he": st.sampled_from(["off", "nope"]),
         "--he-param": st.sampled_from(["key_bits=inf", "a", "x=1"]),
         "--method": st.sampled_from(["splitnn", "local", "nosuch"]),
         "--method-param": st.sampled_from(["alpha=1", "=3", "nosuch=1"]),
         "--test-aligned-fraction": st.sampled_from(["train", "2", "0.5"])}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.dictionaries(st.sampled_from(sorted(FLAGS)), st.just(None), max_size=4).flatmap(
    lambda d: st.fixed_dictionaries({k: FLAGS[k] for k in d})))
def test_any_cli_argument_list_runs_or_exits_2_with_one_error_line(flags):
    import io
    from contextlib import redirect_stderr, redirect_stdout

    args = ["train", "--dataset", "digits", "--max-rows", "400", "--epochs", "1"]
    for k, v in flags.items():
        args += [k, v]
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = main([*args, "--json"])
    assert code in (0, 2), (args, err.getvalue())
    if code == 2:
        lines = [ln for ln in err.getvalue().strip().splitlines() if not ln.startswith("warning:")]
        assert len(lines) >= 1 and lines[-1].startswith("error:") and "Traceback" not in err.getvalue(), args


@pytest.mark.parametrize("section,key,value,needle", [
    ("train", "epochs", [1], "train.epochs"),
    ("model", "hidden", [256, "x"], "model.hidden"),
    ("optim", "optimizer", "rmsprop", "must be one of adam, sgd"),
    ("optim", "weight_decay", -0.1, "optim.weight_decay must be ≥ 0"),
    ("data", "sample", 0, "must be in (0, 1]"),
    ("train", "lr_grid", [0.01, "a"], "train.lr_grid"),
])
def test_config_file_values_of_the_wrong_type_or_range_name_the_key(tmp_path, capsys, section, key, value, needle):
    import yaml

    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"dataset": "digits", section: {key: value}}))
    assert main(["train", "--config", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and len(err.splitlines()) == 1


def test_sweep_cells_are_validated_before_any_runs(tmp_path, capsys):
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "t", "dataset": {"name": "digits"}, "methods": ["splitnn"],
                                 "defenses": ["none"], "seeds": [0], "model": {"cut_dim": 0}}))
    assert main(["sweep", str(f), "--store", str(tmp_path / "s.sqlite"), "--quiet"]) == 2
    assert "--cut-dim (model.cut_dim) must be ≥ 1" in capsys.readouterr().err


def test_non_utf8_config_file_is_a_user_error(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_bytes(b"dataset: digits\nseed: \xff\xfe\n")
    assert main(["train", "--config", str(f)]) == 2
    assert capsys.readouterr().err.startswith("error: config file")


assert typing  # (imported for readers of the schema walk above)


@pytest.mark.parametrize("param,needle", [("ssl_epochs=-1", "ssl_epochs must be ≥ 0"),
                                          ("ssl_epochs=2.5", "must be a whole number"),
                                          ("gamma=true", "must be a finite number"),
                                          ("nosuch=1", "has no parameter 'nosuch'")])
def test_method_parameters_follow_one_convention(capsys, param, needle):
    assert main(["train", "--dataset", "digits", "--method", "fedhssl", "--method-param", param]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: method fedhssl") and needle in err
