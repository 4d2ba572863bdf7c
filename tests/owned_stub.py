"""A LockService stub for tests that present each lease's secret, as the lease's owner does.

Since leases belong to their granter (issue 9), every raw call naming a lease
must carry its secret (LeaseGrantResponse.lease_secret): the metadata entry
``fencepost-lease-secret`` on unary calls, KeepAliveRequest.lease_secret on
the stream. :class:`OwnedStub` wraps the generated stub and does it: it keeps
the secret of each lease it (or any other OwnedStub of this process) granted,
and adds it to Acquire, Release, Withdraw, LeaseRevoke, LeaseKeepAlive and to keepalives and
watches. Everything else is the generated stub's. A test that plays another
caller uses the plain ``lock_pb2_grpc.LockServiceStub``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Generator, Iterable
from typing import Any

import grpc

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.coordinator.admission.ownership import SECRET_METADATA

#: lease id -> secret, of every lease granted through an OwnedStub in this process (lease ids are unique).
SECRETS: dict[int, str] = {}


def adopt(handle: Any) -> None:
    """Make OwnedStubs present the lease secret of a client library's lock handle (``.lease_id``, ``.lease_secret``)."""
    SECRETS[handle.lease_id] = handle.lease_secret


def secret_metadata(lease_id: int, metadata: Any = None) -> tuple[tuple[str, str], ...]:
    """``metadata`` (a sequence of pairs, or None) plus the secret entry of ``lease_id`` when it is known."""
    pairs = tuple(metadata or ())
    secret = SECRETS.get(lease_id)
    return pairs + ((SECRET_METADATA, secret),) if secret is not None else pairs


def with_secret(request: lock_pb2.KeepAliveRequest) -> lock_pb2.KeepAliveRequest:
    """``request`` with the lease_secret of the lease its keepalive or watch names (when known and not set)."""
    kind = request.WhichOneof("request")
    if kind not in ("keepalive", "watch") or request.lease_secret:
        return request
    secret = SECRETS.get(getattr(request, kind).lease_id)
    if secret is None:
        return request
    filled = lock_pb2.KeepAliveRequest()
    filled.CopyFrom(request)
    filled.lease_secret = secret
    return filled


class _Granting:
    """A LeaseGrant call that records the secret of the lease it grants (awaitable; else the call itself)."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __await__(self) -> Generator[Any, None, lock_pb2.LeaseGrantResponse]:
        response = yield from self._call.__await__()
        SECRETS[response.lease_id] = response.lease_secret
        return response  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class _Stream:
    """A KeepAlive call whose written messages carry their lease's secret."""

    def __init__(self, call: Any) -> None:
        self._call = call

    async def write(self, request: lock_pb2.KeepAliveRequest) -> None:
        await self._call.write(with_secret(request))

    def __aiter__(self) -> Any:
        return self._call.__aiter__()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


async def _filled(requests: AsyncIterable[lock_pb2.KeepAliveRequest] | Iterable[lock_pb2.KeepAliveRequest]) -> Any:
    if isinstance(requests, AsyncIterable):
        async for request in requests:
            yield with_secret(request)
    else:
        for request in requests:
            yield with_secret(request)


class OwnedStub:
    """A ``LockServiceStub`` on ``channel`` that presents the secrets of the leases it knows.

    Args:
        channel: a grpc.aio channel to a coordinator.
    """

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = lock_pb2_grpc.LockServiceStub(channel)

    def LeaseGrant(self, request: lock_pb2.LeaseGrantRequest, **kwargs: Any) -> Any:  # noqa: N802
        return _Granting(self._stub.LeaseGrant(request, **kwargs))

    def LeaseRevoke(self, request: lock_pb2.LeaseRevokeRequest, *, metadata: Any = None,  # noqa: N802
                    **kwargs: Any) -> Any:
        return self._stub.LeaseRevoke(request, metadata=secret_metadata(request.lease_id, metadata), **kwargs)

    def LeaseKeepAlive(self, request: lock_pb2.LeaseKeepAliveRequest, *, metadata: Any = None,  # noqa: N802
                       **kwargs: Any) -> Any:
        return self._stub.LeaseKeepAlive(request, metadata=secret_metadata(request.lease_id, metadata), **kwargs)

    def Acquire(self, request: lock_pb2.AcquireRequest, *, metadata: Any = None, **kwargs: Any) -> Any:  # noqa: N802
        return self._stub.Acquire(request, metadata=secret_metadata(request.lease_id, metadata), **kwargs)

    def Release(self, request: lock_pb2.ReleaseRequest, *, metadata: Any = None, **kwargs: Any) -> Any:  # noqa: N802
        return self._stub.Release(request, metadata=secret_metadata(request.lease_id, metadata), **kwargs)

    def Withdraw(self, request: lock_pb2.WithdrawRequest, *, metadata: Any = None, **kwargs: Any) -> Any:  # noqa: N802
        return self._stub.Withdraw(request, metadata=secret_metadata(request.lease_id, metadata), **kwargs)

    def KeepAlive(self, request_iterator: Any = None, **kwargs: Any) -> Any:  # noqa: N802
        if request_iterator is not None:
            return self._stub.KeepAlive(_filled(request_iterator), **kwargs)
        return _Stream(self._stub.KeepAlive(**kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)
