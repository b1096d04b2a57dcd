"""The one run pipeline (securevfl.lab.compose.execute): it never changes the caller's config, it
records the config that ran, and RunResult.to_json is strict JSON."""

import copy
import json
import math

import pytest

from securevfl.errors import UserError
from securevfl.lab.compose import check_compatibility, execute, resolve_config
from securevfl.methods import METHODS, MethodContext
from securevfl.result import RunResult


def test_execute_leaves_the_callers_config_alone_and_records_what_ran(digits_cfg):
    digits_cfg.train.epochs = 1
    digits_cfg.dataset, digits_cfg.method = "breast-cancer", "fedud"  # binary (for norm); fedud has partition defaults
    digits_cfg.partition.aligned_fraction = 0.5
    digits_cfg.attacks = ["mc:n_aux=20,steps=20", "norm"]  # norm reads the transcript: recording switches on
    before = copy.deepcopy(digits_cfg.to_dict())
    run = execute(digits_cfg, progress=False)
    assert isinstance(run, RunResult)
    assert digits_cfg.to_dict() == before
    ran = run.to_json()["config"]
    # control: the recorded config is the resolved one, so it differs from the input where defaults filled in
    assert before["optim"]["lr"] is None and ran["optim"]["lr"] is not None
    assert before["partition"]["active_labels_unaligned"] is None and ran["partition"]["active_labels_unaligned"]
    assert ran["partition"]["test_aligned_fraction"] == "train"
    assert ran["record"] is True and before["record"] is False
    assert set(run.attacks) == {"mc", "norm"}


def test_to_json_is_strict_json(digits_cfg):
    digits_cfg.train.epochs = 1
    run = execute(digits_cfg, progress=False)
    run.utility["test"] = math.nan  # NaN in a result becomes null, never an invalid JSON token
    text = json.dumps(run.to_json(), allow_nan=False)
    assert json.loads(text)["utility"]["test"] is None


def test_resolve_config_returns_a_copy(digits_cfg):
    resolved = resolve_config(digits_cfg)
    assert resolved is not digits_cfg and resolved.optim.lr is not None and digits_cfg.optim.lr is None


@pytest.mark.parametrize("change, message", [
    (dict(he="ckks", method="local"), "sends no passive activations"),
    (dict(he="ckks", method="fedud"), "fedud"),
    (dict(method="splitnn", partition_active_features=False), "needs features at the active party"),
])
def test_check_compatibility_refuses_in_one_place(digits_cfg, change, message):
    for key, value in change.items():
        if key.startswith("partition_"):
            setattr(digits_cfg.partition, key.removeprefix("partition_"), value)
        else:
            setattr(digits_cfg, key, value)
    cfg = resolve_config(digits_cfg)
    method = METHODS.get(cfg.method)(MethodContext(params=cfg.method_params))
    with pytest.raises(UserError, match=message):
        check_compatibility(cfg, method, [], [])
    cfg.he, cfg.partition.active_features = "off", True  # control: the same method and config otherwise pass
    check_compatibility(cfg, method, [], [])
