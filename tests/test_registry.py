"""One Registry behind every extension point, and an import graph without cycles."""

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from securevfl.errors import UserError
from securevfl.registry import Registry

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("securevfl", "attacks", "defenses")


class _Thing:
    def __init__(self, name: str) -> None:
        self.name = name


def test_registry_registers_lists_sorted_and_refuses_duplicates():
    reg: Registry[_Thing] = Registry("widget")
    b = reg.register(_Thing("b"))
    reg.register(_Thing("a"))
    assert reg.get("b") is b and reg.names() == ["a", "b"] and "a" in reg and list(reg) == ["a", "b"]
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register(_Thing("a"))
    with pytest.raises(UserError) as e:
        reg.get("c")
    assert str(e.value) == "unknown widget 'c'; available: a, b"


def test_registry_as_decorator_lazy_and_refused_entries():
    reg: Registry[type] = Registry("engine")

    @reg.register
    class Local:
        name = "local"

    assert reg.get("local") is Local
    reg.register_lazy("reg", "securevfl.registry:Registry")  # imported on first get
    reg.refuse("ray", "--engine ray needs the optional extra")
    assert reg.names() == ["local", "reg"] and reg.get("reg") is Registry
    with pytest.raises(UserError, match="needs the optional extra"):
        reg.get("ray")
    for name in ("local", "reg", "ray"):  # a lazy or refused name is taken too
        with pytest.raises(ValueError):
            reg.register_lazy(name, "x:y")


def test_the_seven_registries_list_their_names_and_refuse_duplicates():
    import attacks
    import defenses
    from securevfl.cutlayer import CUT_LAYERS
    from securevfl.data.registry import DATASETS
    from securevfl.lab.engine import ENGINES
    from securevfl.methods import METHODS
    from securevfl.ssl import OBJECTIVES

    expect = {METHODS: {"splitnn", "fedhssl", "fedlocal-simsiam", "fedlocal-scarf", "local"},
              attacks.ATTACKS: {"mc", "fr"}, defenses.DEFENSES: {"iso", "dp"},
              DATASETS: {"digits", "breast-cancer", "csv"}, CUT_LAYERS: {"off", "ckks", "paillier"},
              ENGINES: {"local"}, OBJECTIVES: {"simsiam", "byol", "moco", "scarf"}}
    for reg, some in expect.items():
        assert isinstance(reg, Registry) and some <= set(reg.names()) and reg.names() == sorted(reg.names())
        with pytest.raises(ValueError, match="already registered"):
            reg.register(reg.get(reg.names()[0]))
    assert [c for c in METHODS.names() if c.startswith("fedlocal-")] == [
        "fedlocal-byol", "fedlocal-moco", "fedlocal-scarf", "fedlocal-simsiam"]
    assert METHODS.get("fedlocal-byol").__name__ == "FedLocalBYOL"  # a plain subclass, not built with type()


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports anywhere in its body (function-level imports too: a
    lazy import hides a cycle from the interpreter, not from the reader)."""
    mods = {_module_of(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            # a module's own parent packages run first anyway: that edge is not a cycle
            graph[mod] |= {t for t in targets if t in mods and t != mod and not mod.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = import_graph()
    assert {"securevfl.cutlayer", "securevfl.crypto", "securevfl.lab.ray_engine"} <= set(graph)
    assert cycles(graph) == []
    # control: the check sees a cycle (the one crypto ↔ cutlayer had) when there is one
    graph["securevfl.cutlayer"].add("securevfl.crypto")
    assert cycles(graph) == [["securevfl.crypto", "securevfl.crypto.protocol", "securevfl.cutlayer"]]


def test_formerly_cyclic_modules_import_first_in_a_fresh_interpreter():
    """Each module of the three former cycles imported before any other project module (a partially
    initialised import would fail), and the lazy registry entries resolve."""
    mods = ["securevfl.lab.ray_engine", "securevfl.lab.engine", "securevfl.crypto", "securevfl.crypto.protocol",
            "securevfl.cutlayer", "securevfl.data.builtin", "securevfl.data.registry"]
    script = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        f"    for k in [k for k in sys.modules if k.split('.')[0] in {PACKAGES!r}]:\n"
        "        del sys.modules[k]\n"
        "    importlib.import_module(m)\n"
        "from securevfl.cutlayer import CUT_LAYERS\n"
        "from securevfl.lab.engine import ENGINES\n"
        "assert CUT_LAYERS.get('ckks').name == 'ckks' and CUT_LAYERS.get('paillier').name == 'paillier'\n"
        "assert ENGINES.get('ray').name == 'ray'\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]


def test_extension_sketches_plug_into_a_run():
    """The sketches of docs/extending.md, run as written, give a method, attack, defense and dataset
    that one training run uses end to end (a sketch that rots fails here; the per-role method sketch
    runs in tests/test_roles.py too)."""
    page = (REPO / "docs" / "extending.md").read_text()
    blocks = [b.split("```")[0] for b in page.split("```python")[1:]]
    assert len(blocks) == 5
    script = "\n".join(blocks) + (
        "\nimport json, attacks, defenses\n"
        "from securevfl.config import RunConfig\n"
        "from securevfl.lab.compose import execute\n"
        "cfg = RunConfig(dataset='wine', method='my-split', defense='clip-grad:0.5', attacks=['majority'])\n"
        "cfg.train.epochs = 1\n"
        "cfg.method_params = {'fraction': 0.5}\n"
        "r = execute(cfg, progress=False).to_json()\n"
        "print(json.dumps({'utility': r['utility']['test'], 'attack': r['attacks']['majority']['value'],\n"
        "                  'defense': r['privacy']}, default=str))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0 <= r["utility"] <= 1 and 0 <= r["attack"] <= 1


def test_ray_engine_without_ray_says_what_to_install():
    """With Ray absent (find_spec says so), ``--engine ray`` is a one-line error naming the extra and
    ray is not listed; with it present (this environment, when installed) it is listed."""
    script = ("import importlib.util as u\n"
              "real = u.find_spec\n"
              "u.find_spec = lambda name, *a: None if name == 'ray' else real(name, *a)\n"
              "from securevfl.errors import UserError\n"
              "from securevfl.lab.engine import ENGINES, make_engine\n"
              "assert ENGINES.names() == ['local'], ENGINES.names()\n"
              "try:\n"
              "    make_engine('ray', 1)\n"
              "except UserError as e:\n"
              "    print(e)\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "--engine ray needs the optional extra: pip install 'securevfl[ray]'"
    from securevfl.lab.engine import ENGINES

    assert ("ray" in ENGINES.names()) == (importlib.util.find_spec("ray") is not None)
