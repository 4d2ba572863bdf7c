"""F08 bad input: invalid TTLs and names are refused before etcd is touched; odd but valid names work.

Field case F08 (docs/reliability.md lists the cases and their tests). Through the client (typed InvalidArgument)
and through the raw stub (INVALID_ARGUMENT naming the field), nothing is
written to etcd (no key, no lease); the TTL granted is reported back, never
shortened; "jobs" and "jobs/1" are independent locks, and so is "../x";
every successful acquire is checked against etcd (its key exists with the
token as create revision).
"""

from __future__ import annotations

import math
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import Keys

from ..conftest import assert_invalid_field, count_keys, lease_ids

CLIENT_TTLS = [0, -1, 0.001, 2**63, math.nan]
# The wire's ttl_seconds is an int64: 0.001 and NaN cannot be sent, 2**63 does not fit.
WIRE_TTLS = [0, -1, 2**63 - 1, -(2**63)]
# 60 KiB: under the coordinator's 64 KiB message limit (a larger request gets RESOURCE_EXHAUSTED from gRPC).
NAMES = {"empty": "", "60 KiB": "n" * (60 * 1024), "NUL byte": "a\x00b"}


async def assert_in_etcd(etcd_client: Etcd3Client, prefix: str, name: str, lease_id: int, token: int) -> None:
    """The hold exists in etcd: the contender key is there with the token as its create revision."""
    assert etcd_client.kv is not None
    key = Keys(prefix).contender(name, lease_id)
    resp = await etcd_client.kv.get(key, timeout=5)
    assert len(resp.kvs) == 1, f"no key for {name!r} in etcd after a successful acquire"
    assert resp.kvs[0].create_revision == token
    assert resp.kvs[0].lease == lease_id
    assert key.startswith(prefix.encode())


async def test_f08_invalid_ttls_are_refused_before_etcd(
    address: str, stub: lock_pb2_grpc.LockServiceStub, etcd_client: Etcd3Client, prefix: str
) -> None:
    """Each invalid TTL is InvalidArgument (client) / INVALID_ARGUMENT ttl_seconds (stub); no key, no lease."""
    leases = await lease_ids(etcd_client)
    async with AsyncLockClient(address) as client:
        for ttl in CLIENT_TTLS:
            for call in (client.acquire, client.try_acquire):
                with pytest.raises(InvalidArgument) as info:
                    await call("ttl-check", ttl=ttl)
                assert info.value.field == "ttl"
    for ttl in WIRE_TTLS:
        with pytest.raises(grpc.aio.AioRpcError) as rpc:
            await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=ttl), timeout=5)
        assert_invalid_field(rpc.value, "ttl_seconds")
    for ttl in (0.001, math.nan, 2**63):
        with pytest.raises((TypeError, ValueError)):  # not representable on the wire at all
            lock_pb2.LeaseGrantRequest(ttl_seconds=ttl)
    assert await count_keys(etcd_client, prefix) == 0
    assert not (await lease_ids(etcd_client)) - leases, "a lease was granted for an invalid TTL"


async def test_f08_granted_ttl_is_reported_never_shortened(
    address: str, stub: lock_pb2_grpc.LockServiceStub, etcd_client: Etcd3Client, prefix: str
) -> None:
    """The TTL etcd granted is what the caller sees, and never less than asked (1 s and 1.5 s round up)."""
    assert etcd_client.lease is not None
    for asked in (1, 1.5, 5):
        async with AsyncLockClient(address) as client:
            h = await client.acquire(f"ttl-{asked}", ttl=asked, timeout=5.0)
            await assert_in_etcd(etcd_client, prefix, h.name, h.lease_id, h.token)
            live = await etcd_client.lease.time_to_live(h.lease_id, timeout=5)
            assert h.ttl >= math.ceil(asked)
            assert h.ttl == live.grantedTTL, (h.ttl, live.grantedTTL)
            await h.release()
    resp = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=1), timeout=5)
    try:
        live = await etcd_client.lease.time_to_live(resp.lease_id, timeout=5)
        assert resp.ttl_seconds >= 1 and resp.ttl_seconds == live.grantedTTL
    finally:
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=resp.lease_id), timeout=5)


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
async def test_f08_invalid_names_are_refused_before_etcd(
    address: str, stub: lock_pb2_grpc.LockServiceStub, etcd_client: Etcd3Client, prefix: str, name: str
) -> None:
    """An empty, 60 KiB or NUL-carrying name is InvalidArgument "name" everywhere, and writes nothing."""
    async with AsyncLockClient(address) as client:
        for call in (client.acquire, client.try_acquire):
            with pytest.raises(InvalidArgument) as info:
                await call(name, ttl=5.0, timeout=1.0) if call is client.acquire else await call(name, ttl=5.0)
            assert info.value.field == "name"
        lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=5)).lease_id
        try:
            for request in (lock_pb2.AcquireRequest(name=name, lease_id=lease),
                            lock_pb2.AcquireRequest(name=name, lease_id=lease, wait_ms=500)):
                with pytest.raises(grpc.aio.AioRpcError) as rpc:
                    await stub.Acquire(request, timeout=5)
                assert_invalid_field(rpc.value, "name")
            assert await count_keys(etcd_client, prefix) == 0
        finally:
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)


async def test_f08_nested_and_dotted_names_are_independent_locks(
    address: str, etcd_client: Etcd3Client, prefix: str
) -> None:
    """"jobs", "jobs/1", "../x", "x" and ".." are held at once by different clients; releasing one frees only it."""
    names = ["jobs", "jobs/1", "../x", "x", ".."]
    clients = [AsyncLockClient(address) for _ in names]
    try:
        handles: dict[str, Any] = {}
        for name, client in zip(names, clients):
            h = await client.try_acquire(name, ttl=10.0)
            await assert_in_etcd(etcd_client, prefix, name, h.lease_id, h.token)
            handles[name] = h
        assert await count_keys(etcd_client, prefix) == len(names)
        assert len({h.token for h in handles.values()}) == len(names)
        await handles["jobs"].release()
        for name in names[1:]:
            assert handles[name].is_valid()
            info = await clients[0].describe(name)
            assert info.held and info.holder_token == handles[name].token
        info = await clients[0].describe("jobs")
        assert not info.held
        h = await clients[1].try_acquire("jobs", ttl=10.0)  # "jobs/1"'s holder can take "jobs" too
        await assert_in_etcd(etcd_client, prefix, "jobs", h.lease_id, h.token)
        await h.release()
        await handles["../x"].release()
        assert (await clients[0].describe("x")).held
    finally:
        for client in clients:
            await client.close()
    assert await count_keys(etcd_client, prefix) == 0
