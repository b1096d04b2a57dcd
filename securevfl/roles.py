"""Role names of a federation's parties: party 0 is the active party (labels and head), the others are
``passive1``, ``passive2``, ... Kept apart from the data package so that parties, methods, defenses and
attacks can name a role without importing the data layer."""

from __future__ import annotations

ACTIVE = "active"


def passive_name(k: int) -> str:
    """The name of passive party ``k`` (k ≥ 1; party 0 is :data:`ACTIVE`)."""
    return f"passive{k}"


def party_index(name: str) -> int:
    """Party ``name``'s index: 0 for the active party, k for ``passive<k>`` (a party's own seed streams)."""
    return 0 if name == ACTIVE else int(name.removeprefix("passive"))


def seed_for(seed: int, party_index: int) -> int:
    """The simulator's default own seed of party ``party_index`` in a run of seed ``seed``
    (:class:`securevfl.federation.PartySeeds`)."""
    return seed * 1009 + party_index


def party_names(n_parties: int) -> list[str]:
    """Party 0 is the active party; the others are ``passive1``, ``passive2``, ..."""
    return [ACTIVE] + [passive_name(k) for k in range(1, n_parties)]


PASSIVE = "passive"
"""The role every passive party plays (a hook's ``runs_at`` names roles: :data:`ACTIVE` or this)."""
