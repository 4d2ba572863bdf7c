"""``fencepost acquire NAME [--ttl S] [--timeout S | --try]``: take a lock, print its token, hold it.

Prints the fencing token alone on the first line of stdout and
``FENCEPOST_LEASE_SECRET=<secret>`` on the second (the lease's credential,
for ``fencepost release --lease-secret`` from another process: keep it out
of logs), then holds the lock (the client streams keepalives) until SIGINT
or SIGTERM, and releases it. A hold lost meanwhile exits 3 with ``lost: REASON`` on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable
from typing import Any

import grpc

from fencepost.client import AsyncLockClient, AsyncLockHandle, FencepostError, TlsConfig

from .common import (
    EXIT_INTERRUPTED,
    EXIT_LOST,
    EXIT_OK,
    CliError,
    ConnectInterrupted,
    Formatter,
    acquire_error,
    connect_within,
    epilog,
    lease_hex,
)
from .flags import address_flag, addresses_of, lock_delay_flag, lock_name, parse_timeout, parse_ttl, tls_flags, tls_of
from . import progress
from .printable import shown_name

__all__ = ["acquire_unless", "add_parser", "execute"]


def add_parser(sub: Any) -> None:
    """Add the ``acquire`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "acquire", formatter_class=Formatter, epilog=epilog(),
        help="take a lock, print its fencing token, hold it until interrupted",
        description="Take the lock NAME, print its fencing token on the first line of "
                    "stdout, then hold it (streaming keepalives) until SIGINT or SIGTERM, "
                    "and release it.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("name", metavar="NAME", help="lock name")
    p.add_argument("--ttl", type=parse_ttl, default=10.0, metavar="S",
                   help="lease TTL in seconds, 1 to 86400 (default 10)")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--timeout", type=parse_timeout, default=None, metavar="S",
                      help="give up after S seconds of waiting, exit 4; exit 1 if no coordinator answers "
                           "within S (at least 2 s) (default: wait forever)")
    wait.add_argument("--try", dest="try_once", action="store_true", help="try once; exit 5 if the lock is held")
    lock_delay_flag(p)


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost acquire NAME [--ttl S] [--timeout S | --try] [--lock-delay S]``.

    Returns:
        0 once released after SIGINT or SIGTERM.

    Raises:
        CliError: with the exit code of :data:`~fencepost.client.cli.common.EXIT_CODES`.
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    lock_name(args.name)
    try:
        return asyncio.run(_acquire_and_hold(args, addresses, tls))
    except (FencepostError, grpc.RpcError) as err:
        raise acquire_error(err, args.name, args.timeout, addresses) from None


async def acquire_unless(client: AsyncLockClient, name: str, *, ttl: float, timeout: float | None,
                         try_once: bool, interrupt: Awaitable[object],
                         acquiring: Awaitable[AsyncLockHandle] | None = None, lock_delay: float = 0,
                         waiting_for: tuple[str, progress.Look] | None = None) -> AsyncLockHandle | None:
    """Acquire ``name`` unless ``interrupt`` completes first (a signal, say).

    On a terminal, a wait of over a second is shown on stderr, with the holder and this client's place in
    the queue (:mod:`.progress`).

    Args:
        client: A connected client.
        name: The lock name.
        ttl: Lease TTL in seconds.
        timeout: Seconds to wait; None waits forever (ignored with ``try_once``).
        try_once: Try once (``try_acquire``) instead of waiting.
        interrupt: An awaitable; if it completes before the grant, the acquire
            is cancelled (which removes the waiter's place in the queue).
        acquiring: Another acquire to run instead (a semaphore permit's), made by the caller.
        lock_delay: The hold's lock-delay in seconds (0: none).
        waiting_for: What the wait is for and how to look at it, for the progress line (``acquiring``'s:
            a semaphore's, an election's); None: the lock ``name`` (its holder and queue).

    Returns:
        The handle, or None when interrupted (a grant that raced with the
        interrupt is released).

    Raises:
        FencepostError: the acquire failed (LockTimeout, LockHeld, ...).
    """
    if acquiring is not None:
        acquiring = asyncio.ensure_future(acquiring)
    elif try_once:
        acquiring = asyncio.ensure_future(client.try_acquire(name, ttl=ttl, lock_delay=lock_delay))
    else:
        acquiring = asyncio.ensure_future(client.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay))
    interrupted = asyncio.ensure_future(interrupt)
    what, look = waiting_for or (shown_name(name), progress.lock_look(client, name))
    try:
        async with progress.showing(progress.Waiting(what, look)):
            await asyncio.wait({acquiring, interrupted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        interrupted.cancel()
    if acquiring.done():
        return acquiring.result()
    acquiring.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await acquiring
    if not acquiring.cancelled() and acquiring.exception() is None:
        await acquiring.result().release()
    return None


async def _acquire_and_hold(args: argparse.Namespace, addresses: list[str], tls: TlsConfig | None) -> int:
    """Acquire, print the token, hold until a signal or the loss, release.

    SIGINT and SIGTERM only set an event: nothing is interrupted half-way, the
    acquire is cancelled (which removes the waiter's place in the queue) or the
    hold is released, and the client closes its stream on the way out.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        client = AsyncLockClient(addresses, tls=tls)
        try:
            timeout = await connect_within(client, 0.0 if args.try_once else args.timeout, stop.wait())
        except ConnectInterrupted:
            raise CliError(f"interrupted while waiting for {shown_name(args.name)}", EXIT_INTERRUPTED) from None
        async with client:
            handle = await acquire_unless(client, args.name, ttl=args.ttl, timeout=timeout,
                                          try_once=args.try_once, interrupt=stop.wait(),
                                          lock_delay=args.lock_delay)
            if handle is None:
                raise CliError(f"interrupted while waiting for {shown_name(args.name)}", EXIT_INTERRUPTED)

            print(handle.token, flush=True)
            if handle.lease_secret:  # for `fencepost release --lease-secret` from another process
                print(f"FENCEPOST_LEASE_SECRET={handle.lease_secret}", flush=True)
            print(f"fencepost: holding {shown_name(handle.name)} with token {handle.token}, lease "
                  f"{lease_hex(handle.lease_id)} ({handle.lease_id}), ttl {handle.ttl:g} s; "
                  f"SIGINT or SIGTERM releases it",
                  file=sys.stderr, flush=True)

            lost = asyncio.ensure_future(handle.lost.wait())
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({lost, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                stopping.cancel()
            if handle.lost.is_set():
                raise CliError(f"lost: {handle.lost_reason or 'lease lost'}", EXIT_LOST, bare=True)
            await handle.release()
            print(f"fencepost: released {shown_name(handle.name)} (token {handle.token})", file=sys.stderr, flush=True)
            return EXIT_OK
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
