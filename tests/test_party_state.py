"""Parties show what they hold (issue 14, item 2): every attribute a party holds is declared in its
constructor (a method keeps its per-party state in ``method_state``), and role names come from
securevfl.roles, so defenses and attacks need nothing of the data package."""

import ast
import json
from pathlib import Path

import pytest

from securevfl.cli import main
from securevfl.data import PartitionSpec, load_dataset, make_partition
from securevfl.federation import OptimConfig, build_federation
from securevfl.models import ModelConfig
from securevfl.parties import ActiveParty, Party, PassiveParty

REPO = Path(__file__).parent.parent

# every method that keeps state in its parties, a party's own update rule (mc-active), both label
# defenses' privatizers, and the HE layer's ends; small runs (about a second each)
RUNS = {
    "fedhssl": ["--method", "fedhssl", "--method-param", "ssl_epochs=1"],
    "fedlocal": ["--method", "fedlocal-simsiam", "--method-param", "ssl_epochs=1"],
    "entity-aug": ["--method", "entity-aug", "--method-param", "queue=true", "--method-param", "miss_rate=0.2"],
    "fedud": ["--method", "fedud", "--aligned-fraction", "0.5"],
    "risa": ["--method", "risa", "--aligned-fraction", "0.5"],
    "vflhlp": ["--method", "vflhlp", "--dataset", "breast-cancer", "--aligned-fraction", "0.5"],
    "splitnn-dp-mc-active": ["--method", "splitnn", "--defense", "dp:noise=1", "--attack", "mc-active:steps=10"],
    "splitnn-embedding-dp": ["--method", "splitnn", "--defense", "embedding-dp:noise=1"],
    "splitnn-ckks": ["--method", "splitnn", "--dataset", "breast-cancer", "--he", "ckks"],
}


@pytest.fixture
def attribute_guard(monkeypatch):
    """Record every assignment to a party attribute its constructor did not declare (a run goes on,
    so one test lists them all)."""
    part = make_partition(load_dataset("digits"), PartitionSpec(), 0)
    fed = build_federation(part, ModelConfig(bottom="mlp"), OptimConfig(), 0)
    declared = {ActiveParty: set(vars(fed.active)), PassiveParty: set(vars(fed.passives[0]))}
    undeclared: list[tuple[str, str]] = []

    def guard(self, name: str, value: object) -> None:
        if name not in declared[type(self)]:
            undeclared.append((type(self).__name__, name))
        object.__setattr__(self, name, value)

    for cls in declared:
        monkeypatch.setattr(cls, "__setattr__", guard)
    return fed, undeclared


@pytest.mark.parametrize("run", list(RUNS))
def test_no_code_assigns_an_undeclared_party_attribute(run, attribute_guard, capsys):
    _, undeclared = attribute_guard
    data = [] if "--dataset" in RUNS[run] else ["--dataset", "digits"]  # a repeated flag is refused
    argv = ["train", *data, "--epochs", "1", "--seed", "0", "--json", "--no-progress", *RUNS[run]]
    assert main(argv) == 0, capsys.readouterr().err
    json.loads(capsys.readouterr().out)
    assert undeclared == []


def test_guard_control_catches_an_undeclared_attribute(attribute_guard):
    """Control: what the methods used to do (``party.hssl = ...``) is caught."""
    fed, undeclared = attribute_guard
    fed.passives[0].hssl = object()
    fed.active.method_state = object()  # the declared slot is fine
    assert undeclared == [("PassiveParty", "hssl")]


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_defenses_and_attacks_do_not_import_the_data_package():
    offenders = [f"{p.relative_to(REPO)} imports {m}" for d in ("defenses", "attacks") for p in (REPO / d).rglob("*.py")
                 for m in _imports(p) if m == "securevfl.data" or m.startswith("securevfl.data.")]
    assert offenders == []
    # control: the scan sees such an import where there is one
    assert "securevfl.data.partition" in _imports(REPO / "securevfl" / "federation.py")


# ------------------------------------------------------------------ parties are built whole (issue 26)
# small settings each method needs to run at all; every other method runs on digits as it is
NEEDS = {"fedud": ["--aligned-fraction", "0.5"], "risa": ["--aligned-fraction", "0.5"],
         "local-vfl": ["--aligned-fraction", "0.5"], "random-match": ["--aligned-fraction", "0.5"],
         "vflhlp": ["--dataset", "breast-cancer", "--aligned-fraction", "0.5", "--optimizer", "sgd"],
         "vflhlp-a": ["--dataset", "breast-cancer", "--aligned-fraction", "0.5", "--optimizer", "sgd"],
         "vflhlp-p": ["--dataset", "breast-cancer", "--aligned-fraction", "0.5"]}
SSL = ("fedhssl", "fedcssl", "fedgssl", "fedlocal-byol", "fedlocal-moco", "fedlocal-scarf", "fedlocal-simsiam",
       "vflhlp", "vflhlp-p")


def _every_method() -> list[str]:
    from securevfl.methods import METHODS

    return METHODS.names()


@pytest.mark.parametrize("method", _every_method())
def test_no_code_outside_a_party_sets_its_attributes(method, monkeypatch, capsys):
    """Every registered method trains with the parties' attribute guard on (the RUNS above add the
    mc-active attack, label/feature DP and HE):
    an assignment to a party's attribute from anywhere but the party's own methods raises
    (``Party.__setattr__``), so a clean run is the proof; the guard is counted to be sure it ran."""
    calls = []
    real = Party.__setattr__

    def counting(self, name, value):
        calls.append(name)
        real(self, name, value)

    monkeypatch.setattr(Party, "__setattr__", counting)
    extra = ["--method-param", "ssl_epochs=1"] if method in SSL else []
    data = [] if "--dataset" in NEEDS.get(method, []) else ["--dataset", "digits"]  # a repeated flag is refused
    argv = ["train", *data, "--epochs", "1", "--seed", "0", "--json", "--no-progress",
            "--method", method, *extra, *NEEDS.get(method, [])]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["method"] == method
    assert "step" in calls  # the guard saw the parties' own updates


def test_party_guard_control_refuses_an_outside_assignment():
    """Control: what methods used to do (``fed.active.head = ...``, ``party.bottom = ...``,
    ``party.optimizer = ...``) now raises; the party's own methods still set its state."""
    part = make_partition(load_dataset("digits"), PartitionSpec(), 0)
    fed = build_federation(part, ModelConfig(bottom="mlp"), OptimConfig(), 0)
    a, p = fed.active, fed.passives[0]
    for party, name in ((a, "head"), (p, "bottom"), (p, "optimizer"), (a, "method_state"), (p, "hssl")):
        with pytest.raises(AttributeError, match="set only by the party's own methods"):
            setattr(party, name, object())
    old = p.optimizer
    p.reset_optimizer()  # the party's own method: allowed
    assert p.optimizer is not old
    p.keep_method_state("state")
    assert p.method_state == "state"
