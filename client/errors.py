"""The exceptions of Fencepost: one tree for the client, the guards and the coordinator.

Every error derives from one base class and carries the lock name and/or
lease id it concerns, its reason (an ``ErrorReason`` name from
``proto/fencepost/v1/lock.proto``, or a client-local one such as
``"DEADLINE"``) and, when it came from a server, the gRPC status code
(chained ``from`` the gRPC error)::

    FencepostError                 base class: .name .lease_id .reason .code
     ├── InvalidArgument           a bad name, TTL, timeout, token or identifier
     │                             (.field); also a ValueError
     ├── LockHeld                  try_acquire found the lock held (reason
     │                             LOCK_HELD; .holder_lease_id, .holder_token)
     ├── LockTimeout               a blocking acquire ran out of time
     ├── LeaseLost                 the lease behind a hold is gone, or its
     │                             local deadline passed
     ├── NotHolder                 the lease does not hold the lock
     │                             (.token, .current_token)
     ├── PermitsMismatch           a semaphore asked for with another number of
     │                             permits than it has (.permits)
     ├── StaleTokenError           a token lower than the newest one: the
     │                             lock is held under a newer token, or a
     │                             fencing guard refused a write
     │                             (.token, .current_token, .record)
     ├── MissingRecordError        a guard's update found no such record
     │                             (.record); also a LookupError
     ├── Unavailable               no coordinator, or etcd without quorum
     │   │                         (.retry_delay)
     │   ├── TlsError              the TLS handshake with a coordinator failed
     │   │                         (.address, .cause)
     │   ├── OutcomeUnknown        a call that changes state was sent, but no
     │   │                         answer settled it in time (.method .request_id)
     │   └── DataLoss              etcd's revisions went back (restored from an
     │                             older snapshot): no token is granted until an
     │                             operator recovers the tokens
     ├── ResourceExhausted         too many waiters, streams or calls, or past
     │   │                         capacity (OVERLOADED, .retry_delay); the S3
     │   │                         guard's conditional writes kept losing
     │   └── LimitExceeded         a coordinator's limit on the caller or the
     │                             lease (.limit .value .retry_delay)
     └── PermissionDenied          the coordinator refuses this caller
         ├── AccessDenied          its access policy does not let the caller's
         │                         identity take this action on this lock name
         │                         (.action)
         └── NotLeaseOwner         the lease is another caller's
                                   (NOT_LEASE_OWNER)

The coordinator raises these same classes and turns them into gRPC statuses
(``fencepost.coordinator.api.status``); the client turns a failed call back into
one with :func:`from_rpc_error`. Both use the one table of status codes in
:mod:`fencepost.client.v1.details`.
"""

from __future__ import annotations

from typing import Any

import grpc

from .v1.details import ErrorReason, reason_name

__all__ = [
    "FencepostError", "InvalidArgument", "LockHeld", "LockTimeout", "LeaseLost", "NotHolder", "StaleTokenError",
    "PermitsMismatch", "MissingRecordError", "Unavailable", "TlsError", "DataLoss", "ResourceExhausted",
    "PermissionDenied", "AccessDenied", "LimitExceeded", "NotLeaseOwner", "OutcomeUnknown", "from_rpc_error",
    "REASON_CLOSED", "REASON_FORKED", "REASON_DEADLINE", "REASON_LOCK_HELD", "REASON_OUTCOME_UNKNOWN",
]

# The client-local reasons: not ErrorReason values, never sent by a server.
#: The hold's local deadline (send time of the last acknowledged keepalive +
#: TTL - margin) passed: the lease must be assumed gone.
REASON_DEADLINE = "DEADLINE"
#: The client was closed while the hold was live.
REASON_CLOSED = "CLOSED"
#: The client or handle was inherited through fork, or a client was made in
#: a child forked from a process that had one (see docs/python.md, "fork and
#: multiprocessing").
REASON_FORKED = "FORKED"
#: A call that changes state was sent and may have been applied, but no answer said so in time.
REASON_OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
#: A try-acquire found the lock (the election, every permit) held: the coordinator's answer was not an
#: error (``acquired = false``); the coordinator's metrics and logs count it under this same word.
REASON_LOCK_HELD = "LOCK_HELD"


class FencepostError(Exception):
    """Base class of every error Fencepost raises.

    Args:
        message: Human-readable description.
        name: The lock name concerned, when known.
        lease_id: The lease id concerned, when known.
        reason: An ``ErrorReason`` name (``"NOT_HOLDER"``), or a client-local
            reason (``"DEADLINE"``); by default the class's own reason.
        code: The gRPC status code when the error came from a server.
    """

    #: The ErrorReason of this class when none is given (None: no reason).
    default_reason: int | None = None

    def __init__(
        self,
        message: str = "",
        *,
        name: str | None = None,
        lease_id: int | None = None,
        reason: str | None = None,
        code: grpc.StatusCode | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.name = name
        self.lease_id = lease_id
        if reason is None and self.default_reason is not None:
            reason = reason_name(self.default_reason)
        self.reason = reason
        self.code = code

    def __str__(self) -> str:
        parts = [self.message or type(self).__name__]
        if self.name is not None:
            parts.append(f"name={self.name!r}")
        if self.lease_id is not None:
            parts.append(f"lease_id={self.lease_id}")
        if self.reason is not None:
            parts.append(f"reason={self.reason}")
        return " ".join(parts)


class InvalidArgument(FencepostError, ValueError):
    """A request field or argument is out of range (checked locally or by the server).

    Attributes:
        field: The offending field or argument (``"ttl"``, ``"name"``,
            ``"timeout"``, ``"token"``, ``"table"``, or the wire field the
            server named, such as ``"ttl_seconds"``).
    """

    default_reason = ErrorReason.INVALID_FIELD

    def __init__(self, message: str = "", *, field: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.field = field


class LockHeld(FencepostError):
    """``try_acquire`` found the lock held by another grant (reason ``LOCK_HELD``).

    Also raised by a semaphore's ``try_acquire`` when every permit is held,
    by ``try_acquire`` of a lock this client holds already under the same
    TTL, and for a free lock whose lost holder's lock-delay has not passed
    (holder unknown: ``holder_lease_id`` 0).

    Attributes:
        holder_lease_id: The holder's lease id (0 when unknown).
        holder_token: The holder's fencing token (0 when unknown).
    """

    def __init__(self, message: str = "", *, holder_lease_id: int = 0, holder_token: int = 0,
                 **kwargs: Any) -> None:
        kwargs.setdefault("reason", REASON_LOCK_HELD)
        super().__init__(message, **kwargs)
        self.holder_lease_id = holder_lease_id
        self.holder_token = holder_token


class LockTimeout(FencepostError):
    """A blocking acquire did not get the lock within its timeout."""

    default_reason = ErrorReason.ACQUIRE_TIMEOUT


class LeaseLost(FencepostError):
    """The lease behind a hold is gone (expired, revoked, or past its local deadline)."""

    default_reason = ErrorReason.LEASE_EXPIRED


class NotHolder(FencepostError):
    """The lease does not hold the lock (released, lost, or never held).

    Attributes:
        token: The fencing token the call carried, when known.
        current_token: The token of the lock's current holder, when the lock
            is held and the server said so.
    """

    default_reason = ErrorReason.NOT_HOLDER

    def __init__(self, message: str = "", *, token: int | None = None, current_token: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.token = token
        self.current_token = current_token


class StaleTokenError(FencepostError):
    """A fencing token lower than the newest one was offered.

    Raised in two places, with the same attributes:

    - by the coordinator (reason ``STALE_TOKEN``): the lease holds the lock,
      but under a newer fencing token (``current_token``) than the one offered;
    - by a fencing guard (:mod:`fencepost.client.fencing`): the guarded
      record has accepted a higher token than the one the write carried, so
      the write was refused and the record left unchanged (reason
      ``STALE_TOKEN``; ``NOT_HOLDER`` from the etcd guard when the writer no
      longer holds the lock). ``record`` is then the record's key.

    Attributes:
        token: The offered (old) fencing token, when known.
        current_token: The newer fencing token (the lock's, or the highest
            the record has accepted), when known.
        record: The key of the guarded record that refused the write; None
            when the error came from the coordinator.
        storage: The kind of storage of the guard that refused the write
            (its ``storage`` metrics label: ``postgresql``, ``redis``, ...);
            None when the error came from the coordinator.
    """

    default_reason = ErrorReason.STALE_TOKEN

    def __init__(self, message: str = "", *, token: int | None = None, current_token: int | None = None,
                 record: object | None = None, storage: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.token = token
        self.current_token = current_token
        self.record = record
        self.storage = storage

    def __str__(self) -> str:
        text = super().__str__()
        if self.record is not None:
            text += f" record={self.record!r}"
        return text


class MissingRecordError(FencepostError, LookupError):
    """A guard's update found no record with that key (nothing was written).

    Attributes:
        record: The key that matched no record.
    """

    def __init__(self, message: str = "", *, record: object = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.record = record


class Unavailable(FencepostError):
    """No coordinator could be reached, or etcd is unreachable or has no quorum.

    Attributes:
        retry_delay: Seconds the server asked the caller to wait before
            retrying (its RetryInfo), None when it did not say.
    """

    default_reason = None

    def __init__(self, message: str = "", *, retry_delay: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_delay = retry_delay


class TlsError(Unavailable):
    """The TLS handshake with a coordinator failed: retrying will not help until certificates change.

    Raised by a client's calls (and ``connect()``) as soon as every
    coordinator address has failed its handshake, well before
    ``connect_timeout``: a certificate that does not verify stays so. The
    message names the address and the cause, e.g. ``TLS handshake with
    127.0.0.1:7420 failed: the coordinator's certificate is not signed by a
    CA in tls.ca (/etc/fencepost/ca.pem) (CERTIFICATE_VERIFY_FAILED: unable
    to get local issuer certificate)``. The client's KeepAlive stream does not
    raise it: it keeps reconnecting (certificates may be rotated) and logs
    the cause once.

    Attributes:
        address: The coordinator address whose handshake failed (the first
            one, when several did).
        cause: Why, in words: the coordinator's certificate is not signed by
            a trusted CA, has expired, does not carry the name checked; the
            coordinator requires a client certificate or refused the one
            given; one side does not speak TLS.
    """

    def __init__(self, message: str = "", *, address: str | None = None, cause: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.address = address
        self.cause = cause


class OutcomeUnknown(Unavailable):
    """A call that changes state (Release, ReleasePermit, Resign, Withdraw, AdminRevoke) may or may not have
    been applied: it was sent, and no answer settled it before the caller's deadline (reason
    ``OUTCOME_UNKNOWN``).

    Each lost answer (no answer within an attempt's time, a connection broken under the call) was followed
    by a retry with the same ``request_id``, which the coordinator answers from its record of the first
    attempt; none was answered in time. The hold a release concerned is kept as held (the lease's
    keepalives and the hold's watch still tell when it ends); calling again settles it.

    Attributes:
        method: The RPC (``"Release"``, ``"AdminRevoke"``, ...).
        request_id: The request id every attempt carried.
    """

    default_reason = None

    def __init__(self, message: str = "", *, method: str | None = None, request_id: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("reason", REASON_OUTCOME_UNKNOWN)
        super().__init__(message, **kwargs)
        self.method = method
        self.request_id = request_id


class DataLoss(Unavailable):
    """etcd's revisions went back, so the coordinator grants no token (reason ``DATA_LOSS``).

    etcd was restored from an older snapshot (or replaced by an older copy
    of its data, or by another cluster): its revisions, and so new fencing
    tokens, would restart below tokens already handed out. Every coordinator
    refuses Acquire, Release, Describe, ListLocks and LeaseGrant, with health
    NOT_SERVING, until an operator runs ``fencepost admin recover-tokens``
    (docs/deploy.md, "Restoring etcd from a snapshot"). Retrying helps only
    after that; ``retry_delay`` is the server's suggestion (5 s).
    """

    default_reason = ErrorReason.DATA_LOSS


class ResourceExhausted(FencepostError):
    """A coordinator limit was hit (too many waiters, streams or calls), or the coordinator is past its capacity.

    Reason ``OVERLOADED``: the call did nothing. The client's calls try the
    next address at once, and wait ``retry_delay`` once every address
    refused, while their time allows; then they raise this.

    Also raised by the S3 fencing guard when every one of its conditional
    writes lost to another write (``max_attempts``); nothing was written.

    Attributes:
        retry_delay: Seconds the server asked the caller to wait (RetryInfo); None when it did not say.
    """

    def __init__(self, message: str = "", *, retry_delay: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_delay = retry_delay


class PermissionDenied(FencepostError):
    """The coordinator refuses this caller (status PERMISSION_DENIED): retrying does not help.

    The base of the refusals that depend on who calls; :class:`AccessDenied`
    is the access policy's.
    """


class AccessDenied(PermissionDenied):
    """The coordinator's access policy does not let the caller take this action on this lock name.

    Reason ``ACCESS_DENIED``. The caller's identity is its client
    certificate's (SPIFFE ID, URI SAN, DNS SAN or subject CN); the message
    names it, the action and the lock name (docs/security.md, "Access policy").

    Attributes:
        action: The refused action: ``"acquire"``, ``"release"``,
            ``"describe"`` or ``"admin"``; None when the server did not say.
        identity: The caller's identity as the coordinator saw it; None
            without a client certificate, or (on the client side) not sent.
    """

    default_reason = ErrorReason.ACCESS_DENIED

    def __init__(self, message: str = "", *, action: str | None = None, identity: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.action = action
        self.identity = identity


class LimitExceeded(ResourceExhausted):
    """A coordinator refused the call at one of its limits on a caller or a lease (reason ``LIMIT_EXCEEDED``).

    The call did nothing: it may be sent again as it was once the limit
    allows. A rate limit (``lease-grant-rate``, ``acquire-rate``) allows again
    after ``retry_delay`` seconds: the client's calls wait that long and try
    again while their time allows, then raise this. The other limits
    (``max-leases-per-caller``, ``max-holds-per-lease``,
    ``max-streams-per-caller``, ``max-leases``) allow again only once the
    caller releases, revokes or closes something; they are not retried. See
    docs/operations.md, "Limits".

    Attributes:
        limit: The limit, as its ``fencepost serve`` flag without dashes
            (``"max-leases-per-caller"``); None when the server did not say.
        value: That limit's configured value, as the server sent it (``"1000"``,
            ``"100/s"``); None when it did not say.
        retry_delay: Seconds the server asked the caller to wait (RetryInfo), for a
            rate limit; None otherwise.
    """

    default_reason = ErrorReason.LIMIT_EXCEEDED

    def __init__(self, message: str = "", *, limit: str | None = None, value: str | None = None,
                 retry_delay: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, retry_delay=retry_delay, **kwargs)
        self.limit = limit
        self.value = value


class NotLeaseOwner(PermissionDenied):
    """The call named a live lease that is another caller's (status PERMISSION_DENIED); nothing changed.

    Reason ``NOT_LEASE_OWNER``: the call named a live lease (``lease_id``)
    that belongs to another caller: the caller's certificate identity is not
    the lease owner's, and it presented no lease secret or a wrong one
    (``LeaseGrantResponse.lease_secret``; the CLI's ``--lease-secret`` or
    ``FENCEPOST_LEASE_SECRET``). Retrying does not help.
    """

    default_reason = ErrorReason.NOT_LEASE_OWNER


class PermitsMismatch(FencepostError):
    """A semaphore was asked for with another number of permits than it has (reason ``PERMITS_MISMATCH``).

    A semaphore's number of permits is fixed at its first use. Retrying with
    the same number does not help.

    Attributes:
        permits: The semaphore's number of permits, as the server said; None when it did not say.
    """

    default_reason = ErrorReason.PERMITS_MISMATCH

    def __init__(self, message: str = "", *, permits: int | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.permits = permits


# The boundary table and from_rpc_error (in their own module: they need the classes above).
from ._rpc_errors import LOCK_SERVICE, from_rpc_error, not_served  # noqa: E402
