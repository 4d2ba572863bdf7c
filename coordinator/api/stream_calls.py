"""Acquire, Release and Withdraw sent as messages on a KeepAlive stream.

A lock cycle made of two unary calls costs two gRPC calls' setup on both
sides; as messages on the client's existing KeepAlive stream it costs one
message each way per call (grpc.aio here: about 4,900 unary calls/s against
17,900 stream messages/s). The calls on the stream are served by the very
same servicer methods as the unary calls (``LockService.Acquire`` and its
siblings), each given a :class:`StreamCallContext`: the few things those
methods read of a ``grpc.aio.ServicerContext`` (the caller's address and
certificate, the call's metadata, its deadline), taken from the stream and
from the message. So the checks (access policy, ownership, limits, token
floor), the logs, the metrics and the errors are the unary calls' own; an
abort becomes a :class:`CallAborted` that the stream answers as
``KeepAliveResponse.failed`` with the same status (code, message, and the
``google.rpc.Status`` details the unary call carries in its trailer).

See the ``KeepAlive`` comment in proto/fencepost/v1/lock.proto for the
protocol: request ids, ``timeout_ms``, ``cancel``, the initial metadata that
announces the calls, and the watch a grant on the stream starts.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from fencepost.client.errors import InvalidArgument
from fencepost.client.v1 import lock_pb2

from ..admission.ownership import SECRET_METADATA

__all__ = ["CALLS", "CALLS_METADATA", "CallAborted", "StreamCallContext", "call_context", "failed", "invalid",
           "wrapped_calls"]

#: The service whose methods the calls on the stream are.
SERVICE = "fencepost.v1.LockService"

#: The initial metadata entry by which a coordinator announces what it serves on the stream beyond keepalive,
#: watch and unwatch: the calls, batches of keepalives (``keepalives``, see :mod:`.renewals`) and batches of
#: calls (``calls``: KeepAliveRequest.calls, each entry served as the call it carries).
CALLS_METADATA = ("fencepost-stream-calls", "acquire,release,withdraw,keepalives,calls")

#: KeepAliveRequest field -> (servicer method name, KeepAliveResponse field of its answer).
CALLS: dict[str, tuple[str, str]] = {
    "acquire": ("Acquire", "acquired"),
    "release": ("Release", "released"),
    "withdraw": ("Withdraw", "withdrawn"),
}


class CallAborted(Exception):
    """A call on the stream ended with a status other than OK (the servicer called ``abort_with_status``).

    Attributes:
        status: the gRPC status the unary call would have ended with.
    """

    def __init__(self, status: grpc.Status) -> None:
        super().__init__(status.details)
        self.status = status


class StreamCallContext:
    """What the LockService servicer reads of a ``grpc.aio.ServicerContext``, for one call on a stream.

    Args:
        peer: the stream's ``context.peer()``.
        auth: the stream's ``context.auth_context()`` (its client certificate).
        metadata: the call's metadata: its lease secret and ``traceparent``, as
            (key, value) pairs, as a unary call would have sent them.
        deadline: the ``time.monotonic()`` reading at which the caller stops
            waiting for the answer; None for no bound.
    """

    __slots__ = ("_auth", "_code", "_deadline", "_details", "_metadata", "_peer", "_trailing")

    def __init__(self, peer: str, auth: Any, metadata: Sequence[tuple[str, str]], deadline: float | None) -> None:
        self._peer = peer
        self._auth = auth
        self._metadata = tuple(metadata)
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None
        self._trailing: tuple[tuple[str, Any], ...] = ()

    def peer(self) -> str:
        """The client's address, as the stream's context gives it."""
        return self._peer

    def auth_context(self) -> Any:
        """The stream's authentication context (the verified client certificate, if any)."""
        return self._auth

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The call's metadata: ``fencepost-lease-secret`` and ``traceparent`` when the message carried them."""
        return self._metadata

    def time_remaining(self) -> float | None:
        """Seconds left before the caller's deadline (>= 0), or None without one."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def abort_with_status(self, status: grpc.Status) -> None:
        """End the call with ``status``: raises :class:`CallAborted`, answered as ``failed`` on the stream."""
        self._code, self._details, self._trailing = status.code, status.details, tuple(status.trailing_metadata or ())
        raise CallAborted(status)

    def code(self) -> grpc.StatusCode | None:
        """The status code the call was aborted with; None while it was not (the interceptors read it)."""
        return self._code

    def details(self) -> str | None:
        """The status message the call was aborted with, or None."""
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        """The trailing metadata of the abort (``grpc-status-details-bin``), or ()."""
        return self._trailing


Handler = Callable[[Any, Any], Awaitable[Any]]


def wrapped_calls(service: Any, interceptors: Sequence[Any]) -> dict[str, Handler]:
    """The servicer's methods for the calls on the stream, each wrapped by the server's interceptors.

    So that a call on the stream is traced (a SERVER span, child of its
    ``traceparent``) and counted (``grpc_server_*`` under its unary twin's
    method) exactly as the unary call would be.

    Args:
        service: the LockService servicer.
        interceptors: the server's interceptors, outermost first
            (:class:`~..telemetry.interceptor.WrappingInterceptor` subclasses; others are skipped).

    Returns:
        Method name (``"Acquire"``, ...) -> ``async (request, context) -> response``.
    """
    from ..telemetry.interceptor import WrappingInterceptor

    calls: dict[str, Handler] = {}
    for method, _ in CALLS.values():
        handler = grpc.unary_unary_rpc_method_handler(getattr(service, method))
        for interceptor in reversed(interceptors):
            if isinstance(interceptor, WrappingInterceptor):
                handler = interceptor.wrapped_handler(f"/{SERVICE}/{method}", handler)
        calls[method] = handler.unary_unary
    return calls


def call_context(auth: Any, peer: str, request: lock_pb2.KeepAliveRequest | lock_pb2.StreamCall
                 ) -> StreamCallContext:
    """The context of the call carried by ``request`` on a KeepAlive stream.

    Args:
        auth: the stream's ``context.auth_context()`` (its client certificate:
            the same for every call of the stream, read once per stream).
        peer: the stream's peer address.
        request: the message, or the entry of a batch of calls (its
            ``lease_secret``, ``traceparent``, ``timeout_ms``).

    Raises:
        InvalidArgument: ``timeout_ms`` below 0 (field ``timeout_ms``).
    """
    if request.timeout_ms < 0:
        raise InvalidArgument(f"timeout_ms must be >= 0, got {request.timeout_ms}", field="timeout_ms")
    metadata = []
    if request.lease_secret:
        metadata.append((SECRET_METADATA, request.lease_secret))
    if request.traceparent:
        metadata.append(("traceparent", request.traceparent))
    deadline = time.monotonic() + request.timeout_ms / 1000 if request.timeout_ms else None
    return StreamCallContext(peer, auth, metadata, deadline)


def failed(status: grpc.Status) -> lock_pb2.CallFailed:
    """The ``failed`` answer to a call that ended with ``status``."""
    details = b""
    for key, value in status.trailing_metadata or ():
        if key == "grpc-status-details-bin":
            details = bytes(value)
    return lock_pb2.CallFailed(code=status.code.value[0], message=status.details or "", status=details)


def invalid(exc: InvalidArgument) -> lock_pb2.CallFailed:
    """The ``failed`` answer (INVALID_ARGUMENT naming the field) to a call message the stream refuses itself."""
    from .status import to_status

    return failed(to_status(exc))
