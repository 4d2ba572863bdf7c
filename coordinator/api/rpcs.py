"""What each LockService RPC needs before its body runs: one table, applied in one place.

Each row of :data:`RPCS` declares, for one RPC, the steps its request goes
through, always in this order:

1. **fields**: the request fields validated first (:data:`VALIDATORS`, in
   the row's order), so that bad input is INVALID_ARGUMENT naming the field
   whoever sends it;
2. **policy**: the access-policy ``action`` on the lock the field ``on``
   names (:mod:`..admission.access`; ``on`` None: a call that names no
   lock). An admin call (``audited``) needs a policy that grants it, and
   each refusal is audited (:mod:`.admin_calls`); ListLocks (``listing``)
   is refused only when the caller may describe no name under its prefix.
   Then a ``lock_delay_seconds`` above the caller's bound on the name is
   refused (:mod:`..admission.lock_delay_limit`);
3. **capacity**: a newcomer (``NEW``: a stream; ``LEASE``: a lease; ``WAIT``:
   a call that would wait) is refused while the coordinator is past its
   capacity, a lease also at the lease ceiling
   (:meth:`~..admission.capacity.Capacity.admit`, RESOURCE_EXHAUSTED /
   OVERLOADED): a cheap check, before anything reads etcd; and a newcomer
   (``drained``: a new lease or stream, an Acquire, AcquirePermit or
   Campaign) is refused while the coordinator drains before it stops
   (:mod:`..admission.drain`, UNAVAILABLE / DRAINING);
4. **token floor**: ``READY`` waits until the floor is known and refuses
   while tokens would go back (:meth:`~..recipes.tokens.TokenFloor.ready`);
   ``SERVING`` refuses only once tokens are known unsafe (LeaseGrant: a
   lease carries no token); none for the calls that only keep or remove
   state (LeaseRevoke, Withdraw, the admin ListSessions, ServerInfo);
5. **owner**: the caller must own ``request.lease_id``
   (:meth:`~..admission.ownership.Ownership.check_call`).

:func:`served` wraps a unary servicer method: it refuses a request that could
not be decoded, bounds the etcd calls by the caller's deadline, runs the
row's steps (:meth:`Admission.admit`), then the body; a FencepostError from
any of them ends the call with its status (:meth:`.status.Refusals.refuse`).
The streaming RPCs (Observe, KeepAlive) call :meth:`Admission.admit`
themselves. A new RPC is a row here and a short method in :mod:`.service`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from fencepost.client.errors import FencepostError, InvalidArgument

from ..admission.access import ACQUIRE, ADMIN, DESCRIBE, RELEASE, Access
from ..admission.capacity import Capacity
from ..admission.lock_delay_limit import LockDelayLimit
from ..admission.drain import Drain
from ..admission.ownership import Ownership
from ..etcd import bounded
from ..recipes.election import validate_election, validate_value
from ..recipes.lock_delay import validate_lock_delay
from ..recipes.multilock import validate_names
from ..recipes.requests import validate_request_id
from ..recipes.rwlock import validate_mode
from ..recipes.semaphore import validate_permits, validate_slot
from ..recipes.tokens import TokenFloor
from ..recipes.validate import validate_lease_id, validate_name, validate_token, wait_seconds
from .admin_calls import admit_admin
from .decode import Undecodable
from .stale_writes import validate_report
from .status import Refusals

__all__ = ["DEADLINE_MARGIN_SECONDS", "EVERY_NAME", "LEASE", "NEW", "READY", "RPCS", "SERVING", "VALIDATORS", "WAIT",
           "Admission", "Rpc", "served"]

R = TypeVar("R")

#: How long before the caller's gRPC deadline the etcd calls made for it end, in seconds (at most;
#: a fifth of the time left when that is less): time for the answer to reach the caller first.
DEADLINE_MARGIN_SECONDS = 0.5

#: Token floor steps: wait until it is known and safe; or refuse only once tokens are known unsafe.
READY = "ready"
SERVING = "serving"
#: Capacity steps: refused while past capacity always (a new lease or stream); or when it would wait.
NEW = "new"
#: ... and a new lease: also refused at the lease ceiling (see :mod:`..admission.capacity`).
LEASE = "lease"
WAIT = "wait"
#: ``on`` of a call on every lock name (ListSessions: every lease of every lock).
EVERY_NAME = "*"


def _after_revision(request: Any) -> None:
    if request.after_revision < 0:
        raise InvalidArgument(f"after_revision is {request.after_revision}; must be >= 0", field="after_revision")


#: Request field -> its check (raises InvalidArgument naming the field). ``token?``: a token that may be 0
#: (0: withdraw whatever the lease has there); ``wait``: wait_ms with wait_forever; ``lock_delay``:
#: lock_delay_seconds.
VALIDATORS: dict[str, Callable[[Any], object]] = {
    "name": lambda r: validate_name(r.name),
    "names": lambda r: validate_names(r.names, public=True),
    "lease_id": lambda r: validate_lease_id(r.lease_id),
    "token": lambda r: validate_token(r.token),
    "token?": lambda r: r.token and validate_token(r.token),
    "request_id": lambda r: validate_request_id(r.request_id),
    "wait": lambda r: wait_seconds(r.wait_ms, r.wait_forever),
    "lock_delay": lambda r: validate_lock_delay(r.lock_delay_seconds),
    "mode": lambda r: validate_mode(r.mode),
    "permits": lambda r: validate_permits(r.permits),
    "slot": lambda r: validate_slot(r.slot),
    "election": lambda r: validate_election(r.election),
    "value": lambda r: validate_value(r.value),
    "after_revision": _after_revision,
    "report": validate_report,
}


@dataclass(frozen=True)
class Rpc:
    """What one RPC needs before its body runs (see the module docstring for the order).

    Attributes:
        fields: the request fields checked first, in this order (keys of :data:`VALIDATORS`).
        action: the access-policy action (``acquire``, ``release``, ``describe``, ``admin``).
        on: the request field naming the lock the action is on; None for a call naming no lock;
            :data:`EVERY_NAME` for every name.
        listing: ``on`` is a prefix whose names the call lists (ListLocks).
        audited: for an admin call, its audited action (``revoke``, ``list_sessions``): it needs a policy.
        floor: :data:`READY`, :data:`SERVING` or None.
        capacity: :data:`NEW`, :data:`LEASE` (refused at the lease ceiling too), :data:`WAIT` (the request's
            ``wait_ms`` > 0 or ``wait_forever``) or None.
        owner: whether the caller must own ``request.lease_id``.
        drained: whether the call is refused while the coordinator drains (a newcomer: it starts something).
    """

    fields: tuple[str, ...] = ()
    action: str | None = None
    on: str | None = None
    listing: bool = False
    audited: str | None = None
    floor: str | None = None
    owner: bool = False
    capacity: str | None = None
    drained: bool = False


#: Every RPC of LockService, by method name.
RPCS: dict[str, Rpc] = {
    "LeaseGrant": Rpc(action=ACQUIRE, floor=SERVING, capacity=LEASE, drained=True),  # a lease is only good for acquiring
    "LeaseRevoke": Rpc(action=ACQUIRE, owner=True),
    # One keepalive (the HTTP API's, a script's): served as one on a stream is, past capacity and draining too.
    "LeaseKeepAlive": Rpc(("lease_id",), ACQUIRE, owner=True),
    "KeepAlive": Rpc(action=ACQUIRE, capacity=NEW, drained=True),
    "Acquire": Rpc(("name", "lease_id", "request_id", "wait", "lock_delay", "mode"), ACQUIRE, "name", floor=READY,
                   owner=True, capacity=WAIT, drained=True),
    "Release": Rpc(("name", "lease_id", "token", "request_id", "mode"), RELEASE, "name", floor=READY, owner=True),
    "Withdraw": Rpc(("name", "lease_id", "request_id", "mode"), ACQUIRE, "name", owner=True),
    # A caller's lock name: never an election's or a semaphore's internal one.
    "Describe": Rpc(("name",), DESCRIBE, "name", floor=READY),
    "ListLocks": Rpc(action=DESCRIBE, on="prefix", listing=True, floor=READY),
    "ServerInfo": Rpc(action=ADMIN),
    # AdminRevoke checks its name and kind after its admission, so that their refusal is audited.
    "AdminRevoke": Rpc(("request_id",), ADMIN, "name", audited="revoke", floor=READY),
    "ListSessions": Rpc(action=ADMIN, on=EVERY_NAME, audited="list_sessions"),
    # AdminEndLockDelay checks its name after its admission, so that its refusal is audited.
    "AdminEndLockDelay": Rpc((), ADMIN, "name", audited="end_lock_delay", floor=READY),
    "AcquirePermit": Rpc(("name", "lease_id", "permits", "request_id", "wait"), ACQUIRE, "name", floor=READY,
                         owner=True, capacity=WAIT, drained=True),
    "ReleasePermit": Rpc(("name", "lease_id", "slot", "token?", "request_id"), RELEASE, "name", floor=READY,
                         owner=True),
    "DescribeSemaphore": Rpc(("name",), DESCRIBE, "name", floor=READY),
    "Campaign": Rpc(("election", "lease_id", "value", "request_id", "wait"), ACQUIRE, "election", floor=READY,
                    owner=True, capacity=WAIT, drained=True),
    "Proclaim": Rpc(("election", "lease_id", "token", "value"), ACQUIRE, "election", floor=READY, owner=True),
    "Resign": Rpc(("election", "lease_id", "token?", "request_id"), RELEASE, "election", floor=READY, owner=True),
    "Leader": Rpc(("election",), DESCRIBE, "election", floor=READY),
    # Observe waits for the token floor once its stream counts against the stream limits (see .observe).
    "Observe": Rpc(("election", "after_revision"), DESCRIBE, "election"),
    # A multi-lock: its body checks the policy's action on each of its names (``on`` names one lock only).
    "AcquireAll": Rpc(("names", "lease_id", "request_id", "wait"), ACQUIRE, floor=READY, owner=True, capacity=WAIT,
                      drained=True),
    "ReleaseAll": Rpc(("names", "lease_id", "token?", "request_id"), RELEASE, floor=READY, owner=True),
    # A guard's refused write: who may take the lock may report it ("" names no lock: acquire on some name).
    "ReportStaleWrite": Rpc(("report",), ACQUIRE, "name"),
}


class Admission:
    """Applies an RPC's row of :data:`RPCS` to one call.

    Args:
        access: the access policy in force.
        owners: the ownership records of leases.
        tokens: the token floor.
        capacity: whether the coordinator is past its capacity; None: never.
        delay_limit: the longest lock-delay a caller may ask for (checked after the policy, for the rows
            with the field ``lock_delay``); None: the default ``--max-lock-delay``.
        drain: whether the coordinator drains before it stops; None: a new one, not draining.
    """

    def __init__(self, access: Access, owners: Ownership, tokens: TokenFloor, capacity: Capacity | None = None,
                 delay_limit: LockDelayLimit | None = None, drain: Drain | None = None) -> None:
        self.access = access
        self.owners = owners
        self.tokens = tokens
        self.capacity = capacity
        self.delay_limit = delay_limit if delay_limit is not None else LockDelayLimit(access)
        self.drain = drain if drain is not None else Drain()

    async def admit(self, rpc: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """Run the steps of ``rpc``'s row on ``request``; return when the call may run.

        Args:
            rpc: the method name (a key of :data:`RPCS`).
            request: the request message (None for KeepAlive, whose row reads no field).
            context: the call's context (its certificate, metadata and deadline).

        Raises:
            InvalidArgument: a field of ``fields`` (``lock_delay_seconds`` also above the caller's bound).
            AccessDenied: the policy does not allow the call (for an admin call: or there is no policy).
            ResourceExhausted: OVERLOADED, a newcomer while past capacity.
            Unavailable: DRAINING, a newcomer while the coordinator drains.
            DataLoss, Unavailable: the token floor refuses (tokens would go back, or etcd is unreachable).
            PermissionDenied: NOT_LEASE_OWNER.
        """
        row = RPCS[rpc]
        for name in row.fields:
            VALIDATORS[name](request)
        on = None if row.on in (None, EVERY_NAME) else getattr(request, row.on)
        if row.audited is not None:
            admit_admin(self.access, context, row.audited, on if on is not None else EVERY_NAME)
        elif row.listing:
            self.access.lister(context, on or "")
        elif row.action is not None:
            self.access.check(context, row.action, on or None)
        if "lock_delay" in row.fields and request.lock_delay_seconds:
            self.delay_limit.check(context, on, request.lock_delay_seconds)
        if row.capacity is not None and self.capacity is not None and (
                row.capacity in (NEW, LEASE) or request.wait_forever or request.wait_ms > 0):
            self.capacity.admit(rpc, lease=row.capacity == LEASE)
        if row.drained:
            self.drain.admit(rpc)
        if row.floor == READY:
            await self.tokens.ready()
        elif row.floor == SERVING:
            self.tokens.check_serving()
        if row.owner:
            await self.owners.check_call(context, request.lease_id, rpc)


class Served(Protocol):
    """A servicer whose methods :func:`served` wraps."""

    admission: Admission
    refusals: Refusals


def served(method: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]
           ) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """Wrap a unary servicer method: admission per its row of :data:`RPCS`, its body, failures to statuses.

    A request that could not be decoded (:class:`~.decode.Undecodable`: a
    string field that is not UTF-8, or bytes that are no protobuf) is refused
    as InvalidArgument naming the field (if any). The etcd calls made for the
    call end :data:`DEADLINE_MARGIN_SECONDS` before the caller's deadline, so
    that the caller hears why (UNAVAILABLE / ETCD_UNAVAILABLE) rather than
    its own DEADLINE_EXCEEDED.
    """
    rpc = method.__name__
    if rpc not in RPCS:
        raise ValueError(f"{rpc} has no row in RPCS")

    @functools.wraps(method)
    async def wrapper(self: Served, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            if isinstance(request, Undecodable):
                raise request.error()
            left = context.time_remaining()
            with bounded(None if left is None else left - min(DEADLINE_MARGIN_SECONDS, left / 5)):
                await self.admission.admit(rpc, request, context)
                return await method(self, request, context)
        except FencepostError as exc:
            await self.refusals.refuse(context, exc, rpc)
            raise  # unreachable: refuse raises

    return wrapper
