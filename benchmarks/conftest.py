"""The benchmark suite: ``pytest benchmarks/ --benchmark-only`` (kept out of the default test run:
``testpaths`` is ``tests/``).

Each benchmark measures one path users hit; where the issue sets a target, the test computes the
ratio inside this run (both sides measured in the same session, alternating), records it in the
benchmark's ``extra_info``, prints it in the summary at the end, and asserts it against the target
with a tolerance for noisy shared machines (``--bench-tolerance``, default 0.15 = 15 %).

    pytest benchmarks/ --benchmark-only                                   # run, print ratios
    pytest benchmarks/ --benchmark-only --benchmark-save=base             # keep a baseline
    pytest benchmarks/ --benchmark-only --benchmark-compare --benchmark-compare-fail=mean:20%
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # harness.py, also imported by the RESULTS scripts

from securevfl import threads  # noqa: E402

threads.configure()

_RATIOS: list[tuple[str, str, float, str, bool]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--bench-tolerance", type=float, default=0.15,
                     help="relative slack on every ratio target (noisy shared machines)")


class Targets:
    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance

    def check(self, benchmark, name: str, value: float, target: float | None, *, higher_is_better: bool = False,
              unit: str = "×") -> None:
        """Record ``value`` (printed in the summary and the saved JSON) and assert it against ``target``."""
        benchmark.extra_info[name] = round(value, 4)
        if target is None:
            _RATIOS.append((benchmark.name, name, value, f"(reported){unit}", True))
            return
        benchmark.extra_info[f"{name}_target"] = target
        if higher_is_better:
            ok, limit, rel = value >= target * (1 - self.tolerance), target * (1 - self.tolerance), "≥"
        else:
            ok, limit, rel = value <= target * (1 + self.tolerance), target * (1 + self.tolerance), "≤"
        _RATIOS.append((benchmark.name, name, value, f"{rel} {target:g}{unit} (limit {limit:.3g})", ok))
        assert ok, f"{name} = {value:.3f}, target {rel} {target} (tolerance {self.tolerance:.0%})"


def timed(fn, into: list[float]):
    """``fn`` that also appends its own wall time to ``into`` (ratios use these, so they hold with
    ``--benchmark-disable`` too, where pytest-benchmark keeps no statistics)."""
    def run(*a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        into.append(time.perf_counter() - t0)
        return out
    return run


@pytest.fixture(scope="session")
def targets(request) -> Targets:
    return Targets(request.config.getoption("--bench-tolerance"))


def pytest_terminal_summary(terminalreporter) -> None:
    if not _RATIOS:
        return
    tr = terminalreporter
    tr.section("securevfl ratios (measured in this run)")
    for test, name, value, target, ok in _RATIOS:
        tr.write_line(f"{'ok  ' if ok else 'MISS'} {test:<42} {name:<28} {value:>12,.3f}  {target}")
