"""``fencepost elect NAME --value V [--ttl S] [--timeout S | --try] [--grace S] -- CMD [ARGS...]``: run a command
while leading an election.

The election twin of ``fencepost run`` (:mod:`.run`), after ``etcdctl elect``:
campaign in the election NAME with the value V, and once this process leads,
run CMD with the leadership's fencing token in its environment (the variables
of ``fencepost run``: FENCEPOST_LOCK is the election's name, FENCEPOST_TOKEN
the leadership's token, ...; plus FENCEPOST_ELECTION_VALUE, the value).
Signals are forwarded to CMD; when CMD exits, the leadership is resigned;
when the leadership is lost first (lease expired or revoked), CMD gets
SIGTERM, then SIGKILL after ``--grace`` seconds, and ``elect`` exits with
``--lost-exit-code`` (3). The exit codes are those of ``fencepost run``.

As with ``run``, a frozen ``fencepost elect`` cannot stop its child: only a
storage that checks the token keeps a deposed leader's late writes out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Sequence
from typing import Any, cast

import grpc

from fencepost.client import AsyncLockClient, FencepostError, Leadership, TlsConfig

from .common import (
    EXIT_HELD,
    EXIT_INTERRUPTED,
    EXIT_LOST,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    CliError,
    ConnectInterrupted,
    Formatter,
    acquire_error,
    connect_within,
    epilog,
)
from .flags import address_flag, addresses_of, lock_name, parse_timeout, parse_ttl, tls_flags, tls_of
from .acquire import acquire_unless
from . import progress
from .printable import shown_name
from .child import FORWARDED_SIGNALS, PROGRAM, CommandError, RunResult, note, parse_grace, parse_lost_exit_code, \
    start, supervise
from .run import RUN_EXIT_CODES, child_environment

__all__ = ["ELECT_EXIT_CODES", "ENV_ELECTION_VALUE", "add_parser", "execute", "run_elected"]

ENV_ELECTION_VALUE = "FENCEPOST_ELECTION_VALUE"
"""The child's environment: the leader's value (``--value``)."""


ELECT_EXIT_CODES: dict[str, str] = {
    **RUN_EXIT_CODES,
    str(EXIT_USAGE): "bad input: a flag, an election name, a TTL; or no command after --",
    str(EXIT_LOST): "the leadership was lost while the command ran: the command got SIGTERM, then "
                    "SIGKILL after --grace (--lost-exit-code changes 3)",
    str(EXIT_TIMEOUT): "--timeout passed before this process led; the command did not run",
    str(EXIT_HELD): "--try: the election has another leader; the command did not run",
    str(EXIT_INTERRUPTED): "interrupted before this process led; the command did not run",
}
"""Exit codes of ``fencepost elect``: those of ``fencepost run``, said of an election."""


def add_parser(sub: Any) -> None:
    """Add the ``elect`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "elect", formatter_class=Formatter,
        epilog=epilog(
            ELECT_EXIT_CODES,
            "The command's environment gets the variables of fencepost run (FENCEPOST_LOCK: the",
            "election's name, FENCEPOST_TOKEN: the leadership's fencing token, FENCEPOST_LEASE_ID,",
            "FENCEPOST_TTL, FENCEPOST_ADDRESS, ...) and FENCEPOST_ELECTION_VALUE (the value).",
        ),
        usage="fencepost elect NAME --value V [--ttl S] [--timeout S | --try] [--grace S] "
              "[--lost-exit-code N] [--address HOST:PORT] [TLS flags] -- CMD [ARGS...]",
        help="run a command while leading an election; the command gets the leadership's fencing token",
        description="Campaign in the election NAME with the value V; once leader, run CMD with the "
                    "leadership's fencing token in its environment while the client streams keepalives, and "
                    "resign when CMD exits. If the leadership is lost first, CMD gets SIGTERM, then SIGKILL "
                    "after --grace seconds. Exits with CMD's status.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("name", metavar="NAME", help="election name")
    p.add_argument("--value", required=True, metavar="V", help="the value this process publishes as leader")
    p.add_argument("--ttl", type=parse_ttl, default=10.0, metavar="S",
                   help="lease TTL in seconds, 1 to 86400 (default 10)")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--timeout", type=parse_timeout, default=None, metavar="S",
                      help="give up after S seconds of waiting, exit 4; exit 1 if no coordinator answers "
                           "within S (at least 2 s) (default: wait forever)")
    wait.add_argument("--try", dest="try_once", action="store_true",
                      help="try once; exit 5 if the election has a leader")
    p.add_argument("--grace", type=parse_grace, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL after the leadership is lost (default 5)")
    p.add_argument("--lost-exit-code", type=parse_lost_exit_code, default=EXIT_LOST, metavar="N",
                   help=f"exit code when the leadership is lost while CMD runs (default {EXIT_LOST})")


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost elect NAME --value V [...] -- CMD [ARGS...]`` (``args.argv`` is CMD [ARGS...]).

    Returns:
        The command's exit status, or the code of ``fencepost run``'s table that applies.

    Raises:
        CliError: the command did not run, or this process did not become leader.
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    lock_name(args.name)
    if not args.argv:
        raise CliError("no command: give it after --, as in fencepost elect NAME --value V -- CMD [ARGS...]",
                       EXIT_USAGE)
    PROGRAM.set("fencepost elect")
    try:
        result = asyncio.run(run_elected(
            addresses, args.name, args.value, args.argv, ttl=args.ttl, timeout=0.0 if args.try_once else args.timeout,
            grace=args.grace, lost_exit_code=args.lost_exit_code, tls=tls))
    except CommandError as err:
        raise CliError(str(err), err.exit_code) from None
    except (FencepostError, grpc.RpcError) as err:
        cli_err = acquire_error(err, args.name, args.timeout, addresses)
        if args.try_once and cli_err.exit_code == EXIT_TIMEOUT:
            cli_err = CliError(f"election {args.name} has a leader", EXIT_HELD)
        if cli_err.exit_code in (EXIT_TIMEOUT, EXIT_HELD):
            cli_err = CliError(f"{cli_err}; command not run", cli_err.exit_code)
        raise cli_err from None
    if result.message:
        print(result.message if result.lost_reason else f"fencepost elect: {result.message}",
              file=sys.stderr, flush=True)
    return result.exit_code


async def _campaign_unless(client: AsyncLockClient, name: str, value: str, *, ttl: float, timeout: float | None,
                           interrupt: Awaitable[object]) -> Leadership | None:
    """Campaign unless ``interrupt`` completes first; None when interrupted (a leadership won meanwhile is resigned:
    a Leadership's release is its resign)."""
    # The argument's own bytes (a value that is not UTF-8 arrives with surrogate escapes, as every argv does).
    campaigning = client.campaign(name, os.fsencode(value), ttl=ttl, timeout=timeout)
    lead = await acquire_unless(client, name, ttl=ttl, timeout=timeout, try_once=False, interrupt=interrupt,
                                acquiring=campaigning,
                                waiting_for=(f"election {shown_name(name)}", progress.election_look(client, name)))
    return cast(Leadership | None, lead)


async def run_elected(addresses: Sequence[str], name: str, value: str, command: Sequence[str], *, ttl: float,
                      timeout: float | None = None, grace: float = 5.0, lost_exit_code: int = EXIT_LOST,
                      tls: TlsConfig | None = None) -> RunResult:
    """Campaign in ``name`` with ``value``, run ``command`` while leading, resign.

    Args:
        addresses: Coordinator addresses.
        name: The election's name.
        value: The value published as leader (its bytes as given on the command line).
        command: The program and its arguments.
        ttl: Lease TTL in seconds.
        timeout: Seconds to wait to lead (0: one try); None waits forever.
        grace: Seconds between SIGTERM and SIGKILL after the leadership is lost.
        lost_exit_code: Exit code when the leadership is lost while the child runs.
        tls: TLS settings; None for plaintext.

    Returns:
        A :class:`~.child.RunResult`; the child has exited and been reaped.

    Raises:
        CommandError: the command could not be started (the leadership is resigned first).
        fencepost.client.FencepostError: this process did not become leader (LockTimeout, Unavailable, ...).
    """

    loop = asyncio.get_running_loop()
    received: asyncio.Queue[int] = asyncio.Queue()
    for sig in FORWARDED_SIGNALS:
        loop.add_signal_handler(sig, received.put_nowait, sig)
    try:
        client = AsyncLockClient(list(addresses), tls=tls)
        try:
            timeout = await connect_within(client, timeout, received.get())  # --try: timeout 0
        except ConnectInterrupted:
            return RunResult(EXIT_INTERRUPTED, message=f"interrupted while campaigning in {name}; command not run")
        async with client:
            lead = await _campaign_unless(client, name, value, ttl=ttl, timeout=timeout, interrupt=received.get())
            if lead is None:
                return RunResult(EXIT_INTERRUPTED, message=f"interrupted while campaigning in {name}; command not run")
            env = child_environment(dict(os.environ), name=lead.name, token=lead.token, lease_id=lead.lease_id,
                                    ttl=lead.ttl, addresses=addresses, tls=tls, lease_secret=lead.lease_secret)
            env[ENV_ELECTION_VALUE] = value
            try:
                proc = await start(command, env)
            except CommandError:
                with contextlib.suppress(FencepostError):
                    await lead.resign()
                raise
            note(f"leading election {shown_name(lead.name)} with token {lead.token}, lease 0x{lead.lease_id:x} "
                  f"({lead.lease_id}), ttl {lead.ttl:g} s; running pid {proc.pid}: {' '.join(command)}")
            return await supervise(proc, lead, received, grace=grace, lost_exit_code=lost_exit_code)
    finally:
        for sig in FORWARDED_SIGNALS:
            loop.remove_signal_handler(sig)

