"""From a failed gRPC call to its :class:`~.errors.FencepostError`: the client's one boundary table.

:func:`from_rpc_error` reads the status details (:func:`fencepost.client.v1.details.parse`)
and picks the class by (status code, ErrorReason). Re-exported by :mod:`.errors`
(import it from there: this module needs the classes defined first).
"""

from __future__ import annotations

from typing import Any

import grpc

from .errors import (
    AccessDenied,
    DataLoss,
    FencepostError,
    InvalidArgument,
    LeaseLost,
    LimitExceeded,
    LockTimeout,
    NotHolder,
    NotLeaseOwner,
    PermissionDenied,
    PermitsMismatch,
    ResourceExhausted,
    StaleTokenError,
    Unavailable,
)
from .v1 import details
from .v1.details import ErrorReason, reason_name

__all__ = ["LOCK_SERVICE", "from_rpc_error", "not_served"]

# (status code, ErrorReason name or None) -> class. A (code, None) row is the
# fallback for that code whatever the reason.
_BY_STATUS: dict[tuple[grpc.StatusCode, str | None], type[FencepostError]] = {
    (grpc.StatusCode.INVALID_ARGUMENT, None): InvalidArgument,
    (grpc.StatusCode.DEADLINE_EXCEEDED, None): LockTimeout,
    (grpc.StatusCode.FAILED_PRECONDITION, reason_name(ErrorReason.NOT_HOLDER)): NotHolder,
    (grpc.StatusCode.FAILED_PRECONDITION, reason_name(ErrorReason.STALE_TOKEN)): StaleTokenError,
    (grpc.StatusCode.FAILED_PRECONDITION, reason_name(ErrorReason.LEASE_EXPIRED)): LeaseLost,
    (grpc.StatusCode.FAILED_PRECONDITION, reason_name(ErrorReason.PERMITS_MISMATCH)): PermitsMismatch,
    (grpc.StatusCode.UNAVAILABLE, reason_name(ErrorReason.DATA_LOSS)): DataLoss,
    (grpc.StatusCode.UNAVAILABLE, None): Unavailable,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, reason_name(ErrorReason.LIMIT_EXCEEDED)): LimitExceeded,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, None): ResourceExhausted,
    (grpc.StatusCode.PERMISSION_DENIED, reason_name(ErrorReason.ACCESS_DENIED)): AccessDenied,
    (grpc.StatusCode.PERMISSION_DENIED, reason_name(ErrorReason.NOT_LEASE_OWNER)): NotLeaseOwner,
    (grpc.StatusCode.PERMISSION_DENIED, None): PermissionDenied,
}


#: The service every call mapped by :func:`from_rpc_error` belongs to.
LOCK_SERVICE = "fencepost.v1.LockService"


def not_served(address: str | None) -> str:
    """The message of an UNIMPLEMENTED answer to a LockService call from the server at ``address``."""
    server = f"the server at {address}" if address else "the server"
    return f"{server} does not serve {LOCK_SERVICE} (is it a health-only port, --health-listen?)"


def from_rpc_error(
    err: grpc.RpcError,
    *,
    name: str | None = None,
    lease_id: int | None = None,
    token: int | None = None,
    address: str | None = None,
) -> FencepostError:
    """Translate a failed gRPC call into a :class:`FencepostError` subclass.

    Reads the call's status details with :func:`fencepost.client.v1.details.parse`
    and picks the class from the (code, reason) table. The caller raises the
    result ``from err``.

    Args:
        err: A ``grpc.aio.AioRpcError``, or a ``grpc.RpcError`` that is also a
            ``grpc.Call`` (anything exposing ``code()``, ``details()`` and
            ``trailing_metadata()``).
        name: The lock name of the call, used when the server did not send one.
        lease_id: The lease id of the call, used when the server did not send one.
        token: The fencing token the call carried, used when the server did not send one.
        address: The address of the server that answered, for the message
            of an UNIMPLEMENTED answer: a server that is not a coordinator,
            such as a coordinator's health-only port (``--health-listen``),
            answers every LockService call so (gRPC's words: "Method not found!").

    Returns:
        The exception to raise (not raised here). Its ``__cause__`` is not set.
    """
    status = details.parse(err)
    code, reason = status.code, status.reason
    message = status.message
    if code == grpc.StatusCode.UNIMPLEMENTED and reason is None:
        message = not_served(address)
    elif code == grpc.StatusCode.UNAVAILABLE and "http1.x server" in message:
        message += " (is it a coordinator's HTTP port, --http-listen? this client speaks gRPC, to --listen)"
    server_lease = status.int_value(details.LEASE_ID)
    common: dict[str, Any] = {
        "name": status.metadata.get(details.NAME) or name,
        "lease_id": server_lease if server_lease is not None else lease_id,
        "reason": reason,
        "code": code,
    }
    cls: type[FencepostError] = FencepostError
    if code is not None:
        cls = _BY_STATUS.get((code, reason)) or _BY_STATUS.get((code, None)) or FencepostError
    sent_token = status.int_value(details.TOKEN)
    tokens = {"token": sent_token if sent_token is not None else token,
              "current_token": status.int_value(details.CURRENT_TOKEN)}
    exc: FencepostError
    if cls is InvalidArgument:
        exc = InvalidArgument(message, field=status.metadata.get(details.FIELD), **common)
    elif cls is StaleTokenError:
        exc = StaleTokenError(message, **tokens, **common)
    elif cls is NotHolder:
        exc = NotHolder(message, **tokens, **common)
    elif cls is AccessDenied:
        exc = AccessDenied(message, action=status.metadata.get(details.ACTION), **common)
    elif cls is Unavailable or cls is DataLoss:
        exc = cls(message, retry_delay=status.retry_delay, **common)
    elif cls is PermitsMismatch:
        exc = PermitsMismatch(message, permits=status.int_value(details.PERMITS), **common)
    elif cls is LimitExceeded:
        exc = LimitExceeded(message, limit=status.metadata.get(details.LIMIT), value=status.metadata.get(details.VALUE),
                            retry_delay=status.retry_delay, **common)
    elif cls is ResourceExhausted:
        exc = ResourceExhausted(message, retry_delay=status.retry_delay, **common)
    else:
        exc = cls(message, **common)
    exc.reason = reason  # exactly what the server said: None when the call never reached a coordinator
    return exc
