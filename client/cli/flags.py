"""The flags of the ``fencepost`` commands and their environment variables, parsed and checked.

Addresses (``--address``, :data:`~.common.ADDRESS_ENV`), TLS (``--tls``,
``--ca``, ``--cert``, ``--key``, ``--tls-server-name`` and their variables),
and the values a command takes (TTL, timeout, lock-delay, lease id, token,
lease secret, lock name): each checked by the client's own rules before any
call. A bad value is an argparse error, or a :class:`~.common.CliError`
with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence

from fencepost.client import DEFAULT_ADDRESS, TlsConfig
from fencepost.client._transport.tls import security
from fencepost.client._transport.wire import check_addresses, check_name, check_prefix
from fencepost.client.errors import InvalidArgument
from fencepost.client.v1.keys import MAX_LEASE_ID, MAX_LOCK_DELAY_SECONDS, MAX_TOKEN, MAX_TTL_SECONDS, MIN_TTL_SECONDS

from .common import (
    ADDRESS_ENV,
    CA_ENV,
    CERT_ENV,
    EXIT_USAGE,
    FLAG_OF_FIELD,
    KEY_ENV,
    TLS_ENV,
    TLS_FLAGS,
    TLS_SERVER_NAME_ENV,
    CliError,
    err_text,
    tls_words,
)

__all__ = [
    "READ_HELP",
    "address_flag",
    "addresses_of",
    "lease_secret",
    "lock_delay_flag",
    "lock_name",
    "name_prefix",
    "parse_address",
    "parse_addresses",
    "parse_lease_id",
    "parse_lock_delay",
    "parse_timeout",
    "parse_tls",
    "parse_token",
    "parse_ttl",
    "read_flag",
    "refuse_read_flags",
    "tls_env",
    "tls_flags",
    "tls_of",
]


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
                             "not released), the lock's next grant waits S seconds (docs/fencing.md, \"Lock-delay\"; "
                             "a mitigation for storage that cannot check tokens, not a replacement for fencing)")


#: The help of ``--read`` where it takes a read hold (``acquire``, ``run``).
READ_HELP = ("take a read hold (docs/rwlocks.md): shared with the other readers of NAME, excluded by any hold "
             "without --read (a writer); no --lock-delay")


def read_flag(parser: argparse.ArgumentParser, help: str) -> None:  # noqa: A002 (argparse's word)
    """Add ``--read`` (a read hold of a read-write lock; ``args.read``, False by default) to ``parser``."""
    parser.add_argument("--read", action="store_true", help=help)


def refuse_read_flags(args: argparse.Namespace) -> None:
    """Refuse what a read hold does not take (exit 2, naming the flag): ``--lock-delay``, ``--permits``.

    Args:
        args: The parsed command line: ``read``, ``lock_delay``, and ``permits`` where the command has it.

    Raises:
        CliError: ``--read`` with a lock-delay other than 0, or with ``--permits`` (exit 2).
    """
    if not args.read:
        return
    if args.lock_delay:
        raise CliError("--read takes no --lock-delay: a reader has no lock-delay (docs/rwlocks.md); it waits "
                       "out a lost writer's", EXIT_USAGE)
    if getattr(args, "permits", None) is not None:
        raise CliError("--read applies to locks, not to semaphores (--permits)", EXIT_USAGE)


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


def name_prefix(prefix: str) -> str:
    """Check a PREFIX argument (``fencepost locks``) as the client does: a name's rules, but it may be empty.

    Returns:
        ``prefix`` unchanged.

    Raises:
        CliError: not a valid name prefix (exit 2).
    """
    try:
        return check_prefix(prefix)
    except InvalidArgument as err:
        raise CliError(f"invalid prefix: {err_text(err)}", EXIT_USAGE) from None


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
        where = source.get(field, FLAG_OF_FIELD.get(field, err.field or "TLS"))
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
