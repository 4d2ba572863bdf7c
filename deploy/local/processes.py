"""The child processes of ``deploy/local/launch.py``: each in a session of its own, its output copied to a log
file by a thread, killed by the kernel when the launcher dies (Linux ``PR_SET_PDEATHSIG``).

- :class:`Child`: one child process; wait for an output line, signal, terminate, kill.
- :func:`stop_all`: SIGTERM many children at once, SIGKILL those still running after a timeout.
- :func:`free_port`: a free TCP port on a host, not among those already taken.

Like launch.py, this file is not part of the installed package: launch.py imports it by name, with its own
directory on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["Child", "free_port", "stop_all"]


_PR_SET_PDEATHSIG = 1
try:  # resolved here, not in the forked child (no dlopen between fork and exec)
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _child_env() -> dict[str, str]:
    """The children's environment: ours without FENCEPOST_* (every setting is a flag), unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _die_with_parent() -> None:
    """In the child, before exec: ask the kernel for SIGKILL when the parent (thread) dies."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def free_port(host: str, taken: set[int]) -> int:
    """A TCP port nothing listens on at ``host`` (right now) and not in ``taken``; added to ``taken``."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port


class Child:
    """One child process, in a session of its own, whose output a thread copies to a log file.

    Args:
        name: a short name for messages ("etcd0", "coordinator1").
        argv: the command.
        log_path: the file that receives stdout and stderr (appended to).
    """

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.lines: list[str] = []
        #: Set when this object signalled or reaped the child: its exit is expected.
        self.stopping = False
        self._eof = False
        self._changed = threading.Condition()
        self._log: IO[str] = open(log_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed by the reader
        self._log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(self.argv)}\n")
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=_child_env(), start_new_session=True, close_fds=True,
                # Only from the main thread: the kernel signals when the *thread* that forked ends.
                preexec_fn=_die_with_parent
                if _prctl is not None and threading.current_thread() is threading.main_thread() else None,
            )
        except BaseException:
            self._log.close()
            raise
        self._reader = threading.Thread(target=self._read, name=f"log-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self._log.write(line + "\n")
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        finally:
            self._log.close()
            with self._changed:
                self._eof = True
                self._changed.notify_all()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    @property
    def running(self) -> bool:
        """Whether the child has not exited (a SIGSTOPped one counts as running)."""
        return self.proc.poll() is None

    def wait_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """Wait until an output line matches ``pattern``.

        Raises:
            RuntimeError: the child exited first, or ``timeout`` seconds passed
                (the message holds the end of its output).
        """
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    match = pattern.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                if self._eof:
                    raise RuntimeError(f"{self.name} exited ({self.proc.wait()}) before printing "
                                       f"{pattern.pattern!r}:\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name}: no line {pattern.pattern!r} within {timeout} s:\n{self.tail()}")
                self._changed.wait(left)

    def tail(self, lines: int = 30) -> str:
        """The last output lines."""
        return "\n".join(self.lines[-lines:])

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (ignored once it has exited)."""
        if sig in (signal.SIGTERM, signal.SIGKILL):
            self.stopping = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the child's process group and reap it; idempotent."""
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def terminate(self, timeout: float) -> int:
        """SIGTERM (and SIGCONT), then SIGKILL after ``timeout`` seconds; returns the exit status."""
        self.signal(signal.SIGTERM)
        self.signal(signal.SIGCONT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        return self.proc.returncode


def stop_all(children: Sequence[Child], timeout: float) -> None:
    """SIGTERM every child at once, then SIGKILL those still running after ``timeout`` seconds."""
    for child in children:
        child.signal(signal.SIGTERM)
        child.signal(signal.SIGCONT)
    deadline = time.monotonic() + timeout
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for child in children:
        child.kill()
