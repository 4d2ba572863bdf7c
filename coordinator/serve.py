"""``fencepost serve``: the coordinator as a process, its flags and their checks.

Every flag also reads ``FENCEPOST_<FLAG>``; the etcd password comes only from
``FENCEPOST_ETCD_PASSWORD`` or from the file ``--etcd-password-file`` names.
Bad input exits 2 with one line, before anything starts; without
``--etcd-endpoints`` an embedded etcd runs in ``--data-dir`` (one
``fencepost serve`` per data directory, held by a file lock).

With ``--tls-cert``/``--tls-key`` (and ``--client-ca`` for mTLS) the port
serves TLS; SIGHUP re-reads those files (changed files are also taken up at
the next handshake), without dropping established connections.
``--health-listen`` adds a plaintext port with only grpc.health.v1.

``--policy FILE`` (with mTLS) sets the access policy (:mod:`.policy`): which
client-certificate identities may acquire, release, describe or administer
which lock names; SIGHUP re-reads it with the TLS files, and a file that
cannot be used keeps the policy in force (a warning names the problem).
Without a policy every caller may do everything; serving so in plaintext on
an address other hosts can reach logs a warning (event ``plaintext_listen``).

Traces are exported over OTLP when the standard variable
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
is set and ``OTEL_SDK_DISABLED`` is not ``true`` (:func:`~.tracing.export_from_environment`);
the spans still queued are sent at shutdown. Set without the ``tracing``
extra installed, it exits 2. ``--no-trace-lock-names`` keeps lock names out
of the spans.

``--workers N`` serves with N coordinator processes on one port (:mod:`.workers`); ``--loop`` picks
uvloop or the standard asyncio loop (:mod:`.eventloop`).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .etcd import EtcdAuth, EtcdTls, check_endpoints
from .eventloop import describe as describe_loop
from .eventloop import run as run_loop
from .events import LOG_FORMATS
from .events import configure as configure_logging
from .events import log_event
from .limits import Limits, add_limit_arguments, limits_from_args
from .listen import bind_problem, is_local, same_address
from .lock_metrics import check_name_prefixes
from .policy import Policy, PolicyError
from .server import DEFAULT_LISTEN, DEFAULT_PREFIX, Coordinator, check_listen
from .tls import ServerTls, TlsFileError, check_pem_files
from .tracing import TraceExport, TracingUnavailable, export_from_environment
from .workers import Processes, ProcessesRefused, add_process_arguments, check_processes, run_workers

__all__ = ["PASSWORD_ENV", "BadFlag", "add_etcd_arguments", "build_parser", "default_data_dir", "etcd_settings", "main"]


def _env(flag: str, default: str | None) -> str | None:
    return os.environ.get("FENCEPOST_" + flag.upper().replace("-", "_"), default)


def default_data_dir() -> Path:
    """The per-user directory of the embedded etcd's data."""
    import platformdirs

    return Path(platformdirs.user_data_dir("fencepost")) / "etcd"


#: The environment variable that carries the etcd password (never a flag, never logged), unless
#: --etcd-password-file names a file holding it.
PASSWORD_ENV = "FENCEPOST_ETCD_PASSWORD"


def build_parser() -> argparse.ArgumentParser:
    """The ``fencepost serve`` argument parser; every flag also reads FENCEPOST_<FLAG>."""
    parser = argparse.ArgumentParser(
        prog="fencepost serve",
        description="Serve the Fencepost lock service. Without --etcd-endpoints, start an embedded "
                    f"single-member etcd whose data lives in --data-dir. The etcd password of --etcd-user "
                    f"is read from the environment variable {PASSWORD_ENV} or from --etcd-password-file, "
                    f"never from a flag. With --tls-cert and "
                    f"--tls-key the port serves TLS (mTLS with --client-ca); SIGHUP re-reads those files "
                    f"(changed files are also taken up at the next handshake) without dropping established "
                    f"connections. With --policy (and --client-ca), only what the access policy file allows "
                    f"each client certificate's identity is served; SIGHUP re-reads it too. If etcd's revisions go back (etcd restored from an older snapshot), the "
                    f"coordinator refuses to grant (UNAVAILABLE/DATA_LOSS, health NOT_SERVING) rather than hand "
                    f"out a smaller fencing token, until `fencepost admin recover-tokens` (docs/deploy.md). "
                    f"Bad flags exit 2 before anything starts.",
    )
    parser.add_argument("--listen", default=_env("listen", DEFAULT_LISTEN), metavar="HOST:PORT",
                        help=f"HOST:PORT to serve on (port 0 picks one), or a Unix socket unix:/ABSOLUTE/PATH; a "
                             f"socket file left by a dead coordinator is removed (env FENCEPOST_LISTEN; default "
                             f"{DEFAULT_LISTEN})")
    parser.add_argument("--tls-cert", default=_env("tls-cert", None), metavar="PATH",
                        help="PEM file of the coordinator's certificate chain, its own certificate first: serve "
                             "TLS on --listen (env FENCEPOST_TLS_CERT; needs --tls-key)")
    parser.add_argument("--tls-key", default=_env("tls-key", None), metavar="PATH",
                        help="PEM file of that certificate's private key, unencrypted (env FENCEPOST_TLS_KEY)")
    parser.add_argument("--client-ca", default=_env("client-ca", None), metavar="PATH",
                        help="PEM file of the CA certificates that clients' certificates must chain to: mTLS "
                             "(env FENCEPOST_CLIENT_CA; needs --tls-cert)")
    parser.add_argument("--client-auth", default=_env("client-auth", None), metavar="require|optional",
                        help="with --client-ca: 'require' refuses a client without a valid certificate at the "
                             "handshake; 'optional' lets any client connect (gRPC Python cannot ask for a "
                             "certificate without requiring it, so none is asked for and --client-ca is not "
                             "checked) (env FENCEPOST_CLIENT_AUTH; default require)")
    parser.add_argument("--health-listen", default=_env("health-listen", None), metavar="HOST:PORT",
                        help="also serve grpc.health.v1, and nothing else, in plaintext on HOST:PORT (or "
                             "unix:/ABSOLUTE/PATH): for probes without a client certificate, such as the kubelet's "
                             "gRPC probe (env FENCEPOST_HEALTH_LISTEN; default: none)")
    parser.add_argument("--policy", default=_env("policy", None), metavar="FILE",
                        help="access policy, a .toml, .yaml or .yml file: which client-certificate identities "
                             "(SPIFFE ID, else URI SAN, else DNS SAN, else subject CN) may acquire, release, "
                             "describe or admin which lock names (exact, or prefixes such as billing/*); what it "
                             "does not allow is refused with PERMISSION_DENIED. Needs --client-ca. SIGHUP re-reads "
                             "it; a file that cannot be used keeps the policy in force (docs/security.md) (env "
                             "FENCEPOST_POLICY; default: none, every caller may do everything)")
    add_etcd_arguments(parser)
    parser.add_argument("--data-dir", default=_env("data-dir", None),
                        help="embedded etcd data directory (env FENCEPOST_DATA_DIR; default: a per-user data directory)")
    parser.add_argument("--prefix", default=_env("prefix", DEFAULT_PREFIX),
                        help=f"etcd key prefix of all locks (env FENCEPOST_PREFIX; default {DEFAULT_PREFIX})")
    parser.add_argument("--grace-seconds", default=_env("grace-seconds", "5"),
                        help="seconds in-flight calls may take at shutdown (env FENCEPOST_GRACE_SECONDS; default 5)")
    parser.add_argument("--etcd-batch-max", default=_env("etcd-batch-max", "64"), type=_batch_max, metavar="N",
                        help="most lock Txns (Acquire, Release, Withdraw) of different locks sent to etcd as one "
                             "Txn when they arrive while one is in flight; 0 sends each alone (env "
                             "FENCEPOST_ETCD_BATCH_MAX; default 64; at most 1024, and etcd's --max-txn-ops, 128)")
    parser.add_argument("--log-level", default=_env("log-level", "INFO"),
                        help="logging level (env FENCEPOST_LOG_LEVEL; default INFO; DEBUG adds each grant, "
                             "release and lease)")
    parser.add_argument("--log-format", default=_env("log-format", "auto"), metavar="text|json|auto",
                        help="stderr log lines: text, json (one JSON object per line), or auto: text when "
                             "stderr is a terminal, json otherwise (env FENCEPOST_LOG_FORMAT; default auto)")
    parser.add_argument("--metrics-listen", default=_env("metrics-listen", None),
                        help="HOST:PORT to serve Prometheus metrics on, over HTTP at /metrics; port 0 picks one "
                             "(env FENCEPOST_METRICS_LISTEN; default: no metrics)")
    parser.add_argument("--metrics-name-prefix", action="append", default=None, metavar="PREFIX",
                        help="a lock-name prefix whose grants, waits and holds get their own label "
                             "prefix=\"PREFIX\" (the longest that matches; other names get prefix=\"\"); "
                             "repeatable, at most 100; needs --metrics-listen (env "
                             "FENCEPOST_METRICS_NAME_PREFIXES, comma-separated; default: none)")
    parser.add_argument("--trace-lock-names", action=argparse.BooleanOptionalAction,
                        default=_env("trace-lock-names", "true"),
                        help="record lock names on trace spans (fencepost.lock.name); --no-trace-lock-names "
                             "leaves them out (env FENCEPOST_TRACE_LOCK_NAMES=true|false; default true). Spans are "
                             "exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or "
                             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (the standard OTEL_* variables apply)")
    add_limit_arguments(parser, _env)
    add_process_arguments(parser, _env)
    return parser


def _batch_max(value: str) -> int:
    """The value of --etcd-batch-max: a whole number, 0 to 1024."""
    if not value.strip().isdigit() or int(value) > 1024:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number from 0 (no batching) to 1024")
    return int(value)


def add_etcd_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags that reach etcd (endpoints, TLS, user and password file), shared with ``fencepost admin``."""
    parser.add_argument("--etcd-endpoints", default=_env("etcd-endpoints", None),
                        help="comma-separated etcd endpoints, HOST:PORT each (a host name or an address; "
                             "https:// for TLS); omit for the embedded etcd (env FENCEPOST_ETCD_ENDPOINTS)")
    parser.add_argument("--etcd-ca", default=_env("etcd-ca", None), metavar="PATH",
                        help="PEM file of the CA that signed etcd's server certificate: TLS to etcd "
                             "(env FENCEPOST_ETCD_CA)")
    parser.add_argument("--etcd-cacert", default=_env("etcd-cacert", None), metavar="PATH",
                        help="the old name of --etcd-ca (env FENCEPOST_ETCD_CACERT)")
    parser.add_argument("--etcd-cert", default=_env("etcd-cert", None), metavar="PATH",
                        help="PEM file of the coordinator's client certificate, for etcd's --client-cert-auth "
                             "(env FENCEPOST_ETCD_CERT; needs --etcd-key)")
    parser.add_argument("--etcd-key", default=_env("etcd-key", None), metavar="PATH",
                        help="PEM file of the client certificate's private key (env FENCEPOST_ETCD_KEY)")
    parser.add_argument("--etcd-user", default=_env("etcd-user", None),
                        help=f"etcd user to authenticate as, its password in env {PASSWORD_ENV} or in "
                             "--etcd-password-file (env FENCEPOST_ETCD_USER)")
    parser.add_argument("--etcd-password-file", default=_env("etcd-password-file", None), metavar="PATH",
                        help=f"file holding the password of --etcd-user, one line (its newline is dropped), "
                             f"instead of env {PASSWORD_ENV} (env FENCEPOST_ETCD_PASSWORD_FILE)")


class _BadFlag(Exception):
    """A flag or environment value that ``fencepost serve`` refuses (exit 2)."""


#: The public name of the bad-flag error (``fencepost admin`` checks the same etcd flags).
BadFlag = _BadFlag


@dataclass(frozen=True)
class _Settings:
    """The checked flags."""

    endpoints: list[str] | None  # None: the embedded etcd
    etcd_tls: EtcdTls | None
    auth: EtcdAuth | None
    grace: float
    level: str
    log_format: str
    tls: ServerTls | None
    health_listen: str | None
    trace_lock_names: bool
    policy: Policy | None = None
    limits: Limits = Limits()


def _pem_files(flags: dict[str, str], cert: str | None = None, key: str | None = None,
               ca: str | None = None) -> None:
    """Load the PEM files as OpenSSL will in gRPC, so that a bad one stops the start, not each handshake.

    gRPC only fails on them at a handshake, and keeps failing (for etcd:
    NOT_SERVING for ever, with core errors on stderr).

    Args:
        flags: the flag of each role (``"cert"``, ``"key"``, ``"ca"``), for the message.

    Raises:
        _BadFlag: naming the flag and the file (see :func:`~.tls.check_pem_files`).
    """
    try:
        check_pem_files(cert, key, ca)
    except TlsFileError as exc:
        raise _BadFlag(f"{flags[exc.role]} {exc.path} {exc.problem}") from None


def _server_tls(args: argparse.Namespace) -> ServerTls | None:
    """The checked --tls-cert, --tls-key, --client-ca and --client-auth.

    Raises:
        _BadFlag: one of them without the flag it needs, a bad --client-auth, or a file that cannot be used.
    """
    if args.tls_key and not args.tls_cert:
        raise _BadFlag("--tls-key needs --tls-cert (the certificate of that key)")
    if args.tls_cert and not args.tls_key:
        raise _BadFlag("--tls-cert needs --tls-key (the certificate's private key)")
    if args.client_ca and not args.tls_cert:
        raise _BadFlag("--client-ca needs --tls-cert and --tls-key: client certificates are checked in the "
                       "TLS handshake")
    if args.client_auth is not None:
        if args.client_auth not in ("require", "optional"):
            raise _BadFlag(f"--client-auth is {args.client_auth!r}; must be require or optional")
        if not args.client_ca:
            raise _BadFlag(f"--client-auth {args.client_auth} needs --client-ca (the CA of the client certificates)")
    if not args.tls_cert:
        return None
    _pem_files({"cert": "--tls-cert", "key": "--tls-key", "ca": "--client-ca"}, args.tls_cert, args.tls_key,
               args.client_ca or None)
    return ServerTls(Path(args.tls_cert), Path(args.tls_key), Path(args.client_ca) if args.client_ca else None,
                     require_client_cert=args.client_auth != "optional")


def _policy(args: argparse.Namespace, tls: ServerTls | None) -> Policy | None:
    """The checked ``--policy`` file, read.

    Raises:
        _BadFlag: a policy without mTLS (every caller would be anonymous), or a file that cannot be used.
    """
    if not args.policy:
        return None
    if tls is None or tls.client_ca is None:
        raise _BadFlag("--policy needs --client-ca (and --tls-cert, --tls-key): callers are told apart by their "
                       "client certificates; without them every caller would be anonymous")
    if not tls.require_client_cert:
        raise _BadFlag("--policy needs client certificates, which --client-auth optional does not ask for: every "
                       "caller would be anonymous; drop --client-auth optional")
    try:
        return Policy.from_file(args.policy)
    except PolicyError as exc:
        raise _BadFlag(f"--policy: {exc}") from None


def _etcd_ca(args: argparse.Namespace) -> tuple[str, str | None]:
    """The etcd CA file and the flag that gave it: --etcd-ca, or --etcd-cacert, its old name.

    Raises:
        _BadFlag: both are given (as flags or variables) and name different files.
    """
    given = [(flag, path) for flag, path in (("--etcd-ca", args.etcd_ca), ("--etcd-cacert", args.etcd_cacert)) if path]
    if len(given) == 2 and given[0][1] != given[1][1]:
        raise _BadFlag(f"--etcd-ca {given[0][1]} and --etcd-cacert {given[1][1]} (its old name, or "
                       f"FENCEPOST_ETCD_CA and FENCEPOST_ETCD_CACERT) name different files; give one")
    return given[0] if given else ("--etcd-ca", None)


def _read_password(path: str) -> str:
    """The password in the file ``--etcd-password-file`` names, without its trailing newline.

    Raises:
        _BadFlag: the file cannot be read, is not UTF-8, is empty, or holds more than one line.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _BadFlag(f"--etcd-password-file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise _BadFlag(f"--etcd-password-file {path} is not UTF-8 text") from None
    if not text:
        raise _BadFlag(f"--etcd-password-file {path} is empty")
    if "\n" in text or "\r" in text:
        raise _BadFlag(f"--etcd-password-file {path} holds more than one line; it must hold the password only")
    return text


def _check_metrics_listen(metrics_listen: str | None) -> None:
    """Check ``--metrics-listen`` (None: no metrics).

    Raises:
        _BadFlag: not HOST:PORT with a port 0 to 65535.
    """
    if metrics_listen is None:
        return
    try:
        if metrics_listen.startswith("unix:"):
            raise ValueError("metrics are served over HTTP on TCP only")
        check_listen(metrics_listen)
    except ValueError:
        raise _BadFlag(f"--metrics-listen is {metrics_listen!r}; must be HOST:PORT with a port 0 to 65535 (e.g. "
                       f"127.0.0.1:7422, 0.0.0.0:7422, [::1]:7422; port 0 picks a free one)") from None


def _metrics_name_prefixes(args: argparse.Namespace) -> tuple[str, ...]:
    """The checked ``--metrics-name-prefix`` values (or ``FENCEPOST_METRICS_NAME_PREFIXES``, comma-separated).

    Raises:
        _BadFlag: an empty or bad prefix, more than 100, or prefixes without --metrics-listen.
    """
    given = args.metrics_name_prefix
    if given is None:
        env = _env("metrics-name-prefixes", None)
        given = env.split(",") if env else []
    try:
        prefixes = check_name_prefixes(given)
    except ValueError as exc:
        raise _BadFlag(f"--metrics-name-prefix: {exc}") from None
    if prefixes and args.metrics_listen is None:
        raise _BadFlag("--metrics-name-prefix needs --metrics-listen (the metrics it labels)")
    return prefixes


def _flag_bool(flag: str, value: bool | str) -> bool:
    """A boolean flag's value: True/False from the flag, or its variable's text (true/false, 1/0, yes/no, on/off).

    Raises:
        _BadFlag: a variable's text that is none of those.
    """
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    variable = "FENCEPOST_" + flag.upper().replace("-", "_")
    raise _BadFlag(f"{variable} is {value!r}; must be true or false (or --{flag} / --no-{flag})")


def _settings(args: argparse.Namespace) -> _Settings:
    """Check the flags.

    Raises:
        _BadFlag: with the one-line message to print.
    """
    try:
        grace = float(args.grace_seconds)
    except ValueError:
        raise _BadFlag(f"--grace-seconds is {args.grace_seconds!r}; must be a number of seconds") from None
    if not 0 <= grace <= 3600 or math.isnan(grace):
        raise _BadFlag(f"--grace-seconds is {args.grace_seconds}; must be 0 to 3600 seconds")
    try:
        check_listen(args.listen)
    except ValueError as exc:
        raise _BadFlag(f"--listen: {exc}") from None
    health_listen = args.health_listen or None
    if health_listen is not None:
        try:
            check_listen(health_listen)
        except ValueError as exc:
            raise _BadFlag(f"--health-listen: {exc}") from None
        if same_address(args.listen, health_listen):
            raise _BadFlag(f"--health-listen is {health_listen!r}, the --listen address; give another address")
    level = str(args.log_level).upper()
    if not isinstance(logging.getLevelName(level), int):
        raise _BadFlag(f"--log-level is {args.log_level!r}; must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    if args.log_format not in LOG_FORMATS:
        raise _BadFlag(f"--log-format is {args.log_format!r}; must be text, json or auto")
    server_tls = _server_tls(args)
    policy = _policy(args, server_tls)
    endpoints, tls, auth = etcd_settings(args)
    trace_lock_names = _flag_bool("trace-lock-names", args.trace_lock_names)
    try:
        limits = limits_from_args(args)
    except ValueError as exc:
        raise _BadFlag(str(exc)) from None
    return _Settings(endpoints, tls, auth, grace, level, args.log_format, server_tls, health_listen,
                     trace_lock_names, policy, limits)


def etcd_settings(args: argparse.Namespace) -> tuple[list[str] | None, EtcdTls | None, EtcdAuth | None]:
    """Check the flags of :func:`add_etcd_arguments`.

    Returns:
        (endpoints, None for the embedded etcd; TLS to etcd or None; etcd user and password or None).

    Raises:
        _BadFlag: with the one-line message to print.
    """
    ca_flag, ca = _etcd_ca(args)
    endpoints = None
    if args.etcd_endpoints is not None:  # given, even empty: only an unset flag and env mean "embedded"
        endpoints = [e.strip() for e in args.etcd_endpoints.split(",") if e.strip()]
        if not endpoints:
            raise _BadFlag("--etcd-endpoints is empty; omit it (and FENCEPOST_ETCD_ENDPOINTS) for the embedded etcd")
    elif ca or args.etcd_cert or args.etcd_key or args.etcd_user or args.etcd_password_file:
        raise _BadFlag(f"{ca_flag}, --etcd-cert, --etcd-key, --etcd-user and --etcd-password-file need "
                       f"--etcd-endpoints (the embedded etcd has no TLS or auth)")
    tls = None
    if ca or args.etcd_cert or args.etcd_key:
        try:
            tls = EtcdTls.from_files(ca, args.etcd_cert, args.etcd_key)
        except ValueError as exc:
            raise _BadFlag(f"--etcd-cert/--etcd-key/{ca_flag}: {exc}") from None
        for flag, pem in ((ca_flag, tls.ca), ("--etcd-cert", tls.cert), ("--etcd-key", tls.key)):
            if pem is not None and b"-----BEGIN " not in pem:
                raise _BadFlag(f"{flag}: not a PEM file")
    if endpoints is not None:
        try:
            check_endpoints(endpoints, tls)
        except ValueError as exc:
            raise _BadFlag(f"--etcd-endpoints: {exc}") from None
    if tls is not None:
        _pem_files({"cert": "--etcd-cert", "key": "--etcd-key", "ca": ca_flag}, args.etcd_cert, args.etcd_key, ca)
    password = os.environ.get(PASSWORD_ENV)
    said = f"{PASSWORD_ENV} is set"
    if args.etcd_password_file:
        if password is not None:
            raise _BadFlag(f"--etcd-password-file and {PASSWORD_ENV} are both given; give the password one way")
        password, said = _read_password(args.etcd_password_file), "--etcd-password-file is given"
    auth = None
    if args.etcd_user:
        if password is None:
            raise _BadFlag(f"--etcd-user {args.etcd_user} needs its password in the environment variable "
                           f"{PASSWORD_ENV} or in --etcd-password-file")
        auth = EtcdAuth(args.etcd_user, password)
    elif password is not None and endpoints is not None:
        raise _BadFlag(f"{said} but no --etcd-user names its user")
    return endpoints, tls, auth


def main(argv: list[str] | None = None) -> int:
    """Run ``fencepost serve``.

    Args:
        argv: the arguments after ``serve``; default ``sys.argv[2:]`` style parsing by the caller.

    Returns:
        The process exit status: 0 after a clean shutdown, 1 when it cannot
        start, 2 for a bad flag or environment value (one line on stderr),
        also an OTLP endpoint variable set without the ``tracing`` extra.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
        _check_metrics_listen(args.metrics_listen)
        name_prefixes = _metrics_name_prefixes(args)
        processes = check_processes(args, embedded=settings.endpoints is None, health_listen=settings.health_listen)
        traces = export_from_environment(os.environ)
    except (_BadFlag, TracingUnavailable, ProcessesRefused) as exc:
        print(f"fencepost serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        if processes.workers > 1:
            return run_workers(argv if argv is not None else sys.argv[1:], args, processes,
                               health_listen=settings.health_listen, grace_seconds=settings.grace)
        return _run(args, settings, traces, name_prefixes, processes)
    finally:
        if traces is not None:
            traces.shutdown()  # sends the spans still queued


def _run(args: argparse.Namespace, settings: _Settings, traces: TraceExport | None,
         name_prefixes: tuple[str, ...] = (), processes: Processes = Processes()) -> int:
    """Start the embedded etcd if needed, then serve until SIGTERM or SIGINT (see :func:`main`)."""
    # The addresses before anything starts (the embedded etcd takes seconds, and would be started for nothing).
    for flag, address in (("--listen", args.listen), ("--health-listen", settings.health_listen),
                          ("--metrics-listen", args.metrics_listen)):
        problem = bind_problem(address) if address is not None else None
        if problem is not None:
            print(f"fencepost serve: cannot listen on {address} ({flag}): {problem}", file=sys.stderr)
            return 1
    endpoints = settings.endpoints
    configure_logging(settings.level, settings.log_format, sys.stderr)
    embedded = None
    if endpoints is None:
        from .embedded import EmbeddedEtcd

        data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
        try:
            owner = _lock_data_dir(data_dir)
        except _BadFlag as exc:
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
    print(f"fencepost: event loop {describe_loop(processes.loop)}", flush=True)
    try:
        return run_loop(_serve(endpoints, args, settings, traces, name_prefixes), processes.loop)
    finally:
        if embedded is not None:
            embedded.stop()


def _lock_data_dir(data_dir: Path) -> IO[str] | None:
    """Make ``data_dir`` if missing and take an exclusive lock on it for this process's lifetime.

    Returns:
        The open lock file (keep it open), or None when another process holds it.

    Raises:
        _BadFlag: ``data_dir`` is not a directory, cannot be made, or no file can be made in it.
    """
    if data_dir.exists() and not data_dir.is_dir():
        raise _BadFlag(f"--data-dir {data_dir} is not a directory")
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # a dangling symbolic link, or made meanwhile as a file
        raise _BadFlag(f"--data-dir {data_dir} is not a directory") from None
    except OSError as exc:
        raise _BadFlag(f"--data-dir {data_dir} cannot be made: {exc.strerror}") from None
    try:
        handle = open(data_dir / "fencepost.lock", "a+")  # noqa: SIM115 - held until the process exits
    except OSError as exc:
        raise _BadFlag(f"--data-dir {data_dir}: cannot make a file in it: {exc.strerror}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


async def _serve(endpoints: list[str], args: argparse.Namespace, settings: _Settings,
                 traces: TraceExport | None, name_prefixes: tuple[str, ...] = (),
                 server_options: Sequence[tuple[str, int]] = ()) -> int:
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
                                  etcd_batch_max=args.etcd_batch_max)
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
    if settings.tls is None and not is_local(args.listen):
        log_event(logging.getLogger("fencepost.coordinator"), logging.WARNING, "plaintext_listen",
                  f"serving in plaintext on {args.listen}, which other hosts can reach: any of them may take, "
                  f"release and list every lock; give --tls-cert, --tls-key and --client-ca (and --policy), or "
                  f"listen on a loopback address or a Unix socket", listen=args.listen)
    if coordinator.health_address is not None:
        print(f"fencepost: health (grpc.health.v1 only, plaintext) on {coordinator.health_address}", flush=True)
    # The last word of this line is the address (tests and bench/cycles.py read it).
    print(f"fencepost: listening on {coordinator.address}", flush=True)
    if coordinator.metrics_address is not None:
        print(f"fencepost: metrics on http://{coordinator.metrics_address}/metrics", flush=True)
    if traces is not None:
        print(f"fencepost: traces to {traces.endpoint} (OTLP {traces.protocol})"
              f"{'' if settings.trace_lock_names else ', without lock names'}", flush=True)
    await stop.wait()
    print("fencepost: shutting down (leases are kept)", flush=True)
    await coordinator.stop()
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
