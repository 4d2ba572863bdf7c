"""The lock implementations the bench compares, behind one small interface.

A *peer* makes *users*: one user is one client of the lock service (its own
lease, session or connection, as each peer's users normally have), with
``acquire(name)`` (blocking until granted; returns the grant) and
``release(name, grant)``. Async peers' users are coroutines run as tasks on
the bench's event loop; sync peers' users (``sync = True``) block and are run
in threads of the bench process, so they share its GIL.

- ``etcd-direct``: the cycle Fencepost does, done directly on etcd over the
  generated etcd stubs on one grpc.aio channel, with the same Txns the
  coordinator makes (``fencepost.client.v1.etcdops``): one puts the contender
  key on a lease granted once per user and reads the holder; when another key
  is first, it waits as the coordinator does (reads the key just before its own,
  watches it for deletion); one deletes the key if its create revision is the
  token. **The baseline of every ratio.**
- ``etcd3aio-direct``: the same two Txns through etcd3aio's public API
  (uncontended only; the old baseline of bench/cycles.py, not in the suite).
- ``etcd3aio-lock``: etcd3aio's own Lock recipe (a lease granted and revoked
  per lock), all users on one Etcd3Client.
- ``redis-lock``: redis-py's ``Lock`` (SET NX PX, a Lua release; waiters poll
  every ``sleep`` = 0.1 s, its default) on a redis-server without persistence.
  No fencing token and no fsync: the speed people compare with.
- ``kazoo-lock``: kazoo's ``Lock`` recipe on ZooKeeper (an ephemeral
  sequential znode per acquire, a watch on the one before), one KazooClient
  (session) per user.
- ``fencepost-stub``: Acquire + Release through the coordinator over the
  generated grpc.aio stub, one channel and one lease per user.
- ``fencepost-sync``: ``LockClient`` (sync; on the loop thread all LockClients share), one per user.
- ``fencepost-async``: ``AsyncLockClient``, one per user.
- ``fencepost-async-shared``: one ``AsyncLockClient`` shared by every user (the tasks of one process: one
  channel, one lease, one KeepAlive stream, the calls of tasks that ask at once sent as one message,
  ``KeepAliveRequest.calls``); P1 and P2 only (its users' holds of one name queue in the client itself).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
import grpc.aio

from fencepost.client import AsyncLockClient, LockClient
from fencepost.client.v1 import etcdops, lock_pb2, lock_pb2_grpc
from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc
from fencepost.client.v1.keys import prefix_end

#: TTL of the users' leases and sessions, seconds: long enough never to matter in a cycle.
TTL = 30
#: Where etcd3aio's Lock recipe puts the contender keys of lock NAME (``{ETCD3AIO_LOCK_PREFIX}/NAME/``): mirrors
#: etcd3aio 0.3's private ``etcd3aio.concurrency._LOCK_PREFIX``, which no public API exposes.
ETCD3AIO_LOCK_PREFIX = "__etcd3aio:lock"


class AsyncUser(Protocol):
    """One client of an async peer."""

    async def acquire(self, name: str) -> Any: ...
    async def release(self, name: str, grant: Any) -> None: ...
    async def close(self) -> None: ...


class SyncUser(Protocol):
    """One client of a sync peer (used from one thread)."""

    def acquire(self, name: str) -> Any: ...
    def release(self, name: str, grant: Any) -> None: ...
    def close(self) -> None: ...


class Peer(Protocol):
    """A lock implementation: makes users (``await peer.user(i)``; for sync peers, in a thread)."""

    kind: str
    sync: bool

    async def user(self, i: int) -> Any: ...
    async def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------- etcd-direct


class EtcdDirect:
    """The baseline: the coordinator's Txns, sent directly to etcd (see the module docstring)."""

    kind = "etcd-direct"
    sync = False

    def __init__(self, endpoint: str, prefix: str) -> None:
        self.endpoint, self.prefix = endpoint, f"{prefix}direct/"
        self.channel = grpc.aio.insecure_channel(f"dns:///{endpoint}")
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.leases = rpc_pb2_grpc.LeaseStub(self.channel)
        self.watch = rpc_pb2_grpc.WatchStub(self.channel)

    async def queued(self, name: str) -> bool:
        """Whether a second contender is queued on ``name`` (for the hand-off figure)."""
        return await _count(self.kv, f"{self.prefix}{name}/".encode()) >= 2

    async def user(self, i: int) -> EtcdDirectUser:
        lease = (await self.leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=TTL), timeout=10)).ID
        return EtcdDirectUser(self, lease)

    async def close(self) -> None:
        await self.channel.close()


class EtcdDirectUser:
    """One lease; one key per lock name (``<prefix><name>/<lease hex>``)."""

    def __init__(self, peer: EtcdDirect, lease: int) -> None:
        self.peer, self.lease = peer, lease
        self._keys: dict[str, tuple[bytes, bytes, list[rpc_pb2.RequestOp], rpc_pb2.TxnRequest]] = {}

    def _key(self, name: str) -> tuple[bytes, bytes, list[rpc_pb2.RequestOp], rpc_pb2.TxnRequest]:
        if name not in self._keys:
            lock = f"{self.peer.prefix}{name}/".encode()
            key = lock + f"{self.lease:016x}".encode()
            reads = [etcdops.get(key, keys_only=True), etcdops.holder_of(lock)]
            put = etcdops.txn([etcdops.is_absent(key)], [etcdops.put(key, lease_id=self.lease),
                                                         etcdops.holder_of(lock)], reads)
            self._keys[name] = (lock, key, reads, put)
        return self._keys[name]

    async def acquire(self, name: str) -> int:
        lock, key, _, put = self._key(name)
        resp = await self.peer.kv.Txn(put, timeout=30)
        token = resp.header.revision
        owners = resp.responses[1].response_range.kvs
        if owners and owners[0].create_revision == token:
            return int(token)
        while True:  # another key is first: wait as the coordinator does (coordinator/recipes/lock.py, _wait_turn)
            check = await self.peer.kv.Txn(etcdops.txn([etcdops.is_owner(key, token)],
                                                        [etcdops.last_before(lock, token)]), timeout=30)
            before = check.responses[0].response_range.kvs
            if not before:
                return int(token)
            await self._deleted(bytes(before[0].key), check.header.revision + 1)

    async def _deleted(self, key: bytes, start: int) -> None:
        call = self.peer.watch.Watch()
        try:
            await call.write(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                key=key, start_revision=start, filters=[rpc_pb2.WatchCreateRequest.NOPUT])))
            async for resp in call:
                if resp.events or resp.canceled:
                    return
        finally:
            call.cancel()

    async def release(self, name: str, grant: int) -> None:
        _, key, reads, _ = self._key(name)
        await self.peer.kv.Txn(etcdops.txn([etcdops.is_owner(key, grant)], [etcdops.delete(key)], reads), timeout=30)

    async def close(self) -> None:
        await self.peer.leases.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=self.lease), timeout=10)


# ---------------------------------------------------------------------------------------------- etcd3aio


class Etcd3aioDirect:
    """The same two Txns through etcd3aio's public API (uncontended cycles only)."""

    kind = "etcd3aio-direct"
    sync = False

    def __init__(self, endpoint: str, prefix: str) -> None:
        from etcd3aio import Etcd3Client

        self.prefix = f"{prefix}direct3aio/"
        self.client = Etcd3Client([endpoint])

    async def start(self) -> None:
        await self.client.connect()

    async def user(self, i: int) -> Any:
        client = self.client
        assert client.kv is not None and client.lease is not None
        kvs, lease = client.kv, (await client.lease.grant(TTL)).ID
        prefix = self.prefix

        class User:
            async def acquire(self, name: str) -> int:
                lock = f"{prefix}{name}/".encode()
                key = lock + f"{lease:016x}".encode()
                first = kvs.txn_op_get(lock, range_end=prefix_end(lock))
                first.request_range.sort_order = first.request_range.ASCEND
                first.request_range.sort_target = first.request_range.CREATE
                first.request_range.limit = 1
                first.request_range.keys_only = True
                mine = kvs.txn_op_get(key)
                mine.request_range.keys_only = True
                absent = kvs.txn_compare_create_revision(key, 0)
                put = await kvs.txn([absent], [kvs.txn_op_put(key, b"", lease=lease), first], [mine, first])
                return int(put.header.revision)

            async def release(self, name: str, grant: int) -> None:
                key = f"{prefix}{name}/{lease:016x}".encode()
                await kvs.txn([kvs.txn_compare_create_revision(key, grant)], [kvs.txn_op_delete(key)], [])

            async def close(self) -> None:
                assert client.lease is not None
                await client.lease.revoke(lease)

        return User()

    async def close(self) -> None:
        await self.client.close()


class Etcd3aioLock:
    """etcd3aio's Lock recipe (a lease granted and revoked per lock), all users on one client."""

    kind = "etcd3aio-lock"
    sync = False

    def __init__(self, endpoint: str, prefix: str) -> None:
        from etcd3aio import Etcd3Client

        self.prefix = f"{prefix}recipe/"
        self.client = Etcd3Client([endpoint])
        self.channel = grpc.aio.insecure_channel(f"dns:///{endpoint}")

    async def start(self) -> None:
        await self.client.connect()

    async def queued(self, name: str) -> bool:
        """Whether a second contender is queued on ``name``."""
        key = f"{ETCD3AIO_LOCK_PREFIX}/{self.prefix}{name}/".encode()
        return await _count(rpc_pb2_grpc.KVStub(self.channel), key) >= 2

    async def user(self, i: int) -> Any:
        client, prefix = self.client, self.prefix

        class User:
            async def acquire(self, name: str) -> Any:
                lock = client.lock(f"{prefix}{name}", ttl=TTL)
                await lock.acquire()
                return lock

            async def release(self, name: str, grant: Any) -> None:
                await grant.release()

            async def close(self) -> None:
                return None

        return User()

    async def close(self) -> None:
        await self.client.close()
        await self.channel.close()


# ---------------------------------------------------------------------------------------------- Fencepost


class Described:
    """A Describe stub on the coordinator: whether a waiter is queued (for the hand-off figure)."""

    address: str
    _probe: Any = None
    _channel: Any = None

    async def queued(self, name: str) -> bool:
        """Whether ``name`` has a waiter behind its holder."""
        if self._probe is None:
            self._channel = grpc.aio.insecure_channel(self.address)
            self._probe = lock_pb2_grpc.LockServiceStub(self._channel)
        return (await self._probe.Describe(lock_pb2.DescribeRequest(name=name), timeout=10)).waiter_count >= 1

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class FencepostStub(Described):
    """Acquire + Release over the generated grpc.aio stub (unary calls): one connection and one session lease
    per user."""

    kind = "fencepost-stub"
    sync = False

    def __init__(self, address: str) -> None:
        self.address = address

    async def user(self, i: int) -> Any:
        # Its own connection, as a separate client has (and as the client library does): the coordinator's
        # per-caller limits (LeaseGrant rate, streams) count a connection as one caller.
        channel = grpc.aio.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
        stub = lock_pb2_grpc.LockServiceStub(channel)
        granted = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=TTL), timeout=30)
        lease = granted.lease_id
        owner = (("fencepost-lease-secret", granted.lease_secret),)  # the lease's owner presents its secret

        class User:
            async def acquire(self, name: str) -> int:
                r = await stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease, wait_forever=True),
                                       metadata=owner)
                return int(r.token)

            async def release(self, name: str, grant: int) -> None:
                await stub.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease, token=grant), metadata=owner,
                                   timeout=30)

            async def close(self) -> None:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), metadata=owner, timeout=10)
                await channel.close()

        return User()


class FencepostAsync(Described):
    """``AsyncLockClient``, one per user (its own channel, lease and KeepAlive stream)."""

    kind = "fencepost-async"
    sync = False

    def __init__(self, address: str) -> None:
        self.address = address

    async def user(self, i: int) -> Any:
        client = AsyncLockClient(self.address)
        await client.connect()

        class User:
            async def acquire(self, name: str) -> Any:
                return await client.acquire(name, ttl=TTL)

            async def release(self, name: str, grant: Any) -> None:
                await grant.release()

            async def close(self) -> None:
                await client.close()

        return User()


class FencepostSync(Described):
    """``LockClient`` (sync, on the shared loop thread), one per user, run from one thread each."""

    kind = "fencepost-sync"
    sync = True

    def __init__(self, address: str) -> None:
        self.address = address

    async def user(self, i: int) -> Any:
        client = LockClient(self.address)
        await asyncio.to_thread(client.connect)

        class User:
            def acquire(self, name: str) -> Any:
                return client.acquire(name, ttl=TTL)

            def release(self, name: str, grant: Any) -> None:
                grant.release()

            def close(self) -> None:
                client.close()

        return User()


# ---------------------------------------------------------------------------------------------- redis, ZooKeeper


class RedisLock:
    """redis-py's ``Lock`` (default ``sleep`` = 0.1 s between attempts), one Redis client per user."""

    kind = "redis-lock"
    sync = True

    def __init__(self, port: int, prefix: str) -> None:
        self.port, self.prefix = port, prefix

    async def user(self, i: int) -> Any:
        import redis

        r = redis.Redis(host="127.0.0.1", port=self.port)
        await asyncio.to_thread(r.ping)
        prefix = self.prefix

        class User:
            def acquire(self, name: str) -> Any:
                # thread_local=False: the lock object is this user's, released from whichever thread runs it.
                lock = r.lock(f"{prefix}{name}", timeout=TTL, thread_local=False)
                lock.acquire(blocking=True)
                return lock

            def release(self, name: str, grant: Any) -> None:
                grant.release()

            def close(self) -> None:
                r.close()

        return User()

    async def close(self) -> None:
        return None


class KazooLock:
    """kazoo's ``Lock`` recipe, one KazooClient (one ZooKeeper session) per user."""

    kind = "kazoo-lock"
    sync = True

    def __init__(self, port: int, prefix: str) -> None:
        self.hosts, self.prefix = f"127.0.0.1:{port}", "/" + prefix.strip("/").replace("/", "_")
        self._probe: Any = None

    def path(self, name: str) -> str:
        """The znode of lock ``name``."""
        return f"{self.prefix}/{name.replace('/', '_')}"

    async def queued(self, name: str) -> bool:
        """Whether a second contender's znode is under ``name``'s."""
        from kazoo.client import KazooClient

        if self._probe is None:
            self._probe = KazooClient(hosts=self.hosts)
            await asyncio.to_thread(self._probe.start, 30)
        return len(await asyncio.to_thread(self._probe.get_children, self.path(name))) >= 2

    async def user(self, i: int) -> Any:
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.hosts, timeout=TTL)
        await asyncio.to_thread(zk.start, 30)
        path, locks = self.path, {}

        class User:
            def acquire(self, name: str) -> Any:
                if name not in locks:
                    locks[name] = zk.Lock(path(name))
                locks[name].acquire()
                return locks[name]

            def release(self, name: str, grant: Any) -> None:
                grant.release()

            def close(self) -> None:
                zk.stop()
                zk.close()

        return User()

    async def close(self) -> None:
        if self._probe is not None:
            await asyncio.to_thread(self._probe.stop)
            self._probe.close()


async def _count(kv: Any, prefix: bytes) -> int:
    """How many keys start with ``prefix``."""
    return int((await kv.Range(etcdops.count(prefix), timeout=10)).count)


async def close_quietly(aw: Awaitable[Any] | Callable[[], Any], sync: bool = False) -> None:
    """Run a close, ignoring its failure (a bench tears down whatever state it is in)."""
    with contextlib.suppress(Exception):
        if sync:
            await asyncio.to_thread(aw)  # type: ignore[arg-type]
        else:
            await aw  # type: ignore[misc]
