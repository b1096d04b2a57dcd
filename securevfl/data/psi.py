"""Private set intersection over the channel (ECDH PSI, openmined-psi).

The active party is the PSI client towards every passive party (the server): it learns
I_1 ∩ I_k for each k, intersects them, and announces the aligned set to the passive parties, as
VFL deployments do. The messages are protobufs serialised to bytes and cross the channel under kind
``alignment``, so their cost is counted.

Across processes (:func:`align_with`, :func:`align_to`) the roles then swap: each passive party
runs a PSI round as the client, so it holds I_1 ∩ I_k itself and checks the announcement against it
rather than trusting the active party (issue 54; docs/threat-model.md, "a malicious active party").
A passive party thus learns I_1 ∩ I_k (with two parties: the aligned set it is told anyway) and the
size of the active party's set; the active party learns the same of each passive party.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import private_set_intersection.python as psi

from securevfl.channel import Endpoint, MessageKind
from securevfl.ids import intersect

FPR = 1e-9  # Bloom/GCS false-positive rate of the server setup; reveal_intersection mode is exact


def _items(ids: np.ndarray) -> list[str]:
    return [str(i) for i in ids]


def psi_server_round(endpoint: Endpoint, client: str, own_ids: np.ndarray) -> None:
    """Passive side: answer one PSI request from ``client`` with its own IDs."""
    server = psi.server.CreateWithNewKey(True)
    n_client = int(cast(int, endpoint.recv_json(client, MessageKind.ALIGNMENT)))  # the client sent len(own_ids)
    setup = server.CreateSetupMessage(FPR, n_client, _items(own_ids), psi.DataStructure.RAW)
    request = psi.Request()
    request.ParseFromString(endpoint.recv(client, MessageKind.ALIGNMENT))
    endpoint.send(client, MessageKind.ALIGNMENT, setup.SerializeToString())
    endpoint.send(client, MessageKind.ALIGNMENT, server.ProcessRequest(request).SerializeToString())


def psi_client_start(endpoint: Endpoint, server: str, own_ids: np.ndarray) -> psi.client:
    client = psi.client.CreateWithNewKey(True)
    endpoint.send_json(server, MessageKind.ALIGNMENT, len(own_ids))
    endpoint.send(server, MessageKind.ALIGNMENT, client.CreateRequest(_items(own_ids)).SerializeToString())
    return client


def psi_client_finish(endpoint: Endpoint, server: str, client: psi.client, own_ids: np.ndarray) -> np.ndarray:
    setup, response = psi.ServerSetup(), psi.Response()
    setup.ParseFromString(endpoint.recv(server, MessageKind.ALIGNMENT))
    response.ParseFromString(endpoint.recv(server, MessageKind.ALIGNMENT))
    idx = np.asarray(sorted(client.GetIntersection(setup, response)), dtype=np.int64)
    return np.asarray(own_ids)[idx]


def plain_intersection(id_sets: list[np.ndarray]) -> np.ndarray:
    """The non-private fallback (only when explicitly requested)."""
    out = np.asarray(id_sets[0])
    for ids in id_sets[1:]:
        out = intersect(out, ids)
    return np.sort(out)


def align_with(endpoint: Endpoint, peers: list[str], own_ids: np.ndarray, mode: str) -> np.ndarray:
    """The active party's side of aligning with passive parties in other processes: ECDH PSI with each
    (``mode`` ``psi``; ``plain``: each sends its ID list in the clear) and, under PSI, the passive
    party's own round as the client; then the intersection of all, which it announces to each (kind
    ``alignment``)."""
    theirs = []
    for name in peers:
        if mode == "plain":
            theirs.append(endpoint.recv_ids(name, MessageKind.ALIGNMENT))
        else:
            client = psi_client_start(endpoint, name, own_ids)
            theirs.append(psi_client_finish(endpoint, name, client, own_ids))
            psi_server_round(endpoint, name, own_ids)  # the passive party's own intersection
    aligned = plain_intersection([own_ids, *theirs])
    if len(aligned):
        for name in peers:
            endpoint.send_ids(name, MessageKind.ALIGNMENT, aligned)
    return aligned


def align_to(endpoint: Endpoint, active: str, own_ids: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """A passive party's side of :func:`align_with`: its PSI rounds (or its ID list), then the aligned IDs.

    Returns:
        (the aligned IDs the active party announced, the IDs this party may align on by its own
        account: its PSI intersection with the active party; under ``plain`` its own IDs, since it
        does not see the active party's)."""
    if mode == "plain":
        endpoint.send_ids(active, MessageKind.ALIGNMENT, own_ids)
        own_result = np.asarray(own_ids)
    else:
        psi_server_round(endpoint, active, own_ids)
        client = psi_client_start(endpoint, active, own_ids)
        own_result = psi_client_finish(endpoint, active, client, own_ids)
    return endpoint.recv_ids(active, MessageKind.ALIGNMENT), own_result
