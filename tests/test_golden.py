"""Behaviour does not change under refactoring: each golden run (tests/golden_runs.py) reproduces
its recorded result. On the machine type the goldens were recorded on (same torch, CPU model and
kernel capability) plaintext runs must match exactly; elsewhere float results may differ in the last
bits and grow through training, so numbers are compared to 0.02 (and structure, counts and ε
exactly). HE runs draw masks from OS entropy: their numbers are compared to 1e-3 on the recording
machine. Refresh with ``python -m tests.golden_runs --write`` only in a commit that changes
behaviour on purpose, and say why in it."""

from __future__ import annotations

import json
import math

import pytest

from tests.golden_runs import GOLDEN, RUNS, fingerprint, run, sweep_rows

SAME_MACHINE = (GOLDEN / "fingerprint.json").exists() and json.loads(
    (GOLDEN / "fingerprint.json").read_text()) == fingerprint()


def compare(got: object, want: object, tol: float, path: str = "") -> list[str]:
    """Differences between two results, as readable paths (empty when they agree). Keys the result
    gained are allowed (a new setting at its default, a new report field): the recorded numbers
    still have to match, which is what catches a change of behaviour. A lost key is a difference."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}: keys {sorted(set(want) - set(got))} missing"] if set(want) - set(got) else []
        return out + [d for k in sorted(set(got) & set(want)) for d in compare(got[k], want[k], tol, f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: length {len(got)} != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in compare(g, w, tol, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        exact = tol == 0 or path.endswith(("epsilon", "delta"))
        ok = got == want or (math.isnan(got) and math.isnan(want)) if exact else math.isclose(got, want, abs_tol=tol)
        return [] if ok else [f"{path}: {got!r} != {want!r}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_run_reproduces(name):
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    he = RUNS[name].get("he", "off") != "off"
    tol = (1e-3 if he else 0.0) if SAME_MACHINE else 0.02
    diffs = compare(run(name), want, tol)
    assert not diffs, f"{name}: " + "; ".join(diffs[:8])


def test_golden_sweep_store_reproduces(tmp_path):
    want = json.loads((GOLDEN / "sweep.json").read_text())
    diffs = compare(json.loads(json.dumps(sweep_rows(tmp_path))), want, 0.0 if SAME_MACHINE else 0.02)
    assert not diffs, "; ".join(diffs[:8])


def test_compare_catches_a_changed_number():
    """Control: the comparison is not vacuous."""
    want = json.loads((GOLDEN / "digits-splitnn.json").read_text())
    changed = json.loads(json.dumps(want))
    changed["utility"]["test"] += 1e-9
    assert compare(changed, want, 0.0) and not compare(want, want, 0.0)
    changed["cost"]["bytes_sent"] += 1
    assert any("bytes_sent" in d for d in compare(changed, want, 0.02))
