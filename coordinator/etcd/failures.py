"""What an etcd failure means, and what the coordinator does about it: two tables.

:data:`FAILURES` sorts a failed etcd call into a :class:`Failure` by its
gRPC status code and etcd's error message (the strings of etcd's
``api/v3rpc/rpctypes/error.go``). :data:`RULES` says, per operation, how
many times it is sent, after which failures it is sent again, and after
which its outcome is unknown and must be read back instead. :func:`error_for`
turns a failure that ends a call into the coordinator's error.

The split of etcd's own client (``client/v3/retry.go``): reads are
"repeatable" and re-sent on UNAVAILABLE; writes are not re-sent once they
may have reached etcd. We go one step further for writes: a Txn or
LeaseRevoke whose outcome is unknown (our deadline passed, the connection
broke, the member lost its leader after sending) is resolved by reading back
what it would have written, and only re-sent once that read shows it did
not apply; every Txn of the lock algorithm is guarded by compares that make
a late duplicate a no-op. A LeaseGrant is never re-sent (a duplicate would
be a second lease nobody keeps alive): the caller gets UNAVAILABLE.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from fencepost.client.errors import FencepostError, LeaseLost, Unavailable
from fencepost.client.v1 import details
from fencepost.client.v1.details import ErrorReason, reason_name

__all__ = ["FAILURES", "RULES", "UNKNOWN_OUTCOME", "EtcdRefused", "Failure", "Op", "Rule", "classify", "error_for",
           "etcd_refused", "etcd_unavailable"]


class EtcdRefused(Unavailable):
    """etcd refused the coordinator itself (its credentials, or its role's permissions), not a request.

    To the caller it is ETCD_UNAVAILABLE like an unreachable etcd; inside the
    coordinator it is told apart, because it lasts until etcd or the
    coordinator's settings change (it is logged once, not on every retry).
    """


def etcd_unavailable(message: str, *, name: str | None = None, lease_id: int | None = None) -> Unavailable:
    """The error for etcd unreachable or without quorum (UNAVAILABLE / ETCD_UNAVAILABLE)."""
    return Unavailable(message, name=name, lease_id=lease_id, reason=reason_name(ErrorReason.ETCD_UNAVAILABLE),
                       retry_delay=details.RETRY_DELAY_BY_REASON[ErrorReason.ETCD_UNAVAILABLE])


def etcd_refused(message: str, *, name: str | None = None, lease_id: int | None = None) -> EtcdRefused:
    """The error for etcd refusing the coordinator's credentials or permissions (UNAVAILABLE / ETCD_UNAVAILABLE)."""
    return EtcdRefused(message, name=name, lease_id=lease_id, reason=reason_name(ErrorReason.ETCD_UNAVAILABLE),
                       retry_delay=details.RETRY_DELAY_BY_REASON[ErrorReason.ETCD_UNAVAILABLE])


class Failure(enum.Enum):
    """What went wrong with one etcd call."""

    #: No answer from the member: no connection, connection lost, TLS handshake failed. Outcome unknown.
    UNREACHABLE = "unreachable"
    #: Our per-call deadline passed (a frozen member, or etcd slow). Outcome unknown.
    TIMEOUT = "timed out"
    #: etcd answered that it has no leader, or its proposal timed out. Outcome unknown.
    NO_LEADER = "no leader"
    #: etcd refused the request before applying it ("too many requests").
    BUSY = "busy"
    #: Our auth token was rejected (expired simple token or JWT, auth store changed): authenticate again.
    AUTH_EXPIRED = "auth token rejected"
    #: etcd refused our user and password (or auth is not enabled, or no such user).
    AUTH_FAILED = "authentication failed"
    #: Our etcd user lacks a role granting this key range.
    PERMISSION_DENIED = "permission denied"
    #: The lease does not exist (expired or revoked).
    LEASE_NOT_FOUND = "lease not found"
    #: The revision asked for has been compacted.
    COMPACTED = "compacted"
    #: Anything else: the request itself was refused (too large, no space, ...). Not retried.
    REJECTED = "rejected"


#: Failures after which a write may or may not have been applied.
UNKNOWN_OUTCOME = frozenset({Failure.UNREACHABLE, Failure.TIMEOUT, Failure.NO_LEADER})

#: (gRPC code, etcd message prefix or None) -> Failure; the first matching row wins.
#: A None message matches any message with that code.
FAILURES: tuple[tuple[grpc.StatusCode, str | None, Failure], ...] = (
    (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found", Failure.LEASE_NOT_FOUND),
    (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token", Failure.AUTH_EXPIRED),
    (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: revision of auth store is old", Failure.AUTH_EXPIRED),
    # The same refusals as etcd's auth store words them where etcd passes them on unmapped (UNKNOWN): a
    # JWT carries the auth store's revision it was issued at, and adding any user or role makes it old
    # ("auth: revision in header is old", etcd 3.5 server/auth/store.go ErrAuthOldRevision).
    (grpc.StatusCode.UNKNOWN, "auth: revision in header is old", Failure.AUTH_EXPIRED),
    (grpc.StatusCode.UNKNOWN, "etcdserver: revision of auth store is old", Failure.AUTH_EXPIRED),
    (grpc.StatusCode.UNKNOWN, "auth: invalid auth token", Failure.AUTH_EXPIRED),
    (grpc.StatusCode.UNKNOWN, "etcdserver: invalid auth token", Failure.AUTH_EXPIRED),
    (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: authentication failed", Failure.AUTH_FAILED),
    (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: authentication is not enabled", Failure.AUTH_FAILED),
    (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: user name not found", Failure.AUTH_FAILED),
    # Auth is enabled and the coordinator has no user (no token sent).
    (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty", Failure.AUTH_FAILED),
    (grpc.StatusCode.UNAUTHENTICATED, None, Failure.AUTH_FAILED),
    (grpc.StatusCode.PERMISSION_DENIED, None, Failure.PERMISSION_DENIED),
    (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader", Failure.NO_LEADER),
    (grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed", Failure.NO_LEADER),
    (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out", Failure.NO_LEADER),
    (grpc.StatusCode.UNAVAILABLE, "etcdserver: unhealthy cluster", Failure.NO_LEADER),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: too many requests", Failure.BUSY),
    (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted", Failure.COMPACTED),
    (grpc.StatusCode.UNAVAILABLE, None, Failure.UNREACHABLE),
    (grpc.StatusCode.CANCELLED, None, Failure.UNREACHABLE),
    (grpc.StatusCode.DEADLINE_EXCEEDED, None, Failure.TIMEOUT),
)


def classify(exc: grpc.RpcError) -> Failure:
    """The :class:`Failure` of a failed etcd call, from :data:`FAILURES` (REJECTED when no row matches).

    Args:
        exc: What the stub call raised (``grpc.aio.AioRpcError``).
    """
    code = exc.code()  # type: ignore[attr-defined]
    message = exc.details() or ""  # type: ignore[attr-defined]
    for row_code, prefix, failure in FAILURES:
        if code == row_code and (prefix is None or message.startswith(prefix)):
            return failure
    return Failure.REJECTED


class Op(enum.Enum):
    """The etcd operations the coordinator makes."""

    RANGE = "Range"
    TXN = "Txn"
    LEASE_GRANT = "LeaseGrant"
    LEASE_REVOKE = "LeaseRevoke"
    LEASE_TTL = "LeaseTimeToLive"
    KEEPALIVE = "LeaseKeepAlive"
    WATCH = "Watch"
    AUTHENTICATE = "Authenticate"
    HEALTH = "Range (health)"
    STATUS = "Status"


@dataclass(frozen=True)
class Rule:
    """How one operation is sent.

    Attributes:
        attempts: Sends at most (each to the current member, which moves on
            after a transport failure), with ``ETCD_BACKOFF`` between them.
        resend: Failures after which the request is sent again as it is.
        read_back: Failures after which the outcome is unknown: read back,
            and send again only if the read shows it was not applied.
        timeout: Per-call deadline, seconds (for KEEPALIVE: per answer on one stream).
    """

    attempts: int
    resend: frozenset[Failure]
    read_back: frozenset[Failure]
    timeout: float


_AGAIN = frozenset({Failure.BUSY, Failure.AUTH_EXPIRED})  # refused before applying: always safe
_READ = Rule(attempts=3, resend=UNKNOWN_OUTCOME | _AGAIN, read_back=frozenset(), timeout=5.0)

#: The retry policy, one row per operation. WATCH is restarted by its owner
#: (watch.py) with ETCD_BACKOFF for as long as the coordinator runs; its row
#: applies to each restart.
RULES: Mapping[Op, Rule] = {
    Op.RANGE: _READ,
    Op.LEASE_TTL: _READ,
    Op.AUTHENTICATE: _READ,
    Op.HEALTH: Rule(attempts=2, resend=UNKNOWN_OUTCOME | _AGAIN, read_back=frozenset(), timeout=1.0),
    Op.STATUS: Rule(attempts=2, resend=UNKNOWN_OUTCOME | _AGAIN, read_back=frozenset(), timeout=2.0),
    Op.KEEPALIVE: Rule(attempts=3, resend=UNKNOWN_OUTCOME | _AGAIN, read_back=frozenset(), timeout=0.5),
    Op.WATCH: Rule(attempts=1, resend=UNKNOWN_OUTCOME | _AGAIN | {Failure.COMPACTED}, read_back=frozenset(),
                   timeout=5.0),
    Op.TXN: Rule(attempts=3, resend=_AGAIN, read_back=UNKNOWN_OUTCOME, timeout=5.0),
    Op.LEASE_REVOKE: Rule(attempts=3, resend=_AGAIN, read_back=UNKNOWN_OUTCOME, timeout=5.0),
    Op.LEASE_GRANT: Rule(attempts=2, resend=_AGAIN, read_back=frozenset(), timeout=5.0),
}


def error_for(failure: Failure, exc: BaseException | None, op: Op, *, name: str | None = None,
              lease_id: int | None = None, user: str | None = None) -> FencepostError:
    """The coordinator's error for a failure that ends an etcd call.

    Args:
        failure: The classified failure.
        exc: The last gRPC error (its message is quoted), if any.
        op: The operation that failed.
        name: The lock name concerned, if any.
        lease_id: The lease concerned, if any.
        user: The coordinator's etcd user, named in auth errors.

    Returns:
        :class:`LeaseLost` for LEASE_NOT_FOUND; otherwise an Unavailable
        (ETCD_UNAVAILABLE): to the caller, etcd refusing the coordinator is
        the same as etcd being out of reach, and the message says which
        (inside the coordinator, a refusal is an :class:`EtcdRefused`).
    """
    said = exc.details() if isinstance(exc, grpc.RpcError) else (str(exc) if exc else "")  # type: ignore[attr-defined]
    if failure is Failure.LEASE_NOT_FOUND:
        who = f"lease {lease_id:#x}" if lease_id else "the lease"
        return LeaseLost(f"{who} has expired or was revoked", name=name, lease_id=lease_id)
    if failure is Failure.AUTH_FAILED and user is None:
        return etcd_refused(f"etcd refused the coordinator, which has no etcd user (--etcd-user): {said}",
                            name=name, lease_id=lease_id)
    if failure is Failure.AUTH_FAILED:
        return etcd_refused(f"etcd refused the coordinator's credentials (user {user!r}): {said}",
                            name=name, lease_id=lease_id)
    if failure is Failure.PERMISSION_DENIED:
        return etcd_refused(f"etcd: permission denied for the coordinator's user {user!r} on {op.value}: its "
                            f"role must grant readwrite on the lock prefix", name=name, lease_id=lease_id)
    if said:
        said = f": {said}"
    elif failure is Failure.TIMEOUT:
        said = " (no answer before the call's deadline)"
    return etcd_unavailable(f"etcd: {op.value} {failure.value}{said}", name=name, lease_id=lease_id)
