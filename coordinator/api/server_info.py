"""What a coordinator reports about itself and its etcd: the ServerInfo RPC (``fencepost status``).

:class:`About` holds the facts of one coordinator that do not come from
etcd (version, instance id, start time, addresses, prefix, endpoints,
readiness); the :class:`~..process.coordinator.Coordinator` fills it in as it
starts and stops. :func:`read_etcd` asks etcd, in parallel, for one keys-only Range of
the lock prefix (its header: revision, cluster and member ids, raft term;
its count: every lock key; its first :data:`SCAN_KEYS` keys: the held locks
and waiters) and for the answering member's Maintenance.Status (server
version, raft leader and index, database size). Neither failing is an
error: the answer says what is missing and why. Both end at the caller's
deadline (:mod:`..etcd.deadline`); the servicer bounds them by
:data:`ETCD_SECONDS` besides. :func:`server_info` is the answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import re
import secrets
import time
from collections.abc import Sequence
from typing import Any
from dataclasses import dataclass, field

from fencepost.client.errors import FencepostError
from fencepost.client.v1 import etcdops, lock_pb2
from fencepost.client.v1.keys import Keys

from ..etcd import EtcdClient
from ..recipes.listing import first_lock_key
from ..recipes.snapshots import Holder, holding

__all__ = ["ETCD_SECONDS", "SCAN_KEYS", "About", "EtcdView", "package_version", "read_etcd", "redact_endpoint",
           "server_info"]

#: Most lock keys read to count held locks and waiters; past it they are -1 (only the total is counted).
SCAN_KEYS = 1000
#: Longest time ServerInfo waits for etcd when the caller set no shorter deadline, in seconds.
ETCD_SECONDS = 2.0

_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?[^/@]*@")


def package_version() -> str:
    """The installed fencepost package's version (importlib.metadata); ``"unknown"`` when not installed."""
    try:
        return importlib.metadata.version("fencepost")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def redact_endpoint(endpoint: str) -> str:
    """``endpoint`` without a ``user:password@`` (or ``user@``) part: ``https://u:p@etcd1:2379`` -> ``https://etcd1:2379``.

    The coordinator refuses such endpoints (credentials go in ``--etcd-user``),
    but what it reports must never carry credentials, whatever it was given.
    """
    return _USERINFO.sub(lambda m: m.group("scheme") or "", endpoint.strip(), count=1)


@dataclass
class About:
    """The facts of one coordinator that do not come from etcd.

    Attributes:
        prefix: The etcd key prefix of its locks.
        endpoints: The etcd endpoints as configured (redacted here).
        embedded: Whether it runs its own etcd.
        version: The fencepost package version.
        instance_id: Random hex, new for each coordinator made.
        started: ``time.monotonic()`` when it started serving; None before.
        listen_address: Where it serves LockService (after ``start()``).
        health_address: Its health-only listener; "" for none.
        metrics_address: Its /metrics endpoint, ``HOST:PORT``; "" for none.
        http_address: Its HTTP/JSON API and lock board (``--http-listen``), ``HOST:PORT`` or
            ``unix:/ABSOLUTE/PATH``; "" for none.
        serving: Its readiness (the health status of "" and LockService).
    """

    prefix: str
    endpoints: Sequence[str]
    embedded: bool = False
    version: str = field(default_factory=package_version)
    instance_id: str = field(default_factory=lambda: secrets.token_hex(8))
    started: float | None = None
    listen_address: str = ""
    health_address: str = ""
    metrics_address: str = ""
    http_address: str = ""
    serving: bool = False

    def __post_init__(self) -> None:
        self.endpoints = [redact_endpoint(e) for e in self.endpoints]

    @property
    def uptime_seconds(self) -> float:
        """Seconds since it started serving (monotonic clock); 0.0 before."""
        return 0.0 if self.started is None else max(0.0, time.monotonic() - self.started)


@dataclass(frozen=True)
class EtcdView:
    """What etcd said to one ServerInfo call.

    Attributes:
        available: Whether the Range of the lock prefix was answered.
        error: Why the Range, or else the Status call, failed; "" when both answered.
        server_version: The answering member's etcd version; "" when Status failed.
        cluster_id: The etcd cluster id.
        member_id: The answering member's id.
        revision: The etcd revision the Range was served at.
        raft_term: The answering member's raft term.
        leader: The raft leader's member id; 0 when unknown.
        raft_index: The answering member's raft index; 0 when Status failed.
        db_size_bytes: The answering member's database size in bytes; 0 when Status failed.
        contender_keys: Lock keys under the prefix (holders and waiters); -1 when unavailable.
        held_locks: Held locks; -1 when unavailable or more than :data:`SCAN_KEYS` keys.
        waiters: Queued contenders; -1 when ``held_locks`` is.
    """

    available: bool = False
    error: str = ""
    server_version: str = ""
    cluster_id: int = 0
    member_id: int = 0
    revision: int = 0
    raft_term: int = 0
    leader: int = 0
    raft_index: int = 0
    db_size_bytes: int = 0
    contender_keys: int = -1
    held_locks: int = -1
    waiters: int = -1


async def read_etcd(etcd: EtcdClient, keys: Keys, *, scan_keys: int = SCAN_KEYS) -> EtcdView:
    """Ask etcd what ServerInfo reports, never failing because etcd does.

    Args:
        etcd: The coordinator's etcd layer (its calls end at the caller's deadline).
        keys: The key layout of the coordinator's prefix.
        scan_keys: Most lock keys read to tell held locks from waiters.

    Returns:
        The view; ``available`` False (with ``error``) when the Range failed.
        A failed Status leaves ``available`` True with its error, and its
        fields (version, leader, raft index, database size) empty.
    """
    # From the first key a caller's lock can have: elections and semaphores (locks with internal names,
    # whose keys come first) are not counted.
    scan = etcdops.keys_under(keys.prefix, scan_keys)
    scan.key = first_lock_key(keys)
    ranged, status = await asyncio.gather(etcd.range(scan), etcd.status(), return_exceptions=True)
    for outcome in (ranged, status):
        if isinstance(outcome, BaseException) and not isinstance(outcome, FencepostError):
            raise outcome
    if isinstance(ranged, FencepostError):
        return EtcdView(error=ranged.message)
    assert not isinstance(ranged, BaseException)
    header = ranged.header
    locks = [kv for kv in ranged.kvs if keys.parse(bytes(kv.key)) is not None]
    # Not lock keys (the token record, guard records kept under the prefix) are not counted;
    # past the first scan_keys keys those are not seen, and the total may count them.
    total = int(ranged.count) - (len(ranged.kvs) - len(locks))
    held = waiters = -1
    if not ranged.more:
        by_lock: dict[bytes, list[Any]] = {}
        for kv in locks:
            by_lock.setdefault(bytes(kv.key).rpartition(b"/")[0], []).append(kv)
        held = len(by_lock)
        waiters = total - sum(holding([Holder(0, int(kv.create_revision), keys.is_reader(bytes(kv.key)))
                                       for kv in sorted(group, key=lambda kv: kv.create_revision)])
                              for group in by_lock.values())
    view = EtcdView(available=True, cluster_id=int(header.cluster_id), member_id=int(header.member_id),
                    revision=int(header.revision), raft_term=int(header.raft_term), contender_keys=total,
                    held_locks=held, waiters=waiters)
    if isinstance(status, FencepostError):
        return dataclasses.replace(view, error=f"etcd Status: {status.message}")
    assert not isinstance(status, BaseException)
    return dataclasses.replace(view, server_version=str(status.version), leader=int(status.leader),
                               raft_index=int(status.raftIndex), db_size_bytes=int(status.dbSize))


def server_info(about: About, etcd: EtcdView, *, waiting_acquires: int, keepalive_streams: int,
                keepalive_leases: int, watched_holds: int) -> lock_pb2.ServerInfoResponse:
    """The ServerInfo answer: ``about``, what etcd said (``etcd``), and this coordinator's counts.

    Args:
        waiting_acquires: the Acquire calls waiting here.
        keepalive_streams, keepalive_leases, watched_holds: the KeepAlive streams open here, the leases
            kept alive on them and the holds they watch.
    """
    return lock_pb2.ServerInfoResponse(
        version=about.version, instance_id=about.instance_id, uptime_seconds=about.uptime_seconds,
        listen_address=about.listen_address, health_address=about.health_address,
        metrics_address=about.metrics_address, http_address=about.http_address, key_prefix=about.prefix,
        serving=about.serving,
        etcd=lock_pb2.EtcdInfo(
            endpoints=list(about.endpoints), embedded=about.embedded, available=etcd.available, error=etcd.error,
            server_version=etcd.server_version, cluster_id=etcd.cluster_id, member_id=etcd.member_id,
            revision=etcd.revision, raft_term=etcd.raft_term, leader=etcd.leader, raft_index=etcd.raft_index,
            db_size_bytes=etcd.db_size_bytes),
        keepalive_streams=keepalive_streams, keepalive_leases=keepalive_leases, watched_holds=watched_holds,
        waiting_acquires=waiting_acquires, contender_keys=etcd.contender_keys, held_locks=etcd.held_locks,
        waiters=etcd.waiters)
