"""A Python lock holder driven line by line, for the TypeScript client's cross-language test.

``python tests/ts_peer.py ADDRESS NAME TTL TABLE`` (PostgreSQL from the PG*
variables) takes the lock NAME with the Python client, prints ``acquired
TOKEN``, then on each ``write VALUE`` line updates row 1 of TABLE through
:class:`~fencepost.client.fencing.SqlGuard` with its token and prints
``accepted`` or ``refused CURRENT_TOKEN``; ``exit`` ends it. Like the Node
worker (client/typescript/test/worker.ts), it never checks its hold before
writing.
"""

from __future__ import annotations

import os
import sys

import psycopg

from fencepost.client import LockClient, StaleTokenError
from fencepost.client.fencing import SqlGuard


def main() -> int:
    address, name, ttl, table = sys.argv[1:5]
    dsn = (f"host={os.environ['PGHOST']} port={os.environ['PGPORT']} user={os.environ['PGUSER']} "
           f"dbname={os.environ['PGDATABASE']}")
    with psycopg.connect(dsn) as conn, LockClient(address) as client:
        guard = SqlGuard(conn, table, "id", commit=True)
        handle = client.acquire(name, ttl=float(ttl), timeout=30)
        print(f"acquired {handle.token}", flush=True)
        for line in sys.stdin:
            command, _, value = line.strip().partition(" ")
            if command == "write":
                try:
                    guard.update(1, handle.token, {"val": value})
                    print("accepted", flush=True)
                except StaleTokenError as err:
                    print(f"refused {err.current_token}", flush=True)
            elif command == "exit":
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
