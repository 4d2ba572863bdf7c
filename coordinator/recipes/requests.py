"""Request records: a retry of a call that changed state answers as its first attempt did.

A call that changes state (Release, Resign, ReleasePermit, AdminRevoke)
and carries a ``request_id`` writes, in the same etcd Txn as its change, a
record ``<prefix>.request.<request_id>`` (:meth:`~fencepost.client.v1.keys.Keys.request_record`)
whose value names the call (:class:`Call`: method, name, lease, token,
slot) and whose mod revision is the change's revision. When a retry of that
call (its answer was lost: a broken connection, a deadline, a coordinator
that stopped) is refused because the first attempt already did the work
(NOT_HOLDER, STALE_TOKEN, LEASE_EXPIRED), the record answers instead: the
same call gets OK with the first revision; another call that reuses the id
gets INVALID_ARGUMENT / REQUEST_ID_REUSED. The success path costs no extra
etcd round trip: the record's put rides in the call's own Txn.

Records must not pile up. Each one is attached to a *records lease* of the
coordinator's own, granted with a TTL of :data:`RECORDS_TTL_SECONDS` and
never kept alive: records are written under one lease for at most
:data:`USE_SECONDS` after its grant, so each record lives between
``RECORDS_TTL_SECONDS - USE_SECONDS`` (60 s) and ``RECORDS_TTL_SECONDS``
(120 s). A replacement lease is granted in the background once the current
one is :data:`ROTATE_SECONDS` old, so calls rarely wait for a grant (and
each lease carries only that many seconds of records: etcd deletes them
all at once when it expires, and a large deletion stalls it briefly). The
leases are not revoked when the coordinator stops: another replica must
still find the records for a retry. So "a retry within 60 s of the first
attempt answers as the first did" (proto/fencepost/v1/lock.proto, "Retries").

Batching (:mod:`..etcd.batch`): the record's key lies outside every lock's
key range, and a batch refuses (then sends each alone) when two of its
Txns put one key. Two Txns with one request id are either a retry of the
same call, so of the same lock, never batched together (one Txn per lock per
batch), or a reuse of the id by another call, which then only costs that
batch a second round (each Txn alone).

Usage by a servicer (Release; Resign and ReleasePermit the same way)::

    call = Call("Release", name, lease_id, token)
    revision = await records.run(request.request_id, call,
                                 lambda also: locks.release(name, lease_id, token, also=also))

where ``also`` is the extra success-branch op(s) to append to the Txn that
makes the change (empty without a request id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fencepost.client.errors import FencepostError, InvalidArgument, LeaseLost, NotHolder, StaleTokenError
from fencepost.client.v1 import etcdops, kinds
from fencepost.client.v1.details import ErrorReason, reason_name
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import MAX_REQUEST_ID_CHARS, Keys

from ..etcd import NOT_APPLIED, EtcdClient, TxnPlan, deadline, unbounded
from ..etcd.failures import Failure, Op, error_for

__all__ = [
    "Call", "RECORDS_TTL_SECONDS", "ROTATE_SECONDS", "Record", "RequestIdReused", "RequestRecords", "USE_SECONDS",
    "validate_request_id",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: TTL of each records lease, in seconds: no record outlives it.
RECORDS_TTL_SECONDS = 120
#: Age of the records lease, in seconds, after which a replacement is granted in the background. Short,
#: because etcd deletes all of a lease's keys in one step when it expires, and stalls meanwhile
#: (measured on the 2-core machine, embedded etcd 3.5.1: 5,000 keys 18 ms, 30,000 keys 165 ms):
#: at 1,000 releases a second each lease then carries about 10,000 records, not 30,000.
ROTATE_SECONDS = 10.0
#: Age of the records lease, in seconds, after which it is no longer written under (a call waits for a new
#: one): every record lives at least ``RECORDS_TTL_SECONDS - USE_SECONDS`` seconds.
USE_SECONDS = 60.0

_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,%d}" % MAX_REQUEST_ID_CHARS)

#: The refusals a retry of a call that already did its work meets (then its record answers).
REFUSALS: tuple[type[FencepostError], ...] = (NotHolder, StaleTokenError, LeaseLost)


def validate_request_id(request_id: str) -> str:
    """Check a request id: "" (none), or 1 to 64 characters of ``[A-Za-z0-9_-]``.

    Returns:
        ``request_id``.

    Raises:
        InvalidArgument: field ``request_id``.
    """
    if request_id and _REQUEST_ID.fullmatch(request_id) is None:
        shown = request_id[:80] + ("..." if len(request_id) > 80 else "")
        raise InvalidArgument(f"request_id {shown!r} must be 1 to {MAX_REQUEST_ID_CHARS} characters of "
                              "[A-Za-z0-9_-] (a UUID's hex is fine)", field="request_id")
    return request_id


class RequestIdReused(InvalidArgument):
    """A request id came with another call than the one it was first used for (REQUEST_ID_REUSED).

    Attributes:
        request_id: The id (sent as ErrorInfo metadata ``request_id``).
    """

    default_reason = ErrorReason.REQUEST_ID_REUSED

    def __init__(self, message: str = "", *, request_id: str, **kwargs: Any) -> None:
        kwargs.setdefault("reason", reason_name(ErrorReason.REQUEST_ID_REUSED))
        super().__init__(message, field="request_id", **kwargs)
        self.request_id = request_id


@dataclass(frozen=True)
class Call:
    """Which call a request id was used for: two attempts are one call when all these are equal.

    Attributes:
        method: The RPC (``"Release"``, ``"Resign"``, ``"ReleasePermit"``, ``"AdminRevoke"``).
        name: The lock, election or semaphore name the call named (as the caller gave it; AdminRevoke of an
            election's leader or a semaphore's permit: the internal lock name of that election or permit slot,
            :func:`~fencepost.client.v1.kinds.internal_name`, so that an id reused for another kind is told apart).
        lease_id: The lease the call named (0: none, as AdminRevoke).
        token: The fencing token the call named (0: none).
        slot: The permit slot the call named (ReleasePermit, AdminRevoke of a permit; 0 otherwise).
    """

    method: str
    name: str
    lease_id: int = 0
    token: int = 0
    slot: int = 0


@dataclass(frozen=True)
class Record:
    """A request record as read from etcd.

    Attributes:
        call: The call that wrote it.
        revision: The etcd revision of that call's change (the record's mod revision).
        outcome: What the call recorded of its outcome beyond the revision
            (AdminRevoke: ``{"lease_id": L, "token": T}`` of the revoked holder, or {} when the lock was free).
    """

    call: Call
    revision: int
    outcome: Mapping[str, int] = field(default_factory=dict)


def _encode(call: Call, outcome: Mapping[str, int] | None = None) -> bytes:
    # The fields in their declaration order, as dataclasses.asdict gives them (without its deep copy).
    value: dict[str, Any] = {"method": call.method, "name": call.name, "lease_id": call.lease_id,
                             "token": call.token, "slot": call.slot}
    if outcome:
        value["outcome"] = dict(outcome)
    return json.dumps(value, separators=(",", ":")).encode()


def _shown(name: str) -> str:
    """A recorded call's name as a message shows it: ``'a'`` for a lock, ``election 'a'``, ``semaphore 'a' slot 2``
    for the internal names AdminRevoke records (never the internal name itself)."""
    return kinds.describe(name) if kinds.is_internal(name) else repr(name)


def _decode(kv: Any) -> Record:
    """The record of a request record's KeyValue.

    Raises:
        ValueError: the value is not a request record.
    """
    try:
        value = json.loads(bytes(kv.value))
        outcome = {str(k): int(v) for k, v in value.pop("outcome", {}).items()}
        call = Call(str(value["method"]), str(value["name"]), int(value.get("lease_id", 0)),
                    int(value.get("token", 0)), int(value.get("slot", 0)))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a request record: {bytes(kv.value)[:100]!r}") from exc
    return Record(call, int(kv.mod_revision), outcome)


class RequestRecords:
    """The request records under one key prefix, and the coordinator's records lease.

    Args:
        etcd: The coordinator's etcd layer.
        keys: The key layout (records live at ``keys.request_record(id)``).
        ttl_seconds: TTL of each records lease.
        rotate_seconds: Age at which a replacement lease is granted in the background.
        use_seconds: Age after which a lease is no longer written under (< ``ttl_seconds``).
        clock: Monotonic clock, in seconds (injected in tests).

    Raises:
        ValueError: not ``0 < rotate_seconds <= use_seconds < ttl_seconds``.
    """

    def __init__(self, etcd: EtcdClient, keys: Keys, *, ttl_seconds: int = RECORDS_TTL_SECONDS,
                 rotate_seconds: float = ROTATE_SECONDS, use_seconds: float = USE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < rotate_seconds <= use_seconds < ttl_seconds:
            raise ValueError(f"need 0 < rotate_seconds ({rotate_seconds}) <= use_seconds ({use_seconds}) "
                             f"< ttl_seconds ({ttl_seconds})")
        self._etcd = etcd
        self._keys = keys
        self._ttl = ttl_seconds
        self._rotate = rotate_seconds
        self._use = use_seconds
        self._clock = clock
        self._lease: tuple[int, float] | None = None  # (records lease id, clock reading before its grant was sent)
        self._granting: asyncio.Task[tuple[int, float]] | None = None

    @property
    def lease_id(self) -> int:
        """The records lease written under now; 0 before the first record."""
        return self._lease[0] if self._lease is not None else 0

    # ------------------------------------------------------------ the calls' API

    async def ops_for(self, request_id: str, call: Call, outcome: Mapping[str, int] | None = None
                      ) -> list[rpc_pb2.RequestOp]:
        """The op(s) to add to the success branch of the Txn that makes ``call``'s change.

        Args:
            request_id: The call's request id (checked already); "" for none.
            call: The call.
            outcome: Facts of the outcome to keep beside the revision (AdminRevoke), None for none.

        Returns:
            [] without a request id; else one put of the record under a
            records lease with at least ``ttl_seconds - use_seconds`` left.

        Raises:
            Unavailable: no records lease could be granted (etcd unreachable).
        """
        if not request_id:
            return []
        lease_id = await self._current_lease()
        return [etcdops.put(self._keys.request_record(request_id), _encode(call, outcome), lease_id=lease_id)]

    async def outcome(self, request_id: str, call: Call) -> Record | None:
        """The record of an earlier attempt of ``call`` with ``request_id`` (one linearizable read).

        For the failure path: the call's Txn was refused, maybe because an
        earlier attempt of the same call did the work.

        Returns:
            The record when the same call wrote it (``.revision`` is its
            change's revision); None without a request id or a record.

        Raises:
            RequestIdReused: another call wrote a record under ``request_id``.
            Unavailable: etcd unreachable.
        """
        if not request_id:
            return None
        resp = await self._etcd.range(etcdops.get(self._keys.request_record(request_id)).request_range,
                                      name=call.name, lease_id=call.lease_id or None)
        if not resp.kvs:
            return None
        return self._same(request_id, call, resp.kvs[0])

    async def run(self, request_id: str, call: Call, change: Callable[[Sequence[rpc_pb2.RequestOp]], Awaitable[int]],
                  *, refusals: tuple[type[FencepostError], ...] = REFUSALS) -> int:
        """Make ``call``'s change with its record; answer a refused retry from the record.

        Args:
            request_id: The call's request id (checked already); "" for none
                (then this is ``await change([])``).
            call: The call.
            change: Sends the Txn that makes the change, with the given ops
                added to its success branch; returns the revision of the change.
            refusals: The errors of ``change`` after which the record is read
                (a retry of a call that did its work is refused with one of them).

        Returns:
            The revision of the change: this attempt's, or the first attempt's.

        Raises:
            RequestIdReused: the Txn was refused and another call wrote a record under ``request_id``.
            FencepostError: what ``change`` raised, when no record of this call is found.
        """
        for attempt in range(2):
            also = await self.ops_for(request_id, call)
            try:
                return await change(also)
            except refusals as exc:
                if also and not attempt and isinstance(exc, LeaseLost) and await self._records_lease_gone(also):
                    continue  # etcd refused the record's put: again, under a new records lease
                record = await self.outcome(request_id, call)
                if record is None:
                    raise
                _log.debug("%s %r with request id %s answered from its record (revision %d): %s",
                           call.method, call.name, request_id, record.revision, exc.message)
                return record.revision
        raise AssertionError("unreachable")  # the second attempt returns or raises

    async def claim(self, request_id: str, call: Call, outcome: Mapping[str, int]) -> Record | None:
        """Write ``call``'s record unless one is there (for a change etcd cannot make in a Txn: AdminRevoke).

        The record is written before the change; a retry that finds it
        answers from it (and may redo the change, which must then be safe to
        redo: revoking the same lease again).

        Args:
            request_id: The call's request id (checked already); "" for none.
            call: The call.
            outcome: What the call is about to do (AdminRevoke: the lease and token it revokes).

        Returns:
            None when this attempt wrote the record (or there is no request
            id): go on; else the earlier attempt's record: answer from it.

        Raises:
            RequestIdReused: another call wrote a record under ``request_id``.
            Unavailable: etcd unreachable.
        """
        if not request_id:
            return None
        key = self._keys.request_record(request_id)
        put = await self.ops_for(request_id, call, outcome)

        def decide(resp: Any) -> Record | None:
            if resp.succeeded:
                return None
            return self._same(request_id, call, resp.responses[0].response_range.kvs[0])

        def resolve(resp: Any) -> Record | None:
            kvs = resp.responses[0].response_range.kvs
            if not kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]
            record = self._same(request_id, call, kvs[0])
            return None if dict(record.outcome) == dict(outcome) else record  # ours (answer lost), or an earlier one

        return await self._etcd.txn(TxnPlan(etcdops.txn([etcdops.is_absent(key)], put, [etcdops.get(key)]),
                                            decide, [etcdops.get(key)], resolve,
                                            name=kinds.public_hold(call.name).name))

    async def close(self) -> None:
        """Stop a grant in flight. The records leases are left to expire (another replica may need the records)."""
        task, self._granting = self._granting, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    # ------------------------------------------------------------ internals

    def _same(self, request_id: str, call: Call, kv: Any) -> Record:
        """The record in ``kv`` if ``call`` wrote it; else RequestIdReused."""
        try:
            record = _decode(kv)
        except ValueError:
            record = None
        if record is None or record.call != call:
            first = f"{record.call.method} of {_shown(record.call.name)}" if record is not None else "another call"
            raise RequestIdReused(f"request_id {request_id} was used for {first}, not for this {call.method}: "
                                  "request ids must be unique per call", request_id=request_id,
                                  name=kinds.public_hold(call.name).name, lease_id=call.lease_id or None)
        return record

    async def _current_lease(self) -> int:
        """The records lease to write under: young enough, granting one (in the background when possible)."""
        now = self._clock()
        lease = self._lease
        if lease is not None and now - lease[1] < self._use:
            if now - lease[1] >= self._rotate and self._granting is None:
                self._start_grant()  # the current one still serves; the next call may use the new one
            return lease[0]
        if self._granting is None:
            self._start_grant()
        assert self._granting is not None
        left = deadline.left()  # the grant goes on for the next calls; this one waits until its own deadline
        try:
            lease_id, _ = await asyncio.wait_for(asyncio.shield(self._granting),
                                                 None if left is None else max(0.0, left))
        except TimeoutError:
            raise error_for(Failure.TIMEOUT, None, Op.LEASE_GRANT) from None
        return lease_id

    def _start_grant(self) -> None:
        with unbounded():  # not bounded by the deadline of the call that happened to start it
            task = asyncio.ensure_future(self._grant())
        self._granting = task

        def done(finished: asyncio.Task[tuple[int, float]]) -> None:
            if self._granting is finished:
                self._granting = None
            if finished.cancelled():
                return
            exc = finished.exception()
            if exc is not None:
                _log.warning("could not grant a records lease: %s", exc)
            else:
                self._lease = finished.result()

        task.add_done_callback(done)

    async def _grant(self) -> tuple[int, float]:
        sent = self._clock()
        lease_id, ttl = await self._etcd.lease_grant(self._ttl)
        if ttl < self._ttl:  # etcd never grants less than asked; if it did, use the lease for less time
            sent -= self._ttl - ttl
        # Its marker: tells a records lease from a caller's (etcdctl, the tests' look for leftover
        # leases), whether or not a record was written under it yet. Ends with the lease.
        marker = self._keys.records_lease_marker(lease_id)
        await self._etcd.txn(TxnPlan(etcdops.txn([], [etcdops.put(marker, lease_id=lease_id)]), lambda resp: None,
                                     [etcdops.get(marker, keys_only=True)],
                                     lambda resp: None if resp.responses[0].response_range.kvs else NOT_APPLIED))
        _log.debug("records lease %#x granted (TTL %d s)", lease_id, ttl)
        return lease_id, sent

    async def _records_lease_gone(self, also: Sequence[rpc_pb2.RequestOp]) -> bool:
        """After a LeaseLost: whether the records lease of ``also`` is gone (then it is dropped, and True)."""
        lease_id = int(also[0].request_put.lease)
        ttl, _ = await self._etcd.lease_ttl(lease_id)
        if ttl > 0:
            return False
        _log.warning("records lease %#x ended before its time (the coordinator stalled?); granting another",
                     lease_id)
        if self._lease is not None and self._lease[0] == lease_id:
            self._lease = None
        return True
