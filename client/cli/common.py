"""What the ``fencepost`` commands share: exit codes, flag parsing (addresses, TLS), error lines, one call.

Every expected failure is a :class:`CliError`: one line on stderr and an
exit code from :data:`EXIT_CODES`. Failed calls are read once, by
:func:`fencepost.client.errors.from_rpc_error` (the client's transport does
it), and turned into that line here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import textwrap
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, NoReturn

import grpc

from fencepost.client import DEFAULT_ADDRESS, AsyncLockClient, TlsConfig
from fencepost.client._transport.tls import security
from fencepost.client._transport.transport import Transport
from fencepost.client._transport.wire import check_addresses, check_name
from fencepost.client.errors import (
    FencepostError,
    InvalidArgument,
    LeaseLost,
    LockHeld,
    LockTimeout,
    NotHolder,
    StaleTokenError,
    Unavailable,
    from_rpc_error,
)
from fencepost.client.v1.keys import MAX_LEASE_ID, MAX_LOCK_DELAY_SECONDS, MAX_TOKEN, MAX_TTL_SECONDS, MIN_TTL_SECONDS

__all__ = [
    "ADDRESS_ENV",
    "CA_ENV",
    "CERT_ENV",
    "KEY_ENV",
    "TLS_ENV",
    "TLS_FLAGS",
    "TLS_SERVER_NAME_ENV",
    "DEFAULT_ADDRESS",
    "EXIT_CODES",
    "EXIT_HELD",
    "EXIT_INTERRUPTED",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_PRECONDITION",
    "EXIT_TIMEOUT",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "MIN_CONNECT_SECONDS",
    "RPC_TIMEOUT_SECONDS",
    "CallFailed",
    "CliError",
    "ConnectInterrupted",
    "Formatter",
    "Parser",
    "acquire_error",
    "address_flag",
    "addresses_of",
    "call",
    "call_error",
    "epilog",
    "err_text",
    "lease_hex",
    "lease_secret",
    "lock_name",
    "parse_address",
    "parse_addresses",
    "parse_lease_id",
    "parse_timeout",
    "parse_tls",
    "parse_token",
    "parse_ttl",
    "tls_env",
    "tls_flags",
    "tls_of",
    "tls_words",
]

ADDRESS_ENV = "FENCEPOST_ADDRESS"
"""Environment variable holding the default coordinator address(es), comma-separated."""
TLS_ENV = "FENCEPOST_TLS"
"""Environment variable of ``--tls``: ``1`` (``true``, ``yes``, ``on``) for TLS with the system's CAs."""
CA_ENV = "FENCEPOST_CA"
"""Environment variable of ``--ca``."""
CERT_ENV = "FENCEPOST_CERT"
"""Environment variable of ``--cert``."""
KEY_ENV = "FENCEPOST_KEY"
"""Environment variable of ``--key``."""
TLS_SERVER_NAME_ENV = "FENCEPOST_TLS_SERVER_NAME"
"""Environment variable of ``--tls-server-name``."""

TLS_FLAGS: dict[str, tuple[str, str]] = {
    "--ca": ("ca", CA_ENV),
    "--cert": ("cert", CERT_ENV),
    "--key": ("key", KEY_ENV),
    "--tls-server-name": ("server_name", TLS_SERVER_NAME_ENV),
}
"""Each TLS flag that takes a value: (its :class:`~fencepost.client.TlsConfig` field, its environment variable)."""

#: The reason of an UNAVAILABLE answer from a coordinator whose etcd did not answer.
ETCD_UNAVAILABLE = "ETCD_UNAVAILABLE"

RPC_TIMEOUT_SECONDS = 5.0
"""Seconds ``status`` and ``release`` keep trying to reach a coordinator, and the deadline of each call."""

MIN_CONNECT_SECONDS = 2.0
"""Shortest time ``acquire``, ``run`` and ``elect`` given ``--timeout S`` spend connecting (S may be 0)."""


class ConnectInterrupted(Exception):
    """The interrupt (a signal) came while :func:`connect_within` was connecting; the client is closed."""


async def connect_within(client: AsyncLockClient, timeout: float | None,
                         interrupt: Awaitable[object] | None = None) -> float | None:
    """Connect ``client`` within ``--timeout`` (at least :data:`MIN_CONNECT_SECONDS`), so that it bounds the wait.

    Args:
        client: A client not yet connected.
        timeout: The command's ``--timeout`` in seconds (0 for ``--try``); None: the client's own
            ``connect_timeout``.
        interrupt: An awaitable (a signal's): if it completes first, connecting stops.

    Returns:
        What is left of ``timeout`` for the wait that follows, in seconds (>= 0); None when ``timeout`` is None.

    Raises:
        ConnectInterrupted: ``interrupt`` completed first (the client is closed).
        Unavailable, TlsError: as :meth:`AsyncLockClient.connect` (the client is then closed).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    connecting = asyncio.ensure_future(
        client.connect() if timeout is None else client.connect(timeout=max(timeout, MIN_CONNECT_SECONDS)))
    if interrupt is not None:
        interrupted = asyncio.ensure_future(interrupt)
        try:
            await asyncio.wait({connecting, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            interrupted.cancel()
        if interrupted.done() and not interrupted.cancelled():  # it came (first, or with the connection): it wins
            connecting.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await connecting
            await client.close()
            raise ConnectInterrupted
    await connecting
    return None if timeout is None else max(0.0, timeout - (loop.time() - started))


EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2
EXIT_LOST = 3
EXIT_TIMEOUT = 4
EXIT_HELD = 5
EXIT_PRECONDITION = 6
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (acquire: released after SIGINT/SIGTERM)",
    EXIT_UNAVAILABLE: "coordinator unreachable (a failed TLS handshake too) or not serving, or another server error",
    EXIT_USAGE: "bad input: a flag, a lock name, a TTL, a lease id, a token or a TLS file",
    EXIT_LOST: "acquire, run: the lease or the lock was lost while holding it",
    EXIT_TIMEOUT: "acquire, run: --timeout passed before the lock was granted",
    EXIT_HELD: "acquire --try, run --try: the lock is held by someone else",
    EXIT_PRECONDITION: "release: not released (NOT_HOLDER, STALE_TOKEN, LEASE_EXPIRED or NOT_LEASE_OWNER); "
                       "leader: the election has no leader",
    EXIT_INTERRUPTED: "acquire, run: interrupted before the lock was granted",
}
"""Exit codes of the client commands (``status``, ``acquire``, ``release``; ``run`` and ``demo`` have their own)."""


class CliError(Exception):
    """An expected failure: printed as one line, exits with ``exit_code``.

    Args:
        message: The line (without the ``fencepost COMMAND: `` prefix).
        exit_code: The process exit code.
        bare: Print the line without the ``fencepost COMMAND: `` prefix.
    """

    def __init__(self, message: str, exit_code: int, *, bare: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.bare = bare


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Wraps the description like the default formatter, keeps the epilog's layout."""

    def add_text(self, text: str | None) -> None:
        if text and not text.startswith("exit codes:"):
            text = textwrap.fill(" ".join(text.split()), width=78)
        super().add_text(text)


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line: ``fencepost acquire: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a number of seconds, got {text!r}") from None


def parse_ttl(text: str) -> float:
    """Parse --ttl.

    Args:
        text: Seconds, 1 to 86400.

    Returns:
        The TTL in seconds.

    Raises:
        argparse.ArgumentTypeError: not a number in range.
    """
    value = _number(text, "ttl")
    if not math.isfinite(value) or not MIN_TTL_SECONDS <= value <= MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(f"ttl must be {MIN_TTL_SECONDS:g} to {MAX_TTL_SECONDS:g} seconds, got {text}")
    return value


def parse_timeout(text: str) -> float:
    """Parse --timeout.

    Args:
        text: Seconds, 0 to 86400.

    Returns:
        The timeout in seconds.

    Raises:
        argparse.ArgumentTypeError: not a number in range.
    """
    value = _number(text, "timeout")
    if not math.isfinite(value) or value < 0 or value > MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(f"timeout must be >= 0 and <= {MAX_TTL_SECONDS:g} seconds, got {text}")
    return value


def parse_lock_delay(text: str) -> float:
    """Parse --lock-delay.

    Args:
        text: Seconds, 0 to 3600.

    Returns:
        The lock-delay in seconds.

    Raises:
        argparse.ArgumentTypeError: not a number in range.
    """
    value = _number(text, "lock-delay")
    if not math.isfinite(value) or not 0 <= value <= MAX_LOCK_DELAY_SECONDS:
        raise argparse.ArgumentTypeError(f"lock-delay must be 0 to {MAX_LOCK_DELAY_SECONDS} seconds, got {text}")
    return value


def lock_delay_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--lock-delay S`` (the hold's lock-delay; ``args.lock_delay``, 0 by default) to ``parser``."""
    parser.add_argument("--lock-delay", type=parse_lock_delay, default=0.0, metavar="S",
                        help="lock-delay in seconds, 0 to 3600: if this hold is lost (lease expired or revoked, "
                             "not released), the lock's next grant waits S seconds (README, \"Lock-delay\"; "
                             "a mitigation for storage that cannot check tokens, not a replacement for fencing)")


def parse_lease_id(text: str) -> int:
    """Parse a lease id given in decimal or as 0x-hex.

    Args:
        text: ``"7587867312345"`` or ``"0x6e6c8e1c9a"``.

    Returns:
        The lease id, > 0.

    Raises:
        argparse.ArgumentTypeError: not a positive integer.
    """
    s = text.strip().lower()
    try:
        value = int(s[2:], 16) if s.startswith("0x") else int(s, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"lease-id must be a decimal or 0x-hex integer, got {text!r}") from None
    if value <= 0 or value > MAX_LEASE_ID:
        raise argparse.ArgumentTypeError(f"lease-id must be > 0 and < 2**63, got {text}")
    return value


def parse_token(text: str) -> int:
    """Parse --token.

    Args:
        text: A positive decimal integer.

    Returns:
        The fencing token.

    Raises:
        argparse.ArgumentTypeError: not a positive integer.
    """
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"token must be a positive integer, got {text!r}") from None
    if value <= 0 or value > MAX_TOKEN:
        raise argparse.ArgumentTypeError(f"token must be > 0 and < 2**63, got {text}")
    return value


_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")


def lease_secret(secret: str | None) -> str | None:
    """Check a lease secret argument (``--lease-secret``, ``FENCEPOST_LEASE_SECRET``): base64url, at most 256 characters.

    A coordinator's secrets are 43 base64url characters; surrounding white
    space (a CRLF env file's ``\\r``) is dropped.

    Args:
        secret: The argument, or None for none.

    Returns:
        The secret without surrounding white space; None for None or an empty one.

    Raises:
        CliError: anything else (exit 2): it could not be sent as gRPC metadata.
    """
    if secret is None or not secret.strip():
        return None
    secret = secret.strip()
    if not _SECRET.fullmatch(secret):
        raise CliError(f"invalid lease secret: expected up to 256 characters of A-Z a-z 0-9 _ - (as `fencepost "
                       f"acquire` prints it), got {len(secret)} characters", EXIT_USAGE)
    return secret


def lock_name(name: str) -> str:
    """Check a NAME argument by the client's rules (the server's: 1 to 256 bytes of UTF-8, no control characters).

    Every command checks its NAME this way before any call, so that a bad
    name reads the same in each (``invalid name: name must not be empty``).

    Args:
        name: The NAME argument as ``sys.argv`` holds it (a byte that is not
            UTF-8 is a lone surrogate there).

    Returns:
        ``name`` unchanged.

    Raises:
        CliError: not a valid lock name (exit 2).
    """
    try:
        return check_name(name)
    except InvalidArgument as err:
        raise CliError(f"invalid name: {err_text(err)}", EXIT_USAGE) from None


def parse_addresses(values: Sequence[str] | None, env: str | None = None) -> list[str]:
    """Collect coordinator addresses from --address flags or FENCEPOST_ADDRESS.

    Parsed by the client's own parser (:func:`fencepost.client._transport.wire.check_addresses`),
    so that the command line accepts exactly what ``LockClient`` accepts.

    Args:
        values: The --address values, each an address or a comma-separated
            list; None when no --address was given (an empty value is an error).
        env: The FENCEPOST_ADDRESS value, used when ``values`` is None (unset
            or empty: the default).

    Returns:
        The addresses in order, without duplicates; ``[DEFAULT_ADDRESS]`` when none is given.

    Raises:
        CliError: an address is not ``HOST:PORT``, ``dns:///HOST:PORT`` or
            ``unix:/ABSOLUTE/PATH``, or an entry is empty (exit 2).
    """
    if values is None and not env:
        return [DEFAULT_ADDRESS]
    try:
        return check_addresses(list(values) if values is not None else [env or ""])
    except InvalidArgument as err:
        where = "" if values is not None else f" (from ${ADDRESS_ENV})"
        raise CliError(f"invalid address: {err_text(err)}{where}", EXIT_USAGE) from None


def addresses_of(args: argparse.Namespace) -> list[str]:
    """The coordinator addresses of a parsed command line (--address, else FENCEPOST_ADDRESS).

    Raises:
        CliError: an address is not valid (exit 2).
    """
    return parse_addresses(args.address, os.environ.get(ADDRESS_ENV))


def parse_address(text: str) -> str:
    """Parse a flag that takes one coordinator address (``demo --target``), with the same parser.

    Raises:
        argparse.ArgumentTypeError: not exactly one valid address.
    """
    try:
        addresses = check_addresses(text)
    except InvalidArgument as err:
        raise argparse.ArgumentTypeError(err_text(err)) from None
    if len(addresses) != 1:
        raise argparse.ArgumentTypeError(f"give one coordinator address, got {text!r}")
    return addresses[0]


def address_flag(parser: argparse.ArgumentParser) -> None:
    """Add --address to ``parser``."""
    parser.add_argument(
        "--address", action="append", metavar="HOST:PORT",
        help=f"coordinator address (HOST:PORT, [IPv6]:PORT, dns:///HOST:PORT or unix:/ABSOLUTE/PATH); "
             f"repeat or comma-separate for several (env {ADDRESS_ENV}, default {DEFAULT_ADDRESS})")


def tls_flags(parser: argparse.ArgumentParser) -> None:
    """Add --tls, --ca, --cert, --key and --tls-server-name to ``parser``."""
    group = parser.add_argument_group(
        "TLS", "Any of these flags (or their variables) means TLS; none means plaintext. A flag wins over "
               "its variable.")
    group.add_argument("--tls", action="store_true",
                       help=f"connect with TLS, trusting the system's CAs (env {TLS_ENV}=1)")
    group.add_argument("--ca", metavar="PATH",
                       help=f"PEM file of the CAs to trust instead of the system's (env {CA_ENV})")
    group.add_argument("--cert", metavar="PATH",
                       help=f"client certificate (PEM) for a coordinator that requires one; with --key "
                            f"(env {CERT_ENV})")
    group.add_argument("--key", metavar="PATH",
                       help=f"the client certificate's private key (PEM, unencrypted) (env {KEY_ENV})")
    group.add_argument("--tls-server-name", metavar="NAME",
                       help=f"the name to check in the coordinator's certificate instead of the address's "
                            f"host (env {TLS_SERVER_NAME_ENV})")


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
_TLS_WORDS = re.compile(r"\btls\.(ca|cert|key|server_name)\b|\(give tls\)")
_FLAG_OF_FIELD = {field: flag for flag, (field, _env) in TLS_FLAGS.items()}


def tls_words(text: str) -> str:
    """``text`` (a TLS error of the library) with its setting names as flags: ``tls.ca`` becomes ``--ca``."""

    def flag(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "(give --tls, or --ca with the coordinator's CA)"
        return _FLAG_OF_FIELD[match.group(1)]

    return _TLS_WORDS.sub(flag, text)


def parse_tls(flags: Mapping[str, str | None], tls: bool, env: Mapping[str, str]) -> TlsConfig | None:
    """Collect the TLS settings from the flags, else their variables, and check the files they name.

    Args:
        flags: Each flag of :data:`TLS_FLAGS` to its value (None: not given).
        tls: Whether --tls was given.
        env: The environment (:data:`TLS_ENV` and the variables of :data:`TLS_FLAGS`).

    Returns:
        The settings (``TlsConfig()`` for --tls alone: the system's CAs), or
        None for plaintext (no flag and no variable set).

    Raises:
        CliError: a file is missing, unreadable or holds no PEM, --cert comes
            without --key (or the other way round), or $FENCEPOST_TLS is
            not a yes or no (exit 2, naming the flag or the variable).
    """
    settings: dict[str, str] = {}
    source: dict[str, str] = {}
    for flag, (field, var) in TLS_FLAGS.items():
        value = flags.get(flag)
        if value is not None:
            settings[field], source[field] = value, flag
        elif env.get(var):
            settings[field], source[field] = env[var], f"{flag} (from ${var})"
    switch = env.get(TLS_ENV, "").strip().lower()
    if switch not in _TRUE + _FALSE:
        raise CliError(f"invalid ${TLS_ENV}: {env[TLS_ENV]!r} is neither 1 nor 0 (true/false, yes/no)", EXIT_USAGE)
    if not settings and not tls and switch not in _TRUE:
        return None
    config = TlsConfig(**settings)
    try:
        security(config)
    except InvalidArgument as err:
        field = (err.field or "").removeprefix("tls.")
        where = source.get(field, _FLAG_OF_FIELD.get(field, err.field or "TLS"))
        problem = err.message.removeprefix(f"{err.field}: ")
        raise CliError(f"invalid {where}: {tls_words(problem)}", EXIT_USAGE) from None
    return config


def tls_of(args: argparse.Namespace) -> TlsConfig | None:
    """The TLS settings of a parsed command line (flags, else FENCEPOST_TLS, FENCEPOST_CA, ...), checked.

    Raises:
        CliError: a bad TLS file or setting (exit 2).
    """
    flags = {flag: getattr(args, flag.lstrip("-").replace("-", "_")) for flag in TLS_FLAGS}
    return parse_tls(flags, args.tls, os.environ)


def tls_env(tls: TlsConfig | None) -> dict[str, str]:
    """The variables that give a ``fencepost`` command these TLS settings (paths made absolute).

    Args:
        tls: What :func:`tls_of` returned.

    Returns:
        ``{}`` for plaintext; else :data:`TLS_ENV` set to ``1`` and one variable per setting.
    """
    if tls is None:
        return {}
    env = {TLS_ENV: "1"}
    for field, var in TLS_FLAGS.values():
        value = getattr(tls, field)
        if value is not None:
            env[var] = value if field == "server_name" else os.path.abspath(os.fspath(value))
    return env


def epilog(codes: dict[Any, str] | None = None, *notes: str) -> str:
    """The ``exit codes:`` block of a command's --help, then ``notes`` and where the address comes from."""
    lines = ["exit codes:"]
    lines += [f"  {code!s:<4} {text}" for code, text in (codes or EXIT_CODES).items()]
    lines += ["", *notes, *([""] if notes else [])]
    lines.append(f"The coordinator address comes from --address, else ${ADDRESS_ENV}, else {DEFAULT_ADDRESS}.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def lease_hex(lease_id: int) -> str:
    """A lease id as ``0x``-hex (etcd's usual spelling)."""
    return f"0x{lease_id:x}"


def err_text(err: BaseException) -> str:
    """The first line of an error's message (its class name when it has none), TLS settings in flags' words.

    Not only a TlsError names them: an Unavailable whose addresses failed
    for TLS and for other reasons carries the TLS cause too.
    """
    text = (getattr(err, "message", None) or str(err)).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return tls_words(line)


def _never_reached(err: FencepostError) -> bool:
    """True when the call never reached a coordinator (no reason, UNAVAILABLE or no status), or timed out."""
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    return err.reason is None and err.code in (None, grpc.StatusCode.UNAVAILABLE)


def call_error(err: FencepostError, addresses: Sequence[str], address: str, what: str) -> CliError:
    """Turn a failed ``status`` or ``release`` call into one line and an exit code.

    Args:
        err: What the client's transport raised.
        addresses: Every address tried (named when none could be reached).
        address: The address that answered.
        what: The RPC (``"Describe"``, ``"Release"``).

    Returns:
        The CliError to raise: exit 2 for INVALID_ARGUMENT, else exit 1.
    """
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED and err.reason is None:
        return CliError(f"{what}: no answer from the coordinator at {address} within {RPC_TIMEOUT_SECONDS:g} s "
                        f"(connected, or still connecting: it or its etcd may be overloaded)", EXIT_UNAVAILABLE)
    if _never_reached(err):
        return CliError(f"cannot reach the coordinator at {', '.join(addresses)}: {err_text(err)}", EXIT_UNAVAILABLE)
    if isinstance(err, InvalidArgument):
        return CliError(f"invalid {err.field or 'request'}: {err_text(err)}", EXIT_USAGE)
    if err.code == grpc.StatusCode.UNIMPLEMENTED and err.reason is None:
        return CliError(err_text(err), EXIT_UNAVAILABLE)  # names the address already: not a coordinator's port
    if err.reason == ETCD_UNAVAILABLE:
        return CliError(f"{what} failed: the coordinator at {address} answered, but its etcd did not: "
                        f"{err_text(err)}", EXIT_UNAVAILABLE)
    label = err.code.name if err.code is not None else "error"
    if err.reason:
        label += f"/{err.reason}"
    return CliError(f"{what} failed at {address}: {label}: {err_text(err)}", EXIT_UNAVAILABLE)


def acquire_error(err: Exception, name: str, timeout: float | None, addresses: Sequence[str]) -> CliError:
    """Map an error raised while acquiring or holding lock ``name`` to a CliError (``acquire`` and ``run``).

    Args:
        err: A FencepostError (a grpc.RpcError is read with ``from_rpc_error`` first).
        name: The lock name.
        timeout: The --timeout value, for the LockTimeout message.
        addresses: The coordinator addresses.

    Returns:
        The CliError to raise.
    """
    if isinstance(err, grpc.RpcError):
        err = from_rpc_error(err, name=name)
    if isinstance(err, InvalidArgument):
        return CliError(f"invalid {err.field or 'request'}: {err_text(err)}", EXIT_USAGE)
    if isinstance(err, LockTimeout):
        return CliError(f"timeout: {name} not granted within {timeout or 0:g} s", EXIT_TIMEOUT)
    if isinstance(err, LockHeld):
        lease = err.holder_lease_id
        who = f" by lease {lease_hex(lease)} ({lease}) with token {err.holder_token}" if lease else ""
        if not lease and "lock-delay" in str(err):  # free, but a lost holder's lock-delay runs (README, "Lock-delay")
            return CliError(f"held: {name} is free, but the lock-delay of a holder that was lost has not passed "
                            "yet", EXIT_HELD)
        return CliError(f"held: {name} is held{who}", EXIT_HELD)
    if isinstance(err, (LeaseLost, NotHolder, StaleTokenError)):
        return CliError(f"lost: {err.reason or type(err).__name__}: {err_text(err)}", EXIT_LOST, bare=True)
    if isinstance(err, Unavailable) and err.reason == ETCD_UNAVAILABLE:
        return CliError(f"the coordinator at {', '.join(addresses)} answered, but its etcd did not: "
                        f"{err_text(err)}", EXIT_UNAVAILABLE)
    if isinstance(err, Unavailable):
        return CliError(f"coordinator unavailable at {', '.join(addresses)}: {err_text(err)}", EXIT_UNAVAILABLE)
    reason = getattr(err, "reason", None)
    label = type(err).__name__ + (f"/{reason}" if reason else "")
    return CliError(f"{label}: {err_text(err)}", EXIT_UNAVAILABLE)


# ---------------------------------------------------------------------------
# One call
# ---------------------------------------------------------------------------


class CallFailed(Exception):
    """A :func:`call` failed.

    Attributes:
        error: What the client's transport raised.
        address: The address of the coordinator that answered (or was tried last).
    """

    def __init__(self, error: FencepostError, address: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.address = address


async def call(addresses: Sequence[str], method: str, request: Any, *, idempotent: bool,
               name: str | None = None, lease_id: int | None = None, token: int | None = None,
               tls: TlsConfig | None = None, secret: str | None = None) -> tuple[str, Any]:
    """Make one unary call through the client's transport (addresses in turn, its retry rule).

    Fails fast: an address whose connection attempt fails is skipped at once,
    and the call fails once every address was tried; the whole call, retries
    included, ends :data:`RPC_TIMEOUT_SECONDS` after it started.

    Args:
        addresses: The coordinator addresses.
        method: The LockService method (``"Describe"``, ``"Release"``).
        request: Its request message.
        idempotent: Whether an UNAVAILABLE answer may be retried (Describe yes, Release no).
        name: The lock name, for the error.
        lease_id: The lease id, for the error.
        token: The fencing token, for the error.
        tls: The TLS settings (from :func:`tls_of`); None for plaintext.
        secret: The secret of the lease the call names (``fencepost-lease-secret`` metadata); None for none.

    Returns:
        The address that answered and the response.

    Raises:
        CallFailed: the call failed (``.error`` is a FencepostError; a
            TlsError when every address failed its TLS handshake).
    """
    transport = Transport(addresses, connect_timeout=RPC_TIMEOUT_SECONDS, fail_fast=True, security=security(tls))
    transport.open()
    try:
        until = asyncio.get_running_loop().time() + RPC_TIMEOUT_SECONDS  # the whole call, retries included
        response = await transport.call(
            method, lambda left: (request, max(0.001, min(RPC_TIMEOUT_SECONDS, left or RPC_TIMEOUT_SECONDS))),
            until=until, idempotent=idempotent, name=name, lease_id=lease_id, token=token, secret=secret)
        return transport.address, response
    except FencepostError as err:
        raise CallFailed(err, transport.address) from err
    finally:
        await transport.close()
