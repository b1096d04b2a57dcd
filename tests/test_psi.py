import contextlib
import hashlib

import numpy as np
import pytest

from securevfl.channel import MessageKind
from securevfl.data import PartitionSpec, load_dataset, make_partition
from securevfl.federation import OptimConfig, align, build_federation
from securevfl.models import ModelConfig


@pytest.mark.parametrize("k", [2, 3])
def test_psi_and_plain_intersection_agree(k):
    part = make_partition(load_dataset("digits"), PartitionSpec(n_parties=k, aligned_fraction=0.4), 3)
    results = {}
    for mode in ("psi", "plain"):
        fed = build_federation(part, ModelConfig(bottom="mlp"), OptimConfig(), 0, record=True)
        results[mode] = align(fed, mode)
        assert fed.channel.pending() == 0
        # every passive party learnt the same aligned set from the active party
        for p in fed.passives:
            assert np.array_equal(p.aligned_ids, results[mode])
        assert fed.channel.stats.bytes_by_kind()[MessageKind.ALIGNMENT] > 0
        if mode == "psi":
            # PSI never sends a party's raw ID list: the active party receives only protobuf bytes
            raw = set(map(str, part.passives[0].train_ids.tolist()))
            seen = b"".join(m.payload for m in fed.channel.received_by("active"))
            assert not any(s.encode() in seen for s in list(raw)[:50] if len(s) >= 4)
    assert np.array_equal(results["psi"], results["plain"])
    assert np.array_equal(results["psi"], np.sort(part.aligned_ids))


def test_psi_with_string_ids_both_sides_learn_it():
    from securevfl.channel import InMemoryChannel
    from securevfl.data import psi

    ch = InMemoryChannel()
    a, b = ch.endpoint("active"), ch.endpoint("passive1")
    ids_a = np.array([f"user-{i}" for i in range(0, 300)], dtype=object)
    ids_b = np.array([f"user-{i}" for i in range(150, 500)], dtype=object)
    got_a, got_b = psi.mutual_psi_local(a, b, ids_a, ids_b, target=64)  # 6 buckets
    want = psi.plain_intersection([ids_a, ids_b])
    assert list(got_a) == list(got_b) == list(want) and len(want) == 150
    assert ch.pending() == 0


def test_psi_across_threads_with_worker_processes_and_buckets(monkeypatch, capfd):
    """The deployed driver (both sides streaming, a window of buckets in flight) with two worker
    processes at one side equals the plain intersection, for int IDs at one side and their text at the
    other; each side shows its progress in buckets (12 here, from 8 on)."""
    monkeypatch.setenv("SECUREVFL_PROGRESS_SECONDS", "0")  # a line at every update
    import threading

    from securevfl.channel import InMemoryChannel
    from securevfl.data import psi

    rng = np.random.default_rng(1)
    ids_a, ids_b = rng.choice(50_000, 3_000, replace=False), rng.choice(50_000, 2_000, replace=False)
    ch = InMemoryChannel()
    ch.lockstep(["active", "passive1"])
    out: dict[str, np.ndarray] = {}

    def run(me: str, peer: str, ids: np.ndarray, workers: psi.Workers | None) -> None:
        ch.join(me)
        try:
            ch.wait_turn()
            out[me] = psi.mutual_psi(ch.endpoint(me), peer, ids, workers, target=256)
        finally:
            ch.leave()

    t = threading.Thread(target=run, args=("passive1", "active", ids_b.astype(str), None))
    t.start()
    with psi.Workers(2) as workers:
        run("active", "passive1", ids_a, workers)
    t.join(60)
    out["a"], out["b"] = out["active"], out["passive1"]
    want = np.intersect1d(ids_a, ids_b)
    assert np.array_equal(out["a"], want) and sorted(out["b"]) == sorted(str(i) for i in want)
    err = capfd.readouterr().err
    assert "PSI with passive1: bucket 12/12 (100%)" in err and "PSI with active: bucket 12/12 (100%)" in err


def _views(n_trials: int, leak_key: bool = False, pad: bool = True):
    """Runs of the PSI where the passive party's set is S0 or S1 (alternately): the same 400 IDs plus
    one of two IDs outside the active party's set; yields (which, the active party's view: its own
    session and every message it received)."""
    from unittest import mock

    from securevfl import ecdh
    from securevfl.channel import InMemoryChannel
    from securevfl.data import psi

    ids_a = np.arange(0, 300)
    base = np.arange(200, 600)  # (20_031: under the fixed nonces, never in 10_000's bucket, so the controls never tie)
    for t in range(n_trials):
        which = t % 2
        ids_b = np.append(base, [10_000, 20_031][which])
        ch = InMemoryChannel(record=True)
        a, b = ch.endpoint("active"), ch.endpoint("passive1")
        patches = []
        if leak_key:  # control: the passive party's exponent is one the adversary knows
            patches.append(mock.patch.object(ecdh, "new_key", lambda: b"\x07" * 32))
        if not pad:  # control: buckets sent at their true sizes (and taken at any size)
            patches.append(mock.patch.object(psi.MutualPSI, "_blinded", _unpadded))
            patches.append(mock.patch.object(psi.MutualPSI, "handle", _any_size(psi.MutualPSI.handle)))
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            got, _ = psi.mutual_psi_local(a, b, ids_a, ids_b, target=128)
        assert np.array_equal(got, np.arange(200, 300))
        yield which, [m.payload for m in ch.received_by("active")]


def _unpadded(self):  # MutualPSI._blinded without the padding (the control of the length attack)
    from securevfl import ecdh
    from securevfl.data.psi import _BLIND

    j = self._sent
    self._sent += 1
    rows = self._order[self._bounds[j]:self._bounds[j + 1]]
    self._slots[j] = rows
    return _BLIND + j.to_bytes(4, "little") + ecdh.blind_ids(self._key, self.nonce, self.ids[rows])


def _any_size(handle):
    def wrapped(self, msg):
        if msg[:1] == b"B":
            self.size_peer = (len(msg) - 5) // 32
        else:
            self.size_own = (len(msg) - 5) // 16
        return handle(self, msg)
    return wrapped


def _adversary(view: list[bytes], sets: tuple[np.ndarray, np.ndarray], candidates: tuple[int, int],
               own_nonce: bytes) -> int:
    """The active party's best tries at "which of the two sets S0, S1 does the passive party hold?" (it
    knows both, and its own nonce): (1) each set's bucket sizes, which the buckets' lengths would show
    unpadded; (2) each candidate's point raised to every exponent it might know (the identity, and the
    fixed key of the leak control), looked up among the passive party's blinded points. 0 when no try
    tells them apart."""
    import hashlib

    from securevfl import ecdh
    from securevfl.channel import codec

    hello = codec.decode_json(view[0])
    nonce = hashlib.sha256(b"".join(sorted([bytes.fromhex(hello["nonce"]), own_nonce]))).digest()
    blinded = {int.from_bytes(m[1:5], "little"): m[5:] for m in view[1:] if m[:1] == b"B"}
    lengths = np.array([len(blinded[j]) // 32 for j in range(len(blinded))])
    score = [0, 0]
    for k, (members, y) in enumerate(zip(sets, candidates, strict=True)):
        counts = np.bincount(ecdh.buckets_of(nonce, len(blinded), members), minlength=len(blinded))
        score[k] += int(np.array_equal(counts, lengths))
        j = int(ecdh.buckets_of(nonce, len(blinded), np.array([y]))[0])
        u = hashlib.sha512(ecdh.DOMAIN + nonce + str(y).encode()).digest()[:32]
        points = {blinded[j][i:i + 32] for i in range(0, len(blinded[j]), 32)}
        score[k] += sum(g in points for g in (u, ecdh.reblind(b"\x07" * 32, u)))
    return int(score[1] > score[0])


@pytest.mark.parametrize("control", [None, "no-padding", "known-key"])
def test_the_active_party_learns_nothing_of_ids_outside_the_intersection(control, monkeypatch):
    """The active party's view of the PSI (everything it received, its own exponent and nonce) does not
    tell which of two IDs outside the intersection the passive party holds: both tries score at chance
    (exactly 0.5 over alternating trials). Controls: with the buckets unpadded, the length try wins;
    with the passive exponent known to the adversary, the dictionary try wins."""
    from securevfl.data import psi

    own_nonces: list[bytes] = []
    real_init = psi.MutualPSI.__init__

    def spy(self, ids, peer, *a, **k):  # fixed nonces: the same buckets on every machine
        real_init(self, ids, peer, *a, **k)
        self._nonce = hashlib.sha256(f"{len(own_nonces)}/{peer}".encode()).digest()[:16]
        if peer == "passive1":
            own_nonces.append(self._nonce)

    monkeypatch.setattr(psi.MutualPSI, "__init__", spy)
    right = 0
    n = 8
    for which, view in _views(n, leak_key=control == "known-key", pad=control != "no-padding"):
        sets = (np.append(np.arange(200, 600), 10_000), np.append(np.arange(200, 600), 20_031))
        right += _adversary(view, sets, (10_000, 20_031), own_nonces[-1]) == which
    if control is None:
        assert right / n == 0.5
    else:
        assert right / n == 1.0


def test_a_peer_cannot_make_a_small_party_pad_without_end(monkeypatch):
    """A peer announcing 2^34 IDs would split the sets into 524,288 buckets, each padded for the small
    party: refused at the hello, before any exponentiation; an honest large peer (10M IDs against 1,000)
    is accepted (the control)."""
    from securevfl.data import psi
    from securevfl.errors import UserError

    small = psi.MutualPSI(np.arange(1000), "active")
    with pytest.raises(UserError, match="announced 17,179,869,184 IDs.*refused"):
        small.agree({"psi": psi.NAME, "n": 1 << 34, "nonce": "00" * 16})
    psi.MutualPSI(np.arange(1000), "active").agree({"psi": psi.NAME, "n": 10_000_000, "nonce": "00" * 16})
    monkeypatch.setenv("SECUREVFL_PSI_WORKERS", "two")
    with pytest.raises(UserError, match="SECUREVFL_PSI_WORKERS='two'"):
        psi.Workers.for_size(100_000)
