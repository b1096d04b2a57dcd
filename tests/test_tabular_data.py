import json

import numpy as np
import pandas as pd
import pytest
import torch

from securevfl.cli import main
from securevfl.data import DataConfig, PartitionSpec, load_dataset, make_partition
from securevfl.data.synthetic import write_avazu, write_criteo
from securevfl.data.tabular import encode_vocab, fit_vocab, hash_values
from securevfl.errors import UserError
from securevfl.models import TabularEncoder

CRITEO_ROW = ["1", "5", "", "3", "0", "12", "", "1", "2", "40", "", "1", "0", "7"] + \
    ["68fd1e64", "80e26c9b", "", "85dd697c"] + ["25c83c98"] * 22


def write(path, lines, newline="\n"):
    path.write_text(newline.join(lines) + newline)
    return path


# ------------------------------------------------------------------------------------------- Criteo
def test_criteo_parses_values_and_missing(tmp_path):
    row2 = list(CRITEO_ROW)
    row2[0], row2[1], row2[15] = "0", "", "deadbeef"
    f = write(tmp_path / "train.txt", ["\t".join(CRITEO_ROW), "\t".join(row2)])
    ds = load_dataset("criteo", DataConfig(path=str(f)))
    assert ds.y.tolist() == [1, 0]
    assert ds.X.shape == (2, 13) and ds.categorical.shape == (2, 26)
    assert ds.X[0, 0] == 5 and np.isnan(ds.X[0, 1]) and ds.X[0, 11] == 0 and np.isnan(ds.X[1, 0])
    assert ds.categorical[0, 0] == hash_values(np.array(["68fd1e64"]))[0]
    assert ds.categorical[0, 1] != ds.categorical[1, 1]  # 80e26c9b vs deadbeef
    assert ds.categorical[0, 2] == hash_values(np.array([""]))[0]  # missing is its own category


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r[:-1], "line 2: expected 40 fields, found 39"),
    (lambda r: r + ["x"], "line 2: expected 40 fields, found 41"),
    (lambda r: [r[0], "abc", *r[2:]], "line 2: I1 is 'abc', expected an integer"),
    (lambda r: [r[0], "1.5", *r[2:]], "line 2: I1 is '1.5', expected an integer"),
    (lambda r: ["2", *r[1:]], "line 2: label is '2', expected 0 or 1"),
])
def test_criteo_malformed_lines(tmp_path, mutate, needle):
    f = write(tmp_path / "train.txt", ["\t".join(CRITEO_ROW), "\t".join(mutate(list(CRITEO_ROW))),
                                       "\t".join(CRITEO_ROW)])
    with pytest.raises(UserError, match=needle) as e:
        load_dataset("criteo", DataConfig(path=str(f)))
    assert str(f) in str(e.value)


def test_criteo_max_rows_and_sampling(tmp_path):
    f = write_criteo(tmp_path / "c.txt", 500, seed=1)
    assert len(load_dataset("criteo", DataConfig(path=str(f), max_rows=123)).y) == 123
    half = load_dataset("criteo", DataConfig(path=str(f), sample=0.5))
    again = load_dataset("criteo", DataConfig(path=str(f), sample=0.5, max_rows=10**6))
    assert 180 < len(half.y) < 320 and np.array_equal(half.y, again.y)  # sampler is seeded


def test_vocab_from_training_rows_unseen_is_unknown():
    tr = hash_values(np.array(["a", "a", "b", "b", "b", "c"]))
    vocab = fit_vocab(tr, min_freq=2)  # "c" is rare
    ids = encode_vocab(hash_values(np.array(["a", "b", "c", "zzz"])), vocab)
    assert ids[0] > 0 and ids[1] > 0 and ids[0] != ids[1]
    assert ids[2] == 0 and ids[3] == 0


def test_partition_fits_categoricals_on_training_rows(tmp_path):
    f = write_criteo(tmp_path / "c.txt", 800, seed=2)
    ds = load_dataset("criteo", DataConfig(path=str(f)))
    part = make_partition(ds, PartitionSpec(columns="vflhlp"), 0, DataConfig(min_freq=3))
    active, passive = part.parties
    assert active.n_numeric == 0 and len(active.cardinalities) == 26  # VFLHLP: active = categorical
    assert passive.n_numeric == 13 and passive.cardinalities == ()
    assert np.allclose(passive.X_train.mean(0), 0, atol=1e-4)  # standardised on its training rows
    assert np.isfinite(passive.X_train).all() and np.isfinite(passive.X_test).all()  # NaN imputed
    # every training-row category below min_freq, and every unseen test category, is id 0
    for j, card in enumerate(active.cardinalities):
        ids_tr = active.X_train[:, j].astype(int)
        assert ids_tr.max() < card
        counts = np.bincount(ids_tr, minlength=card)
        assert (counts[1:] >= 3).all()
    raw = ds.categorical[np.searchsorted(ds.ids, active.test_ids), 0]
    raw_train = ds.categorical[np.searchsorted(ds.ids, active.train_ids), 0]
    unseen = ~np.isin(raw, raw_train)
    assert (active.X_test[unseen, 0] == 0).all()


def test_hash_buckets(tmp_path):
    f = write_criteo(tmp_path / "c.txt", 300, seed=3)
    ds = load_dataset("criteo", DataConfig(path=str(f)))
    part = make_partition(ds, PartitionSpec(), 0, DataConfig(hash_buckets=16))
    assert set(part.active.cardinalities) == {17}
    cat = part.active.X_train[:, part.active.n_numeric:]
    assert cat.min() >= 1 and cat.max() <= 16


def test_tabular_encoder_shapes():
    enc = TabularEncoder(2, (5, 3), emb_dim=4, hidden=(8,), out_dim=6)
    x = torch.tensor([[0.1, -0.2, 4.0, 0.0], [1.0, 2.0, 0.0, 2.0]])
    assert enc(x).shape == (2, 6)


# -------------------------------------------------------------------------------------------- Avazu
AVAZU_HEAD = "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category," \
    "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21"
AVAZU_ROW = "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22," \
    "a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79"


def test_avazu_clean_and_hour_of_day(tmp_path):
    row2 = AVAZU_ROW.replace(",0,14102100,", ",1,14102123,")
    f = write(tmp_path / "train.csv", [AVAZU_HEAD, AVAZU_ROW, row2])
    ds = load_dataset("avazu", DataConfig(path=str(f)))
    assert ds.y.tolist() == [0, 1] and ds.categorical.shape == (2, 22) and ds.X.shape == (2, 0)
    assert ds.categorical[0, 0] == hash_values(np.array([0]))[0]  # hour 00
    assert ds.categorical[1, 0] == hash_values(np.array([23]))[0]  # hour 23
    assert "id" not in ds.cat_names and "click" not in ds.cat_names


@pytest.mark.parametrize("variant", ["index_column", "float_ids", "crlf", "truncated_last"])
def test_avazu_real_world_variants(tmp_path, variant, capsys):
    orig = [AVAZU_ROW, AVAZU_ROW.replace(",0,14102100,", ",1,14102105,")]
    head, rows, newline = AVAZU_HEAD, list(orig), "\n"
    if variant == "index_column":
        head, rows = "," + head, [f"{i},{r}" for i, r in enumerate(rows)]
    elif variant == "float_ids":
        rows = ["1.000009418151094e+19" + r[r.index(","):] for r in rows]
    elif variant == "crlf":
        newline = "\r\n"
    f = tmp_path / "train.csv"
    text = newline.join([head, *rows]) + newline
    if variant == "truncated_last":
        text += AVAZU_ROW[:40]  # an interrupted copy: no newline, too few fields
    f.write_text(text, newline="")
    ds = load_dataset("avazu", DataConfig(path=str(f)))
    assert ds.y.tolist() == [0, 1]
    base = load_dataset("avazu", DataConfig(path=str(write(tmp_path / "b.csv", [AVAZU_HEAD, *orig]))))
    assert np.array_equal(ds.categorical, base.categorical)  # same features as the clean file
    if variant == "truncated_last":
        assert "line 4: truncated last line skipped" in capsys.readouterr().err


@pytest.mark.parametrize("lines,needle", [
    (["id,click,hour,C1", AVAZU_ROW], "line 1: not an Avazu header"),
    ([AVAZU_HEAD, AVAZU_ROW, AVAZU_ROW[:40], AVAZU_ROW], "line 3: expected 24 fields, found"),
    ([AVAZU_HEAD, AVAZU_ROW.replace(",0,14102100,", ",yes,14102100,")], "line 2: click is 'yes'"),
    ([AVAZU_HEAD, AVAZU_ROW.replace(",14102100,", ",14102199,")], "line 2: hour is '14102199'"),
    ([AVAZU_HEAD, "abc" + AVAZU_ROW[AVAZU_ROW.index(","):]], "line 2: id is 'abc'"),
])
def test_avazu_rejects_what_is_ambiguous(tmp_path, lines, needle, capsys):
    f = write(tmp_path / "train.csv", lines)
    assert main(["train", "--dataset", "avazu", "--data-path", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and str(f) in err and needle in err


# --------------------------------------------------------------------------------------- UCI credit
UCI_HEAD = ["ID", "LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE", "PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5",
            "PAY_6", *[f"BILL_AMT{i}" for i in range(1, 7)], *[f"PAY_AMT{i}" for i in range(1, 7)],
            "default.payment.next.month"]


def uci_file(path, n=200, seed=0, bad=None):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.integers(0, 5000, size=(n, len(UCI_HEAD))), columns=UCI_HEAD)
    df["ID"] = np.arange(1, n + 1)
    df["SEX"] = rng.integers(1, 3, n)
    df["default.payment.next.month"] = (df["PAY_0"] > 2500).astype(int)
    if bad:
        df = df.astype(object)
        df.loc[bad[0], bad[1]] = bad[2]
    df.to_csv(path, index=False)
    return path


def test_uci_credit_loads_and_trains(tmp_path, capsys):
    f = uci_file(tmp_path / "uci_credit_card.csv")
    ds = load_dataset("uci-credit", DataConfig(path=str(f)))
    assert ds.X.shape == (200, 20) and ds.categorical.shape == (200, 3) and ds.n_classes == 2
    assert main(["train", "--dataset", "uci-credit", "--data-dir", str(tmp_path), "--fields", "fate", "--epochs", "3",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["utility"]["metric"] == "auc" and r["partition"]["columns"] == {"active": 10, "passive1": 13}


@pytest.mark.parametrize("bad,needle", [((4, "AGE", "old"), "line 6: AGE is 'old'"),
                                        ((0, "default.payment.next.month", 3), "expected 0 or 1"),
                                        ((1, "ID", 1), "duplicate ID 1")])
def test_uci_credit_errors(tmp_path, bad, needle):
    f = uci_file(tmp_path / "u.csv", bad=bad)
    with pytest.raises(UserError, match=needle):
        load_dataset("uci-credit", DataConfig(path=str(f)))


# ----------------------------------------------------------------------------------------- end to end
def test_criteo_and_avazu_train_end_to_end(tmp_path, capsys):
    c = write_criteo(tmp_path / "c.txt", 3000, seed=4)
    assert main(["train", "--dataset", "criteo", "--data-path", str(c), "--fields", "vflhlp", "--epochs", "3",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["utility"]["test"] > 0.7 and r["partition"]["columns"] == {"active": 26, "passive1": 13}
    a = write_avazu(tmp_path / "a.csv", 3000, seed=5)
    assert main(["train", "--dataset", "avazu", "--data-path", str(a), "--parties", "3", "--fields", "vflhlp",
                 "--epochs", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["utility"]["test"] > 0.7 and r["partition"]["columns"] == {"active": 7, "passive1": 7, "passive2": 8}


def test_preset_errors(tmp_path, capsys):
    a = write_avazu(tmp_path / "a.csv", 200)
    assert main(["train", "--dataset", "avazu", "--data-path", str(a), "--fields", "vflhlp"]) == 2
    assert "lists 3 parties but --parties is 2" in capsys.readouterr().err
    assert main(["train", "--dataset", "avazu", "--data-path", str(a), "--fields", "nosuch"]) == 2
    assert "no field preset 'nosuch'" in capsys.readouterr().err
    assert main(["train", "--dataset", "criteo", "--data-path", str(tmp_path / "missing.txt")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_datasets_command_lists_every_dataset(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SECUREVFL_DATA", str(tmp_path))
    write_criteo(tmp_path / "train.txt", 10)
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("avazu", "breast-cancer", "criteo", "csv", "digits", "fashion-mnist", "mnist", "uci-credit"):
        assert name in out
    assert str(tmp_path / "train.txt") in out  # criteo found through $SECUREVFL_DATA
    assert "--data-path" in out  # avazu: says how to get it


def test_avazu_with_an_unnamed_leading_index_column(tmp_path, capsys):
    """Issue 42: a leading row index the header does not name (rows one field longer than the header) was
    refused ("line 2: expected 24 fields, found 25") although docs/datasets.md says it is tolerated. It is
    read as pandas reads it, said on stderr, and gives the same data as the file without it."""
    from securevfl.data import load_dataset
    from securevfl.data.dataset import DataConfig

    plain = write_avazu(tmp_path / "plain.csv", 120, seed=3)
    lines = plain.read_text().splitlines()
    indexed = tmp_path / "indexed.csv"
    indexed.write_text("\n".join([lines[0], *[f"{i},{ln}" for i, ln in enumerate(lines[1:])]]) + "\n")
    a = load_dataset("avazu", DataConfig(path=str(plain)))
    b = load_dataset("avazu", DataConfig(path=str(indexed)))
    assert "one name fewer than the rows" in capsys.readouterr().err
    assert (a.y == b.y).all() and (a.categorical == b.categorical).all()
