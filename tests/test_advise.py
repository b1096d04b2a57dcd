"""``securevfl advise`` (issue 63): the situation measured on the user's files maps to the method of
docs/which-method.md, each rule with a file that takes it and one that does not."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from securevfl.cli import main
from securevfl.operations.advise import advise, situation


def files(tmp_path, n_active: int, aligned: int, labeled_aligned: int, labeled_outside: int,
          active_features: bool = True, tag: str = "") -> list[str]:
    rng = np.random.default_rng(0)
    ids = [f"c{i}" for i in range(n_active)]
    y = [""] * n_active
    for i in range(labeled_aligned):
        y[i] = str(i % 2)
    for i in range(aligned, aligned + labeled_outside):
        y[i] = str(i % 2)
    active = pd.DataFrame({"id": ids, "y": y})
    if active_features:
        active["a0"] = rng.normal(size=n_active)
        active["band"] = rng.choice(["low", "high"], size=n_active)
    passive = pd.DataFrame({"id": ids[:aligned] + [f"p{i}" for i in range(50)], "b0": rng.normal(size=aligned + 50)})
    fa, fp = tmp_path / f"a{tag}.csv", tmp_path / f"p{tag}.csv"
    active.to_csv(fa, index=False)
    passive.to_csv(fp, index=False)
    return [str(fa), str(fp)]


@pytest.mark.parametrize(("shape", "method"), [
    ({"n_active": 1000, "aligned": 900, "labeled_aligned": 900, "labeled_outside": 0}, "splitnn"),
    ({"n_active": 3000, "aligned": 2000, "labeled_aligned": 50, "labeled_outside": 0}, "fedhssl"),
    ({"n_active": 1000, "aligned": 100, "labeled_aligned": 100, "labeled_outside": 800}, "vflhlp"),
    ({"n_active": 1000, "aligned": 200, "labeled_aligned": 200, "labeled_outside": 300}, "risa"),
    ({"n_active": 1000, "aligned": 500, "labeled_aligned": 500, "labeled_outside": 0}, "splitnn"),  # no regime
])
def test_each_situation_maps_to_its_first_method(tmp_path, shape, method):
    s = situation(files(tmp_path, **shape), "y")
    assert s.aligned == shape["aligned"] and s.labeled_aligned == shape["labeled_aligned"]
    assert s.labeled_outside == shape["labeled_outside"] and s.feature_types[0] == {"numeric": 1, "categorical": 1}
    a = advise(s)
    assert a["try_first"] == method and {"local", "splitnn", method} <= set(a["compare"])
    if shape["aligned"] == 500:  # the fallback says no measured regime matches
        assert "no regime" in a["measured"]


def test_a_label_only_host_is_entity_aug_and_the_cli_says_so(tmp_path, capsys):
    given = files(tmp_path, 1000, 100, 100, 800, active_features=False)
    assert main(["advise", "--party-file", given[0], "--party-file", given[1], "--label-column", "y", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["try_first"] == "entity-aug" and out["situation"]["aligned_share"] == 0.1
    # control: the same files with features at the active party read as vflhlp's situation
    with_features = files(tmp_path, 1000, 100, 100, 800, tag="f")
    assert advise(situation(with_features, "y"))["try_first"] == "vflhlp"
    assert main(["advise", "--party-file", given[0], "--party-file", given[1], "--label-column", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "'nope'" in err[0]
