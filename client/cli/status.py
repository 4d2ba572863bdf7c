"""``fencepost status [NAME] [--json]``: one lock's holder and waiters, or whether the coordinators serve.

With NAME: one Describe call through the client's transport (the addresses
in turn), printed as text or one JSON object. Without NAME: each address is
probed on its own with the grpc.health.v1 service (a Describe when the
health service is missing or does not know LockService), since the point is
to report every coordinator, not to fail over between them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import grpc

from fencepost.client import TlsConfig, _handshake
from fencepost.client._tls import Security, security
from fencepost.client._transport import DIAGNOSE_SECONDS
from fencepost.client.v1 import details
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1 import lock_pb2_grpc as pb_grpc

from .common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    RPC_TIMEOUT_SECONDS,
    CallFailed,
    Formatter,
    address_flag,
    addresses_of,
    call,
    call_error,
    epilog,
    lease_hex,
    lock_name,
    tls_flags,
    tls_of,
    tls_words,
)

__all__ = ["HEALTH_SERVICE", "PROBE_NAME", "add_parser", "execute"]

HEALTH_SERVICE = "fencepost.v1.LockService"
"""The service name whose health ``status`` asks for."""
PROBE_NAME = "fencepost-cli-health-probe"
"""The lock name ``status`` describes when no health service answers."""


def add_parser(sub: Any) -> None:
    """Add the ``status`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "status", formatter_class=Formatter, epilog=epilog(),
        help="show a lock's holder, token and waiters, or whether the coordinator serves",
        description="With NAME: the holder's lease id, fencing token, TTL left and waiters "
                    "of that lock. Without NAME: whether each coordinator serves.")
    address_flag(p)
    tls_flags(p)
    p.add_argument("name", nargs="?", metavar="NAME", help="lock name")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost status [NAME] [--json]``.

    Returns:
        0 when the lock was described or every coordinator serves, 1 otherwise.

    Raises:
        CliError: bad input (exit 2) or no coordinator answered (exit 1).
    """
    addresses = addresses_of(args)
    tls = tls_of(args)
    if args.name is None:
        return _health(addresses, args.json, tls)
    return _describe(addresses, lock_name(args.name), args.json, tls)


# ---------------------------------------------------------------------------
# One lock
# ---------------------------------------------------------------------------


def _describe(addresses: list[str], name: str, as_json: bool, tls: TlsConfig | None) -> int:
    try:
        address, resp = asyncio.run(call(addresses, "Describe", pb.DescribeRequest(name=name), idempotent=True,
                                         name=name, tls=tls))
    except CallFailed as failed:
        raise call_error(failed.error, addresses, failed.address, "Describe") from None
    waiters = [{"lease_id": w.lease_id, "lease_id_hex": lease_hex(w.lease_id), "revision": w.token}
               for w in resp.waiters]
    if as_json:
        obj: dict[str, Any] = {
            "name": name,
            "address": address,
            "held": resp.held,
            "holder": ({"lease_id": resp.holder.lease_id,
                        "lease_id_hex": lease_hex(resp.holder.lease_id),
                        "token": resp.holder.token} if resp.held else None),
            "token": resp.holder.token if resp.held else None,
            "ttl_remaining_seconds": resp.ttl_remaining_seconds,
            "ttl_seconds": resp.ttl_seconds,
            "waiter_count": resp.waiter_count,
            "waiters": waiters,
            "revision": resp.revision,
        }
        print(json.dumps(obj))
        return EXIT_OK
    if resp.held:
        lease = resp.holder.lease_id
        print(f"{name}: held")
        print(f"  holder lease   {lease_hex(lease)} ({lease})")
        print(f"  fencing token  {resp.holder.token}")
        print(f"  TTL left       {resp.ttl_remaining_seconds} s of {resp.ttl_seconds} s")
    else:
        print(f"{name}: not held")
    print(f"  waiters        {resp.waiter_count}")
    for i, w in enumerate(waiters[:10], 1):
        print(f"    {i}. lease {w['lease_id_hex']} ({w['lease_id']}), queued at revision {w['revision']}")
    if resp.waiter_count > 10:
        print(f"    ... and {resp.waiter_count - 10} more")
    print(f"  revision       {resp.revision}")
    return EXIT_OK


# ---------------------------------------------------------------------------
# Each coordinator's health
# ---------------------------------------------------------------------------


def _first_line(status: details.StatusDetails) -> str:
    return status.message.strip().splitlines()[0] if status.message.strip() else ""


def _unreachable(status: details.StatusDetails) -> bool:
    """The call never reached a coordinator (UNAVAILABLE without a reason), or ran out of time."""
    if status.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    return status.code == grpc.StatusCode.UNAVAILABLE and status.reason is None


def _failure(status: details.StatusDetails, address: str, channels: Security) -> tuple[str, str]:
    if _unreachable(status):
        if status.code == grpc.StatusCode.UNAVAILABLE:
            # A failed TLS handshake, named (the details alone, or one handshake of our own).
            failure = asyncio.run(_handshake.failure(channels, status.message, address, DIAGNOSE_SECONDS))
            if failure is not None:
                return "UNREACHABLE", tls_words(failure.message)
        return "UNREACHABLE", _first_line(status)
    return (status.code or grpc.StatusCode.UNKNOWN).name, _first_line(status)


def _probe(address: str, channels: Security) -> tuple[str, str]:
    """Ask one coordinator whether it serves.

    Returns:
        ``(status, detail)``; status is SERVING, NOT_SERVING, UNREACHABLE or a status code name.
    """
    with channels.sync_channel(address) as channel:
        try:
            from grpc_health.v1 import health_pb2, health_pb2_grpc
        except ImportError:
            return _probe_by_describe(channel, address, channels)
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=HEALTH_SERVICE), timeout=RPC_TIMEOUT_SECONDS)
        except grpc.RpcError as err:
            status = details.parse(err)
            # No health service, or one that does not know LockService (another gRPC
            # server, an etcd say): only a LockService call can tell whether it serves.
            if status.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
                return _probe_by_describe(channel, address, channels)
            return _failure(status, address, channels)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status), ""


def _probe_by_describe(channel: grpc.Channel, address: str, channels: Security) -> tuple[str, str]:
    """A Describe that succeeds means the coordinator serves."""
    stub = pb_grpc.LockServiceStub(channel)
    try:
        stub.Describe(pb.DescribeRequest(name=PROBE_NAME), timeout=RPC_TIMEOUT_SECONDS)
    except grpc.RpcError as err:
        status = details.parse(err)
        if not _unreachable(status) and status.code == grpc.StatusCode.UNAVAILABLE:
            return "NOT_SERVING", status.reason or _first_line(status)
        return _failure(status, address, channels)
    return "SERVING", ""


def _health(addresses: list[str], as_json: bool, tls: TlsConfig | None) -> int:
    channels = security(tls)
    results = [(a, *_probe(a, channels)) for a in addresses]
    serving = all(status == "SERVING" for _, status, _ in results)
    if as_json:
        print(json.dumps({
            "serving": serving,
            "coordinators": [{"address": a, "status": s, **({"detail": d} if d else {})} for a, s, d in results],
        }))
    else:
        for address, status, detail in results:
            line = f"coordinator {address}: {status}"
            print(line + (f" ({detail})" if detail and status != "SERVING" else ""))
    if not serving:
        bad = [a for a, s, _ in results if s != "SERVING"]
        print(f"fencepost status: not serving: {', '.join(bad)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK
