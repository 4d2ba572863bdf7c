"""Child processes of the tests: ``fencepost`` commands, Python scripts and coordinators run as OS processes.

- :class:`CliResult`: a finished ``fencepost`` command; :func:`cli_env`, the environment to run one in.
- :class:`ChildProcess`: a child whose stdout lines a thread collects (wait for a line, signal, kill).
- :class:`CoordinatorProcess`: ``fencepost serve`` in a child process, restartable on the same port.
- :func:`freeze`: SIGSTOP a process and return once all its threads have stopped.

The fixtures that make them (``coordinator_process``, ``spawn``) are in ``tests/conftest.py``, which
re-exports these names.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"fencepost: listening on (\S+):(\d+)")


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP process ``pid`` and return once every one of its threads is stopped.

    kill() returns as soon as the signal is queued: the kernel wakes one
    thread to take it, and until that thread runs and stops the others they
    go on running. On a busy machine that took long enough for a "frozen"
    etcd to answer one more request (seen once in CI).

    Raises:
        ProcessLookupError: there is no such process.
        TimeoutError: a thread still ran after ``timeout`` seconds.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} still runs {timeout} s after SIGSTOP")
        time.sleep(0.001)


def _all_stopped(pid: int) -> bool:
    """Whether no thread of ``pid`` runs (state T or t in /proc/PID/task/TID/stat, or Z/X: it died)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        tids = list(tasks.iterdir())
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    for tid in tids:
        try:
            stat = (tid / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that exited
        state = stat.rpartition(")")[2].split()[0]
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


@dataclass
class CliResult:
    """A finished ``fencepost`` command: exit status, stdout, stderr."""

    rc: int
    out: str
    err: str


#: The variables the client commands read their coordinator and TLS settings from.
CLIENT_ENV = ("FENCEPOST_ADDRESS", "FENCEPOST_TLS", "FENCEPOST_CA", "FENCEPOST_CERT", "FENCEPOST_KEY",
              "FENCEPOST_TLS_SERVER_NAME")


def cli_env() -> dict[str, str]:
    """The environment for ``fencepost`` commands in tests: none of :data:`CLIENT_ENV`, unbuffered."""
    env = dict(os.environ)
    for name in CLIENT_ENV:
        env.pop(name, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def child_env() -> dict[str, str]:
    """The environment for Python children: unbuffered, the repo importable."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ChildProcess:
    """A child process whose stdout lines are collected by a reader thread.

    The child runs in its own session, so signals for it never hit pytest.
    ``kill()`` is idempotent; use it in ``finally``.
    """

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        """Start ``argv`` in ``cwd`` with stdout piped and stderr to ``log_path``."""
        self.argv = list(argv)
        self.log_path = log_path
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env if env is not None else child_env(),
                start_new_session=True,
                cwd=cwd,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def log_tail(self, max_chars: int = 3000) -> str:
        """The end of the child's stderr log and all of its stdout, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            text = ""
        return f"stdout:\n{chr(10).join(self.output)}\nstderr:\n{text}"

    def wait_line(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """Block until a stdout line matches ``pattern``; fail the test on timeout or exit."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no line matching {regex.pattern!r} within {timeout} s\n{self.log_tail()}")
            try:
                line = self.lines.get(timeout=min(left, 0.1))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=5)
                pytest.fail(
                    f"child exited ({self.proc.returncode}) before printing {regex.pattern!r}\n{self.log_tail()}"
                )
            match = regex.search(line)
            if match:
                return match

    async def await_line(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """``wait_line`` without blocking the event loop."""
        return await asyncio.to_thread(self.wait_line, pattern, timeout)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child; for SIGSTOP, return once it is stopped (:func:`freeze`)."""
        if sig == signal.SIGSTOP:
            freeze(self.proc.pid)
        else:
            self.proc.send_signal(sig)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM the child and wait for it (SIGKILL after ``timeout``); returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGCONT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the child (and its process group) and reap it; idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self.proc.stdout is not None:
            self._reader.join(timeout=5)
            self.proc.stdout.close()


class CoordinatorProcess:
    """A coordinator run as ``python -m fencepost.client.cli serve`` in a child process.

    ``start()`` waits for the line ``fencepost: listening on HOST:PORT``; a
    later ``start()`` after ``terminate()`` reuses the same port.
    """

    def __init__(self, etcd_endpoint: str, prefix: str, log_dir: Path, *, grace_seconds: float = 1.0,
                 drain_seconds: float | None = None) -> None:
        """Describe the coordinator; nothing starts until ``start()``. ``drain_seconds`` None: the
        environment's ``FENCEPOST_DRAIN_SECONDS`` (tests/conftest.py makes it 0: stop at SIGTERM)."""
        self.etcd_endpoint = etcd_endpoint
        self.prefix = prefix
        self.log_dir = log_dir
        self.grace_seconds = grace_seconds
        self.drain_seconds = drain_seconds
        self.port = 0
        self.child: ChildProcess | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` once started."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        """Start the coordinator (on the previous port if there was one) and return its address."""
        self.starts += 1
        argv = [
            sys.executable, "-m", "fencepost.client.cli", "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--etcd-endpoints", self.etcd_endpoint,
            "--prefix", self.prefix,
            "--grace-seconds", str(self.grace_seconds),
            *(("--drain-seconds", str(self.drain_seconds)) if self.drain_seconds is not None else ()),
        ]
        self.child = ChildProcess(argv, log_path=self.log_dir / f"coordinator-{self.starts}.log")
        match = self.child.wait_line(LISTENING, timeout)
        self.port = int(match.group(2))
        return self.address

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM the coordinator and wait for it to exit; returns its exit status."""
        assert self.child is not None
        code = self.child.terminate(timeout)
        self.child.kill()
        return code

    def kill(self) -> None:
        """SIGKILL the coordinator if it runs; idempotent."""
        if self.child is not None:
            self.child.kill()
