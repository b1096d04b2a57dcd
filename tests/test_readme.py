import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _blocks(text: str, lang: str) -> list[str]:
    return [b.split("```")[0] for b in text.split(f"```{lang}\n")[1:]]


def test_ci_runs_the_readme_test_command():
    readme = README.read_text()
    blocks = [b.split("```")[0].strip() for b in readme.split("```bash")[1:3]]
    assert blocks[1].endswith("&& pytest")
    assert blocks[1] in (ROOT / ".ci" / "run").read_text()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "ruff check ." in ci and "mypy" in ci  # the linter and the type checker gate every submission
    assert "securevfl sweep sweeps/quick.yaml" in blocks[0] and "securevfl report" in blocks[0]
    assert (ROOT / "sweeps" / "quick.yaml").is_file()


def test_quick_sweep_file_parses():
    from securevfl.lab.sweep import load_sweep

    sweep = load_sweep(ROOT / "sweeps" / "quick.yaml")
    assert sweep.name == "quick" and len(sweep.cells) == 3 + 2 * 4 * 3


def test_readme_is_a_front_door():
    """The README stays short (the issue's bound); the reference lives in docs/."""
    assert len(README.read_text().splitlines()) <= 250


def test_readme_sweep_example_parses():
    from securevfl.lab.sweep import parse_sweep

    (example,) = _blocks(README.read_text(), "yaml")
    sweep = parse_sweep(yaml.safe_load(example), "README")
    assert sweep.name == "mine" and sweep.swept_keys == ["aligned_fraction"]


def test_readme_extension_sketch_is_one_that_the_tests_run():
    """The README's Python sketches are copies of docs/extending.md's (which
    tests/test_registry.py runs) or of docs/architecture.md's API example."""
    readme = README.read_text()
    docs = (ROOT / "docs" / "extending.md").read_text() + (ROOT / "docs" / "architecture.md").read_text()
    blocks = _blocks(readme, "python")
    assert len(blocks) == 2
    for block in blocks:
        assert block in docs, block[:200]


def test_links_in_readme_and_docs_resolve():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, broken
