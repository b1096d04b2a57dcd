"""The learning-rate search (issue 52): the same search for every arm and every stage, and a
validation split that can always score."""

from __future__ import annotations

import numpy as np

from securevfl.config import RunConfig
from securevfl.lab.compose import execute


def test_lr_search_validates_on_a_stratified_split_or_falls_back() -> None:
    """Issue 52: at 1 % aligned a 7-row random validation split held one class, every rate scored
    undefined and the cell ended "training diverged". The split is now stratified (every class with two
    rows or more has one held out) and, below MIN_VALIDATION rows, replaced by the grid's middle rate,
    said in the run's record — never reported as divergence."""
    from securevfl.training import MIN_VALIDATION, validation_split

    ids = np.arange(60)
    y = np.array([1] * 55 + [0] * 5)  # a rare class: a random 12-row split often misses it
    for seed in range(20):
        val = validation_split(ids, y, seed)
        assert not isinstance(val, str) and set(y[val]) == {0, 1} and len(val) == 12
    assert isinstance(validation_split(ids[:30], y[:30], 0), str)  # one class: no split can score
    assert isinstance(validation_split(ids[:5 * MIN_VALIDATION - 5], None, 0), str)  # too few rows
    cfg = RunConfig()
    cfg.dataset, cfg.method = "breast-cancer", "splitnn"
    cfg.partition.n_labeled = 30  # 6 validation rows: below the minimum
    cfg.train.epochs, cfg.train.lr_grid = 1, [0.001, 0.01, 0.1]
    r = execute(cfg, progress=False).to_json()
    search = r["method_info"]["lr_search"]
    assert search["chosen"] == 0.01 and "fewer than" in search["fallback"]


def test_every_stage_of_local_vfl_and_risa_searches_its_own_rate() -> None:
    """Issue 52: local-vfl trained at the optimiser's default rate (it has no self-training stage, whose
    search RISA's final stage reused); now the final stage searches the same grid on its rows with a
    true label."""
    for method in ("local-vfl", "risa"):
        cfg = RunConfig()
        cfg.dataset, cfg.method = "breast-cancer", method
        cfg.partition.aligned_fraction, cfg.partition.active_labels_unaligned = 0.3, True
        cfg.train.epochs, cfg.train.lr_grid = 1, [0.001, 0.03]
        cfg.optim.optimizer = "sgd"
        if method == "risa":
            cfg.method_params = {"self_training_epochs": 1}
        searches = execute(cfg, progress=False).to_json()["method_info"]["lr_searches"]
        assert set(searches) == ({"final"} if method == "local-vfl" else {"self-training", "final"})
        assert searches["final"]["chosen"] in (0.001, 0.03) and set(searches["final"]["scores"]) == {"0.001", "0.03"}
