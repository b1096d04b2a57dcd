"""The sweep store (SPEC §7): one SQLite table ``runs``, one row per (cell, seed).

Each finished cell is committed on its own (WAL journal), so a killed sweep loses only the cells in
flight. ``run_id`` (hash of the resolved config) is the primary key: a rerun skips rows whose status
is ``ok`` and retries ``failed`` ones, replacing their row.
"""

from __future__ import annotations

import json
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
    "seconds": "REAL",
    "bytes_sent": "INTEGER",
    "versions_json": "TEXT",
    "finished_at": "REAL",
}


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        cols = ", ".join(f"{k} {t}" for k, t in COLUMNS.items())
        self.db.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
        self.db.commit()

    @classmethod
    def open_existing(cls, path: str | Path) -> Store:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"store {p} not found")
        try:
            store = cls(p)
            store.db.execute("SELECT run_id, status FROM runs LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            raise UserError(f"store {p} is not a securevfl SQLite store ({e})") from None
        return store

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
        self.db.commit()

    def rows(self) -> list[dict]:
        cur = self.db.execute("SELECT * FROM runs ORDER BY finished_at")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def close(self) -> None:
        self.db.close()
