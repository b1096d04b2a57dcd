"""The sweep store: one SQLite table ``runs``, one row per (cell, seed).

Each finished cell is committed on its own (WAL journal), so a killed sweep loses only the cells in
flight. ``run_id`` (hash of the resolved config) is the primary key: a rerun skips rows whose status
is ``ok`` and retries ``failed`` ones, replacing their row.

Concurrent sweeps on one store do not compute a cell twice: a sweep *claims* a cell (a row of
``leases``: run id, owner pid and host, time) right before it starts it, in one write transaction,
and releases it when the row is stored. A claim held by another live process is respected; one
whose owner is gone (no such pid on this host) or older than ``LEASE_TIMEOUT`` is taken over.
Reports open the store read-only and never write to it.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from pathlib import Path

from securevfl.errors import UserError

COLUMNS = {
    "run_id": "TEXT PRIMARY KEY",
    "sweep": "TEXT",
    "dataset": "TEXT",
    "method": "TEXT",
    "defense": "TEXT",
    "defense_family": "TEXT",
    "strength": "REAL",
    "seed": "INTEGER",
    "he": "TEXT",
    "swept_json": "TEXT",
    "status": "TEXT",
    "error": "TEXT",
    "config_json": "TEXT",
    "result_json": "TEXT",
    "utility": "REAL",
    "utility_metric": "TEXT",
    "epsilon": "REAL",
    "epsilon_audit": "REAL",  # the one-run audit's empirical ε lower bound (--audit), or NULL
    "privacy_status": "TEXT",  # "not private (mechanism seed fixed)", or NULL
    "seconds": "REAL",
    "bytes_sent": "INTEGER",
    "versions_json": "TEXT",
    "finished_at": "REAL",
}


LEASE_TIMEOUT = 24 * 3600.0
"""Seconds after which a claim is taken over even if its owner cannot be checked (another host)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            if self.path.is_dir():
                raise UserError(f"store {self.path} is a directory; give a file path such as runs/NAME.sqlite")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # autocommit: every statement is its own transaction, except the explicit BEGIN IMMEDIATE of claim()
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            cols = ", ".join(f"{k} {t}" for k, t in COLUMNS.items())
            self.db.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
            have = {r[1] for r in self.db.execute("PRAGMA table_info(runs)")}
            for k, t in COLUMNS.items():  # a store from an older version gains the newer columns
                if k not in have:
                    self.db.execute(f"ALTER TABLE runs ADD COLUMN {k} {t}")
            self.db.execute("CREATE TABLE IF NOT EXISTS leases (run_id TEXT PRIMARY KEY, pid INTEGER, host TEXT, "
                            "claimed_at REAL)")
            self.db.commit()
        except UserError:
            raise
        except (OSError, sqlite3.Error) as e:
            raise UserError(f"store {self.path}: cannot open for writing ({e})") from None

    @classmethod
    def open_existing(cls, path: str | Path) -> Store:
        """A store that must already exist, opened read-only (reports never write)."""
        p = Path(path)
        if not p.is_file():
            raise UserError(f"store {p} not found")
        store = cls.__new__(cls)
        store.path = p
        try:
            store.db = sqlite3.connect(f"file:{p.resolve()}?mode=ro", uri=True, timeout=30)
            store.db.execute("SELECT run_id, status FROM runs LIMIT 1").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                raise UserError(f"store {p} is not a securevfl store (no runs table)") from None
            try:  # a read-only WAL store in a read-only folder: read it as an immutable file
                store.db = sqlite3.connect(f"file:{p.resolve()}?immutable=1", uri=True)
                store.db.execute("SELECT run_id, status FROM runs LIMIT 1").fetchall()
            except sqlite3.DatabaseError as e2:
                raise UserError(f"store {p} cannot be read ({e2})") from None
        except sqlite3.DatabaseError as e:
            raise UserError(f"store {p} is not a securevfl SQLite store ({e})") from None
        return store

    def claim(self, run_id: str) -> bool:
        """Take the cell for this process unless it is done or another live sweep holds it."""
        me, host, now = os.getpid(), socket.gethostname(), time.time()
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ? AND status = 'ok'", (run_id,)).fetchone():
                db.execute("ROLLBACK")
                return False
            held = db.execute("SELECT pid, host, claimed_at FROM leases WHERE run_id = ?", (run_id,)).fetchone()
            if held is not None and held[0] != me:
                pid, h, at = held
                live = _alive(pid) if h == host else now - at < LEASE_TIMEOUT
                if live and now - at < LEASE_TIMEOUT:
                    db.execute("ROLLBACK")
                    return False
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)", (run_id, me, host, now))
            db.execute("COMMIT")
            return True
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def release(self, run_id: str) -> None:
        self.db.execute("DELETE FROM leases WHERE run_id = ? AND pid = ?", (run_id, os.getpid()))
        self.db.commit()

    def completed(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT run_id FROM runs WHERE status = 'ok'")}

    def put(self, row: dict) -> None:
        row = {**row, "finished_at": time.time()}
        for k in ("swept_json", "config_json", "result_json", "versions_json"):
            if k in row and not isinstance(row[k], str | None):
                row[k] = json.dumps(row[k], default=str)
        keys = [k for k in COLUMNS if k in row]
        self.db.execute(f"INSERT OR REPLACE INTO runs ({', '.join(keys)}) VALUES ({', '.join('?' * len(keys))})",
                        [row[k] for k in keys])
        self.db.execute("DELETE FROM leases WHERE run_id = ? AND pid = ?", (row["run_id"], os.getpid()))
        self.db.commit()

    def rows(self) -> list[dict]:
        cur = self.db.execute("SELECT * FROM runs ORDER BY finished_at")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def close(self) -> None:
        self.db.close()
