"""Coordinator errors and the one table that maps them to gRPC statuses.

Tree::

    LockServiceError            any failure a call reports to its caller
    ├── InvalidField            INVALID_ARGUMENT / INVALID_FIELD (names the field)
    ├── AcquireTimeout          DEADLINE_EXCEEDED / ACQUIRE_TIMEOUT
    ├── NotHolder               FAILED_PRECONDITION / NOT_HOLDER
    ├── StaleToken              FAILED_PRECONDITION / STALE_TOKEN
    ├── LeaseExpired            FAILED_PRECONDITION / LEASE_EXPIRED
    ├── TooManyWaiters          RESOURCE_EXHAUSTED / TOO_MANY_WAITERS
    ├── TooManyStreams          RESOURCE_EXHAUSTED / TOO_MANY_STREAMS
    ├── ShuttingDown            UNAVAILABLE / SHUTTING_DOWN
    └── EtcdUnavailable         UNAVAILABLE / ETCD_UNAVAILABLE (+ RetryInfo)

Every status carries one ``google.rpc.ErrorInfo`` (domain ``fencepost.dev``)
whose ``reason`` is the ``fencepost.v1.ErrorReason`` name, with metadata
``field``, ``name`` and ``lease_id`` where known.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "fencepost.dev"


class LockServiceError(Exception):
    """Base class: a failure reported to the caller as a gRPC status.

    Args:
        message: human-readable text (the status message).
        name: the lock name, when the error concerns one lock.
        lease_id: the lease id, when the error concerns one lease.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    reason: str = "ERROR_REASON_UNSPECIFIED"

    def __init__(self, message: str, *, name: str | None = None, lease_id: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.name = name
        self.lease_id = lease_id

    def metadata(self) -> dict[str, str]:
        """ErrorInfo metadata: the lock name and lease id where known."""
        meta: dict[str, str] = {}
        if self.name is not None:
            meta["name"] = self.name
        if self.lease_id is not None:
            meta["lease_id"] = str(self.lease_id)
        return meta

    def to_status(self) -> grpc.Status:
        """The gRPC status (code, message, ErrorInfo detail) for this error."""
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN, metadata=self.metadata())
        details = [_pack(info)]
        retry = self.retry_delay_seconds()
        if retry is not None:
            nanos = int(retry * 1e9)
            delay = duration_pb2.Duration(seconds=nanos // 10**9, nanos=nanos % 10**9)
            details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
        status = status_pb2.Status(code=_CODES[self.code], message=self.message, details=details)
        return rpc_status.to_status(status)

    def retry_delay_seconds(self) -> float | None:
        """Seconds a caller should wait before retrying, or None."""
        return None


class InvalidField(LockServiceError):
    """A request field is out of range.

    Args:
        field: the proto field name (``name``, ``ttl_seconds``, ``wait_ms``, ...).
        problem: what is wrong with it, e.g. ``must not be empty``.
    """

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_FIELD"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field

    def metadata(self) -> dict[str, str]:
        return {**super().metadata(), "field": self.field}


class AcquireTimeout(LockServiceError):
    """A blocking Acquire waited wait_ms without being granted."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = "ACQUIRE_TIMEOUT"


class NotHolder(LockServiceError):
    """The lease does not hold the lock."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "NOT_HOLDER"


class StaleToken(LockServiceError):
    """The lease holds the lock, but under a newer fencing token."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "STALE_TOKEN"


class LeaseExpired(LockServiceError):
    """The lease expired, was revoked or never existed."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "LEASE_EXPIRED"


class TooManyWaiters(LockServiceError):
    """This coordinator already has its maximum of queued Acquire calls."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_WAITERS"


class TooManyStreams(LockServiceError):
    """This coordinator already serves its maximum of KeepAlive streams."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_STREAMS"


class ShuttingDown(LockServiceError):
    """The coordinator is stopping; the caller should reconnect elsewhere."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "SHUTTING_DOWN"

    def retry_delay_seconds(self) -> float | None:
        return 0.1


class EtcdUnavailable(LockServiceError):
    """etcd is unreachable or has no quorum."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "ETCD_UNAVAILABLE"

    def retry_delay_seconds(self) -> float | None:
        return 1.0


def _pack(message: error_details_pb2.ErrorInfo | error_details_pb2.RetryInfo) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


_CODES = {code: getattr(code_pb2, code.name) for code in grpc.StatusCode}
