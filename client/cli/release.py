"""``fencepost release NAME --lease-id ID --token T [--lease-secret S]``: release one grant by hand.

The lease belongs to whoever granted it: pass its secret (``--lease-secret``,
or ``FENCEPOST_LEASE_SECRET``, as ``fencepost acquire`` prints it and
``fencepost run`` sets it), or connect with the client certificate that
granted it; anyone else is refused (PERMISSION_DENIED, exit 6).

One Release call through the client's transport, with a request id that is
the same on each retry: a retry after a lost answer (on the next address)
answers OK when the first attempt released (as the library's own release
does). A refusal (NOT_HOLDER, STALE_TOKEN, LEASE_EXPIRED) exits 6 naming
the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import grpc

from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client._transport.wire import new_request_id

from .run import ENV_LEASE_SECRET
from .common import (
    EXIT_OK,
    EXIT_PRECONDITION,
    CallFailed,
    CliError,
    Formatter,
    call,
    call_error,
    epilog,
    err_text,
    lease_hex,
)
from .flags import address_flag, addresses_of, lease_secret, lock_name, parse_lease_id, parse_token, tls_flags, tls_of
from .printable import shown_name

__all__ = ["add_parser", "execute"]


def add_parser(sub: Any) -> None:
    """Add the ``release`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "release", formatter_class=Formatter, epilog=epilog(),
        help="release a grant by lease id and fencing token",
        description="Release the lock NAME held by lease ID under fencing token T.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("name", metavar="NAME", help="lock name")
    p.add_argument("--lease-id", required=True, type=parse_lease_id, metavar="ID",
                   help="holder's lease id, decimal or 0x-hex")
    p.add_argument("--token", required=True, type=parse_token, metavar="T", help="fencing token of the grant")
    p.add_argument("--lease-secret", default=os.environ.get(ENV_LEASE_SECRET) or None, metavar="SECRET",
                   help="the lease's secret (printed by `fencepost acquire`, FENCEPOST_LEASE_SECRET under "
                        "`fencepost run`; default: $FENCEPOST_LEASE_SECRET); not needed when your client "
                        "certificate's identity granted the lease")


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost release NAME --lease-id ID --token T``; prints ``released``.

    Returns:
        0 once released.

    Raises:
        CliError: not released (exit 6), bad input (exit 2), or no coordinator (exit 1).
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    lock_name(args.name)
    secret = lease_secret(args.lease_secret)
    request = pb.ReleaseRequest(name=args.name, lease_id=args.lease_id, token=args.token,
                                request_id=new_request_id())
    try:
        asyncio.run(call(addresses, "Release", request, idempotent=True, name=args.name,
                         lease_id=args.lease_id, token=args.token, tls=tls, secret=secret))
    except CallFailed as failed:
        err = failed.error
        if err.code == grpc.StatusCode.PERMISSION_DENIED:
            raise CliError(
                f"not released: {err.reason or 'PERMISSION_DENIED'}: lease {lease_hex(args.lease_id)} "
                f"({args.lease_id}) is not yours: pass its secret with --lease-secret or FENCEPOST_LEASE_SECRET "
                f"(`fencepost acquire` prints it), or use the client certificate that granted it",
                EXIT_PRECONDITION) from None
        if err.code == grpc.StatusCode.FAILED_PRECONDITION:
            text = err_text(err)
            raise CliError(
                f"not released: {err.reason or 'FAILED_PRECONDITION'}: {shown_name(args.name)} "
                f"lease {lease_hex(args.lease_id)} ({args.lease_id}) token {args.token}"
                + (f": {text}" if text else ""),
                EXIT_PRECONDITION) from None
        raise call_error(err, addresses, failed.address, "Release") from None
    print("released")
    return EXIT_OK
