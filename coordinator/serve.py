"""``fencepost serve``: the coordinator as a process, its flags and their checks.

Every flag also reads ``FENCEPOST_<FLAG>``; the etcd password comes only from
``FENCEPOST_ETCD_PASSWORD``. Bad input exits 2 with one line, before anything
starts; without ``--etcd-endpoints`` an embedded etcd runs in ``--data-dir``
(one ``fencepost serve`` per data directory, held by a file lock).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import math
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import IO

from .etcd import EtcdAuth, EtcdTls, check_endpoints
from .server import DEFAULT_LISTEN, DEFAULT_PREFIX, Coordinator, check_listen

__all__ = ["PASSWORD_ENV", "build_parser", "default_data_dir", "main"]


def _env(flag: str, default: str | None) -> str | None:
    return os.environ.get("FENCEPOST_" + flag.upper().replace("-", "_"), default)


def default_data_dir() -> Path:
    """The per-user directory of the embedded etcd's data."""
    import platformdirs

    return Path(platformdirs.user_data_dir("fencepost")) / "etcd"


#: The environment variable that carries the etcd password (never a flag, never logged).
PASSWORD_ENV = "FENCEPOST_ETCD_PASSWORD"


def build_parser() -> argparse.ArgumentParser:
    """The ``fencepost serve`` argument parser; every flag also reads FENCEPOST_<FLAG>."""
    parser = argparse.ArgumentParser(
        prog="fencepost serve",
        description="Serve the Fencepost lock service. Without --etcd-endpoints, start an embedded "
                    f"single-member etcd whose data lives in --data-dir. The etcd password of --etcd-user "
                    f"is read from the environment variable {PASSWORD_ENV} only.",
    )
    parser.add_argument("--listen", default=_env("listen", DEFAULT_LISTEN),
                        help=f"HOST:PORT to serve on; port 0 picks one (env FENCEPOST_LISTEN; default {DEFAULT_LISTEN})")
    parser.add_argument("--etcd-endpoints", default=_env("etcd-endpoints", None),
                        help="comma-separated etcd endpoints, HOST:PORT each (a host name or an address; "
                             "https:// for TLS); omit for the embedded etcd (env FENCEPOST_ETCD_ENDPOINTS)")
    parser.add_argument("--etcd-cacert", default=_env("etcd-cacert", None),
                        help="PEM file of the CA that signed etcd's server certificate: TLS to etcd "
                             "(env FENCEPOST_ETCD_CACERT)")
    parser.add_argument("--etcd-cert", default=_env("etcd-cert", None),
                        help="PEM file of the coordinator's client certificate, for etcd's --client-cert-auth "
                             "(env FENCEPOST_ETCD_CERT; needs --etcd-key)")
    parser.add_argument("--etcd-key", default=_env("etcd-key", None),
                        help="PEM file of the client certificate's private key (env FENCEPOST_ETCD_KEY)")
    parser.add_argument("--etcd-user", default=_env("etcd-user", None),
                        help=f"etcd user to authenticate as, its password in env {PASSWORD_ENV} "
                             "(env FENCEPOST_ETCD_USER)")
    parser.add_argument("--data-dir", default=_env("data-dir", None),
                        help="embedded etcd data directory (env FENCEPOST_DATA_DIR; default: a per-user data directory)")
    parser.add_argument("--prefix", default=_env("prefix", DEFAULT_PREFIX),
                        help=f"etcd key prefix of all locks (env FENCEPOST_PREFIX; default {DEFAULT_PREFIX})")
    parser.add_argument("--grace-seconds", default=_env("grace-seconds", "5"),
                        help="seconds in-flight calls may take at shutdown (env FENCEPOST_GRACE_SECONDS; default 5)")
    parser.add_argument("--log-level", default=_env("log-level", "INFO"),
                        help="logging level (env FENCEPOST_LOG_LEVEL; default INFO)")
    parser.add_argument("--metrics-listen", default=_env("metrics-listen", None),
                        help="HOST:PORT to serve Prometheus metrics on, over HTTP at /metrics; port 0 picks one "
                             "(env FENCEPOST_METRICS_LISTEN; default: no metrics)")
    return parser


class _BadFlag(Exception):
    """A flag or environment value that ``fencepost serve`` refuses (exit 2)."""


def _check_metrics_listen(metrics_listen: str | None) -> None:
    """Check ``--metrics-listen`` (None: no metrics).

    Raises:
        _BadFlag: not HOST:PORT with a port 0 to 65535.
    """
    if metrics_listen is None:
        return
    try:
        check_listen(metrics_listen)
    except ValueError:
        raise _BadFlag(f"--metrics-listen is {metrics_listen!r}; must be HOST:PORT with a port 0 to 65535 (e.g. "
                       f"127.0.0.1:7421, 0.0.0.0:7421, [::1]:7421; port 0 picks a free one)") from None


def _settings(args: argparse.Namespace) -> tuple[list[str] | None, EtcdTls | None, EtcdAuth | None, float, str]:
    """Check the flags: (endpoints or None for the embedded etcd, TLS, auth, grace seconds, log level).

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
    except ValueError:
        raise _BadFlag(f"--listen is {args.listen!r}; must be HOST:PORT with a port 0 to 65535 (e.g. "
                       f"127.0.0.1:7420, 0.0.0.0:7420, [::1]:7420; port 0 picks a free one)") from None
    level = str(args.log_level).upper()
    if not isinstance(logging.getLevelName(level), int):
        raise _BadFlag(f"--log-level is {args.log_level!r}; must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    password = os.environ.get(PASSWORD_ENV)
    endpoints = None
    if args.etcd_endpoints is not None:  # given, even empty: only an unset flag and env mean "embedded"
        endpoints = [e.strip() for e in args.etcd_endpoints.split(",") if e.strip()]
        if not endpoints:
            raise _BadFlag("--etcd-endpoints is empty; omit it (and FENCEPOST_ETCD_ENDPOINTS) for the embedded etcd")
    elif args.etcd_cacert or args.etcd_cert or args.etcd_key or args.etcd_user:
        raise _BadFlag("--etcd-cacert, --etcd-cert, --etcd-key and --etcd-user need --etcd-endpoints "
                       "(the embedded etcd has no TLS or auth)")
    tls = None
    if args.etcd_cacert or args.etcd_cert or args.etcd_key:
        try:
            tls = EtcdTls.from_files(args.etcd_cacert, args.etcd_cert, args.etcd_key)
        except ValueError as exc:
            raise _BadFlag(f"--etcd-cert/--etcd-key/--etcd-cacert: {exc}") from None
        for flag, pem in (("--etcd-cacert", tls.ca), ("--etcd-cert", tls.cert), ("--etcd-key", tls.key)):
            if pem is not None and b"-----BEGIN " not in pem:
                raise _BadFlag(f"{flag}: not a PEM file")
    if endpoints is not None:
        try:
            check_endpoints(endpoints, tls)
        except ValueError as exc:
            raise _BadFlag(f"--etcd-endpoints: {exc}") from None
    if tls is not None:
        _check_tls_files(args.etcd_cacert, args.etcd_cert, args.etcd_key)
    auth = None
    if args.etcd_user:
        if password is None:
            raise _BadFlag(f"--etcd-user {args.etcd_user} needs its password in the environment variable "
                           f"{PASSWORD_ENV}")
        auth = EtcdAuth(args.etcd_user, password)
    elif password is not None and endpoints is not None:
        raise _BadFlag(f"{PASSWORD_ENV} is set but no --etcd-user names its user")
    return endpoints, tls, auth, grace, level


class _Encrypted(Exception):
    """The private key asks for a passphrase (gRPC takes unencrypted keys only)."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def _ssl_why(exc: ssl.SSLError) -> str:
    """OpenSSL's reason, when it says more than "no certificate" (not its bare "PEM lib")."""
    return f" ({exc.reason})" if exc.reason and exc.reason != "NO_CERTIFICATE_OR_CRL_FOUND" else ""


def _check_tls_files(cacert: str | None, cert: str | None, key: str | None) -> None:
    """Load the PEM files as OpenSSL will in gRPC, so that a bad one stops the start, not each handshake.

    gRPC only fails on them when it first connects to etcd, and keeps failing
    (NOT_SERVING for ever, with core errors on stderr).

    Raises:
        _BadFlag: naming the flag: a CA file without a certificate, a client
            certificate file without one, a key that is not a private key, is
            encrypted, or is not the key of the certificate.
    """
    if cacert is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cacert)
        except ssl.SSLError as exc:
            raise _BadFlag(f"--etcd-cacert {cacert} holds no certificate that OpenSSL can read"
                           f"{_ssl_why(exc)}") from None
    if cert is None or key is None:
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except ssl.SSLError as exc:
        raise _BadFlag(f"--etcd-cert {cert} holds no certificate that OpenSSL can read{_ssl_why(exc)}; "
                       f"are --etcd-cert and --etcd-key swapped?") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=_no_passphrase)
    except _Encrypted:
        raise _BadFlag(f"--etcd-key {key} is encrypted; give the key without a passphrase") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise _BadFlag(f"--etcd-key {key} is not the private key of the certificate in --etcd-cert {cert}"
                           ) from None
        raise _BadFlag(f"--etcd-key {key} holds no private key that OpenSSL can read{_ssl_why(exc)}") from None


def main(argv: list[str] | None = None) -> int:
    """Run ``fencepost serve``.

    Args:
        argv: the arguments after ``serve``; default ``sys.argv[2:]`` style parsing by the caller.

    Returns:
        The process exit status: 0 after a clean shutdown, 1 when it cannot
        start, 2 for a bad flag or environment value (one line on stderr).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        endpoints, tls, auth, grace, level = _settings(args)
        _check_metrics_listen(args.metrics_listen)
    except _BadFlag as exc:
        print(f"fencepost serve: error: {exc}", file=sys.stderr)
        return 2
    args.grace_seconds = grace
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
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
    try:
        return asyncio.run(_serve(endpoints, args, tls, auth))
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


async def _serve(endpoints: list[str], args: argparse.Namespace, tls: EtcdTls | None,
                 auth: EtcdAuth | None) -> int:
    coordinator = Coordinator(endpoints, listen=args.listen, prefix=args.prefix, grace_seconds=args.grace_seconds,
                              etcd_tls=tls, etcd_auth=auth, metrics_listen=args.metrics_listen)
    try:
        await coordinator.start()
    except RuntimeError as exc:
        print(f"fencepost: {exc}", file=sys.stderr)
        await coordinator.stop(0)
        return 1
    how = []
    if tls is not None:
        how.append("mTLS" if tls.cert else "TLS")
    if auth is not None:
        how.append(f"user {auth.user}")
    print(f"fencepost: etcd at {','.join(endpoints)}{' (' + ', '.join(how) + ')' if how else ''}, "
          f"prefix {args.prefix}", flush=True)
    print(f"fencepost: listening on {coordinator.address}", flush=True)
    if coordinator.metrics_address is not None:
        print(f"fencepost: metrics on http://{coordinator.metrics_address}/metrics", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("fencepost: shutting down (leases are kept)", flush=True)
    await coordinator.stop()
    return 0
