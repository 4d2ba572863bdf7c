"""Unit tests of the client's error table (from_rpc_error), on statuses built as the coordinator builds them.

Behaviour against a real coordinator is tested elsewhere (test_locks.py, tests/faults/).
"""

from __future__ import annotations


import grpc
import grpc.aio
import pytest

import fencepost.client as fc
from fencepost.client.errors import from_rpc_error
from fencepost.client.v1 import details
from fencepost.client.v1.details import ErrorReason, reason_name

from .client_fakes import (
    failed_call,
)


# ---------------------------------------------------------------- from_rpc_error's table


#: The class of each reason the coordinator can send (from_rpc_error's table, as the client sees it).
CLASS_BY_REASON: dict[int, type[fc.FencepostError]] = {
    ErrorReason.INVALID_FIELD: fc.InvalidArgument,
    ErrorReason.NOT_HOLDER: fc.NotHolder,
    ErrorReason.STALE_TOKEN: fc.StaleTokenError,
    ErrorReason.LEASE_EXPIRED: fc.LeaseLost,
    ErrorReason.ACQUIRE_TIMEOUT: fc.LockTimeout,
    ErrorReason.ETCD_UNAVAILABLE: fc.Unavailable,
    ErrorReason.TOO_MANY_WAITERS: fc.ResourceExhausted,
    ErrorReason.SHUTTING_DOWN: fc.Unavailable,
    ErrorReason.TOO_MANY_STREAMS: fc.ResourceExhausted,
    ErrorReason.DATA_LOSS: fc.DataLoss,
    ErrorReason.ACCESS_DENIED: fc.AccessDenied,
    ErrorReason.LIMIT_EXCEEDED: fc.LimitExceeded,
    ErrorReason.NOT_LEASE_OWNER: fc.NotLeaseOwner,
    ErrorReason.PERMITS_MISMATCH: fc.PermitsMismatch,
    ErrorReason.REQUEST_ID_REUSED: fc.InvalidArgument,
    ErrorReason.OVERLOADED: fc.ResourceExhausted,
    ErrorReason.DRAINING: fc.Unavailable,
}


@pytest.mark.parametrize(("reason", "expected"), CLASS_BY_REASON.items(), ids=[reason_name(r) for r in CLASS_BY_REASON])
def test_from_rpc_error_when_server_names_a_reason(reason: int, expected: type[fc.FencepostError]) -> None:
    """Each reason the coordinator sends maps to its class, keeping the reason name and the status code."""
    err = from_rpc_error(failed_call(reason))
    assert type(err) is expected
    assert err.reason == reason_name(reason)
    assert err.code is details.CODE_BY_REASON[reason]
    assert err.message == "server said no"


def test_from_rpc_error_when_table_covers_every_reason() -> None:
    """The table above names every reason the coordinator can send."""
    assert set(CLASS_BY_REASON) == set(details.CODE_BY_REASON)


def test_from_rpc_error_when_stale_token_carries_current_token() -> None:
    """A STALE_TOKEN refusal fills current_token from ErrorInfo; the offered token is the caller's."""
    err = from_rpc_error(failed_call(ErrorReason.STALE_TOKEN, current_token="12", name="inv:1", lease_id="7"),
                         token=9)
    assert isinstance(err, fc.StaleTokenError)
    assert (err.token, err.current_token, err.record) == (9, 12, None)
    assert (err.name, err.lease_id) == ("inv:1", 7)


def test_from_rpc_error_when_not_holder_carries_current_token() -> None:
    """A NOT_HOLDER refusal fills current_token (the holder's) and keeps the caller's token."""
    err = from_rpc_error(failed_call(ErrorReason.NOT_HOLDER, current_token="30"), name="n", lease_id=2, token=4)
    assert isinstance(err, fc.NotHolder)
    assert (err.token, err.current_token, err.name, err.lease_id) == (4, 30, "n", 2)


def test_from_rpc_error_when_not_holder_has_no_current_token() -> None:
    """Without current_token in ErrorInfo (the lock is free), current_token stays None."""
    err = from_rpc_error(failed_call(ErrorReason.NOT_HOLDER), token=4)
    assert isinstance(err, fc.NotHolder) and err.current_token is None


def test_from_rpc_error_when_access_denied_names_the_action() -> None:
    """An ACCESS_DENIED refusal is an AccessDenied (a PermissionDenied) with ErrorInfo's action and name."""
    err = from_rpc_error(failed_call(ErrorReason.ACCESS_DENIED, action="release", name="billing/a"), name="x")
    assert isinstance(err, fc.AccessDenied) and isinstance(err, fc.PermissionDenied)
    assert (err.action, err.name, err.identity) == ("release", "billing/a", None)


def test_from_rpc_error_when_metadata_names_field_lock_and_lease() -> None:
    """ErrorInfo field, name and lease_id land on the exception and win over the caller's values."""
    err = from_rpc_error(failed_call(ErrorReason.INVALID_FIELD, field="wait_ms", name="inv:1", lease_id="99"),
                         name="other", lease_id=1)
    assert isinstance(err, fc.InvalidArgument)
    assert (err.field, err.name, err.lease_id) == ("wait_ms", "inv:1", 99)


def test_from_rpc_error_when_limit_exceeded_carries_limit_value_and_retry_info() -> None:
    """A LIMIT_EXCEEDED refusal, as the coordinator builds it, gives LimitExceeded with limit, value and retry_delay."""
    from fencepost.coordinator.api.status import to_status

    sent = fc.LimitExceeded("limit max-acquire-rate (5/s) reached", name="n", lease_id=3, limit="max-acquire-rate",
                            value="5/s", retry_delay=0.2)
    status = to_status(sent)
    err = from_rpc_error(grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(),
                                              grpc.aio.Metadata(*status.trailing_metadata), details=status.details))
    assert isinstance(err, fc.LimitExceeded) and isinstance(err, fc.ResourceExhausted)
    assert (err.limit, err.value, err.name, err.lease_id) == ("max-acquire-rate", "5/s", "n", 3)
    assert err.retry_delay == pytest.approx(0.2)
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.reason == "LIMIT_EXCEEDED"
    counted = from_rpc_error(failed_call(ErrorReason.LIMIT_EXCEEDED, limit="max-leases", value="10"))
    assert isinstance(counted, fc.LimitExceeded) and counted.retry_delay is None
    assert (counted.limit, counted.value) == ("max-leases", "10")


def test_from_rpc_error_when_overloaded_carries_retry_info() -> None:
    """An OVERLOADED refusal, as the coordinator builds it, gives ResourceExhausted with the RetryInfo's delay."""
    from fencepost.coordinator.api.status import to_status

    status = to_status(fc.ResourceExhausted("past capacity", reason="OVERLOADED"))
    err = from_rpc_error(grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(),
                                              grpc.aio.Metadata(*status.trailing_metadata), details=status.details))
    assert type(err) is fc.ResourceExhausted and err.reason == "OVERLOADED"
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.retry_delay == pytest.approx(1.0)


def test_from_rpc_error_when_unavailable_carries_retry_info() -> None:
    """An UNAVAILABLE refusal carries the server's RetryInfo delay in seconds."""
    err = from_rpc_error(failed_call(ErrorReason.ETCD_UNAVAILABLE))
    assert isinstance(err, fc.Unavailable)
    assert err.retry_delay == pytest.approx(details.RETRY_DELAY_BY_REASON[ErrorReason.ETCD_UNAVAILABLE])


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, fc.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, fc.LockTimeout),
        (grpc.StatusCode.FAILED_PRECONDITION, fc.FencepostError),
        (grpc.StatusCode.PERMISSION_DENIED, fc.PermissionDenied),
    ],
)
def test_from_rpc_error_when_call_never_reached_a_coordinator(
    code: grpc.StatusCode, expected: type[fc.FencepostError]
) -> None:
    """Without status details the class follows the code alone, reason is None and the caller's ids are kept."""
    err = from_rpc_error(grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="x"),
                         name="a", lease_id=5)
    assert type(err) is expected
    assert (err.name, err.lease_id, err.reason, err.code) == ("a", 5, None, code)


def test_from_rpc_error_when_reason_is_unknown() -> None:
    """A FAILED_PRECONDITION with a reason this client does not know is the base class, reason kept."""
    info = details.status_for(ErrorReason.NOT_HOLDER, "m")
    trailing = [(k, v.replace(b"NOT_HOLDER", b"SOME_NEWER") if isinstance(v, bytes) else v)
                for k, v in info.trailing_metadata]
    err = from_rpc_error(grpc.aio.AioRpcError(info.code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing)))
    assert type(err) is fc.FencepostError
    assert err.reason == "SOME_NEWER"


def test_from_rpc_error_when_details_are_garbage() -> None:
    """Undecodable status details do not hide the error: the code still picks the class."""
    trailing = grpc.aio.Metadata((details.STATUS_DETAILS_KEY, b"\xff\x00"))
    err = from_rpc_error(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), trailing))
    assert type(err) is fc.Unavailable and err.reason is None


def test_from_rpc_error_when_permits_mismatch_carries_the_semaphores_permits() -> None:
    """A PERMITS_MISMATCH refusal is a PermitsMismatch with ErrorInfo's permits (the semaphore's)."""
    err = from_rpc_error(failed_call(ErrorReason.PERMITS_MISMATCH, permits="3", name="gpu"))
    assert isinstance(err, fc.PermitsMismatch) and (err.permits, err.name) == (3, "gpu")
