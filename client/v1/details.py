"""The details of a failed call: built by the coordinator, parsed by the client and the CLI.

Every failed call carries a ``google.rpc.Status`` (trailing metadata key
``grpc-status-details-bin``) with one ``google.rpc.ErrorInfo`` (domain
:data:`DOMAIN`, reason = an :data:`ErrorReason` name, metadata keys below)
and, for UNAVAILABLE, OVERLOADED and DRAINING, a ``google.rpc.RetryInfo``. ``proto/fencepost/v1/lock.proto``
documents the same keys. This module is the one place that knows that
encoding: :func:`status_for` builds it and :func:`parse` reads it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from .lock_pb2 import ErrorReason

__all__ = [
    "ACTION",
    "CODE_BY_REASON",
    "CURRENT_TOKEN",
    "DOMAIN",
    "ErrorReason",
    "FIELD",
    "LEASE_ID",
    "LIMIT",
    "NAME",
    "RETRY_DELAY_BY_REASON",
    "StatusDetails",
    "TOKEN",
    "VALUE",
    "PERMITS",
    "REQUEST_ID",
    "parse",
    "reason_name",
    "status_for",
]

DOMAIN = "fencepost.dev"
STATUS_DETAILS_KEY = "grpc-status-details-bin"

# ErrorInfo.metadata keys (lock.proto documents each).
FIELD = "field"
NAME = "name"
LEASE_ID = "lease_id"
TOKEN = "token"
CURRENT_TOKEN = "current_token"
ACTION = "action"
LIMIT = "limit"
VALUE = "value"
PERMITS = "permits"
REQUEST_ID = "request_id"

#: The gRPC status code of each reason: the one table both sides use.
CODE_BY_REASON: Mapping[int, grpc.StatusCode] = {
    ErrorReason.INVALID_FIELD: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.NOT_HOLDER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.STALE_TOKEN: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.LEASE_EXPIRED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.ACQUIRE_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorReason.ETCD_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.TOO_MANY_WAITERS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.TOO_MANY_STREAMS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.DATA_LOSS: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.ACCESS_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorReason.LIMIT_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.NOT_LEASE_OWNER: grpc.StatusCode.PERMISSION_DENIED,
    ErrorReason.PERMITS_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.REQUEST_ID_REUSED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.DRAINING: grpc.StatusCode.UNAVAILABLE,
}

#: Seconds a caller should wait before retrying, sent as RetryInfo.
RETRY_DELAY_BY_REASON: Mapping[int, float] = {
    ErrorReason.ETCD_UNAVAILABLE: 1.0,
    ErrorReason.SHUTTING_DOWN: 0.1,
    # Lasts until an operator recovers the tokens (minutes): no point in asking again sooner.
    ErrorReason.DATA_LOSS: 5.0,
    # Past capacity lasts seconds: long enough for the load to drain, short enough to be back soon.
    ErrorReason.OVERLOADED: 1.0,
    # A drain lasts seconds (``--drain-seconds``): another replica at once, or here again after it.
    ErrorReason.DRAINING: 1.0,
}


def reason_name(reason: int) -> str:
    """The name of an :data:`ErrorReason` value, as ErrorInfo.reason carries it (``"NOT_HOLDER"``)."""
    return ErrorReason.Name(reason)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StatusDetails:
    """What a failed call said, read by :func:`parse`.

    Attributes:
        code: The gRPC status code (None when the error had none).
        message: The status message (its first line is the human-readable text).
        reason: The ErrorReason name from ErrorInfo, None without ErrorInfo
            (the call never reached a coordinator, or the server was not one).
        metadata: The ErrorInfo metadata (keys :data:`FIELD`, :data:`NAME`, ...).
        retry_delay: RetryInfo's delay in seconds, None without RetryInfo.
    """

    code: grpc.StatusCode | None
    message: str
    reason: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    retry_delay: float | None = None

    def int_value(self, key: str) -> int | None:
        """A metadata value as an int, None when absent or not a number."""
        try:
            return int(self.metadata[key])
        except (KeyError, ValueError):
            return None


def status_for(reason: int, message: str, metadata: Mapping[str, str] | None = None, *,
               retry_delay: float | None = None) -> grpc.Status:
    """Build the gRPC status of a failure, for ``context.abort_with_status``.

    Args:
        reason: An :data:`ErrorReason` value; its code comes from :data:`CODE_BY_REASON`.
        message: The status message.
        metadata: ErrorInfo metadata; values must be strings.
        retry_delay: Seconds the caller should wait before retrying (RetryInfo);
            None: the reason's delay in :data:`RETRY_DELAY_BY_REASON`, if any.

    Returns:
        A ``grpc.Status`` carrying ErrorInfo and, where ``retry_delay`` or
        :data:`RETRY_DELAY_BY_REASON` gives one, RetryInfo.
    """
    from grpc_status import rpc_status

    info = error_details_pb2.ErrorInfo(reason=reason_name(reason), domain=DOMAIN, metadata=dict(metadata or {}))
    details = [_pack(info)]
    delay = retry_delay if retry_delay is not None else RETRY_DELAY_BY_REASON.get(reason)
    if delay is not None:
        nanos = int(delay * 1e9)
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=nanos // 10**9,
                                                                              nanos=nanos % 10**9))
        details.append(_pack(retry))
    code = CODE_BY_REASON[reason]
    return rpc_status.to_status(status_pb2.Status(code=getattr(code_pb2, code.name), message=message,
                                                  details=details))


def parse(err: grpc.RpcError) -> StatusDetails:
    """Read the code, message, ErrorInfo and RetryInfo of a failed call.

    Args:
        err: What a sync or asyncio stub call raised (``grpc.aio.AioRpcError``,
            or a ``grpc.RpcError`` that is also a ``grpc.Call``). Never raises:
            a malformed or missing status yields reason None.

    Returns:
        The call's details.
    """
    code_fn = getattr(err, "code", None)
    code = code_fn() if callable(code_fn) else None
    details_fn = getattr(err, "details", None)
    message = (details_fn() if callable(details_fn) else None) or (code.name if code is not None else "RPC failed")
    status = _status(err)
    if status is None:
        return StatusDetails(code, message)
    reason: str | None = None
    metadata: dict[str, str] = {}
    retry_delay: float | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR) and reason is None:
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason or None
            metadata = dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    return StatusDetails(code, message, reason, metadata, retry_delay)


def _status(err: grpc.RpcError) -> status_pb2.Status | None:
    trailing = getattr(err, "trailing_metadata", None)
    try:
        metadata: Any = trailing() if callable(trailing) else None
    except Exception:  # noqa: BLE001 - a broken call object must not hide the error
        return None
    for item in metadata or ():
        try:
            key, value = item[0], item[1]
        except (TypeError, IndexError):
            continue
        if key != STATUS_DETAILS_KEY:
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value if isinstance(value, bytes) else bytes(value))
        except Exception:  # noqa: BLE001 - undecodable details: fall back to the code
            return None
        return status
    return None


def _pack(message: error_details_pb2.ErrorInfo | error_details_pb2.RetryInfo) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed
