"""``fencepost run NAME... --ttl S [--permits N | --read] [--timeout S | --try] [--grace S] -- CMD [ARGS...]``:
hold a lock (a semaphore's permit, a read hold, several locks) while a command runs.

Compare ``etcdctl lock NAME CMD`` and ``consul lock PREFIX CMD``: they run a
command under a lock but do not tell it its fencing token. ``fencepost run``
does, through the child's environment, so the command can hand the token to
its storage (see :mod:`fencepost.client.fencing`).

Sequence:

1. Acquire ``NAME`` with a lease of ``ttl`` seconds (waiting up to
   ``timeout`` seconds; forever when None). The client streams keepalives
   from then on.
2. Start the command with :data:`ENV_LOCK`, :data:`ENV_TOKEN`,
   :data:`ENV_LEASE_ID`, :data:`ENV_TTL` and :data:`ENV_ADDRESS` added to
   the environment. It shares our stdin, stdout and stderr, and leads a
   session and process group of its own: ``run`` owns the whole process
   tree the command starts (``sh -c 'worker & worker & wait'`` included),
   and every signal below goes to that group, not only to the child.
3. SIGINT, SIGTERM and SIGHUP sent to ``fencepost run`` are forwarded to the
   child's process group (``run`` itself keeps going until the child exits).
4. When the child exits, what it left running in its group gets SIGTERM,
   then SIGKILL after ``grace`` seconds, while the lock is still held; then
   the lock is released and ``run`` exits with the child's status
   (``128 + N`` when signal N killed it).
5. When the hold is lost first (lease expired, revoked, the lock released or
   deleted by someone else), send SIGTERM to the process group, SIGKILL to
   whatever is left of it after ``grace`` seconds, and exit with
   ``lost_exit_code`` (3 by default).

With ``--permits N``, NAME is a semaphore of N permits
(:meth:`~fencepost.client.AsyncLockClient.semaphore`): ``run`` takes a permit
instead of the lock, and the child also gets :data:`ENV_SLOT`, the permit's
slot; its token is that slot's (storage partitioned by slot fences each
slot). Losing the permit stops the child as losing a lock does.

With ``--read``, ``run`` takes a read hold of NAME (docs/rwlocks.md): other
readers hold it beside it, a writer (any hold without ``--read``) waits for
them; the child also gets :data:`ENV_LOCK_MODE` (``read``). With several
NAMEs, ``run`` holds every lock or none (a multi-lock, :mod:`.multilock`),
and the child gets each name's token (``FENCEPOST_LOCK_<i>``,
``FENCEPOST_TOKEN_<i>``, ``FENCEPOST_LOCK_COUNT``) instead of
:data:`ENV_LOCK` and :data:`ENV_TOKEN`; losing any one of them stops it.

Not guaranteed: the child may still run for up to ``grace`` seconds after
the lock has passed to someone else, and a frozen ``fencepost run`` cannot
stop its child at all. Only a storage that checks the token keeps such a
late child's writes out; that is why the child gets the token.

The command has no controlling terminal (its own session): a terminal's
Ctrl-C reaches ``fencepost run``, which forwards it to the group once. A
process that leaves the group (``setsid``, a double fork into a new session)
is out of ``run``'s reach.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from fencepost.client import AsyncLockClient, AsyncMultiLockHandle, FencepostError, PermitsMismatch, TlsConfig
from fencepost.client.v1.keys import MAX_PERMITS

from .acquire import acquire_unless, held_name
from . import multilock, progress
from .printable import shown_name
from .child import (
    EXIT_CANNOT_EXECUTE,
    EXIT_NOT_FOUND,
    FORWARDED_SIGNALS,
    CommandError,
    RunResult,
    note,
    parse_grace,
    parse_lost_exit_code,
    start,
    supervise,
)
from .common import (
    ADDRESS_ENV,
    EXIT_HELD,
    EXIT_INTERRUPTED,
    EXIT_LOST,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    ConnectInterrupted,
    Formatter,
    acquire_error,
    connect_within,
    epilog,
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
    tls_env,
    tls_flags,
    tls_of,
)

__all__ = [
    "ENV_ADDRESS",
    "ENV_LEASE_ID",
    "ENV_LEASE_SECRET",
    "ENV_LOCK",
    "ENV_LOCK_MODE",
    "ENV_SLOT",
    "ENV_TOKEN",
    "ENV_TTL",
    "RUN_EXIT_CODES",
    "add_parser",
    "child_environment",
    "execute",
    "run_locked",
]

ENV_LOCK = "FENCEPOST_LOCK"
"""The child's environment: the lock name."""
ENV_TOKEN = "FENCEPOST_TOKEN"
"""The child's environment: the fencing token of the grant (decimal)."""
ENV_SLOT = "FENCEPOST_SLOT"
"""The child's environment with ``--permits``: the permit's slot, 0 to N-1 (decimal); its token is that slot's."""
ENV_LOCK_MODE = "FENCEPOST_LOCK_MODE"
"""The child's environment with ``--read``: ``read`` (a read hold; ``fencepost release --read`` releases it)."""
ENV_LEASE_ID = "FENCEPOST_LEASE_ID"
"""The child's environment: the lease id of the grant (decimal)."""
ENV_LEASE_SECRET = "FENCEPOST_LEASE_SECRET"
"""The child's environment: the secret of the grant's lease (a credential: whoever has it may release the
lock or revoke the lease; ``fencepost release`` reads it)."""
ENV_TTL = "FENCEPOST_TTL"
"""The child's environment: the granted TTL in seconds."""
ENV_ADDRESS = ADDRESS_ENV
"""The child's environment: the coordinator address(es), comma-separated
(the variable the ``fencepost`` command reads, so ``fencepost status`` works
in the child)."""

RUN_EXIT_CODES: dict[str, str] = {
    "N": "the command's own exit status (128+N when signal N killed it)",
    str(EXIT_UNAVAILABLE): "coordinator unreachable or not serving, or another server error",
    str(EXIT_USAGE): "bad input: a flag, a lock name, a TTL, --permits other than the semaphore's, a flag "
                     "that --read or several names do not take; or no command after --",
    str(EXIT_LOST): "the hold was lost while the command ran: the command got SIGTERM, then "
                    "SIGKILL after --grace (--lost-exit-code changes 3)",
    str(EXIT_TIMEOUT): "--timeout passed before the lock was granted; the command did not run",
    str(EXIT_HELD): "--try: the lock is held by someone else; the command did not run",
    str(EXIT_CANNOT_EXECUTE): "the command could not be executed",
    str(EXIT_NOT_FOUND): "the command was not found",
    str(EXIT_INTERRUPTED): "interrupted before the lock was granted; the command did not run",
}
"""Exit codes of ``fencepost run``. A command that exits 1 to 5 itself is told
apart from fencepost's own failures only by the one-line message on stderr
(and, for 3, by choosing another --lost-exit-code)."""

def _permits(text: str) -> int:
    """Parse --permits: 1 to MAX_PERMITS."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"permits must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_PERMITS:
        raise argparse.ArgumentTypeError(f"permits must be 1 to {MAX_PERMITS}, got {text}")
    return value


def add_parser(sub: Any) -> None:
    """Add the ``run`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "run", formatter_class=Formatter,
        epilog=epilog(
            RUN_EXIT_CODES,
            "The command's environment gets FENCEPOST_LOCK (the lock name), FENCEPOST_TOKEN (the",
            "fencing token), FENCEPOST_LEASE_ID (decimal), FENCEPOST_TTL (granted TTL, seconds)",
            "and FENCEPOST_ADDRESS (the coordinator addresses, comma-separated); with TLS, also",
            "FENCEPOST_TLS=1 and FENCEPOST_CA, FENCEPOST_CERT, FENCEPOST_KEY, FENCEPOST_TLS_SERVER_NAME",
            "as given (absolute paths), so that a fencepost command in CMD connects alike.",
            "With --permits N, NAME is a semaphore of N permits: the command runs holding one",
            "permit and also gets FENCEPOST_SLOT (its slot, 0 to N-1; the token is that slot's).",
            "With --read, a read hold of NAME (shared with readers; FENCEPOST_LOCK_MODE=read).",
            "With several names, every lock or none: FENCEPOST_LOCK_COUNT, and FENCEPOST_LOCK_<i>,",
            "FENCEPOST_TOKEN_<i> for each (i from 0, in the order given) instead of FENCEPOST_LOCK,",
            "FENCEPOST_TOKEN.",
            "SIGINT, SIGTERM and SIGHUP sent to fencepost run are forwarded to the command.",
        ),
        usage="fencepost run NAME [NAME...] --ttl S [--permits N | --read] [--timeout S | --try] [--grace S] "
              "[--lost-exit-code N] [--lock-delay S] [--address HOST:PORT] [--tls] [--ca PATH] "
              "[--cert PATH --key PATH] [--tls-server-name NAME] -- CMD [ARGS...]",
        help="run a command while holding a lock; the command gets the fencing token",
        description="Take the lock NAME, run CMD with the fencing token in its environment "
                    "while the client streams keepalives, and release the lock when CMD "
                    "exits. If the hold is lost first, CMD gets SIGTERM, then SIGKILL after "
                    "--grace seconds. Exits with CMD's status. Several names: take every lock "
                    "or none (a multi-lock; no deadlock whatever the order), one token each.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("names", nargs="+", metavar="NAME", help="lock name; several: all or none")
    p.add_argument("--ttl", type=parse_ttl, required=True, metavar="S", help="lease TTL in seconds, 1 to 86400")
    p.add_argument("--permits", type=_permits, default=None, metavar="N",
                   help=f"NAME is a semaphore of N permits (1 to {MAX_PERMITS}): hold one permit, not the lock")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--timeout", type=parse_timeout, default=None, metavar="S",
                      help="give up after S seconds of waiting, exit 4; exit 1 if no coordinator answers "
                           "within S (at least 2 s) (default: wait forever)")
    wait.add_argument("--try", dest="try_once", action="store_true", help="try once; exit 5 if the lock is held")
    p.add_argument("--grace", type=parse_grace, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL after the hold is lost (default 5)")
    p.add_argument("--lost-exit-code", type=parse_lost_exit_code, default=EXIT_LOST, metavar="N",
                   help=f"exit code when the hold is lost while CMD runs (default {EXIT_LOST})")
    lock_delay_flag(p)
    read_flag(p, f"{READ_HELP}; CMD also gets FENCEPOST_LOCK_MODE=read")


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost run NAME... --ttl S [...] -- CMD [ARGS...]`` (``args.argv`` is CMD [ARGS...]).

    Returns:
        The command's exit status, or the code of :data:`RUN_EXIT_CODES` that applies.

    Raises:
        CliError: the command did not run, or the lock could not be taken.
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    names = multilock.lock_names(args.names)
    if not args.argv:
        raise CliError("no command: give it after --, as in fencepost run NAME --ttl S -- CMD [ARGS...]", EXIT_USAGE)
    refuse_read_flags(args)
    multilock.refuse_flags(args, names)
    if args.permits is not None and args.lock_delay:
        raise CliError("--lock-delay applies to locks, not to semaphores (--permits)", EXIT_USAGE)
    try:
        result = asyncio.run(run_locked(
            addresses, names if len(names) > 1 else names[0], args.argv, ttl=args.ttl, timeout=args.timeout,
            try_once=args.try_once, grace=args.grace, lost_exit_code=args.lost_exit_code,
            interrupted_exit_code=EXIT_INTERRUPTED, tls=tls, permits=args.permits, lock_delay=args.lock_delay,
            read=args.read))
    except CommandError as err:
        raise CliError(str(err), err.exit_code) from None
    except PermitsMismatch as err:
        raise CliError(f"permits mismatch: semaphore {names[0]} has {err.permits} permits, not {args.permits}; "
                       "command not run", EXIT_USAGE) from None
    except (FencepostError, grpc.RpcError) as err:
        cli_err = acquire_error(err, held_name(err, names), args.timeout, addresses)
        if cli_err.exit_code in (EXIT_TIMEOUT, EXIT_HELD):
            cli_err = CliError(f"{cli_err}; command not run", cli_err.exit_code)
        raise cli_err from None
    if result.message:
        print(result.message if result.lost_reason else f"fencepost run: {result.message}",
              file=sys.stderr, flush=True)
    return result.exit_code


def child_environment(base: dict[str, str], *, name: str = "", token: int = 0, lease_id: int,
                      ttl: float, addresses: Sequence[str], tls: TlsConfig | None = None,
                      lease_secret: str = "", slot: int | None = None, read: bool = False,
                      tokens: Mapping[str, int] | None = None) -> dict[str, str]:
    """The child's environment: ``base`` plus the FENCEPOST_* variables of the grant.

    Args:
        base: The environment to extend (not modified).
        name: Lock name (one lock).
        token: Fencing token (one lock).
        lease_id: Lease id.
        ttl: Granted TTL in seconds.
        addresses: Coordinator addresses.
        tls: The TLS settings ``fencepost run`` connected with: set as
            FENCEPOST_TLS=1, FENCEPOST_CA, ... (absolute paths), so that a
            ``fencepost`` command in the child connects the same way; None
            adds nothing.
        lease_secret: The lease's secret, set as FENCEPOST_LEASE_SECRET when not "".
        slot: A semaphore permit's slot, set as FENCEPOST_SLOT; None (a lock) adds nothing.
        read: A read hold: FENCEPOST_LOCK_MODE=read.
        tokens: A multi-lock's grant instead of ``name`` and ``token``: name -> token, in the order given
            (FENCEPOST_LOCK_COUNT, FENCEPOST_LOCK_<i>, FENCEPOST_TOKEN_<i>; no FENCEPOST_LOCK, FENCEPOST_TOKEN).

    Returns:
        A new dict.
    """
    env = dict(base)
    env.update(tls_env(tls))
    if tokens is not None:
        env.update(multilock.tokens_env(tokens))
    else:
        env[ENV_LOCK] = name
        env[ENV_TOKEN] = str(token)
    if read:
        env[ENV_LOCK_MODE] = "read"
    if slot is not None:
        env[ENV_SLOT] = str(slot)
    env[ENV_LEASE_ID] = str(lease_id)
    if lease_secret:
        env[ENV_LEASE_SECRET] = lease_secret
    env[ENV_TTL] = f"{ttl:g}"
    env[ENV_ADDRESS] = ",".join(addresses)
    return env


async def run_locked(
    addresses: Sequence[str],
    name: str | Sequence[str],
    command: Sequence[str],
    *,
    ttl: float,
    timeout: float | None = None,
    try_once: bool = False,
    grace: float = 5.0,
    lost_exit_code: int = EXIT_LOST,
    interrupted_exit_code: int = EXIT_INTERRUPTED,
    tls: TlsConfig | None = None,
    permits: int | None = None,
    lock_delay: float = 0,
    read: bool = False,
) -> RunResult:
    """Acquire ``name``, run ``command`` while holding it, release it.

    Args:
        addresses: Coordinator addresses (``HOST:PORT``).
        name: Lock name; or a list of 2 to 32 names, held all together or none (a multi-lock; checked, with
            no ``permits``, ``lock_delay`` or ``read``).
        command: The program and its arguments (``command[0]`` is looked up on PATH).
        ttl: Lease TTL in seconds.
        timeout: Seconds to wait for the lock; None waits forever.
        try_once: Try once instead of waiting (raises LockHeld).
        grace: Seconds between SIGTERM and SIGKILL after the hold is lost.
        lost_exit_code: Exit code when the hold is lost while the child runs.
        interrupted_exit_code: Exit code when a signal arrives before the grant.
        tls: TLS settings for the coordinator (and the child's environment); None for plaintext.
        permits: Take a permit of semaphore ``name`` of this many permits instead of the lock; None: the lock.
        lock_delay: The hold's lock-delay in seconds (0: none; README, "Lock-delay").
        read: A read hold of ``name`` (docs/rwlocks.md; no ``lock_delay``).

    Returns:
        A :class:`RunResult`; the child has exited and been reaped.

    Raises:
        CommandError: the command could not be started (the lock is released first).
        fencepost.client.FencepostError: the lock could not be acquired
            (LockTimeout, LockHeld, Unavailable, TlsError, InvalidArgument, ...).
    """
    loop = asyncio.get_running_loop()
    received: asyncio.Queue[int] = asyncio.Queue()
    for sig in FORWARDED_SIGNALS:
        loop.add_signal_handler(sig, received.put_nowait, sig)
    names = [name] if isinstance(name, str) else list(name)
    not_run = f"interrupted while waiting for {multilock.shown_names(names)}; command not run"
    try:
        client = AsyncLockClient(list(addresses), tls=tls)
        try:
            timeout = await connect_within(client, 0.0 if try_once else timeout, received.get())
        except ConnectInterrupted:
            return RunResult(interrupted_exit_code, message=not_run)
        async with client:
            acquiring, waiting_for = None, None
            if len(names) > 1:
                acquiring, waiting_for = multilock.acquiring(client, names, ttl=ttl, timeout=timeout,
                                                             try_once=try_once)
            elif permits is not None:
                semaphore = client.semaphore(names[0], permits, ttl=ttl)
                acquiring = semaphore.try_acquire() if try_once else semaphore.acquire(timeout)
                waiting_for = (f"a permit of semaphore {shown_name(names[0])}",
                               progress.semaphore_look(client, names[0], permits))
            handle = await acquire_unless(client, names[0], ttl=ttl, timeout=timeout, try_once=try_once,
                                          interrupt=received.get(), acquiring=acquiring, lock_delay=lock_delay,
                                          waiting_for=waiting_for, read=read)
            if handle is None:
                return RunResult(interrupted_exit_code, message=not_run)

            if isinstance(handle, AsyncMultiLockHandle):
                env = child_environment(dict(os.environ), tokens={n: handle.token_for(n) for n in names},
                                        lease_id=handle.lease_id, ttl=handle.ttl, addresses=addresses, tls=tls,
                                        lease_secret=multilock.lease_secret(handle))
                what = multilock.hold_words(handle)
            else:
                env = child_environment(dict(os.environ), name=handle.name, token=handle.token,
                                        lease_id=handle.lease_id, ttl=handle.ttl, addresses=addresses, tls=tls,
                                        lease_secret=handle.lease_secret,
                                        slot=handle.slot if permits is not None else None, read=read)
                what = (f"a permit of {shown_name(handle.name)} (slot {handle.slot})" if permits is not None
                        else f"{shown_name(handle.name)} for reading" if read else shown_name(handle.name))
                what += f" with token {handle.token}"
            try:
                proc = await start(command, env)
            except CommandError:
                with contextlib.suppress(FencepostError):
                    await handle.release()
                raise
            note(f"holding {what}, lease 0x{handle.lease_id:x} ({handle.lease_id}), ttl {handle.ttl:g} s; "
                 f"running pid {proc.pid}: {' '.join(command)}")
            return await supervise(proc, handle, received, grace=grace, lost_exit_code=lost_exit_code, what=what)
    finally:
        for sig in FORWARDED_SIGNALS:
            loop.remove_signal_handler(sig)


