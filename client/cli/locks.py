"""``fencepost locks [PREFIX] [--json] [--watch]``: every held lock, as a table or JSON.

A lock that a lock-delay holds back (its holder was lost) is listed too,
with no holder (``-``) and the delay's time left (the table's
``LOCK-DELAY`` column, shown when a listed lock has one).

A lock held for reading (a read-write lock's readers, docs/rwlocks.md) is
marked ``read(N)`` in the table's ``MODE`` column, N readers holding it
together (shown when a listed lock is held for reading; the other holders
are ``write``), and every lock carries ``mode`` (``read``, ``write``, null
when held back) and ``holder_count`` in JSON. ListLocks names one reader as
the holder; ``fencepost status NAME`` lists each of them.

ListLocks calls through the client's transport (the addresses in turn), one
per page, until the last page; every page of one listing is read at the
first page's etcd revision. ``--watch`` lists again every ``--interval``
seconds until Ctrl-C (exit 0); a listing that fails there prints its error
line and the next one is tried, except for bad input (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from typing import Any

from fencepost.client import TlsConfig
from fencepost.client.v1 import lock_pb2 as pb

from .common import EXIT_OK, EXIT_USAGE, CallFailed, CliError, Formatter, call, call_error, epilog, lease_hex
from .flags import address_flag, addresses_of, name_prefix, tls_flags, tls_of
from .holders import mode
from .printable import shown_name

__all__ = ["COLUMNS", "add_parser", "execute", "listing_json", "table"]

#: The table's column titles, in order (then ``MODE`` when a listed lock is held for reading, ``LOCK-DELAY`` when
#: one is held back by a lock-delay).
COLUMNS = ("NAME", "HOLDER LEASE", "TOKEN", "TTL LEFT", "HELD FOR", "WAITERS")
#: Shortest --interval, seconds.
MIN_INTERVAL_SECONDS = 0.1


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: a number of seconds") from None
    if not MIN_INTERVAL_SECONDS <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: {MIN_INTERVAL_SECONDS} to 86400 seconds")
    return value


def _page_size(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid page size {text!r}: a whole number") from None


def add_parser(sub: Any) -> None:
    """Add the ``locks`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "locks", formatter_class=Formatter, epilog=epilog(),
        help="list the held locks: holder lease, token, TTL left, held for, waiters, lock-delays",
        description="Every held lock whose name starts with PREFIX (all of them without it), read at one etcd "
                    "revision: the holder's lease id, the fencing token, the seconds left on the holder's lease, "
                    "how long it has been held ('-' when another coordinator granted it) and the number of "
                    "waiters; and every lock that a lock-delay holds back (its holder was lost), with the "
                    "delay's time left.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("prefix", nargs="?", default="", metavar="PREFIX", help="list only names that start with it")
    p.add_argument("--json", action="store_true", help="print one JSON object per listing")
    p.add_argument("--watch", action="store_true", help="list again every --interval seconds until Ctrl-C")
    p.add_argument("--interval", type=_interval, default=2.0, metavar="S",
                   help="seconds between listings with --watch (default 2)")
    p.add_argument("--page-size", type=_page_size, default=0, metavar="N",
                   help="locks per ListLocks call, 1 to 1000 (default: the coordinator's, 100)")


async def _listing(addresses: list[str], prefix: str, page_size: int, tls: TlsConfig | None
                   ) -> tuple[str, int, list[Any]]:
    """Read every page; returns (the address that answered last, the revision, the LockInfo messages)."""
    locks: list[Any] = []
    token, address, revision = "", addresses[0], 0
    while True:
        request = pb.ListLocksRequest(prefix=prefix, page_size=page_size, page_token=token)
        try:
            address, resp = await call(addresses, "ListLocks", request, idempotent=True, tls=tls)
        except CallFailed as failed:
            raise call_error(failed.error, addresses, failed.address, "ListLocks") from None
        locks.extend(resp.locks)
        revision = resp.revision
        token = resp.next_page_token
        if not token:
            return address, revision, locks


def listing_json(address: str, revision: int, locks: list[Any]) -> dict[str, Any]:
    """The JSON object of one listing (``--json``): numbers in seconds, null when unknown.

    A lock held back by a lock-delay has a null holder and token; ``lock_delay_seconds`` and
    ``lock_delay_remaining_ms`` are as in ``fencepost status NAME --json`` (-1: starts at the next acquire).
    """
    return {
        "address": address,
        "revision": revision,
        "locks": [{
            "name": lock.name,
            "holder_lease_id": lock.holder.lease_id if lock.HasField("holder") else None,
            "holder_lease_id_hex": lease_hex(lock.holder.lease_id) if lock.HasField("holder") else None,
            "token": lock.holder.token if lock.HasField("holder") else None,
            "mode": mode(lock.holder.read) if lock.HasField("holder") else None,
            "holder_count": lock.holder_count,
            "ttl_remaining_seconds": lock.ttl_remaining_seconds if lock.ttl_remaining_seconds >= 0 else None,
            "ttl_seconds": lock.ttl_seconds,
            "held_seconds": round(lock.held_seconds, 3) if lock.held_seconds >= 0 else None,
            "waiter_count": lock.waiter_count,
            "lock_delay_seconds": lock.lock_delay_seconds,
            "lock_delay_remaining_ms": lock.lock_delay_remaining_ms,
        } for lock in locks],
    }


def _delay(lock: Any) -> str:
    """The LOCK-DELAY cell of a lock held back by one ("" for a held lock)."""
    if not lock.lock_delay_seconds:
        return ""
    if lock.lock_delay_remaining_ms > 0:
        return f"{lock.lock_delay_remaining_ms / 1000:g}s left of {lock.lock_delay_seconds}s"
    if lock.lock_delay_remaining_ms < 0:
        return f"{lock.lock_delay_seconds}s from the next acquire"
    return "ended"


def _mode(lock: Any) -> str:
    """The MODE cell: ``read(N)`` for N readers holding together (``read`` from a coordinator that does not
    count them), ``write``, or ``-`` for a lock held back by a lock-delay."""
    if not lock.HasField("holder"):
        return "-"
    if lock.holder.read and lock.holder_count:
        return f"read({lock.holder_count})"
    return mode(lock.holder.read)


def _duration(seconds: float) -> str:
    if seconds < 0:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def table(locks: list[Any]) -> str:
    """The listing as an aligned text table (:data:`COLUMNS`, then ``MODE`` when a lock is held for reading,
    ``LOCK-DELAY`` when a lock is held back by one), or a line saying none is held."""
    if not locks:
        return "no held locks"
    delays = any(lock.lock_delay_seconds for lock in locks)
    modes = any(lock.holder.read for lock in locks)
    columns = (*COLUMNS, *(("MODE",) if modes else ()), *(("LOCK-DELAY",) if delays else ()))
    rows = [columns] + [(
        shown_name(lock.name), *((lease_hex(lock.holder.lease_id), str(lock.holder.token),
                      f"{lock.ttl_remaining_seconds}s/{lock.ttl_seconds}s" if lock.ttl_remaining_seconds >= 0
                      else "ended") if lock.HasField("holder") else ("-", "-", "-")),
        _duration(lock.held_seconds), str(lock.waiter_count),
        *((_mode(lock),) if modes else ()),
        *((_delay(lock),) if delays else ())) for lock in locks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    right = {2, 3, 4, 5}
    return "\n".join("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in rows)


def _show(args: argparse.Namespace, addresses: list[str], tls: TlsConfig | None) -> None:
    address, revision, locks = asyncio.run(_listing(addresses, args.prefix, args.page_size, tls))
    if args.json:
        print(json.dumps(listing_json(address, revision, locks)), flush=True)
        return
    if args.watch and sys.stdout.isatty():
        print("\033[H\033[2J", end="")  # clear the terminal, as watch(1) does
    print(table(locks))
    back = sum(1 for lock in locks if not lock.HasField("holder"))
    held_back = f", {back} held back by a lock-delay" if back else ""
    print(f"{len(locks) - back} held{held_back}, etcd revision {revision}, from {address}", flush=True)


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost locks [PREFIX] [--json] [--watch] [--interval S] [--page-size N]``.

    Returns:
        0 after one listing, or after Ctrl-C with --watch.

    Raises:
        CliError: bad input (exit 2) or no coordinator answered (exit 1; with --watch only for bad input).
    """
    name_prefix(args.prefix)
    addresses = addresses_of(args)
    tls = tls_of(args)
    if not args.watch:
        _show(args, addresses, tls)
        return EXIT_OK
    # Ctrl-C (SIGINT) ends the loop between listings: a KeyboardInterrupt raised
    # wherever the signal lands (inside gRPC's channel shutdown, or asyncio.run's
    # own clean-up) could leave the process hanging at exit instead.
    # A second Ctrl-C interrupts the listing in progress (up to the call's 5 s).
    interrupted = threading.Event()

    def on_sigint(_signum: int, _frame: Any) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        while not interrupted.is_set():
            started = time.monotonic()
            try:
                _show(args, addresses, tls)
            except CliError as err:
                if err.exit_code == EXIT_USAGE:
                    raise
                print(f"fencepost locks: {err}", file=sys.stderr, flush=True)
            interrupted.wait(max(0.0, args.interval - (time.monotonic() - started)))
        return EXIT_OK
    finally:
        signal.signal(signal.SIGINT, previous)
