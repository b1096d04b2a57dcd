from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```")[0].strip() for b in readme.split("```bash")[1:3]]
    assert blocks[1].endswith("&& pytest")
    assert blocks[1] in (ROOT / ".ci" / "run").read_text()
    assert "securevfl sweep sweeps/quick.yaml" in blocks[0] and "securevfl report" in blocks[0]
    assert (ROOT / "sweeps" / "quick.yaml").is_file()


def test_quick_sweep_file_parses():
    from securevfl.lab.sweep import load_sweep

    sweep = load_sweep(ROOT / "sweeps" / "quick.yaml")
    assert sweep.name == "quick" and len(sweep.cells) == 3 + 3 * 3 * 3
