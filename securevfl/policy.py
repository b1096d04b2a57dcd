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

import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

from securevfl.data.partition import IdIndex
from securevfl.errors import UserError
from securevfl.ids import member

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
        extra = np.asarray(ids)
        self._train = np.concatenate([self._train, extra[~member(extra, self._train)]])  # (linear for str IDs)
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
    """A run's budget of requests and the permissions its method operations need, the state operations
    its settings need (issue 60), the learning rates it may set and the smallest training batch."""

    def __init__(self, max_requests: int, max_rate: float, needs: Mapping[str, str] | None = None,
                 granted: frozenset[str] = frozenset(), state_budget: Mapping[str, int] | None = None,
                 rates: Sequence[float] | None = None, max_lr: float = 1.0, batch_size: int | None = None,
                 min_batch_fraction: float = 0.0) -> None:
        self.max_requests, self.max_rate = max_requests, max_rate
        self.needs = dict(needs or {})
        """Operation → the permission it needs (``--allow``)."""
        self.granted = granted
        self.state_budget = None if state_budget is None else dict(state_budget)
        """Operation → how often a run may ask for it (None: unbounded, the simulator's honest parties)."""
        self.rates = None if rates is None else frozenset(float(r) for r in rates)
        """The learning rates ``set_lr`` may set (this party's own grid); None: any valid rate."""
        self.max_lr = max_lr
        self.floor = 0 if batch_size is None else math.ceil(batch_size * min_batch_fraction)
        """Training batches smaller than this are refused unless they end an epoch."""
        self.count = 0
        self._ran: set[str] = set()
        self._used: dict[str, int] = {}
        self._last_full = True  # the first training batch may be short (an epoch of one batch)
        self._last_short: np.ndarray | None = None
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
        """A method operation that needs a permission runs only with it, and once per run; a state
        operation (snapshot, restore, set_lr, reset_optimizer, resume) at most as often as the run's
        own settings need."""
        if self.state_budget is not None and op in STATE_OPS:
            used = self._used[op] = self._used.get(op, 0) + 1
            allowed = self.state_budget.get(op, 0)
            if used > allowed:
                raise UserError(f"the active party asked for {op!r} {used} times; this run's settings (its method "
                                f"and learning-rate grid) need at most {allowed}; refused")
        need = self.needs.get(op)
        if need is None:
            return
        if need not in self.granted:
            raise UserError(f"the active party asked for {op!r}, which needs this party's --allow {need}; refused")
        if op in self._ran:
            raise UserError(f"the active party asked for {op!r} a second time; this party runs it once per run; "
                            "refused")
        self._ran.add(op)

    def learning_rate(self, value: object) -> float:
        """A learning rate from the wire: a finite positive number, at most ``max_lr``, and one of this
        party's own rates (when it set a grid).

        Raises:
            UserError: anything else (NaN, inf, ≤ 0, a rate outside its grid)."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise UserError(f"the active party asked for learning rate {value!r}; a rate is a finite positive "
                            "number; refused")
        lr = float(value)
        if lr > self.max_lr:
            raise UserError(f"the active party asked for learning rate {lr:g}; this party trains at most at "
                            f"{self.max_lr:g} (--max-lr); refused")
        if self.rates is not None and lr not in self.rates:
            raise UserError(f"the active party asked for learning rate {lr:g}, which is not one of this party's own "
                            "rates (its lr_grid, securevfl party --config); refused")
        return lr

    def training_batch(self, ids: np.ndarray) -> None:
        """A training batch far below the run's batch size (< ``min_batch_fraction`` of it) is refused
        unless it ends an epoch: it follows a full batch, or repeats the rows of the previous short
        batch (an epoch of one batch). Two-row steps chosen by the active party steer the model
        through one row pair at a time (issue 60's sign probe)."""
        n = len(ids)
        if n >= self.floor:
            self._last_full, self._last_short = True, None
            return
        rows = np.sort(np.asarray(ids))
        repeat = self._last_short is not None and np.array_equal(rows, self._last_short)
        if not (self._last_full or repeat):
            raise UserError(f"the active party asked for a training batch of {n} rows after another short one, in "
                            f"a run whose batches hold at least {self.floor} rows but the last of an epoch "
                            "(--min-batch-fraction); refused")
        self._last_full, self._last_short = False, rows


STATE_OPS = ("snapshot", "restore", "set_lr", "reset_optimizer", "resume")
"""The operations that set a passive party's trainable state (budgeted per run)."""


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
