"""The layers (docs/architecture.md): the attack lab (``attacks``, ``securevfl/lab``) sits on top; the
core below it (parties, channel, methods, crypto, the run pipeline, deployment) and a party's own
protection (``defenses``, ``securevfl/party_settings.py``) never import it. Only the CLI, which
launches both, reaches into the lab, and only per command."""

import ast
from pathlib import Path

import securevfl

ROOT = Path(securevfl.__file__).parent
DEFENSES = ROOT.parent / "defenses"
LAB = ROOT / "lab"
LAUNCHERS = set((ROOT / "cli").rglob("*.py"))
"""The command line launches the lab's commands (each imports its part lazily)."""


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute imports, at any depth of the file)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _offenders(files, forbidden) -> list[str]:
    bad = []
    for path in files:
        hit = {m for m in imported(path) if any(m == f or m.startswith(f + ".") for f in forbidden)}
        if hit:
            bad.append(f"{path.relative_to(ROOT.parent)} imports {sorted(hit)}")
    return bad


def test_core_imports_neither_the_attacks_nor_the_lab() -> None:
    core = [p for p in ROOT.rglob("*.py") if LAB not in p.parents and p not in LAUNCHERS]
    assert _offenders(core, {"attacks", "securevfl.lab"}) == []


def test_a_partys_own_protection_imports_nothing_of_the_lab() -> None:
    assert _offenders(DEFENSES.rglob("*.py"), {"attacks", "securevfl.lab"}) == []


def test_the_lab_is_where_the_attacks_are_imported() -> None:
    assert "attacks" in imported(LAB / "compose.py")  # the control: the check sees an import where one is
    assert _offenders([LAB / "compose.py"], {"attacks"})


def test_a_passive_partys_process_never_loads_the_attacks(tmp_path_factory) -> None:
    """``securevfl party`` serves a whole run (its own defense included) with no module of ``attacks`` or
    of the lab in its process: what a passive organisation runs is the core and its own protection."""
    import json
    import os
    import subprocess
    import sys

    import pytest

    pytest.importorskip("grpc")
    from securevfl.channel.grpc import GrpcChannel, NetConfig, TLSFiles
    from securevfl.deploy import train_deployed
    from tests.test_grpc import files as make_files
    from tests.test_grpc import small_cfg

    files = make_files.__wrapped__(tmp_path_factory)
    report = tmp_path_factory.mktemp("modules") / "loaded.json"
    wrapper = report.parent / "party.py"
    wrapper.write_text(
        "import atexit, json, sys\n"
        "from securevfl.cli import main\n"
        "atexit.register(lambda: open(sys.argv[1], 'w').write(json.dumps(sorted(m for m in sys.modules if "
        "m.split('.')[0] == 'attacks' or m.startswith('securevfl.lab')))))\n"
        "sys.exit(main(sys.argv[2:]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(wrapper), str(report), "party", "--role", "passive1", "--listen", "127.0.0.1:0",
           "--party-file", str(files["host"]), "--tls", str(files["certs"] / "passive1"), "--timeout", "60",
           "--hidden", "16", "--cut-dim", "4", "--defense", "embedding-dp:noise=1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        addr = proc.stderr.readline().split("listening on ")[1].split()[0]
        ch = GrpcChannel("active", NetConfig(TLSFiles.load(files["certs"] / "active", "active"), timeout=60),
                         peers={"passive1": addr})
        try:
            train_deployed(small_cfg(files, "guest"), ch, {"passive1": addr}, progress=False)
        finally:
            ch.close()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(report.read_text()) == []
