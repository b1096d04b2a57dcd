"""securevfl's core never imports attacks or defenses; only the composition layer (lab, cli) may."""

import ast
from pathlib import Path

import securevfl

ROOT = Path(securevfl.__file__).parent
ALLOWED = {ROOT / "lab", ROOT / "cli.py"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_core_does_not_import_attacks_or_defenses():
    offenders = []
    for path in ROOT.rglob("*.py"):
        if any(path == a or a in path.parents for a in ALLOWED):
            continue
        bad = imported_roots(path) & {"attacks", "defenses"}
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {bad}")
    assert offenders == []


def test_composition_layer_does_import_them():
    assert {"attacks", "defenses"} <= imported_roots(ROOT / "lab" / "compose.py")
