"""``fencepost leader NAME [--watch] [--json]``: the leader of an election (its value, lease and token).

Without ``--watch``: one Leader call (the addresses in turn, as ``status``);
exit 6 with a message when the election has no leader (:data:`LEADER_EXIT_CODES`:
etcd answers that case FAILED_PRECONDITION, "election: no leader", and 6 is
the precondition code of the table; 1 stays "coordinator unreachable"). With ``--watch``:
the current leader, then each change (a new leader, a new value, no leader)
as it happens, one line each, until Ctrl-C (exit 0); the observation
resumes across coordinator failover without missing or repeating a change,
unless etcd compacted the changes it missed: the next leader's line then
ends with :data:`SKIPPED_NOTE` (``"skipped": true`` with --json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from fencepost.client import AsyncLockClient, FencepostError, LeaderInfo, TlsConfig
from fencepost.client.v1 import lock_pb2 as pb

from .common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PRECONDITION,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CallFailed,
    CliError,
    ConnectInterrupted,
    Formatter,
    call,
    call_error,
    connect_within,
    epilog,
    err_text,
    lease_hex,
)
from .flags import address_flag, addresses_of, lock_name, tls_flags, tls_of
from .printable import shown_name

__all__ = ["EXIT_NO_LEADER", "LEADER_EXIT_CODES", "SKIPPED_NOTE", "add_parser", "execute", "fetch", "line"]

#: The end of a --watch line whose leader follows history etcd compacted away (LeaderInfo.skipped).
SKIPPED_NOTE = " (skipped: earlier changes were compacted away)"

#: ``fencepost leader NAME``'s exit code when the election has no leader (the table's precondition code).
EXIT_NO_LEADER = EXIT_PRECONDITION

LEADER_EXIT_CODES: dict[int, str] = {
    EXIT_OK: "the election has a leader (printed); --watch: stopped by SIGINT/SIGTERM",
    EXIT_UNAVAILABLE: "coordinator unreachable (a failed TLS handshake too) or not serving, or another server error",
    EXIT_USAGE: "bad input: a flag, an election name or a TLS file",
    EXIT_NO_LEADER: "the election has no leader (without --watch; with --json the line is printed too)",
    EXIT_INTERRUPTED: "interrupted before the answer came",
}
"""Exit codes of ``fencepost leader`` (shown by its --help)."""


def add_parser(sub: Any) -> None:
    """Add the ``leader`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "leader", formatter_class=Formatter, epilog=epilog(LEADER_EXIT_CODES),
        help="show an election's leader (value, lease, token), or follow it with --watch",
        description="The leader of the election NAME: its value, lease id and fencing token. Exits "
                    f"{EXIT_NO_LEADER} when the election has no leader. With --watch, prints the leader and then "
                    "each change until Ctrl-C.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("name", metavar="NAME", help="election name")
    p.add_argument("--watch", action="store_true", help="print each change of leader until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print one JSON object per line")


def line(election: str, info: LeaderInfo | None, as_json: bool) -> str:
    """One leader as printed: text, or a JSON object (``leader`` null when there is none)."""
    if as_json:
        return json.dumps({"election": election, "leader": None if info is None else {
            "value": info.value.decode("utf-8", "backslashreplace"), "lease_id": info.lease_id,
            "lease_id_hex": lease_hex(info.lease_id), "token": info.token, "skipped": info.skipped},
            "revision": None if info is None else info.revision})
    if info is None:
        return f"{shown_name(election)}: no leader"
    return (f"{shown_name(election)}: value {info.value.decode('utf-8', 'backslashreplace')!r} lease {lease_hex(info.lease_id)} "
            f"({info.lease_id}) token {info.token}" + (SKIPPED_NOTE if info.skipped else ""))


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost leader NAME [--watch] [--json]``.

    Returns:
        0 when there is a leader (or after Ctrl-C with --watch).

    Raises:
        CliError: no leader (exit 6, without --watch), bad input (exit 2), no coordinator answered (exit 1).
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    name = lock_name(args.name)
    if args.watch:
        return asyncio.run(_watch(addresses, name, args.json, tls))
    _, info = fetch(addresses, name, tls)
    if info is None:
        if args.json:
            print(line(name, None, True), flush=True)
        raise CliError(f"election {shown_name(name)} has no leader", EXIT_NO_LEADER)
    print(line(name, info, args.json), flush=True)
    return EXIT_OK


def fetch(addresses: list[str], name: str, tls: TlsConfig | None) -> tuple[str, LeaderInfo | None]:
    """Read election ``name``'s leader with one Leader call (``status``'s rules: the addresses in turn, 5 s).

    Returns:
        The address that answered, and the leader (None when the election has none).

    Raises:
        CliError: the call failed (exit 2 for INVALID_ARGUMENT, else 1).
    """
    try:
        address, resp = asyncio.run(call(addresses, "Leader", pb.LeaderRequest(election=name), idempotent=True,
                                         name=name, tls=tls))
    except CallFailed as failed:
        raise call_error(failed.error, addresses, failed.address, "Leader") from None
    if not resp.HasField("leader"):
        return address, None
    return address, LeaderInfo(bytes(resp.leader.value), int(resp.leader.lease_id), int(resp.leader.token),
                               int(resp.revision))


async def _watch(addresses: list[str], name: str, as_json: bool, tls: TlsConfig | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        client = AsyncLockClient(addresses, tls=tls)
        try:
            await connect_within(client, None, stop.wait())
        except ConnectInterrupted:
            return EXIT_OK  # stopped before it began, as a stopped watch
        async with client:
            async def follow() -> None:
                async for info in client.observe(name):
                    print(line(name, info, as_json), flush=True)

            following = asyncio.ensure_future(follow())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if following.done():
                following.result()  # raises what ended it
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        return EXIT_OK
    except FencepostError as err:
        raise CliError(f"cannot follow election {shown_name(name)}: {err_text(err)}", EXIT_UNAVAILABLE) from None
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
        sys.stdout.flush()
