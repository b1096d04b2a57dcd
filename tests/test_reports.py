"""The committed reference reports are current (issue 34): each folder under ``reports/`` is listed in
``reports/manifest.yaml``, was made by this securevfl version from the current text of its sweep
files, and its setup lines print no ``None`` for a set value. Regenerate with
``python scripts/regenerate_reports.py NAME``."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

import securevfl

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"


def _script():
    spec = importlib.util.spec_from_file_location("regenerate_reports", ROOT / "scripts" / "regenerate_reports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found is not None
    return found.group(1)


MANIFEST = _script().load_manifest(REPORTS / "manifest.yaml")


def report_problems(name: str, entry: dict, text: str, version: str) -> list[str]:
    """What makes a committed report stale: another version, another sweep-file text, a None setting."""
    problems = []
    made = re.search(r"Report made by securevfl (\S+?),", text)
    if made is None:
        problems.append("no provenance line (made before reports recorded their version)")
    elif made.group(1) != version:
        problems.append(f"made by securevfl {made.group(1)}, this is {version}")
    for sweep in entry["sweeps"]:
        digest = hashlib.sha256((ROOT / sweep).read_bytes()).hexdigest()
        if f"`{sweep}` (sha256 `{digest}`)" not in text:
            problems.append(f"not made from the current text of {sweep} (sha256 {digest[:12]}…)")
    for line in text.splitlines():
        if line.startswith(("- Data:", "- Training:", "- Attack")) and re.search(r"\bNone\b| \? ", line):
            problems.append(f"setup line shows None or ? for a set value: {line.strip()}")
    return problems


def test_versions_agree():
    assert securevfl.__version__ == _version()


def test_every_report_folder_is_in_the_manifest():
    folders = {p.name for p in REPORTS.iterdir() if p.is_dir()}
    assert folders == set(MANIFEST), "reports/ and reports/manifest.yaml list different reports"
    readme = (REPORTS / "README.md").read_text()
    assert all(f"({name}/report.md)" in readme for name in MANIFEST)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_committed_report_is_current(name):
    text = (REPORTS / name / "report.md").read_text()
    assert report_problems(name, MANIFEST[name], text, _version()) == [], (
        f"reports/{name} is stale; regenerate it: python scripts/regenerate_reports.py {name}")


def test_stale_reports_are_caught():
    """Control: the check fails on a report made by another version, from another sweep text, or
    with a None in its setup line."""
    name, entry = "audit-breast-cancer", MANIFEST["audit-breast-cancer"]
    sweep = entry["sweeps"][0]
    digest = hashlib.sha256((ROOT / sweep).read_bytes()).hexdigest()
    good = (f"- Training: 5 epochs, batch 32, adam lr 0.001\n"
            f"- Report made by securevfl {_version()}, git commit x, with `securevfl report`.\n"
            f"- Sweep **{name}** from `{sweep}` (sha256 `{digest}`), run with `securevfl sweep`\n")
    assert report_problems(name, entry, good, _version()) == []
    assert report_problems(name, entry, good.replace(_version(), "0.0.1"), _version())
    assert report_problems(name, entry, good.replace(digest, "0" * 64), _version())
    assert report_problems(name, entry, good.replace("lr 0.001", "lr None"), _version())
    assert report_problems(name, entry, good + "- Attack **mc**: 100 steps on ? labeled rows\n", _version())
    assert report_problems(name, entry, "no provenance", _version())


def test_regenerate_commands(capsys):
    script = _script()
    assert script.main(["--dry-run", "matrix"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["securevfl sweep sweeps/matrix.yaml --store runs/matrix.sqlite --workers 2",
                   "securevfl sweep sweeps/matrix-tabular.yaml --store runs/matrix.sqlite --workers 2",
                   "securevfl report runs/matrix.sqlite --out reports/matrix"]
    assert script.main(["nope"]) == 2
    assert "error: no report nope" in capsys.readouterr().err


def test_the_methods_report_is_made_from_its_claims_and_needs_the_fetched_rows(capsys, monkeypatch, tmp_path):
    script = _script()
    assert script.main(["--dry-run", "methods"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("securevfl report runs/methods.sqlite --out reports/methods "
                       "--claims sweeps/methods/claims.yaml")
    refs = MANIFEST["methods"]["references"]
    assert len(out) == len(MANIFEST["methods"]["sweeps"]) + len(refs) + 1
    assert out[-2].startswith("python benchmarks/reference/fedhssl_authors.py ")  # the authors' arm, after ours
    monkeypatch.setattr(script, "ROOT", tmp_path)  # a clone without runs/data/
    assert script.main(["methods"]) == 2
    err = capsys.readouterr().err
    assert "needs runs/data/criteo_sample10k.txt" in err and "fetch_ctr_samples.py" in err
    monkeypatch.setattr(script, "ROOT", ROOT)  # the rows are there (or not: the authors' clone is asked first)
    for d in MANIFEST["methods"]["data"]:
        if not (ROOT / d).exists():
            return
    monkeypatch.delenv(refs[0]["clone"], raising=False)
    assert script.main(["methods"]) == 2
    assert f"set {refs[0]['clone']}" in capsys.readouterr().err


FOLD_PROBE = """<script>window.addEventListener('load', () => {
  const r = s => document.querySelector(s).getBoundingClientRect();
  document.body.setAttribute('data-fold', JSON.stringify({answer: r('ul.headline').bottom, img: r('img').bottom,
    height: window.innerHeight, answer_text: document.querySelector('ul.headline').innerText}));
});</script>"""


def first_viewport(html: Path, tmp: Path) -> dict:
    """Where the answer and the first plot end in a 1400 × 900 headless Chromium window."""
    import html as html_mod
    import json
    import subprocess

    exe = _script().chromium()
    if exe is None:
        pytest.skip("needs Debian's chromium (.ci/run installs it for the slow suite)")
    probe = tmp / "probe.html"
    probe.write_text(html.read_text() + FOLD_PROBE)
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'data-fold="([^"]*)"', dom)
    assert found, dom[:500]
    return json.loads(html_mod.unescape(found.group(1)))


@pytest.mark.slow
def test_main_jobs_first_screen_shows_the_answer_and_the_plot(tmp_path):
    """Issue 43 "look at it": the committed main job's report, opened at 1400 × 900, shows the
    recommendation and the trade-off plot without scrolling (reports/quick/first_screen.png is that view)."""
    fold = first_viewport(REPORTS / "quick" / "report.html", tmp_path)
    assert fold["answer"] <= fold["height"] and fold["img"] <= fold["height"], fold
    assert fold["answer_text"].startswith(("Pick ", "No defense here", "Federating does not pay")), fold
    assert (REPORTS / "quick" / "first_screen.png").stat().st_size > 50_000


@pytest.mark.slow
def test_first_viewport_probe_can_fail(tmp_path):
    """Control: the same probe on a page whose plot sits below a screen of text finds it below the fold."""
    page = tmp_path / "long.html"
    page.write_text("<html><body><ul class='headline'><li>Pick x</li></ul>" + "<p>text</p>" * 80
                    + "<img src='data:image/png;base64,iVBORw0KGgo=' width=100 height=100></body></html>")
    fold = first_viewport(page, tmp_path)
    assert fold["img"] > fold["height"]


def test_ctr_samples_are_checked_against_their_pinned_hashes(tmp_path, capsys):
    import hashlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("fetch_ctr_samples", ROOT / "scripts" / "fetch_ctr_samples.py")
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    good = hashlib.sha256(b"a\nb\n").hexdigest()
    assert fetch.assemble([b"a", b"b\n"], good, "x") == b"a\nb\n"  # each part ends with a newline
    with pytest.raises(ValueError, match="is not the pinned"):
        fetch.assemble([b"a\n", b"c\n"], good, "x")  # other bytes: refused
    assert fetch.main(["--out", str(tmp_path), "--from-mirror", str(tmp_path / "no-clone")]) == 2
    assert capsys.readouterr().err.startswith("error: criteo_sample10k.txt:")
