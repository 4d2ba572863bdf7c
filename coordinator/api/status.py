"""From the coordinator's errors to gRPC statuses: the one exit for every failure of a call.

The coordinator raises the same exception classes as the client
(:mod:`fencepost.client.errors`), each with an ``ErrorReason`` name in
``.reason``; :func:`to_status` turns one into its gRPC status with the
ErrorInfo (and RetryInfo) that :mod:`fencepost.client.v1.details` defines.
Which reason the coordinator uses where:

===========================  =================================================
raised as                    reason (status)
===========================  =================================================
InvalidArgument              INVALID_FIELD (INVALID_ARGUMENT), ``field`` set
LockTimeout                  ACQUIRE_TIMEOUT (DEADLINE_EXCEEDED)
NotHolder                    NOT_HOLDER (FAILED_PRECONDITION), ``current_token``
StaleTokenError              STALE_TOKEN (FAILED_PRECONDITION), ``current_token``
LeaseLost                    LEASE_EXPIRED (FAILED_PRECONDITION)
ResourceExhausted            TOO_MANY_WAITERS / TOO_MANY_STREAMS (RESOURCE_EXHAUSTED);
                             OVERLOADED (RESOURCE_EXHAUSTED + RetryInfo, :mod:`..admission.capacity`)
LimitExceeded                LIMIT_EXCEEDED (RESOURCE_EXHAUSTED), ``limit`` and ``value``
                             set, RetryInfo for a rate limit (:mod:`..admission.limits`)
NotLeaseOwner                NOT_LEASE_OWNER (PERMISSION_DENIED), ``lease_id`` set
Unavailable                  ETCD_UNAVAILABLE / SHUTTING_DOWN / DRAINING (UNAVAILABLE + RetryInfo,
                             DRAINING: :mod:`..admission.drain`)
AccessDenied                 ACCESS_DENIED (PERMISSION_DENIED), ``action`` set
PermitsMismatch              PERMITS_MISMATCH (FAILED_PRECONDITION), ``permits`` set
InvalidArgument(reason=...)  REQUEST_ID_REUSED (INVALID_ARGUMENT), ``field`` = "request_id"
===========================  =================================================

:class:`Refusals` ends a call with that status: counted in
``fencepost_refusals_total`` and logged as one ``refusal`` event (a refusal
at a limit, or past capacity, at most once per caller and limit every 10 s, see
:meth:`~..admission.limit_tracker.LimitTracker.log_refusal`).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from fencepost.client.errors import (
    AccessDenied,
    FencepostError,
    InvalidArgument,
    LimitExceeded,
    NotHolder,
    PermitsMismatch,
    ResourceExhausted,
    StaleTokenError,
    Unavailable,
)
from fencepost.client.v1 import details
from fencepost.client.v1.details import ErrorReason, reason_name

from ..admission.identity import caller_of
from ..admission.limit_tracker import LimitTracker
from ..telemetry.events import caller, log_event
from ..telemetry.metrics import NO_METRICS, LockMetrics

__all__ = ["Refusals", "reason_of", "shutting_down", "to_status"]

_log = logging.getLogger(__name__)

_OVERLOADED = reason_name(ErrorReason.OVERLOADED)
_DRAINING = reason_name(ErrorReason.DRAINING)


def reason_of(exc: FencepostError) -> int:
    """The ErrorReason that reports ``exc``: its ``.reason``, or ETCD_UNAVAILABLE for an Unavailable without one.

    Raises:
        ValueError: ``exc`` has no ErrorReason name and is not an Unavailable.
    """
    if exc.reason in ErrorReason.keys():
        return ErrorReason.Value(exc.reason)  # type: ignore[arg-type]
    if isinstance(exc, Unavailable):
        return ErrorReason.ETCD_UNAVAILABLE
    raise ValueError(f"{type(exc).__name__} has no ErrorReason to send: {exc.reason!r}")


def to_status(exc: FencepostError) -> grpc.Status:
    """The gRPC status (code, message, ErrorInfo, RetryInfo) that reports ``exc`` to the caller.

    Args:
        exc: An error raised while serving a call; its ``.reason`` must be an
            ErrorReason name (an Unavailable without one counts as ETCD_UNAVAILABLE).

    Returns:
        The status for ``context.abort_with_status``.

    Raises:
        ValueError: see :func:`reason_of`.
    """
    reason = reason_of(exc)
    metadata: dict[str, str] = {}
    if exc.name is not None:
        metadata[details.NAME] = exc.name
    if exc.lease_id is not None:
        metadata[details.LEASE_ID] = str(exc.lease_id)
    if isinstance(exc, InvalidArgument) and exc.field is not None:
        metadata[details.FIELD] = exc.field
    if isinstance(exc, (NotHolder, StaleTokenError)):
        if exc.token is not None:
            metadata[details.TOKEN] = str(exc.token)
        if exc.current_token is not None:
            metadata[details.CURRENT_TOKEN] = str(exc.current_token)
    if isinstance(exc, AccessDenied) and exc.action is not None:
        metadata[details.ACTION] = exc.action
    if isinstance(exc, PermitsMismatch) and exc.permits is not None:
        metadata[details.PERMITS] = str(exc.permits)
    request_id = getattr(exc, "request_id", None)  # REQUEST_ID_REUSED (coordinator.recipes.requests.RequestIdReused)
    if isinstance(exc, InvalidArgument) and request_id:
        metadata[details.REQUEST_ID] = str(request_id)
    retry_delay = exc.retry_delay if isinstance(exc, ResourceExhausted) else None
    if isinstance(exc, LimitExceeded):
        if exc.limit is not None:
            metadata[details.LIMIT] = exc.limit
        if exc.value is not None:
            metadata[details.VALUE] = exc.value
    return details.status_for(reason, exc.message, metadata, retry_delay=retry_delay)


def shutting_down() -> Unavailable:
    """The error for a call or stream refused because the coordinator is stopping."""
    return Unavailable("coordinator is shutting down", reason=reason_name(ErrorReason.SHUTTING_DOWN),
                       retry_delay=details.RETRY_DELAY_BY_REASON[ErrorReason.SHUTTING_DOWN])


class Refusals:
    """Ends refused calls: each with its status, counted, and logged once (a refusal at a limit: rate-limited).

    Args:
        metrics: counts each refusal by reason (``fencepost_refusals_total``).
        limits: says whether a refusal at a limit is logged now (one line per caller and limit per 10 s).
    """

    def __init__(self, metrics: LockMetrics = NO_METRICS, limits: LimitTracker | None = None) -> None:
        self._metrics = metrics
        self._limits = limits

    async def refuse(self, context: grpc.aio.ServicerContext, exc: FencepostError, call: str, *,
                     log: bool = True) -> None:
        """End the call with ``exc``'s status (this raises), counted in ``fencepost_refusals_total``.

        Args:
            context: the call's context (``abort_with_status`` ends it).
            exc: why it is refused.
            call: the RPC's name, for the ``refusal`` event.
            log: False for a stream the coordinator itself ends at shutdown (``stream_close`` says so).

        Raises:
            grpc.aio.AbortError: always (from ``context.abort_with_status``; a call on a KeepAlive
                stream raises :class:`~.stream_calls.CallAborted`).
        """
        status = to_status(exc)
        reason = reason_name(reason_of(exc))
        self._metrics.refused(reason)
        level, limited = logging.INFO, {}
        if log and (isinstance(exc, LimitExceeded) or reason in (_OVERLOADED, _DRAINING)) and self._limits is not None:
            who = caller_of(context)  # one line per caller and limit per 10 s: a loop must not flood
            if isinstance(exc, LimitExceeded):
                suppressed = self._limits.log_refusal(who.key, exc.limit)
                level, limited = logging.WARNING, {"limit": exc.limit, "value": exc.value, "identity": who.identity,
                                                   "suppressed": suppressed}
            else:  # past capacity or draining: the ``overloaded`` or ``drain`` event said so once
                suppressed = self._limits.log_refusal(who.key, reason)
                limited = {"suppressed": suppressed}
            log = suppressed is not None
        if log:
            identity = getattr(exc, "identity", None)
            if reason == reason_name(ErrorReason.NOT_LEASE_OWNER):
                identity = caller_of(context).identity
            fields: dict[str, Any] = {"action": getattr(exc, "action", None), "identity": identity, **limited}
            log_event(_log, level, "refusal", f"{call} refused: {reason}: {exc.message}", call=call,
                      reason=reason, name=exc.name, lease_id=exc.lease_id, token=getattr(exc, "token", None),
                      current_token=getattr(exc, "current_token", None), **fields, **caller(context))
        await context.abort_with_status(status)
