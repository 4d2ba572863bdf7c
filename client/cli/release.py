"""``fencepost release NAME... --lease-id ID --token T [--lease-secret S] [--read]``: release one grant by hand.

The lease belongs to whoever granted it: pass its secret (``--lease-secret``,
or ``FENCEPOST_LEASE_SECRET``, as ``fencepost acquire`` prints it and
``fencepost run`` sets it), or connect with the client certificate that
granted it; anyone else is refused (PERMISSION_DENIED, exit 6).

One Release call through the client's transport, with a request id that is
the same on each retry: a retry after a lost answer (on the next address)
answers OK when the first attempt released (as the library's own release
does). A refusal (NOT_HOLDER, STALE_TOKEN, LEASE_EXPIRED) exits 6 naming
the reason.

``--read`` releases a read hold (``fencepost acquire --read``; a read hold
released without it, or a write hold with it, is NOT_HOLDER). Several names
release a multi-lock's grant (``fencepost acquire A B``): one ReleaseAll,
every name or none, with the token they share.
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
    EXIT_USAGE,
    CallFailed,
    CliError,
    Formatter,
    call,
    call_error,
    epilog,
    err_text,
    lease_hex,
)
from .flags import address_flag, addresses_of, lease_secret, parse_lease_id, parse_token, read_flag, tls_flags, tls_of
from .multilock import lock_names, shown_names

__all__ = ["add_parser", "execute"]


def add_parser(sub: Any) -> None:
    """Add the ``release`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "release", formatter_class=Formatter, epilog=epilog(),
        help="release a grant by lease id and fencing token",
        description="Release the lock NAME held by lease ID under fencing token T; several names: the "
                    "multi-lock that holds them all (every name or none).")
    address_flag(p)
    tls_flags(p)
    p.add_argument("names", nargs="+", metavar="NAME", help="lock name; several: a multi-lock's names")
    p.add_argument("--lease-id", required=True, type=parse_lease_id, metavar="ID",
                   help="holder's lease id, decimal or 0x-hex")
    p.add_argument("--token", required=True, type=parse_token, metavar="T", help="fencing token of the grant")
    p.add_argument("--lease-secret", default=os.environ.get(ENV_LEASE_SECRET) or None, metavar="SECRET",
                   help="the lease's secret (printed by `fencepost acquire`, FENCEPOST_LEASE_SECRET under "
                        "`fencepost run`; default: $FENCEPOST_LEASE_SECRET); not needed when your client "
                        "certificate's identity granted the lease")
    read_flag(p, "the grant is a read hold (fencepost acquire --read; FENCEPOST_LOCK_MODE=read under fencepost run "
                 "--read)")


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost release NAME... --lease-id ID --token T [--read]``; prints ``released``.

    Returns:
        0 once released.

    Raises:
        CliError: not released (exit 6), bad input (exit 2), or no coordinator (exit 1).
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    names = lock_names(args.names)
    if args.read and len(names) > 1:
        raise CliError("--read takes one NAME: a multi-lock (several names) is held for writing only", EXIT_USAGE)
    secret = lease_secret(args.lease_secret)
    method, request = ("ReleaseAll", pb.ReleaseAllRequest(names=names, lease_id=args.lease_id, token=args.token,
                                                          request_id=new_request_id())) if len(names) > 1 else (
        "Release", pb.ReleaseRequest(name=names[0], lease_id=args.lease_id, token=args.token,
                                     request_id=new_request_id(), mode=pb.LOCK_MODE_READ if args.read else pb.LOCK_MODE_WRITE))
    try:
        asyncio.run(call(addresses, method, request, idempotent=True, name=names[0],
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
                f"not released: {err.reason or 'FAILED_PRECONDITION'}: {shown_names(names)} "
                f"lease {lease_hex(args.lease_id)} ({args.lease_id}) token {args.token}"
                + (f": {text}" if text else ""),
                EXIT_PRECONDITION) from None
        raise call_error(err, addresses, failed.address, method) from None
    print("released")
    return EXIT_OK
