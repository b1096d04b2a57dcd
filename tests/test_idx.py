import gzip

import numpy as np
import pytest

from securevfl.data import load_dataset
from securevfl.data.builtin import read_idx
from securevfl.errors import UserError

from .conftest import write_idx


def make_idx_dir(folder, n_train=40, n_test=10, gz=False):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    files = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": np.arange(n_test) % 10,
    }
    for name, arr in files.items():
        path = folder / name
        write_idx(path, arr)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(path.read_bytes()))
            path.unlink()
    return files


@pytest.mark.parametrize("gz", [False, True])
def test_idx_from_data_dir_and_env(tmp_path, monkeypatch, gz):
    files = make_idx_dir(tmp_path / "mnist", gz=gz)
    ds = load_dataset("mnist", tmp_path)
    assert ds.X.shape == (50, 28, 28) and ds.test_mask.sum() == 10
    assert np.allclose(ds.X[0], files["train-images-idx3-ubyte"][0] / 255.0)
    monkeypatch.setenv("SECUREVFL_DATA", str(tmp_path))
    assert load_dataset("mnist", None).X.shape == (50, 28, 28)


def test_malformed_idx_is_user_error(tmp_path):
    p = tmp_path / "bad-idx"
    p.write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05ab")  # claims 5 values, has 2
    with pytest.raises(UserError, match="not a valid IDX"):
        read_idx(p)
