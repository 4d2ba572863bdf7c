"""What the ``fencepost`` commands share: exit codes, environment variables, error lines, one call.

The flags and their variables are parsed in :mod:`.flags`. Every expected failure is a :class:`CliError`: one line on stderr and an
exit code from :data:`EXIT_CODES`. Failed calls are read once, by
:func:`fencepost.client.errors.from_rpc_error` (the client's transport does
it), and turned into that line here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import textwrap
from collections.abc import Awaitable, Sequence
from typing import Any, NoReturn

import grpc

from fencepost.client import DEFAULT_ADDRESS, AsyncLockClient, TlsConfig
from fencepost.client._transport.tls import security
from fencepost.client._transport.transport import Transport
from fencepost.client.errors import (
    FencepostError,
    InvalidArgument,
    LeaseLost,
    LockHeld,
    LockTimeout,
    NotHolder,
    OutcomeUnknown,
    StaleTokenError,
    Unavailable,
    from_rpc_error,
)

from . import progress
from .printable import shown_name

__all__ = [
    "ADDRESS_ENV", "CA_ENV", "CERT_ENV", "KEY_ENV", "TLS_ENV", "TLS_FLAGS", "TLS_SERVER_NAME_ENV", "FLAG_OF_FIELD",
    "DEFAULT_ADDRESS", "ETCD_UNAVAILABLE", "EXIT_CODES", "EXIT_HELD", "EXIT_INTERRUPTED", "EXIT_LOST", "EXIT_OK",
    "EXIT_OUTCOME_UNKNOWN", "EXIT_PRECONDITION", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "EXIT_USAGE", "MIN_CONNECT_SECONDS",
    "CONNECT_SECONDS",
    "RPC_TIMEOUT_SECONDS", "CallFailed", "CliError", "ConnectInterrupted", "Formatter", "Parser", "acquire_error",
    "call", "call_error", "connect_within", "epilog", "err_text", "lease_hex", "tls_words",
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

CONNECT_SECONDS = 10.0
"""How long ``acquire``, ``run`` and ``elect`` without ``--timeout`` try to connect (the client's default
``connect_timeout``)."""


class ConnectInterrupted(Exception):
    """The interrupt (a signal) came while :func:`connect_within` was connecting; the client is closed."""


async def connect_within(client: AsyncLockClient, timeout: float | None,
                         interrupt: Awaitable[object] | None = None) -> float | None:
    """Connect ``client`` within ``--timeout`` (at least :data:`MIN_CONNECT_SECONDS`), so that it bounds the wait.

    On a terminal, a connection that takes over a second is shown on stderr (:mod:`.progress`).

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
    limit = CONNECT_SECONDS if timeout is None else max(timeout, MIN_CONNECT_SECONDS)
    connecting = asyncio.ensure_future(
        client.connect() if timeout is None else client.connect(timeout=limit))
    if interrupt is not None:
        interrupted = asyncio.ensure_future(interrupt)
        try:
            async with progress.showing(progress.connecting(client, limit)):
                await asyncio.wait({connecting, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            interrupted.cancel()
        if interrupted.done() and not interrupted.cancelled():  # it came (first, or with the connection): it wins
            connecting.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await connecting
            await client.close()
            raise ConnectInterrupted
    async with progress.showing(progress.connecting(client, limit)):
        await connecting
    return None if timeout is None else max(0.0, timeout - (loop.time() - started))


EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2
EXIT_LOST = 3
EXIT_TIMEOUT = 4
EXIT_HELD = 5
EXIT_PRECONDITION = 6
EXIT_OUTCOME_UNKNOWN = 7
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (acquire: released after SIGINT/SIGTERM)",
    EXIT_UNAVAILABLE: "coordinator unreachable (a failed TLS handshake too) or not serving, or another server error",
    EXIT_USAGE: "bad input: a flag, a lock name, a TTL, a lease id, a token or a TLS file",
    EXIT_LOST: "acquire, run, elect: the lease or the lock (the leadership) was lost while holding it",
    EXIT_TIMEOUT: "acquire, run, elect: --timeout passed before the lock was granted (before leading)",
    EXIT_HELD: "acquire --try, run --try, elect --try: the lock is held by someone else (the election has a leader)",
    EXIT_PRECONDITION: "release: not released (NOT_HOLDER, STALE_TOKEN, LEASE_EXPIRED or NOT_LEASE_OWNER); "
                       "leader: the election has no leader",
    EXIT_OUTCOME_UNKNOWN: "release, admin revoke: sent, but no answer said whether it was applied "
                          "(OUTCOME_UNKNOWN; retried with its request id until the timeout): check with status",
    EXIT_INTERRUPTED: "acquire, run, elect: interrupted before the lock was granted",
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
# Parsers and their help (the flags: see .flags)
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


_TLS_WORDS = re.compile(r"\btls\.(ca|cert|key|server_name)\b|\(give tls\)")
#: Each :class:`~fencepost.client.TlsConfig` field to its flag (``"ca"`` -> ``"--ca"``).
FLAG_OF_FIELD = {field: flag for flag, (field, _env) in TLS_FLAGS.items()}


def tls_words(text: str) -> str:
    """``text`` (a TLS error of the library) with its setting names as flags: ``tls.ca`` becomes ``--ca``."""

    def flag(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "(give --tls, or --ca with the coordinator's CA)"
        return FLAG_OF_FIELD[match.group(1)]

    return _TLS_WORDS.sub(flag, text)


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
        The CliError to raise: exit 2 for INVALID_ARGUMENT, 7 for an unknown outcome, else exit 1.
    """
    if isinstance(err, OutcomeUnknown):
        return CliError(f"{what}: outcome unknown: the call reached the coordinator at {address} or may have, "
                        f"but no answer said whether it was applied (retried with request id {err.request_id}); "
                        f"check with `fencepost status`", EXIT_OUTCOME_UNKNOWN)
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
    name = shown_name(name)
    if isinstance(err, InvalidArgument):
        return CliError(f"invalid {err.field or 'request'}: {err_text(err)}", EXIT_USAGE)
    if isinstance(err, LockTimeout):
        return CliError(f"timeout: {name} not granted within {timeout or 0:g} s", EXIT_TIMEOUT)
    if isinstance(err, LockHeld):
        lease = err.holder_lease_id
        who = f" by lease {lease_hex(lease)} ({lease}) with token {err.holder_token}" if lease else ""
        if not lease and "lock-delay" in str(err):  # free, but a lost holder's lock-delay runs (docs/fencing.md, "Lock-delay")
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
