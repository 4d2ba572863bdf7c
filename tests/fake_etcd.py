"""An in-memory etcd KV and Lease service with injected failures, for unit tests of the etcd layer.

Implements the subset of etcd's semantics the lock algorithm uses
(``api/etcdserverpb/rpc.proto``): one revision counter; Txn with CREATE,
VALUE and MOD compares over a key or a range (a compare over an empty range
is made against an empty KeyValue, and a VALUE compare on a missing key is
false, as etcd's ``applyCompare``); put (refused with NOT_FOUND for an
unknown lease), delete and range ops (sort, limit, keys_only, count_only,
max_create_revision), nested Txns; lease grant, revoke and time-to-live.

Failures are injected per method: ``fail["Txn"] = [(code, applied)]`` makes
the next Txn raise ``code`` after applying it (``applied=True``: the answer
is lost) or without applying it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import grpc

from fencepost.client.v1.etcd import kv_pb2, rpc_pb2
from fencepost.coordinator.etcd import Stubs

Compare = rpc_pb2.Compare


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    """A failed call as grpc.aio raises it."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details or code.name)


@dataclass
class FakeEtcd:
    """The state and the failure plan shared by every member's fake stubs."""

    revision: int = 1
    kvs: dict[bytes, kv_pb2.KeyValue] = field(default_factory=dict)
    leases: dict[int, int] = field(default_factory=dict)  # id -> TTL
    next_lease: int = 0x1000
    fail: dict[str, collections.deque[tuple[grpc.StatusCode, bool, str]]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque))
    calls: list[tuple[int, str, Any]] = field(default_factory=list)  # (member, method, metadata)
    tokens: list[str] = field(default_factory=list)  # tokens Authenticate hands out, in order
    valid_tokens: set[str] = field(default_factory=set)
    wrote: bool = False

    def stubs(self) -> Any:
        """A ``stubs`` factory for EtcdClient: member i gets stubs that record i."""
        members = iter(range(1000))

        def make(channel: Any) -> Stubs:
            member = _Member(self, next(members))
            return Stubs(kv=member, lease=member, watch=member, auth=member)

        return make

    def inject(self, method: str, code: grpc.StatusCode, *, applied: bool = False, details: str = "") -> None:
        """Make the next call of ``method`` fail with ``code``, after applying it when ``applied``."""
        self.fail[method].append((code, applied, details))

    # ------------------------------------------------------------ semantics

    def header(self) -> rpc_pb2.ResponseHeader:
        return rpc_pb2.ResponseHeader(revision=self.revision)

    def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        found = [kv for k, kv in sorted(self.kvs.items()) if _in(k, req.key, req.range_end)]
        if req.max_create_revision:
            found = [kv for kv in found if kv.create_revision <= req.max_create_revision]
        if req.sort_target == rpc_pb2.RangeRequest.CREATE:
            found.sort(key=lambda kv: kv.create_revision, reverse=req.sort_order == rpc_pb2.RangeRequest.DESCEND)
        count = len(found)
        if req.count_only:
            found = []
        if req.limit:
            found = found[:req.limit]
        out = [kv_pb2.KeyValue(key=kv.key, create_revision=kv.create_revision, mod_revision=kv.mod_revision,
                               lease=kv.lease, value=b"" if req.keys_only else kv.value) for kv in found]
        return rpc_pb2.RangeResponse(header=self.header(), kvs=out, count=count)

    def compare(self, c: rpc_pb2.Compare) -> bool:
        found = [kv for k, kv in self.kvs.items() if _in(k, c.key, c.range_end)]
        if not found:
            if c.target == Compare.VALUE:
                return False
            found = [kv_pb2.KeyValue()]
        for kv in found:
            mine, theirs = {Compare.CREATE: (kv.create_revision, c.create_revision),
                            Compare.MOD: (kv.mod_revision, c.mod_revision),
                            Compare.VALUE: (kv.value, c.value)}[c.target]
            ok = {Compare.EQUAL: mine == theirs, Compare.NOT_EQUAL: mine != theirs,
                  Compare.LESS: mine < theirs, Compare.GREATER: mine > theirs}[c.result]
            if not ok:
                return False
        return True

    def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        saved, self.wrote = dict(self.kvs), False
        try:
            self._apply(req)  # a dry run: does the chosen branch write, is its lease known?
        finally:
            self.kvs = saved
        if self.wrote:
            self.revision += 1
        return self._apply(req)

    def _apply(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        succeeded = all(self.compare(c) for c in req.compare)
        responses = []
        for op in req.success if succeeded else req.failure:
            kind = op.WhichOneof("request")
            if kind == "request_range":
                responses.append(rpc_pb2.ResponseOp(response_range=self.range(op.request_range)))
            elif kind == "request_put":
                p = op.request_put
                if p.lease and p.lease not in self.leases:
                    raise rpc_error(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")
                self.wrote = True
                old = self.kvs.get(p.key)
                self.kvs[p.key] = kv_pb2.KeyValue(key=p.key, value=p.value, lease=p.lease,
                                                  create_revision=old.create_revision if old else self.revision,
                                                  mod_revision=self.revision)
                responses.append(rpc_pb2.ResponseOp(response_put=rpc_pb2.PutResponse(header=self.header())))
            elif kind == "request_delete_range":
                self.wrote = True
                deleted = int(self.kvs.pop(op.request_delete_range.key, None) is not None)
                responses.append(rpc_pb2.ResponseOp(
                    response_delete_range=rpc_pb2.DeleteRangeResponse(header=self.header(), deleted=deleted)))
            else:
                responses.append(rpc_pb2.ResponseOp(response_txn=self._apply(op.request_txn)))
        return rpc_pb2.TxnResponse(header=self.header(), succeeded=succeeded, responses=responses)


def _in(key: bytes, start: bytes, end: bytes) -> bool:
    return key == start if not end else start <= key < end


class _Member:
    """One member's KV, Lease and Auth stubs over the shared state (every method is a coroutine)."""

    def __init__(self, etcd: FakeEtcd, index: int) -> None:
        self.etcd = etcd
        self.index = index

    async def _call(self, method: str, run: Any, metadata: Any) -> Any:
        etcd = self.etcd
        etcd.calls.append((self.index, method, metadata))
        if method != "Authenticate" and etcd.valid_tokens:
            token = dict(metadata or ()).get("token")
            if token not in etcd.valid_tokens:
                raise rpc_error(grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
        plan = etcd.fail[method]
        if plan:
            code, applied, details = plan.popleft()
            if applied:
                run()
            raise rpc_error(code, details)
        return run()

    async def Range(self, req: Any, *, timeout: float | None = None, metadata: Any = None) -> Any:
        return await self._call("Range", lambda: self.etcd.range(req), metadata)

    async def Txn(self, req: Any, *, timeout: float | None = None, metadata: Any = None) -> Any:
        return await self._call("Txn", lambda: self.etcd.txn(req), metadata)

    async def LeaseGrant(self, req: Any, *, timeout: float | None = None, metadata: Any = None) -> Any:
        def grant() -> rpc_pb2.LeaseGrantResponse:
            self.etcd.next_lease += 1
            self.etcd.leases[self.etcd.next_lease] = req.TTL
            return rpc_pb2.LeaseGrantResponse(ID=self.etcd.next_lease, TTL=req.TTL)
        return await self._call("LeaseGrant", grant, metadata)

    async def LeaseRevoke(self, req: Any, *, timeout: float | None = None, metadata: Any = None) -> Any:
        def revoke() -> rpc_pb2.LeaseRevokeResponse:
            if self.etcd.leases.pop(req.ID, None) is None:
                raise rpc_error(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")
            self.etcd.revision += 1
            for key in [k for k, kv in self.etcd.kvs.items() if kv.lease == req.ID]:
                del self.etcd.kvs[key]
            return rpc_pb2.LeaseRevokeResponse(header=self.etcd.header())
        return await self._call("LeaseRevoke", revoke, metadata)

    async def LeaseTimeToLive(self, req: Any, *, timeout: float | None = None, metadata: Any = None) -> Any:
        ttl = self.etcd.leases.get(req.ID)
        return await self._call("LeaseTimeToLive", lambda: rpc_pb2.LeaseTimeToLiveResponse(
            ID=req.ID, TTL=-1 if ttl is None else ttl, grantedTTL=ttl or 0), metadata)

    async def Authenticate(self, req: Any, *, timeout: float | None = None, metadata: Any = None) -> Any:
        def authenticate() -> rpc_pb2.AuthenticateResponse:
            if req.password != "right":
                raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                                "etcdserver: authentication failed, invalid user ID or password")
            token = self.etcd.tokens.pop(0)
            self.etcd.valid_tokens = {token}
            return rpc_pb2.AuthenticateResponse(token=token)
        return await self._call("Authenticate", authenticate, metadata)
