import numpy as np
import pytest

from securevfl.data import PartitionSpec, load_dataset, make_partition
from securevfl.errors import UserError


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_same_seed_same_partition_different_seed_different(digits):
    spec = PartitionSpec(aligned_fraction=0.3, n_labeled=50)
    a, b = make_partition(digits, spec, 1), make_partition(digits, spec, 1)
    c = make_partition(digits, spec, 2)
    assert a.fingerprint() == b.fingerprint()
    for pa, pb in zip(a.parties, b.parties, strict=True):
        assert np.array_equal(pa.train_ids, pb.train_ids) and np.array_equal(pa.X_train, pb.X_train)
    assert a.fingerprint() != c.fingerprint()
    assert not np.array_equal(np.sort(a.aligned_ids), np.sort(c.aligned_ids))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_disjoint_unaligned_and_aligned_is_intersection(digits, k):
    p = make_partition(digits, PartitionSpec(n_parties=k, aligned_fraction=0.25), 0)
    sets = [set(q.train_ids.tolist()) for q in p.parties]
    assert set.intersection(*sets) == set(p.aligned_ids.tolist())
    unaligned = [s - set(p.aligned_ids.tolist()) for s in sets]
    flat = [i for s in unaligned for i in s]
    assert len(flat) == len(set(flat))  # each unaligned entity at exactly one party
    n_train = len(set.union(*sets))
    assert len(p.aligned_ids) == round(0.25 * n_train)
    assert max(map(len, unaligned)) - min(map(len, unaligned)) <= 1  # split evenly
    # columns: every party a non-empty, disjoint block; together all 8 image columns
    cols = np.concatenate([q.columns for q in p.parties])
    assert sorted(cols.tolist()) == list(range(8))
    # test rows are aligned: every party holds features for the same test ids
    for q in p.passives:
        assert np.array_equal(q.test_ids, p.active.test_ids)
        assert q.y_test is None and q.label_ids is None  # passive parties hold no labels


def test_unaligned_all_and_labels(digits):
    p = make_partition(digits, PartitionSpec(aligned_fraction=0.5, unaligned="all", n_labeled=40,
                                             active_labels_unaligned=True), 0)
    assert np.array_equal(np.sort(p.parties[0].train_ids), np.sort(p.parties[1].train_ids))
    assert len(p.labeled_ids) == 40 and set(p.labeled_ids) <= set(p.aligned_ids)
    # active labels = 40 aligned + all its unaligned rows
    n_unaligned = len(p.active.train_ids) - len(p.aligned_ids)
    assert len(p.active.label_ids) == 40 + n_unaligned
    y_all = load_dataset("digits").y
    assert np.array_equal(p.active.y_labels, y_all[p.active.label_ids])  # ids are row indices


def test_image_halves(digits):
    p = make_partition(digits, PartitionSpec(), 0)
    assert p.active.X_train.shape[1:] == (8, 4) and p.passives[0].X_train.shape[1:] == (8, 4)
    i = p.active.train_ids[0]
    full = digits.X[i]
    assert np.array_equal(p.active.rows(np.array([i]))[0], full[:, :4])
    assert np.array_equal(p.passives[0].rows(np.array([i]))[0], full[:, 4:])


def test_tabular_standardised_on_training_rows_only():
    ds = load_dataset("breast-cancer")
    p = make_partition(ds, PartitionSpec(), 0)
    for q in p.parties:
        assert np.allclose(q.X_train.mean(0), 0, atol=1e-4)
        assert np.allclose(q.X_train.std(0), 1, atol=1e-3)
        assert not np.allclose(q.X_test.mean(0), 0, atol=1e-4)  # test rows use the train statistics


@pytest.mark.parametrize("kw,msg", [
    ({"aligned_fraction": -0.1}, "aligned-fraction"),
    ({"aligned_fraction": 1.5}, "aligned-fraction"),
    ({"n_parties": 1}, "parties"),
    ({"n_parties": 9}, "columns"),
    ({"n_labeled": 10_000}, "labeled"),
    ({"unaligned": "some"}, "unaligned"),
    ({"unaligned": "passive"}, "unaligned"),
    ({"columns": [[0, 1], [1, 2]]}, "same column"),
    ({"test_aligned_fraction": 0.0}, "test_aligned_fraction"),
    ({"test_aligned_fraction": "most"}, "test_aligned_fraction"),
    ({"train_rows": 5_000}, "train_rows 5000 exceeds"),
])
def test_bad_specs_are_user_errors(digits, kw, msg):
    with pytest.raises(UserError, match=msg):
        make_partition(digits, PartitionSpec(**kw), 0)


@pytest.mark.parametrize("ids", [np.arange(10, 20), np.array([5, 10**12, 7]), np.array(["a", "b", "c"], dtype=object)])
def test_id_index_lookup(ids):
    from securevfl.data.partition import IdIndex

    idx = IdIndex(ids)
    perm = ids[::-1]
    assert np.array_equal(idx.positions(perm), np.arange(len(ids))[::-1])
    missing = np.array(["zz"], dtype=object) if ids.dtype == object else np.array([-3, 10**13])
    assert (idx.positions(missing) == -1).all()


@pytest.mark.parametrize("alignment", ["given", "psi"])
def test_unaligned_test_rows_stay_at_the_active_party(digits, alignment):
    from securevfl.config import RunConfig
    from securevfl.lab.compose import execute

    spec = PartitionSpec(aligned_fraction=0.3, test_aligned_fraction=0.5)
    p = make_partition(digits, spec, 0)
    act, pas = p.active, p.passives[0]
    assert len(pas.test_ids) == round(0.5 * len(act.test_ids)) == len(p.test_aligned_ids)
    assert set(pas.test_ids) < set(act.test_ids) and len(pas.X_test) == len(pas.test_ids)
    assert make_partition(digits, PartitionSpec(aligned_fraction=0.3), 0).test_aligned_ids is None
    assert make_partition(digits, PartitionSpec(aligned_fraction=0.3, test_aligned_fraction="train"), 0) \
        .summary()["test_aligned_rows"] == round(len(act.test_ids) * len(p.aligned_ids) / len(p.truth_ids))
    # the alignment step found the aligned test rows; splitnn predicts the others with a zero passive input
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0)
    cfg.train.epochs = 1
    cfg.partition = PartitionSpec(aligned_fraction=0.3, test_aligned_fraction=0.5, alignment=alignment)
    out = execute(cfg)
    assert np.array_equal(np.sort(out.federation.active.aligned_test_ids), np.sort(pas.test_ids))
    util = out.to_json()["utility"]
    assert util["aligned"]["rows"] == len(pas.test_ids)
    assert util["aligned"]["rows"] + util["unaligned"]["rows"] == len(act.test_ids)


@pytest.mark.parametrize("k", [3, 4])
def test_label_only_host_spreads_columns_and_unaligned_rows_over_guests(digits, k):
    p = make_partition(digits, PartitionSpec(n_parties=k, aligned_fraction=0.2, active_features=False,
                                             active_labels_all=True), 0)
    host, guests = p.active, p.passives
    assert len(host.columns) == 0 and host.X_train.shape[1:] == (8, 0)
    assert sorted(np.concatenate([g.columns for g in guests]).tolist()) == list(range(8))
    unaligned = [set(g.train_ids.tolist()) - set(p.aligned_ids.tolist()) for g in guests]
    assert all(not (a & b) for i, a in enumerate(unaligned) for b in unaligned[i + 1:])  # disjoint over guests
    assert max(map(len, unaligned)) - min(map(len, unaligned)) <= 1
    # the host knows every training entity and its label; its features are zero-width
    assert set(host.train_ids.tolist()) == set.union(set(p.aligned_ids.tolist()), *unaligned)
    assert set(host.label_ids.tolist()) == set(host.train_ids.tolist())
    assert host.rows(host.train_ids[:3]).shape == (3, 8, 0)


def test_active_labels_all_and_unlabeled_active_rows(digits):
    base = dict(aligned_fraction=0.3, active_labels_unaligned=True)
    p = make_partition(digits, PartitionSpec(**base, active_labels_all=True), 0)
    passive_only = set(p.passives[0].train_ids.tolist()) - set(p.aligned_ids.tolist())
    assert passive_only <= set(p.active.label_ids.tolist())
    assert not passive_only & set(p.active.train_ids.tolist())  # labels, but no features there
    q = make_partition(digits, PartitionSpec(**base, unaligned_label_fraction=0.25), 0)
    r = make_partition(digits, PartitionSpec(**base), 0)
    own = np.setdiff1d(q.active.train_ids, q.aligned_ids)
    labeled_own = np.intersect1d(own, q.active.label_ids)
    assert len(labeled_own) == round(0.25 * len(own))
    # the draw leaves every other part of the split unchanged
    for a, b in zip(q.parties, r.parties, strict=True):
        assert np.array_equal(a.train_ids, b.train_ids) and np.array_equal(a.X_train, b.X_train)
    with pytest.raises(UserError, match="unaligned_label_fraction"):
        make_partition(digits, PartitionSpec(unaligned_label_fraction=1.5), 0)


def test_train_rows_is_a_nested_prefix_with_the_test_rows_unchanged(digits):
    """The rows axis: N training rows are the first N of the seed's shuffle (1,000 ⊂ all), the test rows
    and, with an aligned count, the aligned and labeled rows stay the same; unset = the partition as before."""
    spec = {"aligned_count": 100, "n_labeled": 40, "unaligned": "all"}
    whole = make_partition(digits, PartitionSpec(**spec), 3)
    assert whole.fingerprint() == make_partition(digits, PartitionSpec(**spec, train_rows=None), 3).fingerprint()
    small, mid = (make_partition(digits, PartitionSpec(**spec, train_rows=n), 3) for n in (400, 900))
    for p in (small, mid):
        assert np.array_equal(p.active.test_ids, whole.active.test_ids)
        assert np.array_equal(p.aligned_ids, whole.aligned_ids)
        assert np.array_equal(p.active.label_ids, whole.active.label_ids)
    assert len(small.truth_ids) == 400 and len(mid.truth_ids) == 900
    assert set(small.truth_ids.tolist()) < set(mid.truth_ids.tolist()) < set(whole.truth_ids.tolist())
    # a share scales with the rows
    share = make_partition(digits, PartitionSpec(aligned_fraction=0.5, train_rows=400), 3)
    assert len(share.aligned_ids) == 200


def test_train_rows_is_refused_for_party_files():
    from securevfl.data.csvsource import split_rows

    ids = np.arange(50)
    with pytest.raises(UserError, match="party files are used whole"):
        split_rows(ids, ids, np.ones(50, dtype=bool), PartitionSpec(train_rows=10), 0)
