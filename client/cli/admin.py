"""``fencepost admin COMMAND [flags]``: operator commands.

Two talk to a coordinator (AdminRevoke, ListSessions; they need an access
policy that grants the caller ``admin``, docs/security.md "Administration"):

- ``fencepost admin revoke NAME``: end the hold of lock NAME by revoking its
  holder's lease (the holder is told at once, the next waiter is granted
  with a larger fencing token). Prints what was revoked; exit 0 also when
  the lock was free (the line says so). ``--election``: depose election
  NAME's leader the same way; ``--semaphore --slot N``: the holder of
  semaphore NAME's permit N.
- ``fencepost admin end-lock-delay NAME [--json]``: end lock NAME's lock-delay.
- ``fencepost admin sessions [--json]``: every live lease with its owner
  identity, TTL and the locks it holds and waits for.

One talks to etcd directly (needs the ``fencepost[coordinator]`` extra):
``fencepost admin recover-tokens --above T --etcd-endpoints ...`` makes every
later fencing token greater than T after etcd was restored from an older
snapshot (docs/deploy.md, "Restoring etcd from a snapshot"). Its flags belong
to :func:`fencepost.coordinator.process.admin.main`, imported only for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from fencepost.client import TlsConfig
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1.keys import MAX_PERMITS
from fencepost.client._transport.wire import new_request_id

from .common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CallFailed,
    CliError,
    Formatter,
    Parser,
    call,
    call_error,
    epilog,
    err_text,
    lease_hex,
)
from .flags import address_flag, addresses_of, lock_name, tls_flags, tls_of
from .printable import shown_name

__all__ = ["HELP", "build_parser", "execute", "sessions_json", "sessions_table"]

HELP = ("operator commands: revoke a lock's holder, list sessions, recover-tokens after an etcd restore "
        "(see `fencepost admin --help`)")
"""The one-line help of ``admin`` in ``fencepost --help``."""

#: The sessions table's column titles, in order.
COLUMNS = ("LEASE", "OWNER", "TTL LEFT", "HOLDS", "WAITS")
_NEEDS = "Needs an access policy on the coordinator that grants the caller's identity the admin action."


def build_parser() -> argparse.ArgumentParser:
    """The ``fencepost admin`` parser of the commands that call a coordinator (``recover-tokens`` is handed on)."""
    parser = Parser(prog="fencepost admin", formatter_class=Formatter,
                    description="Operator commands. revoke and sessions call a coordinator; recover-tokens "
                                "talks to etcd directly (see `fencepost admin recover-tokens --help`).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    sub.add_parser("recover-tokens", add_help=False,
                   help="after etcd was restored from an older snapshot: make every new fencing token greater "
                        "than --above and serve again")
    revoke = sub.add_parser(
        "revoke", formatter_class=Formatter, epilog=epilog(None, _NEEDS),
        help="end the hold of a lock (an election's leader, a semaphore's permit) by revoking its holder's lease",
        description="Revoke the lease of lock NAME's holder (AdminRevoke): the lease ends with all its holds and "
                    "waits, the holder is told at once and its keepalives fail, and the next waiter is granted "
                    "with a larger fencing token. A free lock is left alone (exit 0, the line says so). With "
                    "--election, election NAME's leader is deposed the same way (the next candidate leads); with "
                    "--semaphore --slot N, the holder of semaphore NAME's permit N (`fencepost status NAME "
                    "--semaphore` lists the slots).")
    address_flag(revoke)
    tls_flags(revoke)
    revoke.add_argument("name", metavar="NAME", help="the lock (election, semaphore) whose holder's lease is revoked")
    kind = revoke.add_mutually_exclusive_group()
    kind.add_argument("--election", action="store_true", help="NAME is an election: revoke its leader's lease")
    kind.add_argument("--semaphore", action="store_true",
                      help="NAME is a semaphore: revoke the lease of the holder of permit --slot")
    revoke.add_argument("--slot", type=_slot, metavar="N",
                        help="with --semaphore (and then required): the permit slot, 0 to the semaphore's "
                             "permits - 1")
    revoke.add_argument("--json", action="store_true", help="print one JSON object")
    sessions = sub.add_parser(
        "sessions", formatter_class=Formatter, epilog=epilog(None, _NEEDS),
        help="list the live leases: owner identity, TTL, holds and waits",
        description="Every live lease granted by the coordinators (ListSessions), in lease id order: its owner's "
                    "certificate identity ('-' without one), seconds left of its TTL, and the locks it holds and "
                    "waits for.")
    address_flag(sessions)
    tls_flags(sessions)
    sessions.add_argument("--json", action="store_true", help="print one JSON object")
    end = sub.add_parser(
        "end-lock-delay", formatter_class=Formatter, epilog=epilog(None, _NEEDS),
        help="end the lock-delay of lock NAME (running, or pending after its holder was lost)",
        description="End the lock-delay of lock NAME: its waiters are granted at once (AdminEndLockDelay; "
                    "a hold still held keeps its own). Prints what was ended; exit 0 also when there was none.")
    address_flag(end)
    tls_flags(end)
    end.add_argument("name", metavar="NAME", help="the lock whose lock-delay ends")
    end.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _slot(text: str) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"slot must be a whole number, 0 or more, got {text!r}") from None
    if not 0 <= value < MAX_PERMITS:
        raise argparse.ArgumentTypeError(f"slot must be 0 or more (below the semaphore's permits, at most "
                                         f"{MAX_PERMITS - 1}), got {text}")
    return value


def _revoke_target(args: argparse.Namespace) -> tuple[int, int, str]:
    """The (HoldKind, slot, words for the output) of ``admin revoke``'s flags.

    Raises:
        CliError: --slot without --semaphore, or --semaphore without --slot (exit 2).
    """
    if args.semaphore:
        if args.slot is None:
            raise CliError("--semaphore needs --slot N (the permit whose holder is revoked)", EXIT_USAGE)
        return pb.HoldKind.HOLD_KIND_SEMAPHORE, args.slot, f"semaphore {shown_name(args.name)} permit {args.slot}"
    if args.slot is not None:
        raise CliError("--slot is for a semaphore's permit: give it with --semaphore", EXIT_USAGE)
    if args.election:
        return pb.HoldKind.HOLD_KIND_ELECTION, 0, f"election {shown_name(args.name)}"
    return pb.HoldKind.HOLD_KIND_LOCK, 0, args.name


def sessions_json(address: str, revision: int, sessions: list[Any]) -> dict[str, Any]:
    """The JSON object of ``admin sessions --json``: owner null without a certificate."""
    return {"address": address, "revision": revision, "sessions": [{
        "lease_id": s.lease_id, "lease_id_hex": lease_hex(s.lease_id), "owner_identity": s.owner_identity or None,
        "ttl_seconds": s.ttl_seconds, "ttl_remaining_seconds": s.ttl_remaining_seconds,
        "holds": list(s.holds), "waits": list(s.waits)} for s in sessions]}


def sessions_table(sessions: list[Any]) -> str:
    """The sessions as an aligned text table (:data:`COLUMNS`), or a line saying there is none."""
    if not sessions:
        return "no live sessions"
    rows = [COLUMNS] + [(lease_hex(s.lease_id), s.owner_identity or "-",
                         f"{s.ttl_remaining_seconds}s/{s.ttl_seconds}s", ",".join(map(shown_name, s.holds)) or "-",
                         ",".join(map(shown_name, s.waits)) or "-") for s in sessions]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.rjust(w) if i == 2 else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in rows)


async def _sessions(addresses: list[str], tls: TlsConfig | None) -> tuple[str, int, list[Any]]:
    found: list[Any] = []
    token, address, revision = "", addresses[0], 0
    while True:
        try:
            address, resp = await call(addresses, "ListSessions", pb.ListSessionsRequest(page_token=token),
                                       idempotent=True, tls=tls)
        except CallFailed as failed:
            raise call_error(failed.error, addresses, failed.address, "ListSessions") from None
        found.extend(resp.sessions)
        revision, token = resp.revision, resp.next_page_token
        if not token:
            return address, revision, found


def _run(args: argparse.Namespace) -> int:
    addresses = addresses_of(args)
    tls = tls_of(args)
    if args.command == "sessions":
        address, revision, found = asyncio.run(_sessions(addresses, tls))
        if args.json:
            print(json.dumps(sessions_json(address, revision, found)), flush=True)
        else:
            print(sessions_table(found))
            print(f"{len(found)} sessions, etcd revision {revision}, from {address}", flush=True)
        return EXIT_OK
    lock_name(args.name)
    if args.command == "end-lock-delay":
        return _end_lock_delay(addresses, tls, args.name, args.json)
    kind, slot, what = _revoke_target(args)
    # With a request id (the same on each retry), a retry after a lost answer answers as the first
    # attempt did instead of revoking the next holder: retried like an idempotent call.
    request = pb.AdminRevokeRequest(name=args.name, kind=kind, slot=slot, request_id=new_request_id())
    try:
        address, resp = asyncio.run(call(addresses, "AdminRevoke", request, idempotent=True, name=args.name,
                                         tls=tls))
    except CallFailed as failed:
        raise call_error(failed.error, addresses, failed.address, "AdminRevoke") from None
    if args.json:
        shown = {"kind": _KIND_WORDS[kind]} | ({"slot": slot} if kind == pb.HoldKind.HOLD_KIND_SEMAPHORE else {})
        print(json.dumps({"address": address, "name": args.name, **shown, "revoked": resp.revoked,
                          "lease_id": resp.lease_id or None, "token": resp.token or None}), flush=True)
    elif resp.revoked:
        holder = "the leader" if kind == pb.HoldKind.HOLD_KIND_ELECTION else "the holder"
        print(f"revoked lease {lease_hex(resp.lease_id)} ({resp.lease_id}), {holder} of {what} with token "
              f"{resp.token}", flush=True)
    elif kind == pb.HoldKind.HOLD_KIND_ELECTION:
        print(f"{what} has no leader: nothing revoked", flush=True)
    else:
        print(f"{what} is not held: nothing revoked", flush=True)
    return EXIT_OK


def _end_lock_delay(addresses: list[str], tls: Any, name: str, as_json: bool) -> int:
    try:
        address, resp = asyncio.run(call(addresses, "AdminEndLockDelay", pb.AdminEndLockDelayRequest(name=name),
                                         idempotent=True, name=name, tls=tls))
    except CallFailed as failed:
        raise call_error(failed.error, addresses, failed.address, "AdminEndLockDelay") from None
    if as_json:
        print(json.dumps({"address": address, "name": name, "ended": resp.ended,
                          "lock_delay_remaining_ms": resp.lock_delay_remaining_ms}), flush=True)
    elif resp.ended:
        left = f" ({resp.lock_delay_remaining_ms / 1000:g} s were left)" if resp.lock_delay_remaining_ms else ""
        print(f"lock-delay of {shown_name(name)} ended{left}", flush=True)
    else:
        print(f"{shown_name(name)} has no lock-delay: nothing ended", flush=True)
    return EXIT_OK


#: The ``kind`` of ``admin revoke --json``.
_KIND_WORDS = {pb.HoldKind.HOLD_KIND_LOCK: "lock", pb.HoldKind.HOLD_KIND_ELECTION: "election",
               pb.HoldKind.HOLD_KIND_SEMAPHORE: "semaphore"}


def execute(argv: list[str]) -> int:
    """Run ``fencepost admin ARGS...``: revoke and sessions here, recover-tokens by the coordinator's admin main.

    Args:
        argv: The arguments after ``admin``.

    Returns:
        The command's exit code (see :data:`~.common.EXIT_CODES`); 2 when
        recover-tokens is asked for and the coordinator cannot be imported.
    """
    if not argv or argv[0] != "recover-tokens":
        args = build_parser().parse_args(argv)
        try:
            return _run(args)
        except CliError as err:
            print(str(err) if err.bare else f"fencepost admin {args.command}: {err}", file=sys.stderr, flush=True)
            return err.exit_code
        except KeyboardInterrupt:
            print(f"fencepost admin {args.command}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
    try:
        from fencepost.coordinator.process import admin
    except ImportError as err:
        missing = getattr(err, "name", None) or str(err)
        if missing.startswith("fencepost"):
            print(f"fencepost admin: cannot import the coordinator: {err_text(err)}", file=sys.stderr)
        else:
            print(f"fencepost admin: the coordinator extra is not installed (missing module "
                  f"{missing}); install it with: pip install 'fencepost[coordinator]'", file=sys.stderr)
        return EXIT_USAGE
    return int(admin.main(argv) or 0)
