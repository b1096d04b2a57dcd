"""Issue 54, "bad input gets one line": a sweep's ``attack_search`` and a methods report's claims file.

Each mistake is one ``UserError`` (through the CLI: ``error: ...`` and exit status 2), never a
traceback, a silent loop or a MemoryError. No test here trains anything."""

from __future__ import annotations

import itertools
import json
import re
import time

import numpy as np
import pytest
import yaml

import attacks  # noqa: F401  (the attack, defense and method registries, slow to import: loaded once, at collection)
import defenses  # noqa: F401
import securevfl.methods  # noqa: F401
from securevfl.cli import main
from securevfl.errors import UserError
from securevfl.lab.report.methods import fill, load_claims
from securevfl.lab.sweep import parse_sweep

MAX_SEARCH_BUDGET = 10_000  # the stated maximum (securevfl.lab.sweep.MAX_SEARCH_BUDGET)

BASE = {"name": "t", "dataset": {"name": "digits", "aligned_fraction": 0.5}, "methods": ["splitnn"],
        "defenses": ["none"], "seeds": [0], "train": {"epochs": 1}}

# five parameters of mc with 100 values each: a space of 10^10 points
HUGE_SPACE = {"mc": {"n_aux": list(range(1, 101)), "steps": list(range(1, 101)), "batch_size": list(range(1, 101)),
                     "eval_rows": list(range(1, 101)), "baseline_rows": list(range(100))}}


def _search(search: dict, **extra) -> object:
    return parse_sweep({**BASE, "attacks": ["mc"], "attack_search": search, **extra})


# ------------------------------------------------------------------------------------- attack_search
@pytest.mark.parametrize("searcher", ["random", "tpe"])
def test_a_budget_above_the_maximum_is_one_line_naming_it(searcher):
    # before: tpe accepted it and its rounds would loop a billion times in silence
    with pytest.raises(UserError) as e:
        _search({"budget": 1_000_000_000, "searcher": searcher, "space": {"mc": {"steps": [5, 50]}}})
    msg = str(e.value)
    assert "'attack_search.budget'" in msg and f"{MAX_SEARCH_BUDGET:,}" in msg and "\n" not in msg


def test_the_maximum_budget_itself_is_accepted():
    from securevfl.lab import sweep

    assert sweep.MAX_SEARCH_BUDGET == MAX_SEARCH_BUDGET
    sw = _search({"budget": MAX_SEARCH_BUDGET, "searcher": "tpe", "space": {"mc": {"steps": [5, 50]}}},
                 max_cells=MAX_SEARCH_BUDGET)
    assert sw.search is not None and sw.search.budget == MAX_SEARCH_BUDGET


def test_a_tpe_search_counts_its_later_tries_towards_max_cells():
    # the rounds after try 0 are cells too: 2 seeds × 4,000 tries is more than the default 5,000
    with pytest.raises(UserError, match=re.escape("'max_cells'")):
        parse_sweep({**BASE, "seeds": [0, 1], "attacks": ["mc"],
                     "attack_search": {"budget": 4000, "searcher": "tpe", "space": {"mc": {"steps": [5, 50]}}}})


def test_a_space_of_ten_billion_points_is_sampled_lazily():
    # before: the whole grid was listed (itertools.product) and permuted: a MemoryError
    start = time.perf_counter()
    sw = _search({"budget": 5, "seed": 3, "space": HUGE_SPACE})
    assert time.perf_counter() - start < 2
    tries = [c for c in sw.cells if c.method == "splitnn"]
    assert [c.swept["search:try"] for c in tries] == [0, 1, 2, 3, 4]
    points = [json.dumps(c.config["attacks"], sort_keys=True) for c in tries]
    assert len(set(points)) == 5  # distinct points
    again = _search({"budget": 5, "seed": 3, "space": HUGE_SPACE})
    assert [c.run_id for c in again.cells] == [c.run_id for c in sw.cells]  # seeded: the same tries
    other = _search({"budget": 5, "seed": 4, "space": HUGE_SPACE})
    assert [c.run_id for c in other.cells][1:] != [c.run_id for c in sw.cells][1:]


def test_a_space_of_astronomically_many_points_is_sampled_too():
    space = {"mc": {k: list(range(1, 101)) for k in ("n_aux", "steps", "batch_size", "eval_rows")}
             | {"baseline_rows": list(range(100)), "baseline_ssl_epochs": list(range(100)),
                "lr": [i / 1000 for i in range(1, 101)], "lambda_u": [float(i) for i in range(1, 101)],
                "T": [i / 100 for i in range(1, 101)], "alpha": [i / 100 for i in range(1, 101)]}}
    sw = _search({"budget": 3, "space": space})  # 10^20 points: more than an int64 can index
    assert len(sw.cells) == 3


def test_a_small_space_keeps_its_old_tries():
    """Up to SEARCH_PERMUTED_MAX points the tries are what the listed grid gave before (stores keep their
    rows): the seeded permutation of the grid's indices, points in itertools.product order."""
    space = {"mc": {"steps": [5, 50, 100], "n_aux": [20, 40]}}
    sw = _search({"budget": 4, "seed": 1, "space": space})
    grid = list(itertools.product([5, 50, 100], [20, 40]))
    expected = []
    for i in np.random.default_rng(1).permutation(len(grid)):
        steps, n_aux = grid[i]
        expected.append([{"mc": {"steps": steps, "n_aux": n_aux}}])
    assert [c.config["attacks"] for c in sw.cells[1:]] == expected[:3]


def test_a_grid_point_is_found_by_its_index_without_the_grid():
    from securevfl.lab.sweep import SEARCH_PERMUTED_MAX, _grid_point

    axes = [("mc", "a", [1, 2, 3]), ("mc", "b", ["x", "y"]), ("fr", "c", [7, 8, 9, 10])]
    for i, point in enumerate(itertools.product([1, 2, 3], ["x", "y"], [7, 8, 9, 10])):
        p = _grid_point(axes, i)
        assert (p["mc"]["a"], p["mc"]["b"], p["fr"]["c"]) == point
    assert SEARCH_PERMUTED_MAX >= 1_000_000


def test_a_value_listed_twice_in_the_space_is_one_line():
    # before: accepted; a space of repeats is searched by draws that find nothing new
    with pytest.raises(UserError, match=re.escape("'attack_search.space.mc.steps'") + ".*listed twice"):
        _search({"budget": 3, "space": {"mc": {"steps": [5, 50, 5]}}})


def test_attack_parameter_lists_with_ten_billion_combinations_are_refused_before_expanding():
    # before: itertools.product over the attacks' own parameter lists ran before the size check
    start = time.perf_counter()
    with pytest.raises(UserError, match=re.escape("'max_cells'") + ".*10,000,000,000 combinations"):
        parse_sweep({**BASE, "attacks": [HUGE_SPACE]})
    assert time.perf_counter() - start < 1


def test_a_search_making_more_tries_than_max_cells_is_refused_as_it_counts():
    # before: the whole space was listed first (MemoryError), the cell count checked only after
    start = time.perf_counter()
    with pytest.raises(UserError, match=re.escape("'max_cells'") + ".*the attack search"):
        _search({"budget": MAX_SEARCH_BUDGET, "space": HUGE_SPACE}, max_cells=20)
    assert time.perf_counter() - start < 1


def test_a_sweep_file_with_a_huge_budget_through_the_cli(tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({**BASE, "attacks": ["mc"],
                                     "attack_search": {"budget": 10**9, "space": {"mc": {"steps": [5, 50]}}}}))
    assert main(["sweep", str(sweep), "--store", str(tmp_path / "s.sqlite"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "10,000" in err[0]


# ------------------------------------------------------------------------------------------ claims
GOOD = {"method": "splitnn", "title": "Split vs local", "paper": "a paper", "sweep": "m",
        "regime": "aligned_fraction", "headline": 0.2, "comparisons": [{"baseline": "local", "paper": 0.01}],
        "why": "it scored {utility.splitnn@0.2:.3f}"}


def _claims(tmp_path, content: object) -> str:
    path = tmp_path / "claims.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(yaml.safe_dump(content))
    return str(path)


def _refused(path: str, *words: str) -> str:
    with pytest.raises(UserError) as e:
        load_claims(path)
    msg = str(e.value)
    assert msg.startswith(f"--claims {path}") and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_a_good_claims_file_and_the_repository_s_own_load(tmp_path):
    assert load_claims(_claims(tmp_path, [GOOD]))[0]["method"] == "splitnn"
    assert len(load_claims("sweeps/methods/claims.yaml")) >= 1


@pytest.mark.parametrize("item, words", [(5, ["a number (5)"]), ("splitnn", ["text ('splitnn')"]),
                                         (None, ["nothing"]), ([1, 2], ["a list"])])
def test_a_claim_that_is_not_a_mapping(tmp_path, item, words):
    # before: set(5) -> TypeError; "splitnn".get -> AttributeError
    _refused(_claims(tmp_path, [GOOD, item]), "claim 2", "expected a mapping", *words)


@pytest.mark.parametrize("comparisons, words", [
    (["local"], ["comparisons[0]", "expected a mapping", "text ('local')"]),
    ([7], ["comparisons[0]", "a number (7)"]),
    ("local", ["comparisons", "expected a list"]),
    ([], ["comparisons", "an empty list"]),
    ({"baseline": "local"}, ["comparisons", "a mapping"]),
])
def test_a_comparison_that_is_not_a_mapping(tmp_path, comparisons, words):
    # before: comp.get on a str -> AttributeError while the report was being made
    _refused(_claims(tmp_path, [{**GOOD, "comparisons": comparisons}]), *words)


def test_a_comparison_without_its_baseline(tmp_path):
    # before: KeyError 'baseline' while the report was being made
    _refused(_claims(tmp_path, [{**GOOD, "comparisons": [{"paper": 0.1}]}]), "comparisons[0]", "baseline")


@pytest.mark.parametrize("comparison, words", [
    ({"baseline": "local", "papr": 0.1}, ["comparisons[0]", "unknown keys ['papr']"]),
    ({"baseline": 3}, ["comparisons[0]", "baseline"]),
    ({"baseline": "local", "paper": "0.1"}, ["comparisons[0]", "paper", "a number"]),
])
def test_a_comparison_with_a_wrong_field(tmp_path, comparison, words):
    # before: a typo'd key was ignored; a paper difference given as text was silently not shown
    _refused(_claims(tmp_path, [{**GOOD, "comparisons": [comparison]}]), *words)


def test_a_claim_missing_its_baseline_comparisons(tmp_path):
    claim = {k: v for k, v in GOOD.items() if k != "comparisons"}
    _refused(_claims(tmp_path, [claim]), "missing ['comparisons']")


@pytest.mark.parametrize("subset_at", ["claim", "comparison"])
def test_an_unknown_subset_is_refused_with_the_valid_ones(tmp_path, subset_at):
    # before: a typo ("unalinged") read the overall utility and labelled it with the typo
    claim = ({**GOOD, "subset": "unalinged"} if subset_at == "claim" else
             {**GOOD, "comparisons": [{"baseline": "local", "subset": "unalinged"}]})
    msg = _refused(_claims(tmp_path, [claim]), "subset", "'unalinged'", "all, aligned, unaligned")
    assert (subset_at == "comparison") == ("comparisons[0]" in msg)


def test_the_valid_subsets_are_accepted(tmp_path):
    claim = {**GOOD, "subset": "aligned", "comparisons": [{"baseline": "local", "subset": "unaligned"},
                                                          {"baseline": "local", "subset": "all"}]}
    assert load_claims(_claims(tmp_path, [claim]))


@pytest.mark.parametrize("why", ["{utility.splitnn@0.2:.3q}", "{x:d}", "{x:,,}", "{x:{y}"])
def test_a_bad_format_spec_in_why_is_refused_when_read(tmp_path, why):
    # before: the ValueError came out of format() at the end of the report
    with pytest.raises(ValueError):
        fill(why, {"utility.splitnn@0.2": 0.5, "x": 0.5})
    _refused(_claims(tmp_path, [{**GOOD, "why": "scored " + why}]), "why", "not a format for a number")


def test_a_huge_format_width_is_refused_without_trying_it(tmp_path):
    start = time.perf_counter()
    _refused(_claims(tmp_path, [{**GOOD, "why": "{x:999999999999.2f}"}]), "why", "width or precision")
    assert time.perf_counter() - start < 1


def test_a_claims_file_that_is_not_utf8(tmp_path):
    # before: UnicodeDecodeError from read_text()
    _refused(_claims(tmp_path, b"- method: \xff\xfe splitnn\n"), "not UTF-8")


@pytest.mark.parametrize("text", ["", "   \n\n", "# only a comment\n"])
def test_an_empty_claims_file(tmp_path, text):
    # before: one line too, but "expected a list of claims" without saying the file is empty
    _refused(_claims(tmp_path, text), "the file is empty", "expected a list of claims")


def test_a_recursive_claims_file(tmp_path):
    # before: a cyclic list whose only claim is itself: set(list) -> TypeError
    _refused(_claims(tmp_path, "&a [*a]\n"), "recursive alias")
    _refused(_claims(tmp_path, "- &c {method: splitnn, title: t, paper: p, sweep: m, comparisons: [*c]}\n"),
             "recursive alias")


@pytest.mark.parametrize("text, words", [
    ("method: splitnn\ntitle: t\n", ["expected a list of claims", "a mapping"]),
    ("splitnn\n", ["expected a list of claims", "text"]),
    ("[]\n", ["expected a list of claims", "an empty list"]),
    ("- [method, splitnn]\n", ["claim 1", "a list"]),
])
def test_a_claims_file_of_the_wrong_shape(tmp_path, text, words):
    _refused(_claims(tmp_path, text), *words)


@pytest.mark.parametrize("key, value, words", [
    ("headline", "abc", ["headline", "a number"]),
    ("method", 5, ["method", "text"]),
    ("why", ["a", "b"], ["why", "text"]),
    ("regime", {"a": 1}, ["regime", "text"]),
])
def test_a_claim_field_of_the_wrong_type(tmp_path, key, value, words):
    # before: float("abc"), re.sub on a list, .split on an int etc. failed in the middle of the report
    _refused(_claims(tmp_path, [{**GOOD, key: value}]), *words)


def test_a_missing_claims_file(tmp_path):
    _refused(str(tmp_path / "nope.yaml"), "no such file")


def test_claims_mistakes_through_the_cli_are_one_error_line(tmp_path, capsys):
    from securevfl.lab.store import Store

    Store(tmp_path / "s.sqlite").close()  # an (empty) store: the claims are read before any run is
    for content in ([GOOD, 5], [{**GOOD, "comparisons": ["local"]}], b"\xff\xfe", "&a [*a]\n",
                    [{**GOOD, "subset": "unalinged"}], [{**GOOD, "why": "{x:.3q}"}]):
        path = _claims(tmp_path, content)
        code = main(["report", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "rep"), "--claims", path])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"error: --claims {path}"), (content, err)
    assert not (tmp_path / "rep").exists()
