"""Behaviour does not change under refactoring: each golden run (tests/golden_runs.py) reproduces
its recorded result on any CPU. The set-up (configuration, partition, ε, message counts and sizes,
attack parameters) is compared exactly; numbers a training loop produced are chaotic in floating
point (a last-bit difference between CPU kernels grows through training), so each is compared to its
family's tolerance (:data:`tests.golden_runs.TOLERANCE`), measured by ``scripts/golden_spread.py``
under perturbed kernels (docs/install.md, "Golden runs on every CPU"). Refresh with
``python -m tests.golden_runs --write`` only in a commit that changes behaviour on purpose, and say
why in it."""

from __future__ import annotations

import json
import math

import pytest

from tests.golden_runs import GOLDEN, RUNS, TOLERANCE, family, float_leaves, run, sweep_rows


def compare(got: object, want: object, tol: float | None = None, path: str = "", he: bool = False) -> list[str]:
    """Differences between two results, as readable paths (empty when they agree). ``tol``: one
    tolerance for every float (0: exact); None: each number's family tolerance. Keys the result
    gained are allowed (a new setting at its default, a new report field): the recorded numbers
    still have to match, which is what catches a change of behaviour. A lost key is a difference."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}: keys {sorted(set(want) - set(got))} missing"] if set(want) - set(got) else []
        return out + [d for k in sorted(set(got) & set(want)) for d in compare(got[k], want[k], tol, f"{path}.{k}", he)]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: length {len(got)} != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in compare(g, w, tol, f"{path}[{i}]", he)]
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        t = tol if tol is not None else TOLERANCE.get(family(path, he), max(TOLERANCE.values()))
        ok = (got == want or (math.isnan(got) and math.isnan(want)) if t == 0
              else math.isclose(got, want, rel_tol=0.0, abs_tol=t))
        return [] if ok else [f"{path}: {got!r} != {want!r} (tolerance {t:g}, {family(path, he)})"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_run_reproduces(name):
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    diffs = compare(run(name), want, he=RUNS[name].get("he", "off") != "off")
    assert not diffs, f"{name}: " + "; ".join(diffs[:8])


def test_golden_sweep_store_reproduces(tmp_path):
    want = json.loads((GOLDEN / "sweep.json").read_text())
    diffs = compare(json.loads(json.dumps(sweep_rows(tmp_path))), want)
    assert not diffs, "; ".join(diffs[:8])


def test_compare_catches_a_changed_number():
    """Control: the comparison is not vacuous."""
    want = json.loads((GOLDEN / "digits-splitnn.json").read_text())
    changed = json.loads(json.dumps(want))
    changed["utility"]["test"] += 1e-9
    assert compare(changed, want, 0.0) and not compare(want, want, 0.0) and not compare(changed, want)
    changed["cost"]["bytes_sent"] += 1
    assert any("bytes_sent" in d for d in compare(changed, want))
    changed = json.loads(json.dumps(want))
    changed["partition"]["spec"]["test_fraction"] += 1e-12  # the set-up is exact
    assert compare(changed, want)


def test_families_cover_the_recorded_numbers():
    """Every recorded float has a family with a tolerance (a new field cannot fall through to a guess)."""
    for f in GOLDEN.glob("*.json"):
        if f.stem == "fingerprint":
            continue
        he = f.stem.endswith(("ckks", "paillier"))
        missing = {family(p, he) for p, _ in float_leaves(json.loads(f.read_text()))} - set(TOLERANCE)
        assert not missing, f"{f.name}: families without a tolerance: {missing}"


def test_golden_fails_on_a_real_regression(monkeypatch):
    """The tolerances still catch a real change: model completion reporting its control (the untrained
    architecture) where its value belongs — the attack's control swapped in — fails the golden."""
    import attacks.base as base

    real = base.AttackResult.__init__

    def swapped(self, metric, value, prior, baseline, control, *a, **k):  # type: ignore[no-untyped-def]
        real(self, metric, control if control is not None else value, prior, baseline, value, *a, **k)

    monkeypatch.setattr(base.AttackResult, "__init__", swapped)
    want = json.loads((GOLDEN / "digits-splitnn-iso-mc.json").read_text())
    diffs = compare(run("digits-splitnn-iso-mc"), want)
    assert any(".attacks.mc.value" in d for d in diffs), diffs


def test_a_control_message_is_as_long_whatever_the_last_bits():
    """Issue 51: a training result sent as JSON text (a loss in a control message) changed the message's
    length with its last bits, so byte counts moved with the CPU's kernels. Floats now cross at a fixed
    width; the control shows that plain JSON text does not."""
    import numpy as np

    from securevfl.channel.codec import decode_json, encode_json

    for x in (0.1, 1 / 3, 2.5e-7, -3.75, 123456.789):
        y = float(np.nextafter(x, np.inf))
        assert len(encode_json({"loss": [x, 1.0]})) == len(encode_json({"loss": [y, 1.0]}))
        assert decode_json(encode_json({"loss": [x]})) == {"loss": [x]}  # the same float back
    assert len(json.dumps(0.1)) != len(json.dumps(float(np.nextafter(0.1, np.inf))))  # the control


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["aten-default", "aten-avx2", "mkl-compatible", "all-avx2"])
def test_byte_counts_do_not_move_with_the_cpu_kernels(variant):
    """Every byte count of the runs whose control messages carry training results (local SSL losses,
    SCARF losses) is exact under each kernel variant of scripts/golden_spread.py."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("golden_spread", root / "scripts" / "golden_spread.py")
    assert spec is not None and spec.loader is not None
    spread = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spread)
    names = ["digits-fedlocal-simsiam", "cancer-vflhlp"]
    script = ("import json, sys; from tests.golden_runs import run; "
              "print(json.dumps({n: run(n) for n in sys.argv[1:]}))")  # the runs alone, not the golden sweep
    out = subprocess.run([sys.executable, "-c", script, *names], cwd=root, check=True, capture_output=True, text=True,
                         env={**os.environ, **spread.KERNELS[variant]})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for name in names:
        want = json.loads((GOLDEN / f"{name}.json").read_text())
        assert got[name]["cost"]["bytes_by_kind"] == want["cost"]["bytes_by_kind"], name
        assert got[name]["cost"]["bytes_sent"] == want["cost"]["bytes_sent"], name
