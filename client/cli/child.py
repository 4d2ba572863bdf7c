"""A command run under a hold: started in its own process group, signals forwarded, the group ended.

What ``fencepost run`` and ``fencepost elect`` share once they hold: the
command is started (through :data:`DIE_WITH_PARENT` on Linux) leading a
session and process group of its own, so that every signal below reaches
the whole process tree it starts; :func:`supervise` waits for it while
forwarding :data:`FORWARDED_SIGNALS`, ends the group (SIGTERM, then SIGKILL
after ``grace`` seconds) when the hold is lost first or when the command
left processes running, and releases the hold once the group is gone. Its
outcome is a :class:`RunResult`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from fencepost.client import AsyncLockHandle, AsyncMultiLockHandle, FencepostError, LeaseLost, NotHolder, StaleTokenError

from .printable import shown_name

__all__ = [
    "DIE_WITH_PARENT", "EXIT_CANNOT_EXECUTE", "EXIT_NOT_FOUND", "FORWARDED_SIGNALS", "MAX_GRACE_SECONDS", "PROGRAM",
    "CommandError", "RunResult", "end_group", "exit_status", "note", "parse_grace", "parse_lost_exit_code", "start",
    "supervise",
]

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that ``fencepost run`` forwards to its child."""

EXIT_CANNOT_EXECUTE = 126
"""The command exists but could not be executed (as in POSIX shells)."""
EXIT_NOT_FOUND = 127
"""The command was not found (as in POSIX shells)."""

MAX_GRACE_SECONDS = 3600.0
"""Longest --grace, in seconds."""


def parse_grace(text: str) -> float:
    """Parse --grace: seconds, 0 to 3600."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"grace must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_GRACE_SECONDS:
        raise argparse.ArgumentTypeError(f"grace must be 0 to {MAX_GRACE_SECONDS:g} seconds, got {text}")
    return value


def parse_lost_exit_code(text: str) -> int:
    """Parse --lost-exit-code: 1 to 255."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"lost-exit-code must be an integer, got {text!r}") from None
    if not 1 <= value <= 255:
        raise argparse.ArgumentTypeError(f"lost-exit-code must be 1 to 255, got {text}")
    return value


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


#: On Linux the command is started through this: it asks the kernel to SIGKILL it when the process that
#: started it (``fencepost run``/``elect``) dies, even by SIGKILL (prctl PR_SET_PDEATHSIG; it survives the
#: exec), then execs the command. Without it a killed supervisor would leave its command running after the
#: hold ended. Arguments: the supervisor's pid, then the command.
DIE_WITH_PARENT = """\
import ctypes, os, sys
ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
if os.getppid() != int(sys.argv[1]):  # the supervisor died before the prctl
    os._exit(137)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except FileNotFoundError as err:
    print(f"command not found: {sys.argv[2]}: {err.strerror}", file=sys.stderr)
    os._exit(127)
except OSError as err:
    print(f"cannot execute {sys.argv[2]}: {err.strerror}", file=sys.stderr)
    os._exit(126)
"""


def _resolve(command: Sequence[str], env: dict[str, str]) -> None:
    """Refuse a command that cannot run before starting anything (as the exec itself would).

    Raises:
        CommandError: not found (127) or not executable (126).
    """
    program = command[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise CommandError(f"command not found: {program}", EXIT_NOT_FOUND)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise CommandError(f"cannot execute: {program}", EXIT_CANNOT_EXECUTE)
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise CommandError(f"command not found: {program}", EXIT_NOT_FOUND)


async def start(command: Sequence[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    if sys.platform.startswith("linux"):
        _resolve(command, env)
        command = [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT, str(os.getpid()), *command]
    try:
        return await asyncio.create_subprocess_exec(*command, env=env, start_new_session=True)
    except FileNotFoundError:
        raise CommandError(f"command not found: {command[0]}", EXIT_NOT_FOUND) from None
    except PermissionError:
        raise CommandError(f"cannot execute: {command[0]}", EXIT_CANNOT_EXECUTE) from None
    except OSError as err:
        raise CommandError(f"cannot execute {command[0]}: {err.strerror or err}",
                           EXIT_CANNOT_EXECUTE) from None


def _send(proc: asyncio.subprocess.Process, sig: int) -> None:
    """Send ``sig`` to the child's process group (it leads its own: the group id is its pid).

    The group outlives the child while a process of the tree it started
    runs, and its id cannot be reused meanwhile; once it is empty, nothing
    happens.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _group_alive(proc: asyncio.subprocess.Process) -> bool:
    """Whether a process of the child's group still exists (a zombie not yet reaped counts)."""
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: After SIGKILL, how long to wait for the group to be gone before going on (a
#: zombie whose parent does not reap it would keep the group "alive" for ever).
KILLED_WAIT_SECONDS = 2.0
#: How often to look whether the group is empty while waiting for it.
GROUP_POLL_SECONDS = 0.02


async def end_group(proc: asyncio.subprocess.Process, exited: asyncio.Future[int], grace: float,
                     why: str) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after ``grace`` s; return when it is gone.

    Args:
        proc: The child (leader of the group).
        exited: The child's ``wait()``; done once it is reaped.
        grace: Seconds between SIGTERM and SIGKILL.
        why: What the note on stderr says led to this.
    """
    loop = asyncio.get_running_loop()
    note(f"{why}; sending SIGTERM to process group {proc.pid}, SIGKILL in {grace:g} s")
    _send(proc, signal.SIGTERM)

    async def gone(until: float) -> bool:
        while not exited.done() or _group_alive(proc):
            left = until - loop.time()
            if left <= 0:
                return False
            await asyncio.wait({exited}, timeout=min(GROUP_POLL_SECONDS, left))
        return True

    if await gone(loop.time() + grace):
        return
    note(f"process group {proc.pid} still running after {grace:g} s; sending SIGKILL")
    _send(proc, signal.SIGKILL)
    await exited
    await gone(loop.time() + KILLED_WAIT_SECONDS)


#: The command whose supervision of a child is running (its notes start with it): run, or elect.
PROGRAM: ContextVar[str] = ContextVar("fencepost_program", default="fencepost run")


def note(text: str) -> None:
    """Print ``text`` on stderr after the name of the command supervising the child (:data:`PROGRAM`)."""
    print(f"{PROGRAM.get()}: {text}", file=sys.stderr, flush=True)


def lost_words(handle: AsyncLockHandle | AsyncMultiLockHandle) -> str:
    """Why ``handle`` was lost, and for a multi-lock which of its names went first."""
    reason = handle.lost_reason or "lost"
    name = handle.lost_name if isinstance(handle, AsyncMultiLockHandle) else None
    return f"{reason} ({shown_name(name)} first)" if name else reason


async def supervise(proc: asyncio.subprocess.Process, handle: AsyncLockHandle | AsyncMultiLockHandle,
                    received: asyncio.Queue[int], *, grace: float, lost_exit_code: int,
                    what: str | None = None) -> RunResult:
    """Wait for the child while forwarding signals; stop it if the hold is lost; release the hold after it.

    Args:
        proc: The child (leader of its process group).
        handle: The hold it runs under (a multi-lock's is lost when any of its names is).
        received: The signals received, to forward to the group.
        grace: Seconds between SIGTERM and SIGKILL.
        lost_exit_code: The exit code when the hold is lost while the child runs.
        what: The hold as the messages name it; None: ``NAME with token T`` (a lock handle's).

    Returns:
        How it ended; the child has exited and been reaped, its group is gone.
    """
    if what is None:
        assert isinstance(handle, AsyncLockHandle)
        what = f"{shown_name(handle.name)} with token {handle.token}"
    exited = asyncio.ensure_future(proc.wait())
    lost = asyncio.ensure_future(handle.lost.wait())
    forwarding = asyncio.ensure_future(_forward(proc, received))
    try:
        await asyncio.wait({exited, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            reason, why = handle.lost_reason or "lost", lost_words(handle)
            await end_group(proc, exited, grace, f"lost {what}: {why}")
            status = exit_status(exited.result())
            return RunResult(lost_exit_code, status, reason, f"lost: {why}: {what}; command stopped (status {status})")
        status = exit_status(exited.result())
        if _group_alive(proc):  # it left processes running: they go before the lock does
            await end_group(proc, exited, grace, f"pid {proc.pid} exited (status {status}) and left "
                                                  f"processes running in its group")
        if handle.lost.is_set():
            reason, why = handle.lost_reason or "lost", lost_words(handle)
            return RunResult(lost_exit_code, status, reason,
                             f"lost: {why}: {what} was lost before the command exited (status {status})")
        try:
            await handle.release()
        except (LeaseLost, NotHolder, StaleTokenError) as err:
            reason = getattr(err, "reason", None) or type(err).__name__
            return RunResult(lost_exit_code, status, reason,
                             f"lost: {reason}: {what} was lost before it was released (command status {status})")
        except FencepostError as err:
            # Unreachable coordinator: the hold was not known to be lost while the
            # command ran; the lease expires one TTL after the last keepalive.
            return RunResult(status, status, None,
                             f"could not release {what} ({type(err).__name__}); it is "
                             f"freed when the lease expires, within {handle.ttl:g} s")
        return RunResult(status, status)
    finally:
        forwarding.cancel()
        lost.cancel()
        if not exited.done() or _group_alive(proc):  # only when cancelled from outside
            _send(proc, signal.SIGKILL)
            with contextlib.suppress(BaseException):
                await exited


async def _forward(proc: asyncio.subprocess.Process, received: asyncio.Queue[int]) -> None:
    while True:
        sig = await received.get()
        _send(proc, sig)
