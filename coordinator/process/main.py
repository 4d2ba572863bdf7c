"""``fencepost serve``: the coordinator as a process (its flags and their checks are :mod:`.flags`).

Every flag also reads ``FENCEPOST_<FLAG>``; the etcd password comes only from
``FENCEPOST_ETCD_PASSWORD`` or from the file ``--etcd-password-file`` names.
Bad input exits 2 with one line, before anything starts; without
``--etcd-endpoints`` an embedded etcd runs in ``--data-dir`` (one
``fencepost serve`` per data directory, held by a file lock). The data
directory (with ``--etcd-endpoints``: when given, not locked, shared by
``--workers``) also keeps the highest token handed out, ``tokens.json``
(:mod:`..recipes.high_water`): after a restart, no grant while etcd is below it.

With ``--tls-cert``/``--tls-key`` (and ``--client-ca`` for mTLS) the port
serves TLS; SIGHUP re-reads those files (changed files are also taken up at
the next handshake), without dropping established connections.
``--health-listen`` adds a plaintext port with only grpc.health.v1.

``--policy FILE`` (with mTLS) sets the access policy (:mod:`..admission.access`): which
client-certificate identities may acquire, release, describe or administer
which lock names; SIGHUP re-reads it with the TLS files, and a file that
cannot be used keeps the policy in force (a warning names the problem).
Without a policy every caller may do everything; serving so in plaintext on
an address other hosts can reach logs a warning (event ``plaintext_listen``).

Traces are exported over OTLP when the standard variable
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
is set and ``OTEL_SDK_DISABLED`` is not ``true`` (:func:`~..telemetry.tracing.export_from_environment`);
the spans still queued are sent at shutdown. Set without the ``tracing``
extra installed, it exits 2. ``--no-trace-lock-names`` keeps lock names out
of the spans.

The first SIGTERM (or SIGINT) drains for ``--drain-seconds`` (default 10 s)
before the shutdown (:meth:`~.coordinator.Coordinator.drain`): readiness
NOT_SERVING, new leases, streams and acquires refused with DRAINING, while
releases, resigns, revokes and keepalives are served, so that an
application stopped at the same time releases through it; the drain ends
early once no stream is left, and at once on a second signal.

``--workers N`` serves with N coordinator processes on one port (:mod:`.workers`); ``--loop`` picks
uvloop or the standard asyncio loop (:mod:`.eventloop`).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from ..telemetry.events import configure as configure_logging
from ..telemetry.events import log_event
from ..telemetry.tracing import TraceExport, TracingUnavailable, export_from_environment
from . import flags
from .coordinator import Coordinator
from .eventloop import describe as describe_loop
from .eventloop import run as run_loop
from .flags import BadFlag, Settings
from .listen import bind_problem, is_local
from .workers import Processes, ProcessesRefused, check_processes, run_workers

__all__ = ["main", "serve"]


def main(argv: list[str] | None = None) -> int:
    """Run ``fencepost serve``.

    Args:
        argv: the arguments after ``serve``; default ``sys.argv[2:]`` style parsing by the caller.

    Returns:
        The process exit status: 0 after a clean shutdown, 1 when it cannot
        start, 2 for a bad flag or environment value (one line on stderr),
        also an OTLP endpoint variable set without the ``tracing`` extra.
    """
    parser = flags.build_parser()
    args = parser.parse_args(argv)
    try:
        settings = flags.settings(args)
        flags.check_metrics_listen(args.metrics_listen)
        name_prefixes = flags.metrics_name_prefixes(args)
        processes = check_processes(args, embedded=settings.endpoints is None, health_listen=settings.health_listen)
        traces = export_from_environment(os.environ)
    except (BadFlag, TracingUnavailable, ProcessesRefused) as exc:
        print(f"fencepost serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        if processes.workers > 1:
            return run_workers(argv if argv is not None else sys.argv[1:], args, processes,
                               health_listen=settings.health_listen, grace_seconds=settings.grace + settings.drain,
                               http_listen=settings.http_listen, http_scheme="https" if settings.tls else "http")
        return _run(args, settings, traces, name_prefixes, processes)
    finally:
        if traces is not None:
            traces.shutdown()  # sends the spans still queued


def _run(args: argparse.Namespace, settings: Settings, traces: TraceExport | None,
         name_prefixes: tuple[str, ...] = (), processes: Processes = Processes()) -> int:
    """Start the embedded etcd if needed, then serve until SIGTERM or SIGINT (see :func:`main`)."""
    # The addresses before anything starts (the embedded etcd takes seconds, and would be started for nothing).
    for flag, address in (("--listen", args.listen), ("--health-listen", settings.health_listen),
                          ("--metrics-listen", args.metrics_listen), ("--http-listen", settings.http_listen)):
        problem = bind_problem(address) if address is not None else None
        if problem is not None:
            print(f"fencepost serve: cannot listen on {address} ({flag}): {problem}", file=sys.stderr)
            return 1
    endpoints = settings.endpoints
    configure_logging(settings.level, settings.log_format, sys.stderr)
    embedded = None
    data_dir: Path | None = None
    if endpoints is None:
        from .embedded import EmbeddedEtcd

        data_dir = Path(args.data_dir) if args.data_dir else flags.default_data_dir()
        try:
            owner = lock_data_dir(data_dir)
        except BadFlag as exc:
            print(f"fencepost serve: error: {exc}", file=sys.stderr)
            return 2
        if owner is None:
            print(f"fencepost: {data_dir} is in use by another fencepost serve; give it another --data-dir "
                  f"or stop the other one", file=sys.stderr)
            return 1
        print(f"fencepost: embedded etcd, data in {data_dir}", flush=True)
        embedded = EmbeddedEtcd(data_dir)
        try:
            # No other serve holds the data directory (the flock above): an etcd recorded there is an orphan.
            orphan = embedded.reclaim()
            if orphan is not None:
                print(f"fencepost: stopped etcd (pid {orphan}) that a killed fencepost serve left running on "
                      f"{data_dir}", flush=True)
            embedded.start()
        except (RuntimeError, OSError) as exc:
            print(f"fencepost: cannot start the embedded etcd: {exc}", file=sys.stderr)
            return 1
        endpoints = [embedded.endpoint]
    else:
        try:
            data_dir = own_data_dir(args.data_dir)
        except BadFlag as exc:
            print(f"fencepost serve: error: {exc}", file=sys.stderr)
            return 2
    print(f"fencepost: event loop {describe_loop(processes.loop)}", flush=True)
    try:
        return run_loop(serve(endpoints, args, settings, traces, name_prefixes, data_dir=data_dir), processes.loop)
    finally:
        if embedded is not None:
            embedded.stop()


def own_data_dir(flag: str | None) -> Path | None:
    """With ``--etcd-endpoints``: the ``--data-dir`` where the coordinator keeps its highest token, made if missing.

    Not locked: several coordinators (``--workers``) may share it (:mod:`..recipes.high_water`).

    Returns:
        The directory; None when ``--data-dir`` was not given.

    Raises:
        BadFlag: it is not a directory, or cannot be made.
    """
    if not flag:
        return None
    data_dir = Path(flag)
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise BadFlag(f"--data-dir {data_dir} is not a directory") from None
    except OSError as exc:
        raise BadFlag(f"--data-dir {data_dir} cannot be made: {exc.strerror}") from None
    return data_dir


def lock_data_dir(data_dir: Path) -> IO[str] | None:
    """Make ``data_dir`` if missing and take an exclusive lock on it for this process's lifetime.

    Returns:
        The open lock file (keep it open), or None when another process holds it.

    Raises:
        BadFlag: ``data_dir`` is not a directory, cannot be made, or no file can be made in it.
    """
    if data_dir.exists() and not data_dir.is_dir():
        raise BadFlag(f"--data-dir {data_dir} is not a directory")
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # a dangling symbolic link, or made meanwhile as a file
        raise BadFlag(f"--data-dir {data_dir} is not a directory") from None
    except OSError as exc:
        raise BadFlag(f"--data-dir {data_dir} cannot be made: {exc.strerror}") from None
    try:
        handle = open(data_dir / "fencepost.lock", "a+")  # noqa: SIM115 - held until the process exits
    except OSError as exc:
        raise BadFlag(f"--data-dir {data_dir}: cannot make a file in it: {exc.strerror}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


async def serve(endpoints: list[str], args: argparse.Namespace, settings: Settings,
                 traces: TraceExport | None, name_prefixes: tuple[str, ...] = (),
                 server_options: Sequence[tuple[str, int]] = (), *, data_dir: Path | None = None) -> int:
    tls, auth = settings.etcd_tls, settings.auth
    try:
        coordinator = Coordinator(endpoints, listen=args.listen, prefix=args.prefix, grace_seconds=settings.grace,
                                  etcd_tls=tls, etcd_auth=auth, tls=settings.tls,
                                  health_listen=settings.health_listen,
                                  metrics_listen=args.metrics_listen, metrics_name_prefixes=name_prefixes,
                                  etcd_embedded=settings.endpoints is None,
                                  tracer_provider=traces.provider if traces is not None else None,
                                  trace_lock_names=settings.trace_lock_names, policy=settings.policy,
                                  limits=settings.limits, server_options=server_options,
                                  etcd_batch_max=args.etcd_batch_max, data_dir=data_dir,
                                  http_listen=settings.http_listen)
    except ValueError as exc:  # a TLS file changed since it was checked
        print(f"fencepost serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        await coordinator.start()
    except RuntimeError as exc:
        print(f"fencepost: {exc}", file=sys.stderr)
        await coordinator.stop(0)
        return 1
    # Before the "listening" line: a supervisor may signal as soon as it reads it.
    stop, again = asyncio.Event(), asyncio.Event()  # the first SIGTERM/SIGINT drains, the second stops at once
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: again.set() if stop.is_set() else stop.set())
    loop.add_signal_handler(signal.SIGHUP, _reload, coordinator)
    how = []
    if tls is not None:
        how.append("mTLS" if tls.cert else "TLS")
    if auth is not None:
        how.append(f"user {auth.user}")
    print(f"fencepost: etcd at {','.join(endpoints)}{' (' + ', '.join(how) + ')' if how else ''}, "
          f"prefix {args.prefix}", flush=True)
    if settings.tls is not None:
        ca = f", client CA {settings.tls.client_ca}" if settings.tls.client_ca is not None else ""
        print(f"fencepost: {settings.tls.describe()}, certificate {settings.tls.cert}{ca}; SIGHUP re-reads them",
              flush=True)
    if settings.policy is not None:
        print(f"fencepost: access policy {settings.policy.source} ({settings.policy.summary}); "
              f"SIGHUP re-reads it", flush=True)
    for flag, address in (("--listen", args.listen), ("--http-listen", settings.http_listen)):
        if settings.tls is None and address is not None and not is_local(address):
            log_event(logging.getLogger("fencepost.coordinator"), logging.WARNING, "plaintext_listen",
                      f"serving in plaintext on {address}{'' if flag == '--listen' else f' ({flag})'}, which other "
                      f"hosts can reach: any of them may take, release and list every lock; give --tls-cert, "
                      f"--tls-key and --client-ca (and --policy), or listen on a loopback address or a Unix socket",
                      listen=address)
    if coordinator.high_water is not None:
        kept = coordinator.high_water
        print(f"fencepost: highest token kept in {kept.path} (recorded: {kept.recorded or 'none'})", flush=True)
    if coordinator.health_address is not None:
        print(f"fencepost: health (grpc.health.v1 only, plaintext) on {coordinator.health_address}", flush=True)
    # The last word of this line is the address (tests and bench/cycles.py read it).
    print(f"fencepost: listening on {coordinator.address}", flush=True)
    if coordinator.http_address is not None:
        scheme = "https" if settings.tls is not None else "http"
        address = coordinator.http_address
        print(f"fencepost: HTTP API on {address if address.startswith('unix:') else f'{scheme}://{address}'}",
              flush=True)
    if coordinator.metrics_address is not None:
        print(f"fencepost: metrics on http://{coordinator.metrics_address}/metrics", flush=True)
    if traces is not None:
        print(f"fencepost: traces to {traces.endpoint} (OTLP {traces.protocol})"
              f"{'' if settings.trace_lock_names else ', without lock names'}", flush=True)
    await stop.wait()
    if settings.drain > 0:
        print(f"fencepost: draining for at most {settings.drain:g} s (releases and keepalives served, new "
              f"leases and acquires refused; SIGTERM again to stop at once)", flush=True)
        await coordinator.drain(settings.drain, interrupted=again)
    print("fencepost: shutting down (leases are kept)", flush=True)
    await coordinator.stop(0 if again.is_set() else None)
    return 0


def _reload(coordinator: Coordinator) -> None:
    """SIGHUP: re-read the TLS files and the access policy (a bad file keeps the one in use; a warning names it)."""
    if coordinator.policy is not None:
        if coordinator.reload_policy():
            policy = coordinator.policy
            print(f"fencepost: SIGHUP: access policy reloaded from {policy.source} ({policy.summary}); "
                  f"new calls use it", flush=True)
        else:
            print("fencepost: SIGHUP: access policy not reloaded, the policy in use stays (see the warning)",
                  flush=True)
    if coordinator.tls is None:
        print("fencepost: SIGHUP: no TLS files to reload", flush=True)
    elif coordinator.reload_tls():
        print("fencepost: SIGHUP: TLS files reloaded; new connections use them", flush=True)
    else:
        print("fencepost: SIGHUP: TLS files not reloaded, the certificate in use stays (see the warning)",
              flush=True)
