"""Exceptions raised by the Fencepost client.

Every error the client raises derives from one base class and carries the lock
name and/or lease id it concerns, the server's ErrorInfo reason and the gRPC
status code when it came from the server (chained with ``from`` the gRPC
error)::

    FencepostError                 base class: .name .lease_id .reason .code
     ├── InvalidArgument           a bad name, TTL or timeout (.field)
     ├── LockHeld                  try_acquire found the lock held
     │                             (.holder_lease_id, .holder_token)
     ├── LockTimeout               a blocking acquire ran out of time
     ├── LeaseLost                 the lease behind a hold is gone, or its
     │                             local deadline passed
     ├── NotHolder                 release of a lock this grant does not hold
     ├── StaleTokenError           a token lower than the newest one: the
     │                             lock is held under a newer token, or a
     │                             fencing guard refused a write
     │                             (.token, .current_token, .record)
     ├── Unavailable               no coordinator, or etcd without quorum
     └── ResourceExhausted         too many waiters, streams or calls

One table (:data:`_BY_STATUS`) maps a gRPC status code and ErrorInfo reason to
a class; :func:`from_rpc_error` applies it to a failed call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

__all__ = [
    "FencepostError",
    "InvalidArgument",
    "LockHeld",
    "LockTimeout",
    "LeaseLost",
    "NotHolder",
    "StaleTokenError",
    "Unavailable",
    "ResourceExhausted",
    "from_rpc_error",
]

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class FencepostError(Exception):
    """Base class of every error raised by the Fencepost client.

    Args:
        message: Human-readable description.
        name: The lock name concerned, when known.
        lease_id: The lease id concerned, when known.
        reason: The server's ErrorInfo reason (an ErrorReason name such as
            ``"NOT_HOLDER"``), or a local reason such as ``"DEADLINE"``;
            None when there is none.
        code: The gRPC status code when the error came from the server.
    """

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


class InvalidArgument(FencepostError):
    """A request field is out of range (client- or server-side).

    Attributes:
        field: The offending field or argument name (``"ttl"``, ``"name"``,
            ``"timeout"``, or the wire field named by the server).
    """

    def __init__(self, message: str = "", *, field: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.field = field


class LockHeld(FencepostError):
    """``try_acquire`` found the lock held by another grant.

    Attributes:
        holder_lease_id: The holder's lease id (0 when unknown).
        holder_token: The holder's fencing token (0 when unknown).
    """

    def __init__(
        self,
        message: str = "",
        *,
        holder_lease_id: int = 0,
        holder_token: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.holder_lease_id = holder_lease_id
        self.holder_token = holder_token


class LockTimeout(FencepostError):
    """A blocking acquire did not get the lock within its timeout."""


class LeaseLost(FencepostError):
    """The lease behind a hold is gone (expired, revoked, or past its local deadline)."""


class NotHolder(FencepostError):
    """The lease does not hold the lock (released, lost, or never held)."""


class StaleTokenError(FencepostError):
    """A fencing token lower than the newest one was offered.

    Raised in two places, with the same attributes:

    - by the coordinator (reason ``STALE_TOKEN``): the lease holds the lock,
      but under a newer fencing token than the one offered;
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
    """

    def __init__(
        self,
        message: str = "",
        *,
        token: int | None = None,
        current_token: int | None = None,
        record: object | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.token = token
        self.current_token = current_token
        self.record = record

    def __str__(self) -> str:
        text = super().__str__()
        if self.record is not None:
            text += f" record={self.record!r}"
        return text


class Unavailable(FencepostError):
    """No coordinator could be reached, or etcd is unreachable or has no quorum."""


class ResourceExhausted(FencepostError):
    """A coordinator limit was hit (too many waiters, streams or calls)."""


# (status code, ErrorInfo reason or None) -> class. A (code, None) row is the
# fallback for that code whatever the reason.
_BY_STATUS: dict[tuple[grpc.StatusCode, str | None], type[FencepostError]] = {
    (grpc.StatusCode.INVALID_ARGUMENT, None): InvalidArgument,
    (grpc.StatusCode.DEADLINE_EXCEEDED, None): LockTimeout,
    (grpc.StatusCode.FAILED_PRECONDITION, "NOT_HOLDER"): NotHolder,
    (grpc.StatusCode.FAILED_PRECONDITION, "STALE_TOKEN"): StaleTokenError,
    (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EXPIRED"): LeaseLost,
    (grpc.StatusCode.UNAVAILABLE, None): Unavailable,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, None): ResourceExhausted,
}


def _metadata_items(metadata: Any) -> Iterable[tuple[str, Any]]:
    if not metadata:
        return ()
    items = []
    for item in metadata:
        try:
            key, value = item[0], item[1]
        except (TypeError, IndexError):  # grpc.aio.Metadata yields (key, value) pairs
            continue
        items.append((key, value))
    return items


def _error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """Return the ErrorInfo packed in the call's google.rpc.Status, if any."""
    trailing = getattr(err, "trailing_metadata", None)
    if trailing is None:
        return None
    try:
        metadata = trailing()
    except Exception:  # noqa: BLE001 - a broken call object must not hide the error
        return None
    for key, value in _metadata_items(metadata):
        if key != _STATUS_DETAILS_KEY:
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value if isinstance(value, bytes) else bytes(value))
        except Exception:  # noqa: BLE001 - undecodable details: fall back to the code
            return None
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR):
                detail.Unpack(info)
                return info
    return None


def _int_or_none(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


def from_rpc_error(
    err: grpc.RpcError,
    *,
    name: str | None = None,
    lease_id: int | None = None,
    token: int | None = None,
) -> FencepostError:
    """Translate a failed gRPC call into a :class:`FencepostError` subclass.

    Reads the google.rpc.Status from the trailing metadata key
    ``grpc-status-details-bin`` and its ErrorInfo (reason, metadata "field",
    "name", "lease_id"), then picks the class from :data:`_BY_STATUS`. The
    caller raises the result ``from err``.

    Args:
        err: A ``grpc.aio.AioRpcError`` or a ``grpc.RpcError`` that is also a
            ``grpc.Call`` (anything exposing ``code()``, ``details()`` and
            ``trailing_metadata()``).
        name: The lock name of the call, used when the server did not send one.
        lease_id: The lease id of the call, used when the server did not send one.
        token: The fencing token the call carried (for StaleTokenError.token).

    Returns:
        The exception to raise (not raised here). Its ``__cause__`` is not set.
    """
    code_fn = getattr(err, "code", None)
    code = code_fn() if callable(code_fn) else None
    details_fn = getattr(err, "details", None)
    message = (details_fn() if callable(details_fn) else None) or str(code or "RPC failed")
    info = _error_info(err)
    reason = info.reason if info is not None and info.reason else None
    meta = dict(info.metadata) if info is not None else {}
    name = meta.get("name") or name
    server_lease = _int_or_none(meta.get("lease_id"))
    lease_id = server_lease if server_lease is not None else lease_id
    cls: type[FencepostError] = FencepostError
    if code is not None:
        cls = _BY_STATUS.get((code, reason)) or _BY_STATUS.get((code, None)) or FencepostError
    common: dict[str, Any] = {"name": name, "lease_id": lease_id, "reason": reason, "code": code}
    if cls is InvalidArgument:
        return InvalidArgument(message, field=meta.get("field"), **common)
    if cls is StaleTokenError:
        return StaleTokenError(
            message,
            token=_int_or_none(meta.get("token")) if "token" in meta else token,
            current_token=_int_or_none(meta.get("current_token")),
            **common,
        )
    return cls(message, **common)
