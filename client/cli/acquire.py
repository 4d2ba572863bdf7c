"""``fencepost acquire NAME... [--ttl S] [--timeout S | --try] [--read]``: take a lock, print its token, hold it.

Prints the fencing token alone on the first line of stdout and
``FENCEPOST_LEASE_SECRET=<secret>`` on the second (the lease's credential,
for ``fencepost release --lease-secret`` from another process: keep it out
of logs), then holds the lock (the client streams keepalives) until SIGINT
or SIGTERM, and releases it. A hold lost meanwhile exits 3 with ``lost: REASON`` on stderr.

``--read`` takes a read hold (docs/rwlocks.md; ``fencepost release --read``
releases it by hand). Several names are a multi-lock (:mod:`.multilock`):
every lock or none, the first line holding each name's token in the order
given, space-separated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from fencepost.client import AsyncLockClient, AsyncLockHandle, AsyncMultiLockHandle, FencepostError, LockHeld, TlsConfig

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
from .flags import (
    READ_HELP,
    address_flag,
    addresses_of,
    lock_delay_flag,
    parse_timeout,
    parse_ttl,
    read_flag,
    refuse_read_flags,
    tls_flags,
    tls_of,
)
from . import multilock, progress
from .printable import shown_name

__all__ = ["Held", "acquire_unless", "add_parser", "execute", "held_name"]

#: What :func:`acquire_unless` returns: a lock's handle (a permit's, a leadership's), or a multi-lock's.
Held = TypeVar("Held", AsyncLockHandle, AsyncMultiLockHandle)


def add_parser(sub: Any) -> None:
    """Add the ``acquire`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "acquire", formatter_class=Formatter, epilog=epilog(),
        help="take a lock, print its fencing token, hold it until interrupted",
        description="Take the lock NAME, print its fencing token on the first line of "
                    "stdout, then hold it (streaming keepalives) until SIGINT or SIGTERM, "
                    "and release it. Several names: take every lock or none (a multi-lock; "
                    "no deadlock whatever the order), and print their tokens in that order.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("names", nargs="+", metavar="NAME", help="lock name; several: all or none")
    p.add_argument("--ttl", type=parse_ttl, default=10.0, metavar="S",
                   help="lease TTL in seconds, 1 to 86400 (default 10)")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--timeout", type=parse_timeout, default=None, metavar="S",
                      help="give up after S seconds of waiting, exit 4; exit 1 if no coordinator answers "
                           "within S (at least 2 s) (default: wait forever)")
    wait.add_argument("--try", dest="try_once", action="store_true", help="try once; exit 5 if the lock is held")
    lock_delay_flag(p)
    read_flag(p, f"{READ_HELP}; `fencepost release --read` releases it by hand")


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost acquire NAME... [--ttl S] [--timeout S | --try] [--lock-delay S] [--read]``.

    Returns:
        0 once released after SIGINT or SIGTERM.

    Raises:
        CliError: with the exit code of :data:`~fencepost.client.cli.common.EXIT_CODES`.
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    names = multilock.lock_names(args.names)
    refuse_read_flags(args)
    multilock.refuse_flags(args, names)
    try:
        return asyncio.run(_acquire_and_hold(args, names, addresses, tls))
    except (FencepostError, grpc.RpcError) as err:
        raise acquire_error(err, held_name(err, names), args.timeout, addresses) from None


def held_name(err: BaseException, names: list[str]) -> str:
    """The name(s) an acquire error is about: the held one of a multi-lock's LockHeld, else every name."""
    if len(names) > 1 and isinstance(err, LockHeld) and err.name in names:
        return err.name
    return ", ".join(names)


async def acquire_unless(client: AsyncLockClient, name: str, *, ttl: float, timeout: float | None,
                         try_once: bool, interrupt: Awaitable[object],
                         acquiring: Awaitable[Held] | None = None, lock_delay: float = 0,
                         waiting_for: tuple[str, progress.Look] | None = None, read: bool = False) -> Held | None:
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
        acquiring: Another acquire to run instead (a semaphore permit's, a multi-lock's), made by the caller.
        lock_delay: The hold's lock-delay in seconds (0: none).
        waiting_for: What the wait is for and how to look at it, for the progress line (``acquiring``'s:
            a semaphore's, an election's); None: the lock ``name`` (its holder and queue).
        read: A read hold of ``name`` (docs/rwlocks.md), not a write hold.

    Returns:
        The handle (``acquiring``'s, else a lock's), or None when interrupted (a grant that raced with the
        interrupt is released).

    Raises:
        FencepostError: the acquire failed (LockTimeout, LockHeld, ...).
    """
    if acquiring is not None:
        acquiring = asyncio.ensure_future(acquiring)
    elif try_once:
        acquiring = asyncio.ensure_future(client.try_acquire(name, ttl=ttl, lock_delay=lock_delay, read=read))
    else:
        acquiring = asyncio.ensure_future(client.acquire(name, ttl=ttl, timeout=timeout, lock_delay=lock_delay,
                                                         read=read))
    interrupted = asyncio.ensure_future(interrupt)
    what = f"a read hold of {shown_name(name)}" if read else shown_name(name)
    what, look = waiting_for or (what, progress.lock_look(client, name))
    try:
        async with progress.showing(progress.Waiting(what, look)):
            await asyncio.wait({acquiring, interrupted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Both may be done: the signal was taken from the queue, so it wins (else nothing would act on it).
        signalled = interrupted.done() and not interrupted.cancelled()
        interrupted.cancel()
    if acquiring.done() and not signalled:
        return acquiring.result()
    acquiring.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await acquiring
    if not acquiring.cancelled() and acquiring.exception() is None:
        await acquiring.result().release()
    return None


async def _acquire_and_hold(args: argparse.Namespace, names: list[str], addresses: list[str],
                            tls: TlsConfig | None) -> int:
    """Acquire, print the token(s), hold until a signal or the loss, release.

    SIGINT and SIGTERM only set an event: nothing is interrupted half-way, the
    acquire is cancelled (which removes the waiter's place in the queue) or the
    hold is released, and the client closes its stream on the way out.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    interrupted = CliError(f"interrupted while waiting for {multilock.shown_names(names)}", EXIT_INTERRUPTED)
    try:
        client = AsyncLockClient(addresses, tls=tls)
        try:
            timeout = await connect_within(client, 0.0 if args.try_once else args.timeout, stop.wait())
        except ConnectInterrupted:
            raise interrupted from None
        async with client:
            acquiring, waiting_for = (multilock.acquiring(client, names, ttl=args.ttl, timeout=timeout,
                                                          try_once=args.try_once)
                                      if len(names) > 1 else (None, None))
            handle = await acquire_unless(client, names[0], ttl=args.ttl, timeout=timeout,
                                          try_once=args.try_once, interrupt=stop.wait(), acquiring=acquiring,
                                          lock_delay=args.lock_delay, waiting_for=waiting_for, read=args.read)
            if handle is None:
                raise interrupted
            if isinstance(handle, AsyncMultiLockHandle):
                tokens, secret = [handle.token_for(name) for name in names], multilock.lease_secret(handle)
                words = multilock.hold_words(handle)
            else:
                tokens, secret = [handle.token], handle.lease_secret
                words = f"{shown_name(handle.name)} {'for reading ' if args.read else ''}with token {handle.token}"

            print(" ".join(str(token) for token in tokens), flush=True)
            if secret:  # for `fencepost release --lease-secret` from another process
                print(f"FENCEPOST_LEASE_SECRET={secret}", flush=True)
            print(f"fencepost: holding {words}, lease {lease_hex(handle.lease_id)} ({handle.lease_id}), "
                  f"ttl {handle.ttl:g} s; SIGINT or SIGTERM releases it",
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
            print(f"fencepost: released {words}", file=sys.stderr, flush=True)
            return EXIT_OK
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
