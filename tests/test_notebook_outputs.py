"""benchmarks/notebook_outputs.py, the reader docs/literature.md uses to check transcribed numbers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "notebook_outputs.py"
spec = importlib.util.spec_from_file_location("notebook_outputs", SCRIPT)
assert spec is not None and spec.loader is not None
notebook_outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(notebook_outputs)


def write_notebook(path: Path) -> Path:
    cells = [
        {"cell_type": "markdown", "source": ["evaluate_ in prose"]},
        {"cell_type": "code", "source": ["evaluate_single_run(...)"],
         "outputs": [{"output_type": "execute_result",
                      "data": {"text/plain": ["(0.780952513217926, 0.4510853886604309, 'no_noise')"]}}]},
        {"cell_type": "code", "source": ["for a in b: print(a)"],
         "outputs": [{"output_type": "stream", "text": ["0.7687 0.1172 KL_fixed_scale1.0\n"]}]},
        {"cell_type": "code", "source": ["evaluate_ without output"], "outputs": []},
    ]
    path.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    return path


def test_prints_the_stored_outputs_of_matching_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb")
    assert notebook_outputs.dump(nb, "evaluate_") == 1
    out = capsys.readouterr().out
    assert "--- cell 1" in out and "0.4510853886604309" in out
    assert "KL_fixed_scale1.0" not in out  # filtered out by --grep
    assert notebook_outputs.dump(nb, None) == 2  # every code cell that has an output
    assert "KL_fixed_scale1.0" in capsys.readouterr().out


def test_bad_input_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as missing:
        notebook_outputs.main([str(tmp_path / "absent.ipynb")])
    assert missing.value.code == 2
    assert capsys.readouterr().err.startswith("error: cannot read notebook")
    nb = write_notebook(tmp_path / "nb.ipynb")
    with pytest.raises(SystemExit) as nothing:
        notebook_outputs.main([str(nb), "--grep", "no such source"])
    assert nothing.value.code == 2
