"""One definition per setting (issue 26): each setting is one dataclass field; the ``train`` flags, the
flag → config mapping, the validation messages and docs/configuration.md are generated from it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from securevfl.cli import main, make_parser
from securevfl.config import RunConfig
from securevfl.configuration import settings
from securevfl.configuration.settings_doc import _md, render
from securevfl.errors import UserError

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def help_flags(capsys) -> set[str]:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - {"--help"}


def missing_flags(doc: str, flags: set[str]) -> list[str]:
    """Flags with no code span of their own in ``doc`` (a table row names each as `--flag`)."""
    return sorted(f for f in flags if f"`{f}`" not in doc)


def test_every_train_help_flag_is_in_the_docs(capsys):
    flags = help_flags(capsys)
    assert {"--epochs", "--mechanism-seed", "--config", "--no-progress", "--id-column"} <= flags
    doc = DOC.read_text(encoding="utf-8")
    assert missing_flags(doc, flags) == []
    # control: the check fails for a doc missing one flag's row, and for a flag the doc never heard of
    without = "\n".join(line for line in doc.splitlines() if "`--epochs`" not in line)
    assert missing_flags(without, flags) == ["--epochs"]
    assert missing_flags(doc, flags | {"--nosuch"}) == ["--nosuch"]


def test_the_committed_doc_is_the_generated_one():
    text = render()
    assert DOC.read_text(encoding="utf-8") == text, \
        "docs/configuration.md is stale: python -m securevfl.configuration.settings_doc > docs/configuration.md"
    # control: the page is made from the fields: each one's key and doc is on it, so editing a field
    # without regenerating the page fails the comparison above
    for entry in settings.walk(RunConfig):
        assert entry.setting is not None
        assert f"| `{entry.key}` |" in text and _md(entry.setting.doc) in text, entry.key


def test_every_setting_has_a_doc():
    assert settings.undocumented(RunConfig) == []

    @dataclasses.dataclass
    class Bare:  # control: a field declared without setting() is reported
        documented: int = settings.setting(1, doc="A documented setting.")
        bare: int = 2

    assert settings.undocumented(Bare) == ["bare"]
    with pytest.raises(ValueError, match="docstring"):
        settings.setting(1, doc=" ")


def test_the_defaults_pass_their_own_validation_and_flags_are_unique():
    from securevfl.configuration.validate import validate_config

    validate_config(RunConfig())
    flags = [e.setting.flag for e in settings.walk(RunConfig) if e.setting and e.setting.flag]
    assert len(flags) == len(set(flags))
    with pytest.raises(ValueError, match="not one of the choices"):  # control: caught at declaration
        settings.setting("rmsprop", choices=("adam", "sgd"), doc="An optimizer.")


def sample(entry: settings.Entry) -> tuple[list[str], object]:
    """Command-line arguments that set ``entry`` and the value they must produce."""
    s = entry.setting
    assert s is not None and s.flag is not None
    if s.cli == "keyvalue":
        return [s.flag, "k=1", s.flag, "j=x"], {"k": 1, "j": "x"}
    if s.cli == "append":
        if settings._scalar(entry.hint) is int:  # --passive-seed N
            return [s.flag, "1", s.flag, "2"], [1, 2]
        if entry.key == "attacks":  # names are checked with the flags (issue 51)
            return [s.flag, "mc", s.flag, "fr"], ["mc", "fr"]
        return [s.flag, "a", s.flag, "b"], ["a", "b"]
    if entry.key == "defense":
        return [s.flag, "iso:5"], "iso:5"
    if s.cli == "comma":
        return [s.flag, "a, b,"], ["a", "b"]
    typ = settings._scalar(entry.hint)
    if typ is bool:
        return [s.flag], True
    if s.choices:
        return [s.flag, s.choices[-1]], s.choices[-1]
    if typ is int:
        return [s.flag, "3"], 3
    if typ is float:
        return [s.flag, "0.5"], 0.5
    return [s.flag, "."], "."  # '.' is a directory, for --data-dir


def lookup(cfg: object, key: str) -> object:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("key", [e.key for e in settings.walk(RunConfig) if e.setting and e.setting.flag])
def test_each_flag_sets_its_key_and_nothing_else(key):
    from securevfl.cli import _build_config

    entry = settings.by_key(RunConfig)[key]
    argv, want = sample(entry)
    cfg = _build_config(make_parser().parse_args(["train", *argv]))
    assert lookup(cfg, key) == want
    default = RunConfig()
    changed = [e.key for e in settings.walk(RunConfig) if lookup(cfg, e.key) != lookup(default, e.key)]
    assert changed == [key]


def test_flags_override_the_config_file_and_id_column_maps_once_or_per_file(tmp_path):
    from securevfl.cli import _build_config

    f = tmp_path / "c.yaml"
    f.write_text("train: {epochs: 7, batch_size: 32}\nhe_params: {key_bits: 2048}\n")
    cfg = _build_config(make_parser().parse_args(["train", "--config", str(f), "--epochs", "2",
                                                  "--he-param", "packing=false", "--id-column", "uid"]))
    assert (cfg.train.epochs, cfg.train.batch_size) == (2, 32)
    assert cfg.he_params == {"key_bits": 2048, "packing": False}  # merged, as before
    assert (cfg.data.id_column, cfg.data.id_columns) == ("uid", [])
    cfg = _build_config(make_parser().parse_args(["train", "--id-column", "a", "--id-column", "b"]))
    assert (cfg.data.id_column, cfg.data.id_columns) == ("id", ["a", "b"])


@pytest.mark.parametrize("argv,needle", [
    (["--epochs", "0"], "--epochs (train.epochs) must be ≥ 1, got 0"),
    (["--mechanism-seed", "-1"], "--mechanism-seed (mechanism_seed) must be in [0, 2147483647], got -1"),
    (["--sample", "1.5"], "--sample (data.sample) must be in (0, 1], got 1.5"),
    (["--test-aligned-fraction", "x"], "expected a number or 'train', got 'x'"),
    (["--he-param", "=3"], "--he-param '=3': expected KEY=VALUE"),
])
def test_validation_messages_name_the_flag_and_the_key(capsys, argv, needle):
    assert main(["train", "--dataset", "digits", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and len(err.splitlines()) == 1


def test_a_setting_without_a_flag_is_named_by_its_key():
    from securevfl.configuration.validate import validate_config

    cfg = RunConfig()
    cfg.data.sample_seed = -1
    with pytest.raises(UserError, match=r"^data\.sample_seed must be in \[0, 2147483647\], got -1$"):
        validate_config(cfg)


def test_mechanism_seed_is_a_config_and_sweep_key():
    from securevfl.config import apply_dict
    from securevfl.lab.sweep import parse_sweep

    cfg = RunConfig()
    assert cfg.mechanism_seed is None and "mechanism_seed" in cfg.to_dict()
    apply_dict(cfg, {"mechanism_seed": 7})
    assert cfg.mechanism_seed == 7
    sweep = parse_sweep({"name": "t", "dataset": "digits", "methods": ["splitnn"], "mechanism_seed": 3})
    # each cell derives its own mechanism seed from the sweep's (issue 25: cells never share noise)
    [seed] = [c.config["mechanism_seed"] for c in sweep.cells]
    assert isinstance(seed, int) and seed != 3
    with pytest.raises(UserError, match="mechanism_seed"):
        parse_sweep({"name": "t", "dataset": "digits", "methods": ["splitnn"], "mechanism_seed": "x"})


def test_building_the_parser_imports_no_torch():
    """``train``'s flags come from config modules that import torch; they are added on first use,
    so ``securevfl methods`` and ``securevfl --help`` stay fast."""
    code = ("import sys; from securevfl.cli import make_parser; p = make_parser(); p.parse_args(['methods']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout
    assert out.strip() == "False"
