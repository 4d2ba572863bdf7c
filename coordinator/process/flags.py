"""``fencepost serve``'s flags and their checks: every bad flag is refused here, before anything starts.

Every flag also reads ``FENCEPOST_<FLAG>``; the etcd password comes only from
``FENCEPOST_ETCD_PASSWORD`` or from the file ``--etcd-password-file`` names.
:func:`settings` checks the parsed flags into :class:`Settings` or raises
:class:`BadFlag` with the one line ``fencepost serve`` prints (exit 2). The
etcd flags (:func:`add_etcd_arguments`, :func:`etcd_settings`) are shared
with ``fencepost admin`` (:mod:`.admin`). The process itself is :mod:`.main`.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..admission.access import Policy, PolicyError
from ..admission.limits import Limits, add_limit_arguments, limits_from_args
from ..etcd import EtcdAuth, EtcdTls, check_endpoints
from ..telemetry.events import LOG_FORMATS
from ..telemetry.metrics import check_name_prefixes
from .coordinator import DEFAULT_LISTEN, DEFAULT_PREFIX, check_listen
from .listen import same_address
from .tls import ServerTls, TlsFileError, check_pem_files
from .workers import add_process_arguments

__all__ = ["DEFAULT_DRAIN_SECONDS", "PASSWORD_ENV", "BadFlag", "Settings", "add_etcd_arguments", "build_parser", "check_metrics_listen",
           "default_data_dir", "etcd_settings", "metrics_name_prefixes", "settings"]


def _env(flag: str, default: str | None) -> str | None:
    return os.environ.get("FENCEPOST_" + flag.upper().replace("-", "_"), default)


def default_data_dir() -> Path:
    """The per-user directory of the embedded etcd's data."""
    import platformdirs

    return Path(platformdirs.user_data_dir("fencepost")) / "etcd"


#: The environment variable that carries the etcd password (never a flag, never logged), unless
#: --etcd-password-file names a file holding it.
PASSWORD_ENV = "FENCEPOST_ETCD_PASSWORD"

#: ``--drain-seconds`` by default: long enough for an application stopped at the same time to release.
DEFAULT_DRAIN_SECONDS = 10.0


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
    parser.add_argument("--http-listen", default=_env("http-listen", None), metavar="HOST:PORT",
                        help="also serve the HTTP/JSON API on HOST:PORT (or unix:/ABSOLUTE/PATH): every call as "
                             "JSON over HTTP (curl), with the TLS, client certificates and policy of --listen; with "
                             "--workers, every worker serves it (docs/http.md) (env FENCEPOST_HTTP_LISTEN; default: "
                             "none)")
    parser.add_argument("--policy", default=_env("policy", None), metavar="FILE",
                        help="access policy, a .toml, .yaml or .yml file: which client-certificate identities "
                             "(SPIFFE ID, else URI SAN, else DNS SAN, else subject CN) may acquire, release, "
                             "describe or admin which lock names (exact, or prefixes such as billing/*); what it "
                             "does not allow is refused with PERMISSION_DENIED. Needs --client-ca. SIGHUP re-reads "
                             "it; a file that cannot be used keeps the policy in force (docs/security.md) (env "
                             "FENCEPOST_POLICY; default: none, every caller may do everything)")
    add_etcd_arguments(parser)
    parser.add_argument("--data-dir", default=_env("data-dir", None),
                        help="the coordinator's own directory: it keeps there (tokens.json) the highest fencing "
                             "token it may have handed out, and after a restart refuses to grant while etcd is "
                             "below it (an etcd restored from an older snapshot); without --etcd-endpoints also the "
                             "embedded etcd's data. Give a persistent directory (env FENCEPOST_DATA_DIR; default: "
                             "with --etcd-endpoints none, the mark is kept in memory only; else a per-user data "
                             "directory)")
    parser.add_argument("--prefix", default=_env("prefix", DEFAULT_PREFIX),
                        help=f"etcd key prefix of all locks (env FENCEPOST_PREFIX; default {DEFAULT_PREFIX})")
    parser.add_argument("--grace-seconds", default=_env("grace-seconds", "5"),
                        help="seconds in-flight calls may take at shutdown (env FENCEPOST_GRACE_SECONDS; default 5)")
    parser.add_argument("--drain-seconds", default=_env("drain-seconds", str(DEFAULT_DRAIN_SECONDS)),
                        help="seconds the coordinator drains after SIGTERM before it stops: readiness NOT_SERVING, "
                             "new leases, streams and acquires refused (DRAINING), releases, revokes and "
                             "keepalives still served; it ends early once no stream is left, and at a second "
                             "SIGTERM; 0: stop at once (env FENCEPOST_DRAIN_SECONDS; default "
                             f"{DEFAULT_DRAIN_SECONDS:g})")
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


class BadFlag(Exception):
    """A flag or environment value that ``fencepost serve`` (or ``fencepost admin``: its etcd flags) refuses: exit 2."""


@dataclass(frozen=True)
class Settings:
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
    drain: float = DEFAULT_DRAIN_SECONDS
    http_listen: str | None = None


def _pem_files(flags: dict[str, str], cert: str | None = None, key: str | None = None,
               ca: str | None = None) -> None:
    """Load the PEM files as OpenSSL will in gRPC, so that a bad one stops the start, not each handshake.

    gRPC only fails on them at a handshake, and keeps failing (for etcd:
    NOT_SERVING for ever, with core errors on stderr).

    Args:
        flags: the flag of each role (``"cert"``, ``"key"``, ``"ca"``), for the message.

    Raises:
        BadFlag: naming the flag and the file (see :func:`~.tls.check_pem_files`).
    """
    try:
        check_pem_files(cert, key, ca)
    except TlsFileError as exc:
        raise BadFlag(f"{flags[exc.role]} {exc.path} {exc.problem}") from None


def _server_tls(args: argparse.Namespace) -> ServerTls | None:
    """The checked --tls-cert, --tls-key, --client-ca and --client-auth.

    Raises:
        BadFlag: one of them without the flag it needs, a bad --client-auth, or a file that cannot be used.
    """
    if args.tls_key and not args.tls_cert:
        raise BadFlag("--tls-key needs --tls-cert (the certificate of that key)")
    if args.tls_cert and not args.tls_key:
        raise BadFlag("--tls-cert needs --tls-key (the certificate's private key)")
    if args.client_ca and not args.tls_cert:
        raise BadFlag("--client-ca needs --tls-cert and --tls-key: client certificates are checked in the "
                       "TLS handshake")
    if args.client_auth is not None:
        if args.client_auth not in ("require", "optional"):
            raise BadFlag(f"--client-auth is {args.client_auth!r}; must be require or optional")
        if not args.client_ca:
            raise BadFlag(f"--client-auth {args.client_auth} needs --client-ca (the CA of the client certificates)")
    if not args.tls_cert:
        return None
    _pem_files({"cert": "--tls-cert", "key": "--tls-key", "ca": "--client-ca"}, args.tls_cert, args.tls_key,
               args.client_ca or None)
    return ServerTls(Path(args.tls_cert), Path(args.tls_key), Path(args.client_ca) if args.client_ca else None,
                     require_client_cert=args.client_auth != "optional")


def _policy(args: argparse.Namespace, tls: ServerTls | None) -> Policy | None:
    """The checked ``--policy`` file, read.

    Raises:
        BadFlag: a policy without mTLS (every caller would be anonymous), or a file that cannot be used.
    """
    if not args.policy:
        return None
    if tls is None or tls.client_ca is None:
        raise BadFlag("--policy needs --client-ca (and --tls-cert, --tls-key): callers are told apart by their "
                       "client certificates; without them every caller would be anonymous")
    if not tls.require_client_cert:
        raise BadFlag("--policy needs client certificates, which --client-auth optional does not ask for: every "
                       "caller would be anonymous; drop --client-auth optional")
    try:
        return Policy.from_file(args.policy)
    except PolicyError as exc:
        raise BadFlag(f"--policy: {exc}") from None


def _etcd_ca(args: argparse.Namespace) -> tuple[str, str | None]:
    """The etcd CA file and the flag that gave it: --etcd-ca, or --etcd-cacert, its old name.

    Raises:
        BadFlag: both are given (as flags or variables) and name different files.
    """
    given = [(flag, path) for flag, path in (("--etcd-ca", args.etcd_ca), ("--etcd-cacert", args.etcd_cacert)) if path]
    if len(given) == 2 and given[0][1] != given[1][1]:
        raise BadFlag(f"--etcd-ca {given[0][1]} and --etcd-cacert {given[1][1]} (its old name, or "
                       f"FENCEPOST_ETCD_CA and FENCEPOST_ETCD_CACERT) name different files; give one")
    return given[0] if given else ("--etcd-ca", None)


def _read_password(path: str) -> str:
    """The password in the file ``--etcd-password-file`` names, without its trailing newline.

    Raises:
        BadFlag: the file cannot be read, is not UTF-8, is empty, or holds more than one line.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadFlag(f"--etcd-password-file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise BadFlag(f"--etcd-password-file {path} is not UTF-8 text") from None
    if not text:
        raise BadFlag(f"--etcd-password-file {path} is empty")
    if "\n" in text or "\r" in text:
        raise BadFlag(f"--etcd-password-file {path} holds more than one line; it must hold the password only")
    return text


def check_metrics_listen(metrics_listen: str | None) -> None:
    """Check ``--metrics-listen`` (None: no metrics).

    Raises:
        BadFlag: not HOST:PORT with a port 0 to 65535.
    """
    if metrics_listen is None:
        return
    try:
        if metrics_listen.startswith("unix:"):
            raise ValueError("metrics are served over HTTP on TCP only")
        check_listen(metrics_listen)
    except ValueError:
        raise BadFlag(f"--metrics-listen is {metrics_listen!r}; must be HOST:PORT with a port 0 to 65535 (e.g. "
                       f"127.0.0.1:7422, 0.0.0.0:7422, [::1]:7422; port 0 picks a free one)") from None


def metrics_name_prefixes(args: argparse.Namespace) -> tuple[str, ...]:
    """The checked ``--metrics-name-prefix`` values (or ``FENCEPOST_METRICS_NAME_PREFIXES``, comma-separated).

    Raises:
        BadFlag: an empty or bad prefix, more than 100, or prefixes without --metrics-listen.
    """
    given = args.metrics_name_prefix
    if given is None:
        env = _env("metrics-name-prefixes", None)
        given = env.split(",") if env else []
    try:
        prefixes = check_name_prefixes(given)
    except ValueError as exc:
        raise BadFlag(f"--metrics-name-prefix: {exc}") from None
    if prefixes and args.metrics_listen is None:
        raise BadFlag("--metrics-name-prefix needs --metrics-listen (the metrics it labels)")
    return prefixes


def _flag_bool(flag: str, value: bool | str) -> bool:
    """A boolean flag's value: True/False from the flag, or its variable's text (true/false, 1/0, yes/no, on/off).

    Raises:
        BadFlag: a variable's text that is none of those.
    """
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    variable = "FENCEPOST_" + flag.upper().replace("-", "_")
    raise BadFlag(f"{variable} is {value!r}; must be true or false (or --{flag} / --no-{flag})")


def settings(args: argparse.Namespace) -> Settings:
    """Check the flags.

    Raises:
        BadFlag: with the one-line message to print.
    """
    try:
        grace = float(args.grace_seconds)
    except ValueError:
        raise BadFlag(f"--grace-seconds is {args.grace_seconds!r}; must be a number of seconds") from None
    if not 0 <= grace <= 3600 or math.isnan(grace):
        raise BadFlag(f"--grace-seconds is {args.grace_seconds}; must be 0 to 3600 seconds")
    try:
        drain = float(args.drain_seconds)
    except ValueError:
        raise BadFlag(f"--drain-seconds is {args.drain_seconds!r}; must be a number of seconds") from None
    if not 0 <= drain <= 3600 or math.isnan(drain):
        raise BadFlag(f"--drain-seconds is {args.drain_seconds}; must be 0 to 3600 seconds")
    try:
        check_listen(args.listen)
    except ValueError as exc:
        raise BadFlag(f"--listen: {exc}") from None
    health_listen = args.health_listen or None
    if health_listen is not None:
        try:
            check_listen(health_listen)
        except ValueError as exc:
            raise BadFlag(f"--health-listen: {exc}") from None
        if same_address(args.listen, health_listen):
            raise BadFlag(f"--health-listen is {health_listen!r}, the --listen address; give another address")
    http_listen = args.http_listen or None
    if http_listen is not None:
        try:
            check_listen(http_listen)
        except ValueError as exc:
            raise BadFlag(f"--http-listen: {exc}") from None
        if any(same_address(http_listen, other) for other in (args.listen, health_listen) if other is not None):
            raise BadFlag(f"--http-listen is {http_listen!r}, the address of another listener; give another address")
    level = str(args.log_level).upper()
    if not isinstance(logging.getLevelName(level), int):
        raise BadFlag(f"--log-level is {args.log_level!r}; must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    if args.log_format not in LOG_FORMATS:
        raise BadFlag(f"--log-format is {args.log_format!r}; must be text, json or auto")
    server_tls = _server_tls(args)
    policy = _policy(args, server_tls)
    endpoints, tls, auth = etcd_settings(args)
    trace_lock_names = _flag_bool("trace-lock-names", args.trace_lock_names)
    try:
        limits = limits_from_args(args)
    except ValueError as exc:
        raise BadFlag(str(exc)) from None
    return Settings(endpoints, tls, auth, grace, level, args.log_format, server_tls, health_listen,
                     trace_lock_names, policy, limits, drain, http_listen)


def etcd_settings(args: argparse.Namespace) -> tuple[list[str] | None, EtcdTls | None, EtcdAuth | None]:
    """Check the flags of :func:`add_etcd_arguments`.

    Returns:
        (endpoints, None for the embedded etcd; TLS to etcd or None; etcd user and password or None).

    Raises:
        BadFlag: with the one-line message to print.
    """
    ca_flag, ca = _etcd_ca(args)
    endpoints = None
    if args.etcd_endpoints is not None:  # given, even empty: only an unset flag and env mean "embedded"
        endpoints = [e.strip() for e in args.etcd_endpoints.split(",") if e.strip()]
        if not endpoints:
            raise BadFlag("--etcd-endpoints is empty; omit it (and FENCEPOST_ETCD_ENDPOINTS) for the embedded etcd")
    elif ca or args.etcd_cert or args.etcd_key or args.etcd_user or args.etcd_password_file:
        raise BadFlag(f"{ca_flag}, --etcd-cert, --etcd-key, --etcd-user and --etcd-password-file need "
                       f"--etcd-endpoints (the embedded etcd has no TLS or auth)")
    tls = None
    if ca or args.etcd_cert or args.etcd_key:
        try:
            tls = EtcdTls.from_files(ca, args.etcd_cert, args.etcd_key)
        except ValueError as exc:
            raise BadFlag(f"--etcd-cert/--etcd-key/{ca_flag}: {exc}") from None
        for flag, pem in ((ca_flag, tls.ca), ("--etcd-cert", tls.cert), ("--etcd-key", tls.key)):
            if pem is not None and b"-----BEGIN " not in pem:
                raise BadFlag(f"{flag}: not a PEM file")
    if endpoints is not None:
        try:
            check_endpoints(endpoints, tls)
        except ValueError as exc:
            raise BadFlag(f"--etcd-endpoints: {exc}") from None
    if tls is not None:
        _pem_files({"cert": "--etcd-cert", "key": "--etcd-key", "ca": ca_flag}, args.etcd_cert, args.etcd_key, ca)
    password = os.environ.get(PASSWORD_ENV)
    said = f"{PASSWORD_ENV} is set"
    if args.etcd_password_file:
        if password is not None:
            raise BadFlag(f"--etcd-password-file and {PASSWORD_ENV} are both given; give the password one way")
        password, said = _read_password(args.etcd_password_file), "--etcd-password-file is given"
    auth = None
    if args.etcd_user:
        if password is None:
            raise BadFlag(f"--etcd-user {args.etcd_user} needs its password in the environment variable "
                           f"{PASSWORD_ENV} or in --etcd-password-file")
        auth = EtcdAuth(args.etcd_user, password)
    elif password is not None and endpoints is not None:
        raise BadFlag(f"{said} but no --etcd-user names its user")
    return endpoints, tls, auth
