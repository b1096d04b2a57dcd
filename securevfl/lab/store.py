"""The sweep store: one SQLite table ``runs``, one row per (cell, seed).

Each finished cell is committed on its own (WAL journal), so a killed sweep loses only the cells in
flight. ``run_id`` (hash of the resolved config) is the primary key: a rerun skips rows whose status
is ``ok`` and retries ``failed`` ones, replacing their row.

Concurrent sweeps on one store do not compute a cell twice: a sweep *claims* a cell (a row of
``leases``: run id, owner pid and host, time) right before it starts it, in one write transaction,
and releases it when the row is stored. A claim held by another live process is respected; one
whose owner is gone (no such pid on this host) or older than ``LEASE_TIMEOUT`` is taken over.
Reports open the store read-only and never write to it.

The store identifies itself: SQLite's ``application_id`` header field is :data:`APPLICATION_ID` and
``user_version`` the schema version (:data:`SCHEMA_VERSION`). Any other file — not SQLite, another
application's database — is refused before SQLite opens it for writing, so it stays byte-for-byte
untouched; a store from before the marker (``runs``/``leases`` tables only) is migrated in place, and a
store from a newer version is refused with a clear error. Every write that fails (a read-only file, a
full disk) ends in one ``error:`` line, finished rows kept.

A lease records its owner's process identity (boot id and process start time, Linux), so a pid reused
after a restart does not keep a dead sweep's claim alive; ``--take-over-leases`` ignores every claim.
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
    "version": "TEXT",  # the securevfl version that ran the cell (versions_json has the commit)
    "finished_at": "REAL",
    "node": "TEXT",  # where the cell ran: this host's name, or a Ray node's (issue 53)
}


SWEEP_COLUMNS = {"name": "TEXT", "path": "TEXT", "sha256": "TEXT", "text": "TEXT", "command": "TEXT",
                 "version": "TEXT", "git_commit": "TEXT", "started_at": "REAL"}
"""Provenance of each sweep file run into the store (table ``sweeps``): its text and hash, the
command, and the securevfl version and git commit that ran it; the report prints them."""
APPLICATION_ID = 0x53564C31  # "SVL1" in SQLite's header (offset 68): this file is a securevfl store
SCHEMA_VERSION = 1  # user_version; 0: a store from before the marker (migrated on open for writing)
_SQLITE_MAGIC = b"SQLite format 3\x00"
_LEASE_COLUMNS = {"run_id": "TEXT PRIMARY KEY", "pid": "INTEGER", "host": "TEXT", "claimed_at": "REAL",
                  "owner": "TEXT"}

LEASE_TIMEOUT = 24 * 3600.0
"""Seconds after which a claim is taken over even if its owner cannot be checked (another host)."""


def process_identity(pid: int) -> str | None:
    """``boot-id:start-time`` of a process (Linux), None where it cannot be read: a pid reused after a
    reboot or a container restart has another identity."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
        start = stat.rpartition(")")[2].split()[19]  # field 22, after the parenthesised command name
    except (OSError, IndexError):
        return None
    return f"{boot}:{start}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _foreign(path: Path, why: str) -> UserError:
    return UserError(f"store {path}: cannot open: not a securevfl SQLite store ({why}); the file was not touched")


def check_identity(path: Path) -> int | None:
    """The schema version of an existing store at ``path``, None for a new or empty file. Reads the
    header bytes and, only for a marker-less SQLite file, its table list through a read-only
    connection; never writes. Raises a UserError for any file that is not a securevfl store."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except (FileNotFoundError, NotADirectoryError):
        return None  # a new store (or a path SQLite will refuse with its own message)
    except OSError as e:
        raise UserError(f"store {path}: cannot read ({e.strerror or e})") from None
    if not header:
        return None
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise _foreign(path, "not an SQLite file")
    app_id, version = int.from_bytes(header[68:72], "big"), int.from_bytes(header[60:64], "big")
    if app_id not in (0, APPLICATION_ID):
        raise _foreign(path, f"another application's SQLite file (application_id {app_id:#x})")
    if app_id == 0:  # the header of a WAL store may lag behind: ask SQLite, read-only
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
            try:
                app_id = db.execute("PRAGMA application_id").fetchone()[0]
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                cols = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
            finally:
                db.close()
        except sqlite3.DatabaseError as e:
            raise _foreign(path, f"cannot be read as a securevfl store ({e})") from None
        if app_id not in (0, APPLICATION_ID):
            raise _foreign(path, f"another application's SQLite file (application_id {app_id:#x})")
        # a marker-less store of ours: no table but runs and leases, and the runs columns we write
        if app_id == 0 and tables and (not tables <= {"runs", "leases"}
                                       or not {"run_id", "status", "config_json", "result_json"} <= cols):
            raise _foreign(path, f"an SQLite file of another application (tables {', '.join(sorted(tables))})")
    if version > SCHEMA_VERSION:
        raise UserError(f"store {path}: schema version {version} is newer than this securevfl's "
                        f"({SCHEMA_VERSION}); upgrade securevfl to use it")
    return version


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            if self.path.is_dir():
                raise UserError(f"store {self.path} is a directory; give a file path such as runs/NAME.sqlite")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:  # before SQLite opens it for writing: a foreign file stays untouched
                check_identity(self.path)
            except UserError as e:
                raise UserError(str(e).replace("cannot open:", "cannot open for writing:", 1)) from None
            # autocommit: every statement is its own transaction, except the explicit BEGIN IMMEDIATE of claim()
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self._migrate()
        except UserError:
            raise
        except (OSError, sqlite3.Error) as e:
            raise UserError(f"store {self.path}: cannot open for writing ({e})") from None

    def _migrate(self) -> None:
        """Create the tables, or bring an older store up to :data:`SCHEMA_VERSION` (version 0, before the
        marker: add the columns it lacks), and mark the file as ours, in one transaction."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for table, columns in (("runs", COLUMNS), ("leases", _LEASE_COLUMNS)):
                db.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{k} {t}' for k, t in columns.items())})")
                have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
                for k, t in columns.items():  # a store from an older version gains the newer columns
                    if k not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {k} {t.replace(' PRIMARY KEY', '')}")
            sweep_cols = ", ".join(f"{k} {t}" for k, t in SWEEP_COLUMNS.items())
            db.execute(f"CREATE TABLE IF NOT EXISTS sweeps ({sweep_cols}, PRIMARY KEY (name, sha256))")
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _write_failed(self, e: sqlite3.Error) -> UserError:
        return UserError(f"store {self.path}: cannot write ({e}); rows already stored are kept, rerun to resume")

    @classmethod
    def open_existing(cls, path: str | Path) -> Store:
        """A store that must already exist, opened read-only (reports never write)."""
        p = Path(path)
        if not p.is_file():
            raise UserError(f"store {p} not found")
        check_identity(p)
        store = cls.__new__(cls)
        store.path = p
        try:
            store.db = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
            store.db.execute("SELECT run_id, status FROM runs LIMIT 1").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                raise UserError(f"store {p} is not a securevfl store (no runs table)") from None
            try:  # a read-only WAL store in a read-only folder: read it as an immutable file
                store.db = sqlite3.connect(f"{p.resolve().as_uri()}?immutable=1", uri=True)
                store.db.execute("SELECT run_id, status FROM runs LIMIT 1").fetchall()
            except sqlite3.DatabaseError as e2:
                raise UserError(f"store {p} cannot be read ({e2})") from None
        except sqlite3.DatabaseError as e:
            raise UserError(f"store {p} is not a securevfl SQLite store ({e})") from None
        return store

    def claim(self, run_id: str) -> bool:
        """Take the cell for this process unless it is done or another live sweep holds it (with
        :attr:`take_over_leases`, every claim of another process is ignored)."""
        me, host, now = os.getpid(), socket.gethostname(), time.time()
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise self._write_failed(e) from None
        try:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ? AND status = 'ok'", (run_id,)).fetchone():
                db.execute("ROLLBACK")
                return False
            held = db.execute("SELECT pid, host, claimed_at, owner FROM leases WHERE run_id = ?",
                              (run_id,)).fetchone()
            if held is not None and held[0] != me and not self.take_over_leases:
                pid, h, at, owner = held
                if h == host:  # same host: the owner must still run, and be the same process (pid reuse)
                    live = _alive(pid) and (owner is None or process_identity(pid) in (owner, None))
                else:
                    live = True
                if live and now - at < LEASE_TIMEOUT:
                    db.execute("ROLLBACK")
                    return False
            db.execute("INSERT OR REPLACE INTO leases (run_id, pid, host, claimed_at, owner) VALUES (?, ?, ?, ?, ?)",
                       (run_id, me, host, now, process_identity(me)))
            db.execute("COMMIT")
            return True
        except sqlite3.OperationalError as e:
            db.execute("ROLLBACK")
            raise self._write_failed(e) from None
        except BaseException:
            db.execute("ROLLBACK")
            raise

    take_over_leases = False
    """Ignore other processes' claims (``securevfl sweep --take-over-leases``): for a store whose
    claims are stale in a way the owner check cannot see (another host that is gone)."""

    def release(self, run_id: str) -> None:
        try:
            self.db.execute("DELETE FROM leases WHERE run_id = ? AND pid = ?", (run_id, os.getpid()))
            self.db.commit()
        except sqlite3.OperationalError as e:
            raise self._write_failed(e) from None

    def completed(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT run_id FROM runs WHERE status = 'ok'")}

    def put(self, row: dict) -> None:
        row = {**row, "finished_at": time.time()}
        for k in ("swept_json", "config_json", "result_json", "versions_json"):
            if k in row and not isinstance(row[k], str | None):
                row[k] = json.dumps(row[k], default=str)
        keys = [k for k in COLUMNS if k in row]
        try:
            self.db.execute(f"INSERT OR REPLACE INTO runs ({', '.join(keys)}) VALUES ({', '.join('?' * len(keys))})",
                            [row[k] for k in keys])
            self.db.execute("DELETE FROM leases WHERE run_id = ? AND pid = ?", (row["run_id"], os.getpid()))
            self.db.commit()
        except sqlite3.OperationalError as e:
            raise self._write_failed(e) from None

    def record_sweep(self, info: dict) -> None:
        """Store a sweep file's provenance (a rerun of the same file updates its command and time)."""
        keys = [k for k in SWEEP_COLUMNS if k in info]
        self.db.execute(f"INSERT OR REPLACE INTO sweeps ({', '.join(keys)}) VALUES ({', '.join('?' * len(keys))})",
                        [info[k] for k in keys])
        self.db.commit()

    def sweeps(self) -> list[dict]:
        """Every recorded sweep file, oldest first (none in a store from before provenance was kept)."""
        try:
            cur = self.db.execute("SELECT * FROM sweeps ORDER BY started_at")
        except sqlite3.OperationalError:  # an older store: no sweeps table
            return []
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def rows(self) -> list[dict]:
        """Every row, oldest first; a column an older store lacks reads as None (reports read any version)."""
        have = {r[1] for r in self.db.execute("PRAGMA table_info(runs)")}
        order = "finished_at" if "finished_at" in have else "rowid"
        cur = self.db.execute(f"SELECT * FROM runs ORDER BY {order}")
        names = [d[0] for d in cur.description]
        return [{**dict.fromkeys(COLUMNS), **dict(zip(names, r, strict=True))} for r in cur.fetchall()]

    def close(self) -> None:
        self.db.close()
