"""``fencepost status [NAME [--semaphore | --election]] [--json]``: one lock's holder and waiters, a
semaphore's permits, an election's leader, or each coordinator's state.

With NAME: one Describe call through the client's transport (the addresses
in turn), printed as text or one JSON object (:mod:`.holders`: a read hold's
readers each shown); with ``--semaphore`` one
DescribeSemaphore (its permits, each slot's holder with lease and token, its
waiters; read as :class:`~fencepost.client.SemaphoreInfo`), with
``--election`` one Leader call, printed as ``fencepost leader`` prints it.
A free lock, a semaphore never used and an election without a leader are
described (exit 0), as a held one is. Without NAME: each address is
probed on its own with the grpc.health.v1 service (a Describe when the
health service is missing or does not know LockService), since the point is
to report every coordinator, not to fail over between them; a coordinator
that answers is then asked for its ServerInfo (version, uptime, addresses,
etcd, counts), printed under its health line. A coordinator without
ServerInfo (older, UNIMPLEMENTED) is reported by its health alone; one
whose ServerInfo fails or is refused (it needs the ``admin`` action of the
access policy) by its health and a ``details`` line (``info_error`` in
JSON) saying which details are missing and why. The exit code follows the
health alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass
import sys
from typing import Any

import grpc

from fencepost.client import SemaphoreInfo, ServerInfo, TlsConfig
from fencepost.client._transport import handshake
from fencepost.client._transport.tls import Security, security
from fencepost.client._transport.connection import DIAGNOSE_SECONDS
from fencepost.client.v1 import details
from fencepost.client.v1 import lock_pb2 as pb
from fencepost.client.v1 import lock_pb2_grpc as pb_grpc

from . import holders, leader
from .common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    RPC_TIMEOUT_SECONDS,
    CallFailed,
    CliError,
    Formatter,
    call,
    call_error,
    epilog,
    lease_hex,
    tls_words,
)
from .flags import address_flag, addresses_of, lock_name, tls_flags, tls_of
from .printable import shown_name

__all__ = ["HEALTH_SERVICE", "PROBE_NAME", "add_parser", "execute"]

HEALTH_SERVICE = "fencepost.v1.LockService"
"""The service name whose health ``status`` asks for."""
PROBE_NAME = "fencepost-cli-health-probe"
"""The lock name ``status`` describes when no health service answers."""


def add_parser(sub: Any) -> None:
    """Add the ``status`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "status", formatter_class=Formatter, epilog=epilog(),
        help="show a lock's holder, token and waiters (a semaphore's permits, an election's leader), or each "
             "coordinator's health and state",
        description="With NAME: the holder's lease id, fencing token, TTL left and waiters "
                    "of that lock; with --semaphore, the semaphore's number of permits, each slot's holder (lease "
                    "id and fencing token) and its waiters; with --election, the election's leader (value, lease "
                    "id, fencing token), as `fencepost leader NAME` shows it. A free lock, a semaphore never used "
                    "and an election without a leader exit 0 too. Without NAME: whether each coordinator serves, "
                    "with its version, "
                    "uptime, addresses, key prefix, etcd (endpoints, version, ids, revision, raft leader "
                    "and term) and counts (its own streams, leases, watched holds and waiting acquires; "
                    "the held locks and waiters of the whole cluster).")
    address_flag(p)
    tls_flags(p)
    p.add_argument("name", nargs="?", metavar="NAME", help="lock name (a semaphore's, an election's)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--semaphore", action="store_true",
                      help="NAME is a semaphore: its permits, each slot's holder, its waiters")
    kind.add_argument("--election", action="store_true", help="NAME is an election: its leader")
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
        if args.semaphore or args.election:
            raise CliError(f"--{'semaphore' if args.semaphore else 'election'} needs a NAME", EXIT_USAGE)
        return _health(addresses, args.json, tls)
    name = lock_name(args.name)
    if args.semaphore:
        return _semaphore(addresses, name, args.json, tls)
    if args.election:
        return _election(addresses, name, args.json, tls)
    return holders.show(addresses, name, args.json, tls)


# ---------------------------------------------------------------------------
# One semaphore, one election
# ---------------------------------------------------------------------------


def semaphore_json(info: SemaphoreInfo, address: str) -> dict[str, Any]:
    """The JSON object of ``status NAME --semaphore --json``: ``permits`` 0 for a semaphore never used."""
    return {
        "name": info.name,
        "address": address,
        "kind": "semaphore",
        "permits": info.permits,
        "held": len(info.holders),
        "holders": [{"slot": h.slot, "lease_id": h.lease_id, "lease_id_hex": lease_hex(h.lease_id),
                     "token": h.token} for h in info.holders],
        "waiter_count": info.waiter_count,
        "revision": info.revision,
    }


def semaphore_lines(info: SemaphoreInfo) -> list[str]:
    """The text of ``status NAME --semaphore``: one line per permit slot, then the waiters and the revision."""
    if not info.permits:
        return [f"{shown_name(info.name)}: semaphore never used (no permits record)", f"  revision       {info.revision}"]
    permits = f"{info.permits} permit{'' if info.permits == 1 else 's'}"
    lines = [f"{shown_name(info.name)}: semaphore of {permits}, {len(info.holders)} held"]
    by_slot = {h.slot: h for h in info.holders}
    width = len(str(info.permits - 1))
    for slot in range(info.permits):
        h = by_slot.get(slot)
        shown = "free" if h is None else f"lease {lease_hex(h.lease_id)} ({h.lease_id}), fencing token {h.token}"
        lines.append(f"  slot {slot:<{width}}  {shown}")
    lines.append(f"  waiters        {info.waiter_count}")
    lines.append(f"  revision       {info.revision}")
    return lines


def _semaphore(addresses: list[str], name: str, as_json: bool, tls: TlsConfig | None) -> int:
    try:
        address, resp = asyncio.run(call(addresses, "DescribeSemaphore", pb.DescribeSemaphoreRequest(name=name),
                                         idempotent=True, name=name, tls=tls))
    except CallFailed as failed:
        raise call_error(failed.error, addresses, failed.address, "DescribeSemaphore") from None
    info = SemaphoreInfo.from_response(name, resp)
    print(json.dumps(semaphore_json(info, address)) if as_json else "\n".join(semaphore_lines(info)), flush=True)
    return EXIT_OK


def _election(addresses: list[str], name: str, as_json: bool, tls: TlsConfig | None) -> int:
    _, info = leader.fetch(addresses, name, tls)
    print(leader.line(name, info, as_json), flush=True)
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
            failure = asyncio.run(handshake.failure(channels, status.message, address, DIAGNOSE_SECONDS))
            if failure is not None:
                return "UNREACHABLE", tls_words(failure.message)
        return "UNREACHABLE", _first_line(status)
    return (status.code or grpc.StatusCode.UNKNOWN).name, _first_line(status)


@dataclass(frozen=True)
class _Probed:
    """What ``status`` learnt of one address."""

    address: str
    status: str  # SERVING, NOT_SERVING, UNREACHABLE or a status code name
    detail: str
    info: ServerInfo | None  # None: no coordinator answered, or it has no ServerInfo
    info_error: str = ""  # why a coordinator that answered gave no ServerInfo ("" when it did, or none answered)


#: What ServerInfo tells, named when it is refused.
DETAILS = "version, uptime, addresses, etcd and counts"


def _probe(address: str, channels: Security) -> _Probed:
    """Ask one coordinator whether it serves and, when it answers, for its ServerInfo."""
    with channels.sync_channel(address) as channel:
        status, detail = _health_of(channel, address, channels)
        info, error = _server_info(channel) if status in ("SERVING", "NOT_SERVING") else (None, "")
    return _Probed(address, status, detail, info, error)


def _server_info(channel: grpc.Channel) -> tuple[ServerInfo | None, str]:
    """The coordinator's ServerInfo, or None and why not (health says enough about serving).

    Returns:
        ``(info, "")``; ``(None, "")`` from an older coordinator without ServerInfo (UNIMPLEMENTED);
        or ``(None, why)``: the policy refused it (ServerInfo needs the ``admin`` action:
        PERMISSION_DENIED/ACCESS_DENIED and the coordinator's words), or the call failed.
    """
    try:
        resp = pb_grpc.LockServiceStub(channel).ServerInfo(pb.ServerInfoRequest(), timeout=RPC_TIMEOUT_SECONDS)
    except grpc.RpcError as err:
        status = details.parse(err)
        if status.code == grpc.StatusCode.UNIMPLEMENTED:
            return None, ""  # an older coordinator: its health line is all it has to say
        label = (status.code or grpc.StatusCode.UNKNOWN).name + (f"/{status.reason}" if status.reason else "")
        why = f"{label}: {_first_line(status)}" if _first_line(status) else label
        if status.code == grpc.StatusCode.PERMISSION_DENIED:
            return None, f"{DETAILS} refused: {why} (ServerInfo needs the admin action in the access policy)"
        return None, f"{DETAILS} unknown: ServerInfo failed: {why}"
    return ServerInfo.from_response(resp), ""


def _health_of(channel: grpc.Channel, address: str, channels: Security) -> tuple[str, str]:
    """Ask one coordinator whether it serves.

    Returns:
        ``(status, detail)``; status is SERVING, NOT_SERVING, UNREACHABLE or a status code name.
    """
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
    results = [_probe(a, channels) for a in addresses]
    serving = all(r.status == "SERVING" for r in results)
    if as_json:
        print(json.dumps({
            "serving": serving,
            "coordinators": [{"address": r.address, "status": r.status, **({"detail": r.detail} if r.detail else {}),
                              "info": info_json(r.info) if r.info is not None else None,
                              **({"info_error": r.info_error} if r.info_error else {})} for r in results],
        }))
    else:
        for r in results:
            line = f"coordinator {r.address}: {r.status}"
            print(line + (f" ({r.detail})" if r.detail and r.status != "SERVING" else ""))
            if r.info is not None:
                for label, text in info_lines(r.info):
                    print(f"  {label:<15} {text}")
            elif r.info_error:
                print(f"  {'details':<15} {r.info_error}")
    if not serving:
        bad = [r.address for r in results if r.status != "SERVING"]
        print(f"fencepost status: not serving: {', '.join(bad)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


# ---------------------------------------------------------------------------
# ServerInfo, as text and JSON
# ---------------------------------------------------------------------------


def _etcd_id(value: int | None) -> str | None:
    """An etcd cluster or member id in hex, as etcdctl prints it (a string: ids exceed JSON's exact integers)."""
    return None if value is None else f"{value:x}"


def info_json(info: ServerInfo) -> dict[str, Any]:
    """The ``info`` object of one coordinator in ``status --json``.

    Counts under ``coordinator`` are that replica's own; those under
    ``cluster`` are read from etcd (null when etcd did not answer, or, for
    ``held_locks`` and ``waiters``, past 1000 lock keys). etcd ids are hex strings.
    """
    e = info.etcd
    return {
        "version": info.version,
        "instance_id": info.instance_id,
        "uptime_seconds": round(info.uptime, 3),
        "listen_address": info.listen_address,
        "health_address": info.health_address,
        "metrics_address": info.metrics_address,
        "http_address": info.http_address,
        "key_prefix": info.key_prefix,
        "serving": info.serving,
        "etcd": {
            "endpoints": list(e.endpoints),
            "embedded": e.embedded,
            "available": e.available,
            "error": e.error,
            "server_version": e.server_version,
            "cluster_id": _etcd_id(e.cluster_id),
            "member_id": _etcd_id(e.member_id),
            "leader": _etcd_id(e.leader),
            "raft_term": e.raft_term,
            "raft_index": e.raft_index,
            "revision": e.revision,
            "db_size_bytes": e.db_size,
        },
        "coordinator": {
            "keepalive_streams": info.keepalive_streams,
            "keepalive_leases": info.keepalive_leases,
            "watched_holds": info.watched_holds,
            "waiting_acquires": info.waiting_acquires,
        },
        "cluster": {
            "contender_keys": info.contender_keys,
            "held_locks": info.held_locks,
            "waiters": info.waiters,
        },
    }


def _duration(seconds: float) -> str:
    """``3h07m12s``, ``4m05s``, ``12.3s``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s"


def _size(size: int) -> str:
    """``812 B``, ``20.0 KiB``, ``1.5 MiB``."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _many(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def info_lines(info: ServerInfo) -> list[tuple[str, str]]:
    """The text block of one coordinator's ServerInfo, as (label, text) lines."""
    e = info.etcd
    extra = [f"health {info.health_address}"] if info.health_address else []
    extra += [f"metrics http://{info.metrics_address}/metrics"] if info.metrics_address else []
    extra += [f"HTTP API and lock board {info.http_address}"] if info.http_address else []
    lines = [
        ("version", f"{info.version}, instance {info.instance_id}, up {_duration(info.uptime)}"),
        ("listening", info.listen_address + (f" ({', '.join(extra)})" if extra else "")),
        ("key prefix", info.key_prefix),
        ("etcd", ", ".join(e.endpoints) + (" (embedded)" if e.embedded else "")),
    ]
    if e.available:
        server = [e.server_version or "version unknown", f"cluster {_etcd_id(e.cluster_id)}",
                  f"member {_etcd_id(e.member_id)}"]
        if e.leader is not None:
            server.append(f"leader {_etcd_id(e.leader)}")
        raft = f"raft term {e.raft_term}" + (f", index {e.raft_index}" if e.raft_index is not None else "")
        lines.append(("etcd server", f"{', '.join(server)}; {raft}"))
        size = f", database {_size(e.db_size)}" if e.db_size is not None else ""
        lines.append(("etcd revision", f"{e.revision}{size}"))
        if e.error:
            lines.append(("etcd note", e.error))
    else:
        lines.append(("etcd state", f"unavailable: {e.error or 'no answer'}"))
    lines.append(("this replica", f"{_many(info.keepalive_streams, 'KeepAlive stream')}, "
                                  f"{_many(info.keepalive_leases, 'lease')} kept alive, "
                                  f"{_many(info.watched_holds, 'watched hold')}, "
                                  f"{_many(info.waiting_acquires, 'waiting acquire')}"))
    if info.contender_keys is None:
        lines.append(("cluster-wide", "unknown (etcd unavailable)"))
    elif info.held_locks is None or info.waiters is None:
        lines.append(("cluster-wide", f"{_many(info.contender_keys, 'lock key')} (holders and waiters; "
                                      f"too many to tell apart)"))
    else:
        lines.append(("cluster-wide", f"{_many(info.held_locks, 'held lock')}, {_many(info.waiters, 'waiter')}"))
    return lines
