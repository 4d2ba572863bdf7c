"""``fencepost run``: hold a lock for as long as a command runs.

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
   the environment. It shares our stdin, stdout, stderr and process group.
3. SIGINT, SIGTERM and SIGHUP sent to ``fencepost run`` are forwarded to the
   child (the ``run`` process itself keeps going until the child exits).
4. When the child exits, release the lock and exit with the child's status
   (``128 + N`` when signal N killed it).
5. When the hold is lost first (lease expired, revoked, the lock released or
   deleted by someone else), send SIGTERM to the child, SIGKILL after
   ``grace`` seconds, and exit with ``lost_exit_code`` (3 by default).

Not guaranteed: the child may still run for up to ``grace`` seconds after
the lock has passed to someone else, and a frozen ``fencepost run`` cannot
stop its child at all. Only a storage that checks the token keeps such a
late child's writes out; that is why the child gets the token.

A terminal's Ctrl-C reaches the child directly (same process group) and is
forwarded once more by ``fencepost run``; a child that treats a second SIGINT
as "force quit" sees two.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

ENV_LOCK = "FENCEPOST_LOCK"
"""The child's environment: the lock name."""
ENV_TOKEN = "FENCEPOST_TOKEN"
"""The child's environment: the fencing token of the grant (decimal)."""
ENV_LEASE_ID = "FENCEPOST_LEASE_ID"
"""The child's environment: the lease id of the grant (decimal)."""
ENV_TTL = "FENCEPOST_TTL"
"""The child's environment: the granted TTL in seconds."""
ENV_ADDRESS = "FENCEPOST_ADDRESS"
"""The child's environment: the coordinator address(es), comma-separated
(the variable the ``fencepost`` command reads, so ``fencepost status`` works
in the child)."""

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that ``fencepost run`` forwards to its child."""

EXIT_CANNOT_EXECUTE = 126
"""The command exists but could not be executed (as in POSIX shells)."""
EXIT_NOT_FOUND = 127
"""The command was not found (as in POSIX shells)."""


@dataclass
class RunResult:
    """How a ``fencepost run`` ended.

    Attributes:
        exit_code: The code ``fencepost run`` exits with.
        child_status: The child's exit status (``128 + N`` for signal N), or
            None when it never started.
        lost_reason: Why the hold was lost, or None when it was not.
        message: A one-line note for stderr, or None.
    """

    exit_code: int
    child_status: int | None = None
    lost_reason: str | None = None
    message: str | None = None


class CommandError(Exception):
    """The command could not be started.

    Attributes:
        exit_code: 127 (not found) or 126 (not executable).
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_status(returncode: int) -> int:
    """Turn a ``Popen.returncode`` into a shell-style exit status.

    Args:
        returncode: ``>= 0`` for an exit, ``-N`` when signal N killed the process.

    Returns:
        ``returncode``, or ``128 + N`` for a signal.
    """
    return 128 - returncode if returncode < 0 else returncode


def child_environment(base: dict[str, str], *, name: str, token: int, lease_id: int,
                      ttl: float, addresses: Sequence[str]) -> dict[str, str]:
    """The child's environment: ``base`` plus the FENCEPOST_* variables of the grant.

    Args:
        base: The environment to extend (not modified).
        name: Lock name.
        token: Fencing token.
        lease_id: Lease id.
        ttl: Granted TTL in seconds.
        addresses: Coordinator addresses.

    Returns:
        A new dict.
    """
    env = dict(base)
    env[ENV_LOCK] = name
    env[ENV_TOKEN] = str(token)
    env[ENV_LEASE_ID] = str(lease_id)
    env[ENV_TTL] = f"{ttl:g}"
    env[ENV_ADDRESS] = ",".join(addresses)
    return env


async def _start(command: Sequence[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(*command, env=env)
    except FileNotFoundError:
        raise CommandError(f"command not found: {command[0]}", EXIT_NOT_FOUND) from None
    except PermissionError:
        raise CommandError(f"cannot execute: {command[0]}", EXIT_CANNOT_EXECUTE) from None
    except OSError as err:
        raise CommandError(f"cannot execute {command[0]}: {err.strerror or err}",
                           EXIT_CANNOT_EXECUTE) from None


def _send(proc: asyncio.subprocess.Process, sig: int) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def _note(text: str) -> None:
    print(f"fencepost run: {text}", file=sys.stderr, flush=True)


async def acquire_unless(client: Any, name: str, *, ttl: float, timeout: float | None, try_once: bool,
                         interrupt: Awaitable[object]) -> Any:
    """Acquire ``name`` unless ``interrupt`` completes first (a signal, say).

    Args:
        client: a connected :class:`fencepost.client.AsyncLockClient`.
        name: the lock name.
        ttl: lease TTL in seconds.
        timeout: seconds to wait; None waits forever (ignored with ``try_once``).
        try_once: try once (``try_acquire``) instead of waiting.
        interrupt: an awaitable; if it completes before the grant, the acquire
            is cancelled (which removes the waiter's place in the queue).

    Returns:
        The :class:`fencepost.client.AsyncLockHandle`, or None when interrupted
        (a grant that raced with the interrupt is released).

    Raises:
        fencepost.client.FencepostError: the acquire failed (LockTimeout, LockHeld, ...).
    """
    if try_once:
        acquiring = asyncio.ensure_future(client.try_acquire(name, ttl=ttl))
    else:
        acquiring = asyncio.ensure_future(client.acquire(name, ttl=ttl, timeout=timeout))
    interrupted = asyncio.ensure_future(interrupt)
    try:
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


async def run_locked(
    addresses: Sequence[str],
    name: str,
    command: Sequence[str],
    *,
    ttl: float,
    timeout: float | None = None,
    try_once: bool = False,
    grace: float = 5.0,
    lost_exit_code: int = 3,
    interrupted_exit_code: int = 130,
) -> RunResult:
    """Acquire ``name``, run ``command`` while holding it, release it.

    Args:
        addresses: Coordinator addresses (``HOST:PORT``).
        name: Lock name.
        command: The program and its arguments (``command[0]`` is looked up on PATH).
        ttl: Lease TTL in seconds.
        timeout: Seconds to wait for the lock; None waits forever.
        try_once: Try once instead of waiting (raises LockHeld).
        grace: Seconds between SIGTERM and SIGKILL after the hold is lost.
        lost_exit_code: Exit code when the hold is lost while the child runs.
        interrupted_exit_code: Exit code when a signal arrives before the grant.

    Returns:
        A :class:`RunResult`; the child has exited and been reaped.

    Raises:
        CommandError: the command could not be started (the lock is released first).
        fencepost.client.FencepostError: the lock could not be acquired
            (LockTimeout, LockHeld, Unavailable, InvalidArgument, ...).
    """
    from fencepost.client import AsyncLockClient, FencepostError

    loop = asyncio.get_running_loop()
    received: asyncio.Queue[int] = asyncio.Queue()
    for sig in FORWARDED_SIGNALS:
        loop.add_signal_handler(sig, received.put_nowait, sig)
    try:
        async with AsyncLockClient(list(addresses)) as client:
            handle = await acquire_unless(client, name, ttl=ttl, timeout=timeout, try_once=try_once,
                                          interrupt=received.get())
            if handle is None:
                return RunResult(interrupted_exit_code,
                                 message=f"interrupted while waiting for {name}; command not run")

            env = child_environment(dict(os.environ), name=handle.name, token=handle.token,
                                    lease_id=handle.lease_id, ttl=handle.ttl, addresses=addresses)
            try:
                proc = await _start(command, env)
            except CommandError:
                with contextlib.suppress(FencepostError):
                    await handle.release()
                raise
            _note(f"holding {handle.name} with token {handle.token}, lease 0x{handle.lease_id:x} "
                  f"({handle.lease_id}), ttl {handle.ttl:g} s; running pid {proc.pid}: "
                  f"{' '.join(command)}")
            return await _supervise(proc, handle, received, grace=grace,
                                    lost_exit_code=lost_exit_code)
    finally:
        for sig in FORWARDED_SIGNALS:
            loop.remove_signal_handler(sig)


async def _supervise(proc: asyncio.subprocess.Process, handle: object, received: asyncio.Queue[int],
                     *, grace: float, lost_exit_code: int) -> RunResult:
    """Wait for the child while forwarding signals; stop it if the hold is lost."""
    from fencepost.client import AsyncLockHandle, FencepostError, LeaseLost, NotHolder, StaleTokenError

    assert isinstance(handle, AsyncLockHandle)
    exited = asyncio.ensure_future(proc.wait())
    lost = asyncio.ensure_future(handle.lost.wait())
    forwarding = asyncio.ensure_future(_forward(proc, received))
    try:
        await asyncio.wait({exited, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            reason = handle.lost_reason or "lost"
            _note(f"lost {handle.name} (token {handle.token}): {reason}; sending SIGTERM to pid "
                  f"{proc.pid}, SIGKILL in {grace:g} s")
            _send(proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), grace)
            except TimeoutError:
                _note(f"pid {proc.pid} still running after {grace:g} s; sending SIGKILL")
                _send(proc, signal.SIGKILL)
                await exited
            status = exit_status(exited.result())
            return RunResult(lost_exit_code, status, reason,
                             f"lost: {reason}: {handle.name} token {handle.token}; "
                             f"command stopped (status {status})")
        status = exit_status(exited.result())
        if handle.lost.is_set():
            reason = handle.lost_reason or "lost"
            return RunResult(lost_exit_code, status, reason,
                             f"lost: {reason}: {handle.name} token {handle.token} was lost before "
                             f"the command exited (status {status})")
        try:
            await handle.release()
        except (LeaseLost, NotHolder, StaleTokenError) as err:
            reason = getattr(err, "reason", None) or type(err).__name__
            return RunResult(lost_exit_code, status, reason,
                             f"lost: {reason}: {handle.name} token {handle.token} was lost before "
                             f"it was released (command status {status})")
        except FencepostError as err:
            # Unreachable coordinator: the hold was not known to be lost while the
            # command ran; the lease expires one TTL after the last keepalive.
            return RunResult(status, status, None,
                             f"could not release {handle.name} ({type(err).__name__}); it is "
                             f"freed when the lease expires, within {handle.ttl:g} s")
        return RunResult(status, status)
    finally:
        forwarding.cancel()
        lost.cancel()
        if not exited.done():  # only when cancelled from outside
            _send(proc, signal.SIGKILL)
            with contextlib.suppress(BaseException):
                await exited


async def _forward(proc: asyncio.subprocess.Process, received: asyncio.Queue[int]) -> None:
    while True:
        sig = await received.get()
        _send(proc, sig)
