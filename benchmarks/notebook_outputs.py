"""Print a Jupyter notebook's stored code cells and their text outputs, without running anything.

docs/literature.md transcribes published numbers from the stored outputs of the MARVELL authors'
notebooks (OscarcarLi/label-protection @ 9f371c5). This prints those outputs, so that every
transcribed number can be checked against its source:

    git clone https://github.com/OscarcarLi/label-protection
    git -C label-protection checkout 9f371c5
    python benchmarks/notebook_outputs.py \
        label-protection/diff_methods_tradeoff_viz_save_memory-criteo.ipynb --grep evaluate_

Only the JSON is read (standard library); the notebook's code is never executed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def text_outputs(cell: dict) -> list[str]:
    """The printed text of a code cell's stored outputs (stream text or plain-text results)."""
    texts = []
    for out in cell.get("outputs", []):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else str(text)
        if text.strip():
            texts.append(text)
    return texts


def dump(path: Path, grep: str | None) -> int:
    """Print each code cell whose source contains ``grep`` (all with outputs if None); return how many."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: cannot read notebook {path}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    shown = 0
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", []))
        outputs = text_outputs(cell)
        if not outputs or (grep is not None and grep not in source):
            continue
        shown += 1
        print(f"--- cell {index}")
        print(source)
        for text in outputs:
            print(">>>", text.rstrip())
    return shown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--grep", help="only cells whose source contains this string")
    args = parser.parse_args(argv)
    if dump(args.notebook, args.grep) == 0:
        print("error: no matching code cell with stored output", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
