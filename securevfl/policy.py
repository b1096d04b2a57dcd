"""What a deployed passive party enforces on every request of the active party, whatever the active
party sends (issue 54; docs/threat-model.md, "a malicious active party").

- :class:`ServedRows`: the rows it reveals anything of. Training batches only from the aligned
  training rows it checked against its own PSI result (plus rows it chose to announce, where its
  policy allows a method to use them), test batches only from the checked test rows, each batch no
  larger than its maximum. A refusal names counts, never an ID, and is the same whether the party
  holds an ID or not: no membership oracle.
- :class:`RequestLimits`: how many requests a run may make, at what rate (excess requests wait:
  the party throttles), which method operations need a permission of its policy and how often each
  may run, and how many snapshots it keeps.

The simulator builds none of this (its parties are honest by construction); a deployed passive
party builds both from its own settings (``securevfl party``; securevfl/deploy.py)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from securevfl.data.partition import IdIndex
from securevfl.errors import UserError

MAX_SNAPSHOTS = 4
"""Snapshots a passive party keeps at once (the learning-rate search and RISA hold one; the oldest
goes first): 3,000 snapshot requests no longer grow its memory."""


class ServedRows:
    """The rows a passive party answers requests for, by split."""

    def __init__(self, train: np.ndarray, test: np.ndarray, max_batch: int) -> None:
        self._train = np.asarray(train)
        self._index = {"train": IdIndex(self._train), "test": IdIndex(np.asarray(test))}
        self.max_batch = max_batch

    def add_train(self, ids: np.ndarray) -> None:
        """Rows this party itself announced for the method to use (e.g. RISA's, where allowed)."""
        self._train = np.union1d(self._train, np.asarray(ids))
        self._index["train"] = IdIndex(self._train)

    def inside(self, ids: np.ndarray, split: str) -> np.ndarray:
        """Which of ``ids`` this party serves in ``split`` (a boolean mask)."""
        return self._index["train" if split == "train" else "test"].positions(np.asarray(ids)) >= 0

    def check(self, ids: np.ndarray, split: str, outside_ok: bool = False) -> None:
        """Refuse a batch that is too large or, unless ``outside_ok`` (a view that stands in for rows it
        does not serve, RISA's imputation), asks for rows outside what this party serves.

        Raises:
            UserError: one line with counts only (sent to the active party as the abort reason)."""
        if len(ids) > self.max_batch:
            raise UserError(f"the active party asked for a batch of {len(ids)} rows; this party serves at most "
                            f"{self.max_batch} (--max-batch-size); refused")
        if outside_ok or split not in ("train", "test"):
            return
        out = int((~self.inside(ids, split)).sum())
        if out:
            raise UserError(f"the active party asked for {out} {split} row(s) outside the rows this party aligned "
                            "on (its own PSI result); refused")


class RequestLimits:
    """A run's budget of requests and the permissions its method operations need."""

    def __init__(self, max_requests: int, max_rate: float, needs: Mapping[str, str] | None = None,
                 granted: frozenset[str] = frozenset()) -> None:
        self.max_requests, self.max_rate = max_requests, max_rate
        self.needs = dict(needs or {})
        """Operation → the permission it needs (``--allow``)."""
        self.granted = granted
        self.count = 0
        self._ran: set[str] = set()
        self._start = time.monotonic()

    def request(self) -> None:
        """One more request: refused past the maximum; throttled to the rate."""
        self.count += 1
        if self.count > self.max_requests:
            raise UserError(f"the active party made more than {self.max_requests} requests in one run "
                            "(--max-requests); refused")
        if self.max_rate > 0:
            due = self._start + self.count / self.max_rate  # the earliest time this request may run
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 1.0))

    def operation(self, op: str) -> None:
        """A method operation that needs a permission runs only with it, and once per run."""
        need = self.needs.get(op)
        if need is None:
            return
        if need not in self.granted:
            raise UserError(f"the active party asked for {op!r}, which needs this party's --allow {need}; refused")
        if op in self._ran:
            raise UserError(f"the active party asked for {op!r} a second time; this party runs it once per run; "
                            "refused")
        self._ran.add(op)


class Snapshots:
    """A passive party's snapshots by tag, at most :data:`MAX_SNAPSHOTS` (the oldest is freed)."""

    def __init__(self, keep: int = MAX_SNAPSHOTS) -> None:
        self.keep = keep
        self._held: OrderedDict[int, dict] = OrderedDict()

    def put(self, tag: int, state: dict) -> None:
        self._held.pop(tag, None)
        self._held[tag] = state
        while len(self._held) > self.keep:
            self._held.popitem(last=False)

    def get(self, tag: int) -> dict:
        if tag not in self._held:
            raise UserError(f"the active party asked to restore snapshot {tag}, which this party does not hold (it "
                            f"keeps the newest {self.keep})")
        return self._held[tag]

    def __len__(self) -> int:
        return len(self._held)
