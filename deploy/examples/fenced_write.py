"""A fenced write to PostgreSQL, run under ``fencepost run`` (the example worker of deploy/).

    fencepost run invoice-42 --ttl 10 --timeout 60 -- python fenced_write.py

``fencepost run`` takes the lock, then starts this script with the grant in
its environment: ``FENCEPOST_LOCK`` (the lock name) and ``FENCEPOST_TOKEN``
(the fencing token). The script records "this job ran, by this writer" in
one row per lock name, and the write carries the token: the row keeps the
highest token it has accepted, and the statement's WHERE clause refuses a
token lower than that, in the same statement as the write (never a read
followed by a write). A worker that stalled past its lease and writes after
the next holder did is refused here, whatever it believes about its lock.

The statement is the one ``fencepost.client.fencing.SqlGuard.upsert`` issues
(tests/test_deploy_worker.py checks that they stay equal); in your own code, use
the guard. Only psycopg 3 is needed here.

Environment:
    FENCEPOST_LOCK, FENCEPOST_TOKEN: set by ``fencepost run``.
    DATABASE_URL: a libpq connection string or URI, e.g.
        ``postgresql://postgres:PASSWORD@postgres:5432/fencepost``.

Exit status: 0 written; 1 refused (a newer holder has written: stale
token; or the stored token is not a token), the stored token on stderr;
2 a missing or bad variable.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys

TABLE = "fencepost_example_jobs"

CREATE = (f'CREATE TABLE IF NOT EXISTS "{TABLE}" ('
          '"name" TEXT PRIMARY KEY, "writer" TEXT NOT NULL, "ran_at" TIMESTAMPTZ NOT NULL, '
          '"fencing_token" BIGINT)')

#: Insert the row, or update it only if our token is not lower than the stored one (and that one is a
#: token: a value >= 0 of an integer column; docs/fencing.md, "What a stored token must be").
UPSERT = (f'INSERT INTO "{TABLE}" ("name", "writer", "ran_at", "fencing_token") VALUES (%s, %s, %s, %s) '
          'ON CONFLICT ("name") DO UPDATE SET "writer" = excluded."writer", "ran_at" = excluded."ran_at", '
          '"fencing_token" = excluded."fencing_token" '
          f'WHERE "{TABLE}"."fencing_token" IS NULL OR (pg_typeof("{TABLE}"."fencing_token") IN '
          "('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype) AND "
          f'"{TABLE}"."fencing_token" >= 0 AND "{TABLE}"."fencing_token" <= excluded."fencing_token")')

STORED = f'SELECT "fencing_token" FROM "{TABLE}" WHERE "name" = %s'


def main() -> int:
    """Write this run's row under the fencing token; see the module docstring for the exit status."""
    try:
        name = os.environ["FENCEPOST_LOCK"]
        token = int(os.environ["FENCEPOST_TOKEN"])
        dsn = os.environ["DATABASE_URL"]
    except (KeyError, ValueError) as exc:
        print(f"fenced_write: needs FENCEPOST_LOCK, FENCEPOST_TOKEN (run it under fencepost run) and "
              f"DATABASE_URL: {exc!r}", file=sys.stderr)
        return 2
    import psycopg

    writer = f"{socket.gethostname()}:{os.getpid()}"
    with psycopg.connect(dsn) as conn:
        conn.execute(CREATE)
        conn.commit()
        cur = conn.execute(UPSERT, (name, writer, datetime.datetime.now(datetime.timezone.utc), token))
        accepted = cur.rowcount == 1
        conn.commit()
        if accepted:
            print(f"fenced_write: {name}: written by {writer} with token {token}", flush=True)
            return 0
        row = conn.execute(STORED, (name,)).fetchone()
    stored = row[0] if row else None
    if isinstance(stored, int) and stored >= 0:
        print(f"fenced_write: {name}: REFUSED: token {token} is lower than the stored token {stored} "
              f"(a newer holder has written)", file=sys.stderr, flush=True)
    else:
        print(f"fenced_write: {name}: REFUSED: the stored token {stored!r} is not a fencing token "
              f"(written outside the guard)", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
