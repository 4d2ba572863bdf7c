"""``fencepost serve --workers N``: N coordinator processes sharing one listening port, and their supervisor.

A coordinator is one Python process, so it uses about one core. With
``--workers N`` the ``fencepost serve`` process (the **parent**) starts N
coordinator processes (the **workers**), each a whole coordinator with its
own etcd connections, caches, limits and instance id, all bound to the same
``HOST:PORT`` with ``SO_REUSEPORT``: the kernel spreads new connections over
them (a connection, and so every call and stream on it, stays with one
worker). They hold no lock state of their own, like replicas, so they must
share one etcd: ``--workers`` above 1 needs ``--etcd-endpoints`` (separate
embedded etcds would grant one lock twice).

The parent:

- checks and reserves the ports first: ``--listen`` (and ``--health-listen``,
  ``--http-listen``) is bound by the parent without ``SO_REUSEPORT``, so that a port another
  process uses is refused (exit 1), and port 0 becomes one free port; the
  socket then gets ``SO_REUSEPORT`` and is kept, bound but not listening
  (it takes no connection), until the parent exits, so that no other
  process can take the port while workers start or restart;
- prints ``fencepost: listening on HOST:PORT`` once, after every worker
  listens (then ``fencepost: HTTP API on ...`` for ``--http-listen``: every
  worker serves the HTTP port too, each answering any call, its lock board
  read from etcd); each worker's other stdout lines are relayed as
  ``fencepost: worker K: ...`` (their stderr log lines go straight through);
- forwards SIGTERM and SIGINT (as SIGTERM) to every worker (each drains,
  then stops; a second signal is forwarded too: the drain ends) and exits
  after them: 0 when every worker shut down cleanly, 1 otherwise; a worker
  still running ``--drain-seconds`` + ``--grace-seconds`` +
  :data:`STOP_SLACK_SECONDS` after the signal is killed. SIGHUP (reload TLS files and policy) goes to every worker;
- restarts a worker that dies on its own (a crash, SIGKILL, the OOM killer)
  after a backoff (:data:`RESTART_FIRST_SECONDS`, doubling up to
  :data:`RESTART_MAX_SECONDS`; back to the first after a worker that served
  :data:`RESTART_RESET_SECONDS`), logging each death and restart. Its clients'
  connections break; they reconnect (to any worker) and keep their leases and
  tokens, which live in etcd. A worker that exits before it ever listened
  stops the start: the other workers are stopped and the parent exits with
  that worker's status (a bad certificate, etcd refusing the credentials);
- workers get SIGTERM if the parent dies (Linux ``PR_SET_PDEATHSIG``), so
  none outlives it.

Not with ``--workers`` above 1: a Unix socket listen address (a socket path
cannot be shared), ``--metrics-listen`` (each worker counts its own metrics
and no one port would serve them all; run one process per worker to scrape
them), the embedded etcd. Linux only (``SO_REUSEPORT`` spreading connections).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .eventloop import LOOPS, LoopUnavailable, describe, pick_loop
from .listen import bind_problem, unix_socket_path

__all__ = ["MAX_WORKERS", "REUSEPORT_OPTIONS", "RESTART_FIRST_SECONDS", "RESTART_MAX_SECONDS",
           "RESTART_RESET_SECONDS", "STOP_SLACK_SECONDS", "Processes", "ProcessesRefused",
           "add_process_arguments", "check_processes", "reserve_port", "run_workers", "worker_main"]

#: Most workers one ``fencepost serve`` starts.
MAX_WORKERS = 64
#: Seconds before the first restart of a worker that died; doubles for each death in a row.
RESTART_FIRST_SECONDS = 0.5
#: Longest wait before restarting a worker, in seconds.
RESTART_MAX_SECONDS = 30.0
#: A worker that served this many seconds before dying restarts after the first delay again.
RESTART_RESET_SECONDS = 60.0
#: Seconds beyond ``--grace-seconds`` that workers get to exit after SIGTERM before they are killed.
STOP_SLACK_SECONDS = 10.0
#: The gRPC server options of a worker: share the port with the other workers.
REUSEPORT_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.so_reuseport", 1),)

#: The line a coordinator prints when it serves; the last word is the address.
_LISTENING = "fencepost: listening on "
#: The line a coordinator prints when it serves HTTP; the last word is the URL.
_HTTP_LISTENING = "fencepost: HTTP API on "
_PR_SET_PDEATHSIG = 1


class ProcessesRefused(ValueError):
    """A ``--workers`` or ``--loop`` value, or a combination with other flags, that ``fencepost serve`` refuses."""


@dataclass(frozen=True)
class Processes:
    """The checked ``--workers`` and ``--loop``.

    Attributes:
        workers: how many coordinator processes serve (1: this process alone).
        loop: the event loop each runs, ``"uvloop"`` or ``"asyncio"``.
    """

    workers: int = 1
    loop: str = "asyncio"


def add_process_arguments(parser: argparse.ArgumentParser, env: Callable[[str, str | None], str | None]) -> None:
    """Add ``--workers`` and ``--loop`` to ``fencepost serve``'s parser.

    Args:
        parser: the parser.
        env: (flag, default) -> the value of ``FENCEPOST_<FLAG>`` or the default.
    """
    group = parser.add_argument_group("processes", "how many coordinator processes serve, and on which event loop")
    group.add_argument("--workers", default=env("workers", "1"), metavar="N",
                       help=f"serve with N coordinator processes (1 to {MAX_WORKERS}) sharing the --listen port, "
                            f"and the --http-listen one "
                            f"(SO_REUSEPORT; the kernel spreads connections over them): one process uses about one "
                            f"core. Needs --etcd-endpoints (they must share one etcd), a HOST:PORT --listen, and no "
                            f"--metrics-listen; each worker has its own limits. A worker that dies is restarted "
                            f"(docs/operations.md, Workers) (env FENCEPOST_WORKERS; default 1)")
    group.add_argument("--loop", default=env("loop", "auto"), metavar="|".join(LOOPS),
                       help="the asyncio event loop: uvloop, the standard asyncio loop, or auto: uvloop when it is "
                            "installed (pip install 'fencepost[uvloop]') (env FENCEPOST_LOOP; default auto)")


def check_processes(args: argparse.Namespace, *, embedded: bool, health_listen: str | None) -> Processes:
    """Check ``--workers`` and ``--loop`` against the other flags.

    Args:
        args: the parsed flags (``workers``, ``loop``, ``listen``, ``metrics_listen``).
        embedded: whether the embedded etcd would run (no ``--etcd-endpoints``).
        health_listen: the checked ``--health-listen``, or None.

    Returns:
        The checked values; ``loop`` resolved (``auto`` -> what runs).

    Raises:
        ProcessesRefused: a count that is not 1 to :data:`MAX_WORKERS`; ``--loop``
            not one of auto, asyncio, uvloop, or uvloop not installed; more than
            one worker with the embedded etcd, a Unix socket or ``--metrics-listen``;
            more than one worker off Linux.
    """
    try:
        loop = pick_loop(args.loop)
    except LoopUnavailable as exc:
        raise ProcessesRefused(str(exc)) from None
    text = str(args.workers).strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise ProcessesRefused(f"--workers is {args.workers!r}; must be a whole number from 1 to {MAX_WORKERS}")
    workers = int(text)
    if workers > 1:
        if embedded:
            raise ProcessesRefused(f"--workers {workers} needs --etcd-endpoints: the workers must share one etcd; "
                                   f"each would start an embedded etcd of its own, and two etcds would grant one "
                                   f"lock twice")
        for flag, address in (("--listen", args.listen), ("--health-listen", health_listen),
                              ("--http-listen", args.http_listen or None)):
            if address is not None and unix_socket_path(address) is not None:
                raise ProcessesRefused(f"--workers {workers}: {flag} {address} is a Unix socket, which one process "
                                       f"alone can serve; give HOST:PORT, or run one worker")
        if args.metrics_listen is not None:
            raise ProcessesRefused(f"--workers {workers} cannot serve --metrics-listen: each worker counts its own "
                                   f"metrics and one port cannot serve them all; run --workers 1 (one process per "
                                   f"port) to scrape metrics")
        if not sys.platform.startswith("linux"):
            raise ProcessesRefused(f"--workers {workers} needs Linux (SO_REUSEPORT spreading connections)")
    return Processes(workers, loop)


def reserve_port(listen: str) -> tuple[socket.socket, str]:
    """Bind ``listen`` for workers to share: free of other processes, port 0 made concrete.

    The socket is bound without ``SO_REUSEPORT`` (so a port that another
    process uses, or that the kernel picks for port 0, is one nobody else
    holds), then given ``SO_REUSEPORT`` so that workers (same user, with
    ``SO_REUSEPORT``) bind it too. It never listens: it takes no connection.

    Args:
        listen: a checked ``HOST:PORT``.

    Returns:
        (the bound socket, to keep open while workers may bind; ``HOST:PORT`` with the bound port).

    Raises:
        OSError: no address of ``HOST`` could be bound; ``strerror`` says why
            (:func:`~.listen.bind_problem`'s words when it finds the problem).
    """
    problem = bind_problem(listen)
    if problem is not None:
        raise OSError(0, problem)
    host, _, port = listen.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    infos = socket.getaddrinfo(bare or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    failure: OSError = OSError(0, f"{host} does not resolve to an address")
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        return sock, f"{host}:{sock.getsockname()[1]}"
    raise failure


def run_workers(argv: Sequence[str], args: argparse.Namespace, processes: Processes, *,
                health_listen: str | None, grace_seconds: float, http_listen: str | None = None,
                http_scheme: str = "http") -> int:
    """Run ``fencepost serve`` as the parent of ``processes.workers`` workers, until SIGTERM or SIGINT.

    Args:
        argv: the ``fencepost serve`` arguments as given (each worker gets them,
            with the concrete ``--listen`` and ``--health-listen`` after them).
        args: the same, parsed and checked.
        processes: from :func:`check_processes`, with ``workers`` above 1.
        health_listen: the checked ``--health-listen``, or None.
        grace_seconds: the checked ``--grace-seconds`` plus ``--drain-seconds`` (a worker drains, then stops).
        http_listen: the checked ``--http-listen``, or None: every worker serves it too.
        http_scheme: ``https`` with TLS, else ``http`` (for the HTTP port's line).

    Returns:
        The exit status: 0 when every worker shut down cleanly; 1 when an
        address cannot be bound, or a worker did not shut down cleanly; a
        worker's own status (1 or 2) when it exited before it listened.
    """
    reserved: list[socket.socket] = []
    concrete: dict[str, str] = {}
    try:
        for flag, address in (("--listen", args.listen), ("--health-listen", health_listen),
                              ("--http-listen", http_listen)):
            if address is None:
                continue
            try:
                sock, concrete[flag] = reserve_port(address)
            except OSError as exc:
                print(f"fencepost serve: cannot listen on {address} ({flag}): {exc.strerror or exc}",
                      file=sys.stderr)
                return 1
            reserved.append(sock)
        overrides = [item for pair in concrete.items() for item in pair]
        http = f"{http_scheme}://{concrete['--http-listen']}" if "--http-listen" in concrete else None
        supervisor = _Supervisor([*argv, *overrides, "--loop", processes.loop], processes, concrete["--listen"],
                                 grace_seconds, http)
        return asyncio.run(supervisor.run())
    finally:
        for sock in reserved:
            sock.close()


class _Worker:
    """One worker slot: its current process and its restarts."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.listening_since: float | None = None
        self.deaths = 0


class _Supervisor:
    """The parent's event loop: start the workers, relay their lines, forward signals, restart the dead."""

    def __init__(self, worker_argv: list[str], processes: Processes, address: str, grace_seconds: float,
                 http: str | None = None) -> None:
        self._argv = worker_argv
        self._processes = processes
        self._address = address
        self._http = http
        self._grace = grace_seconds
        self._workers = [_Worker(i + 1) for i in range(processes.workers)]
        self._stop = asyncio.Event()
        self._stopping = False
        self._announced = False
        self._failure: int | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        lives = [asyncio.create_task(self._keep(worker), name=f"fencepost-worker-{worker.index}")
                 for worker in self._workers]
        await self._stop.wait()
        self._stopping = True
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal ends the workers' drain at once
            loop.add_signal_handler(sig, self._forward, signal.SIGTERM)
        if self._failure is None:
            print(f"fencepost: shutting down {len(self._workers)} workers (leases are kept)", flush=True)
        self._forward(signal.SIGTERM)
        _, late = await asyncio.wait(lives, timeout=self._grace + STOP_SLACK_SECONDS)
        if late:
            print(f"fencepost: {len(late)} workers still running {self._grace + STOP_SLACK_SECONDS:g} s after "
                  f"SIGTERM; killing them", flush=True)
            self._forward(signal.SIGKILL)
        statuses = await asyncio.gather(*lives)
        if self._failure is not None:
            return self._failure
        return 0 if all(status in (0, -signal.SIGTERM) for status in statuses) else 1

    def _forward(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every running worker."""
        for worker in self._workers:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(sig)

    async def _keep(self, worker: _Worker) -> int:
        """Run ``worker`` until the parent stops, restarting it when it dies; its last exit status."""
        while True:
            process = worker.process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import sys; from fencepost.coordinator.process.workers import worker_main; "
                                      "sys.exit(worker_main(sys.argv[1:]))",
                str(os.getpid()), *self._argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                start_new_session=True)
            if self._stopping:  # the signal came while it was being started
                process.send_signal(signal.SIGTERM)
            assert process.stdout is not None
            await self._relay(worker, process.stdout)
            status = await process.wait()
            listened, worker.listening_since = worker.listening_since, None
            if self._stopping:
                return status
            if listened is None and not self._announced:
                print(f"fencepost: worker {worker.index} (pid {process.pid}) {_ended(status)} before it listened; "
                      f"stopping the others", flush=True)
                self._failure = status if status > 0 else 1
                self._stop.set()
                return status
            if listened is not None and time.monotonic() - listened >= RESTART_RESET_SECONDS:
                worker.deaths = 0
            worker.deaths += 1
            delay = min(RESTART_MAX_SECONDS, RESTART_FIRST_SECONDS * 2 ** (worker.deaths - 1))
            print(f"fencepost: worker {worker.index} (pid {process.pid}) {_ended(status)}; restarting it in "
                  f"{delay:g} s", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stopping or self._stop.is_set():
                return status

    async def _relay(self, worker: _Worker, stdout: asyncio.StreamReader) -> None:
        """Print ``worker``'s stdout lines as ``fencepost: worker K: ...`` until it closes; note when it listens."""
        async for raw in stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(_LISTENING):
                self._listening(worker)
                continue
            if line.startswith(_HTTP_LISTENING):  # said once, by the parent
                continue
            text = line.removeprefix("fencepost: ")
            print(f"fencepost: worker {worker.index}: {text}", flush=True)

    def _listening(self, worker: _Worker) -> None:
        """``worker`` listens: announce the address once every worker does, or say a restarted one is back."""
        assert worker.process is not None
        worker.listening_since = time.monotonic()
        if self._announced:
            print(f"fencepost: worker {worker.index} restarted (pid {worker.process.pid})", flush=True)
            return
        if all(w.listening_since is not None for w in self._workers):
            self._announced = True
            pids = ", ".join(str(w.process.pid) for w in self._workers if w.process is not None)
            print(f"fencepost: {len(self._workers)} workers (pids {pids}) share {self._address} (SO_REUSEPORT), "
                  f"event loop {describe(self._processes.loop)}; SIGTERM or SIGINT stops them all, SIGHUP goes "
                  f"to each", flush=True)
            # The last word of this line is the address (tests and bench/cycles.py read it).
            print(f"{_LISTENING}{self._address}", flush=True)
            if self._http is not None:
                print(f"{_HTTP_LISTENING}{self._http}", flush=True)


def _ended(status: int) -> str:
    """How a worker ended, from its exit status: ``exited with status 1``, ``was killed by SIGKILL``."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def _end_with_parent(parent: int) -> bool:
    """Have the kernel send this process SIGTERM when its parent dies (Linux); False when the parent is gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    return os.getppid() == parent


def worker_main(argv: list[str]) -> int:
    """Run one worker: a coordinator whose port the other workers share (the parent starts it; not for users).

    Args:
        argv: the parent's pid, then the ``fencepost serve`` arguments, whose
            ``--listen`` (and ``--health-listen``) come last, with a concrete port.

    Returns:
        The coordinator's exit status (see :func:`~.main.main`); 1 when the parent is already gone.
    """
    from ..telemetry.events import configure as configure_logging
    from ..telemetry.tracing import TracingUnavailable, export_from_environment
    from . import flags, main

    if not _end_with_parent(int(argv[0])):
        return 1
    args = flags.build_parser().parse_args(argv[1:])
    try:
        settings = flags.settings(args)
        name_prefixes = flags.metrics_name_prefixes(args)
        loop = pick_loop(args.loop)
        traces = export_from_environment(os.environ)
        data_dir = main.own_data_dir(args.data_dir)  # shared by the workers: its file is merged under a lock
    except (flags.BadFlag, LoopUnavailable, TracingUnavailable) as exc:  # a file changed since the parent checked
        print(f"fencepost serve: error: {exc}", file=sys.stderr)
        return 2
    assert settings.endpoints is not None  # check_processes refuses the embedded etcd
    configure_logging(settings.level, settings.log_format, sys.stderr)
    try:
        from .eventloop import run

        return run(main.serve(settings.endpoints, args, settings, traces, name_prefixes,
                              server_options=REUSEPORT_OPTIONS, data_dir=data_dir), loop)
    finally:
        if traces is not None:
            traces.shutdown()
