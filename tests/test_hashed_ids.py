"""``--hashed-ids`` (issue 64): string IDs held as their 64-bit hashes (int64), so that no Python object per ID
outlives its block; the parties still align on exactly the same rows, a deployed passive party follows the
active party's choice, and predictions name the original IDs."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd
import pytest

from securevfl.config import RunConfig
from securevfl.data.blocks import IdReader, hash_ids
from securevfl.errors import UserError
from securevfl.lab.compose import execute
from securevfl.lab.predict import predict
from securevfl.metrics import utility
from tests.test_serving import _write, frames  # noqa: F401 - the module fixture


def _cfg(files, hashed: bool) -> RunConfig:
    cfg = RunConfig(dataset="csv", method="splitnn", seed=1)
    cfg.data.party_files = list(files)
    cfg.data.label_column = "y"
    cfg.data.hashed_ids = hashed
    cfg.train.epochs, cfg.train.batch_size = 2, 32
    return cfg


def test_hashed_ids_align_the_same_rows_and_predictions_name_the_originals(tmp_path, frames):  # noqa: F811
    guest, host = frames
    files = _write(tmp_path, guest, host, "all")
    plain = execute(_cfg(files, False), progress=False)
    hashed = execute(_cfg(files, True), progress=False, save=tmp_path / "model")
    assert hashed.partition.active.test_ids.dtype == np.int64  # no Python string per ID
    assert plain.partition.active.test_ids.dtype == object  # control: the default keeps the strings
    def every_aligned(res, hashed: bool) -> set:  # the aligned training rows and the test rows
        part = res.partition
        rows = np.concatenate([part.aligned_ids, part.active.test_ids])
        return set((rows if hashed else hash_ids(rows)).tolist())

    assert len(every_aligned(hashed, True)) == 200 and every_aligned(hashed, True) == every_aligned(plain, False)
    # the saved model scores the run's own test rows as the run did, and writes the file's own IDs
    test = hashed.partition.active.test_ids
    keep = hash_ids(guest["id"].to_numpy(dtype=object))
    new = _write(tmp_path, guest[np.isin(keep, test)], host[np.isin(hash_ids(host["id"].to_numpy(dtype=object)), test)],
                 "new")
    predict(tmp_path / "model", list(new), tmp_path / "p.csv")
    pred = pd.read_csv(tmp_path / "p.csv", dtype={"id": str}).set_index("id")
    assert pred.index.str.startswith("c").all() and len(pred) == len(test)
    y = guest.set_index("id").loc[pred.index, "y"].to_numpy()
    assert utility(pred[["proba_0", "proba_1"]].to_numpy(), y, 2)["auc"] == pytest.approx(hashed.utility["auc"],
                                                                                           abs=1e-6)


def test_a_hashed_reader_keeps_no_string_per_id(tmp_path):
    """200,000 string IDs: what the reader keeps after reading is 8 bytes an ID, against ≈ 70+ for the strings
    (the control, the default reader, on the same column)."""
    from pathlib import Path

    ids = pd.Series([f"CUST-{i:012d}" for i in range(200_000)])
    kept = {}
    for hashed in (True, False):
        tracemalloc.start()
        reader = IdReader(Path("f.csv"), "id", numeric=False, hashed=hashed)
        for s in range(0, len(ids), 50_000):
            reader.add(ids.iloc[s:s + 50_000].copy())
        out = reader.finish()
        kept[hashed] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert out.dtype == (np.int64 if hashed else object)
        del reader, out
    assert kept[True] < 12 * len(ids) < kept[False] / 4


def test_hashed_and_numeric_ids_are_one_or_the_other(tmp_path, frames):  # noqa: F811
    guest, host = frames
    cfg = _cfg(_write(tmp_path, guest, host, "x"), True)
    cfg.data.numeric_ids = True
    with pytest.raises(UserError, match="--hashed-ids is for string IDs"):
        execute(cfg, progress=False)


def test_a_deployed_passive_party_follows_the_active_partys_choice():
    pytest.importorskip("grpc")
    from tests import test_grpc
    from tests.test_grpc import Passive, deploy, small_cfg

    files = test_grpc.files.__wrapped__(_Factory())
    base = deploy(files, small_cfg(files, "guest"), [Passive(files)])
    out = deploy(files, small_cfg(files, "guest", data__hashed_ids=True), [Passive(files)])
    assert out["partition"]["aligned"] == base["partition"]["aligned"] > 0


class _Factory:
    def mktemp(self, name: str):
        import tempfile
        from pathlib import Path

        return Path(tempfile.mkdtemp(prefix=name))
