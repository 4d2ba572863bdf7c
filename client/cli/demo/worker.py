"""One worker of ``fencepost demo``, run as its own OS process.

``python -m fencepost.client.cli.demo.worker --role A ...`` connects to the
coordinator and the database, prints ``ready``, waits for a ``go T0`` line on
stdin, then does what a worker holding a lock usually does: acquire, read the
invoice, compute, write, release. It never checks whether it still holds the
lock before writing: a stall can fall between such a check and the write
anyway. ``--mode unfenced`` writes with a plain UPDATE; ``--mode fenced``
writes through :class:`fencepost.client.fencing.SqlGuard` with its token.

Every step is one JSON line on stdout: ``{"t": seconds since the T0 of the
``go T0`` line on the monotonic clock (shared by all processes of the
machine), "who": role,
"event": ..., ...}``. Events: ready, acquired (token, lease_id, ttl), read
(version, body), computing (seconds), wrote (version, token), rejected
(version, token, stored_token), released, release_failed (reason), error
(message).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from fencepost.client import FencepostError, LockClient, StaleTokenError


def connect_db(db: str) -> Any:
    """Open the demo database: ``sqlite:PATH`` or a PostgreSQL DSN (psycopg 3).

    Args:
        db: ``sqlite:/path/to/file.db`` or ``postgresql://...`` / ``host=... dbname=...``.

    Returns:
        A DB-API connection.
    """
    if db.startswith("sqlite:"):
        import sqlite3

        return sqlite3.connect(db[len("sqlite:"):], timeout=10.0)
    import psycopg

    return psycopg.connect(db)


def placeholder(conn: Any) -> str:
    """The parameter placeholder of the connection's driver."""
    return "?" if type(conn).__module__.startswith("sqlite3") else "%s"


class Worker:
    """One worker: its role, its clock origin and its event output."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.role = args.role
        self.t0 = time.monotonic()  # replaced by the demo's origin on "go T0"

    def emit(self, event: str, **fields: Any) -> None:
        """Print one event as a JSON line."""
        line = {"t": round(time.monotonic() - self.t0, 4), "who": self.role, "event": event, **fields}
        print(json.dumps(line), flush=True)

    def run(self) -> int:
        """Do the worker's job; returns the exit code."""
        a = self.args
        conn = connect_db(a.db)
        p = placeholder(conn)
        with LockClient(a.address) as client:
            client.connect()
            self.emit("ready")
            words = sys.stdin.readline().split()
            if len(words) != 2 or words[0] != "go":
                return 1
            self.t0 = float(words[1])
            handle = client.acquire(a.lock, ttl=a.ttl, timeout=a.timeout)
            self.emit("acquired", name=handle.name, token=handle.token, lease_id=handle.lease_id, ttl=handle.ttl)

            cur = conn.cursor()
            cur.execute(f"SELECT version, body FROM {a.table} WHERE id = {p}", (a.invoice,))
            version, body = cur.fetchall()[0]
            cur.close()
            conn.commit()  # end the read transaction: a frozen reader must not block writers
            self.emit("read", version=version, body=body)

            self.emit("computing", seconds=a.compute)
            time.sleep(a.compute)  # A is frozen (SIGSTOP) in here

            values = {"version": a.version, "body": a.body, "written_by": self.role}
            if a.mode == "unfenced":
                cur = conn.cursor()
                cur.execute(f"UPDATE {a.table} SET version = {p}, body = {p}, written_by = {p} WHERE id = {p}",
                            (a.version, a.body, self.role, a.invoice))
                cur.close()
                conn.commit()
                self.emit("wrote", version=a.version, token=handle.token)
            else:
                from fencepost.client.fencing import SqlGuard

                guard = SqlGuard(conn, a.table, "id", commit=True)
                try:
                    guard.update(a.invoice, handle.token, values)
                except StaleTokenError as err:
                    self.emit("rejected", version=a.version, token=handle.token, stored_token=err.current_token,
                              error=type(err).__name__)
                else:
                    self.emit("wrote", version=a.version, token=handle.token)

            try:
                handle.release()
            except FencepostError as err:
                self.emit("release_failed", reason=getattr(err, "reason", None) or type(err).__name__)
            else:
                self.emit("released")
        conn.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run one worker."""
    parser = argparse.ArgumentParser(prog="fencepost-demo-worker")
    parser.add_argument("--role", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--lock", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--db", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--invoice", type=int, required=True)
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--body", required=True)
    parser.add_argument("--mode", choices=("unfenced", "fenced"), required=True)
    parser.add_argument("--compute", type=float, default=0.5)
    args = parser.parse_args(argv)
    worker = Worker(args)
    try:
        return worker.run()
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - reported to the demo as an event
        worker.emit("error", message=f"{type(err).__name__}: {err}")
        raise


if __name__ == "__main__":
    sys.exit(main())
