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


def test_psi_with_string_ids():
    from securevfl.channel import InMemoryChannel
    from securevfl.data import psi

    ch = InMemoryChannel()
    a, b = ch.endpoint("active"), ch.endpoint("passive1")
    ids_a = np.array([f"user-{i}" for i in range(0, 300)], dtype=object)
    ids_b = np.array([f"user-{i}" for i in range(150, 500)], dtype=object)
    client = psi.psi_client_start(a, "passive1", ids_a)
    psi.psi_server_round(b, "active", ids_b)
    got = psi.psi_client_finish(a, "passive1", client, ids_a)
    assert sorted(got) == sorted(psi.plain_intersection([ids_a, ids_b]))
