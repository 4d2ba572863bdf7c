"""One call, two transports: a LockService call made over gRPC or over the HTTP/JSON API, with the same answer shape.

:class:`GrpcCaller` and :class:`HttpCaller` take an RPC name and its request
message and return the response message or a :class:`Failure` (status
code, ErrorInfo reason and metadata, RetryInfo delay; for HTTP also the HTTP
status and ``Retry-After``). :class:`HttpCaller` finds the RPC's row in the
API's route table (``fencepost.coordinator.http.ROUTES``), fills the path
from the request's fields, sends the others as the JSON body (POST) or the
query (GET, DELETE), and parses the canonical JSON answer back into the
response message: a round trip through the documented wire format, not a
shortcut. The twin tests (tests/test_http_twins.py) run one scenario through
each and compare.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import LEASE_SECRET_METADATA
from fencepost.coordinator.http import ROUTES, Route

_SERVICE = lock_pb2.DESCRIPTOR.services_by_name["LockService"]


@dataclass(frozen=True)
class Failure:
    """A failed call, as either transport reports it.

    Attributes:
        code: the gRPC status code (HTTP: the body's ``code``).
        reason: the ErrorInfo reason, or None without one.
        metadata: the ErrorInfo metadata.
        retry_delay: the RetryInfo delay in seconds, or None.
        message: the status message.
        http_status: the HTTP status (None over gRPC).
        retry_after: the ``Retry-After`` header (None over gRPC, or without one).
    """

    code: grpc.StatusCode
    reason: str | None
    metadata: dict[str, str] = field(default_factory=dict)
    retry_delay: float | None = None
    message: str = ""
    http_status: int | None = None
    retry_after: str | None = None


def _failure(status: status_pb2.Status, http_status: int | None = None, retry_after: str | None = None) -> Failure:
    reason, metadata, delay = None, {}, None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    code = next(c for c in grpc.StatusCode if c.value[0] == status.code)
    return Failure(code, reason, metadata, delay, status.message, http_status, retry_after)


def _response_type(rpc: str) -> type[Message]:
    return getattr(lock_pb2, _SERVICE.methods_by_name[rpc].output_type.name)  # type: ignore[no-any-return]


class GrpcCaller:
    """Calls over gRPC on ``channel``."""

    name = "grpc"

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = lock_pb2_grpc.LockServiceStub(channel)

    async def __call__(self, rpc: str, request: Message, secret: str | None = None, timeout: float = 10.0
                       ) -> Message | Failure:
        metadata = ((LEASE_SECRET_METADATA, secret),) if secret else ()
        try:
            answer: Message = await getattr(self.stub, rpc)(request, metadata=metadata, timeout=timeout)
            return answer
        except grpc.aio.AioRpcError as err:
            for key, value in err.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    return _failure(status_pb2.Status.FromString(value))
            return Failure(err.code(), None, message=err.details() or "")


def route_of(rpc: str, request: Message) -> Route:
    """The API's row for a unary ``rpc`` (an AdminRevoke's by its ``kind``)."""
    for route in ROUTES:
        if route.rpc == rpc and route.stream is None and all(getattr(request, k) == v for k, v in route.fixed.items()):
            return route
    raise LookupError(f"no route for {rpc}")


def path_of(route: Route, request: Message) -> tuple[str, set[str]]:
    """``route``'s path with ``request``'s fields, percent-encoded; and the names of the fields it holds."""
    used: set[str] = set()
    parts = []
    for part in route.path.split("/"):
        if part.startswith("{"):
            name, _, verb = part[1:].partition("}")
            used.add(name)
            parts.append(quote(str(getattr(request, name)), safe="") + verb)
        else:
            parts.append(part)
    return "/".join(parts), used


class HttpCaller:
    """Calls over the HTTP/JSON API at ``base`` (``http://HOST:PORT``)."""

    name = "http"

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def __call__(self, rpc: str, request: Message, secret: str | None = None, timeout: float = 10.0
                       ) -> Message | Failure:
        route = route_of(rpc, request)
        path, used = path_of(route, request)
        fields = {k: v for k, v in json_format.MessageToDict(request, preserving_proto_field_name=True).items()
                  if k not in used and k not in route.fixed}
        headers = {"Fencepost-Lease-Secret": secret} if secret else {}
        headers["Fencepost-Timeout-Ms"] = str(int(timeout * 1000))
        if route.method == "POST":
            sent: dict[str, Any] = {"json": fields}
        else:
            sent = {"params": {k: json.dumps(v) if isinstance(v, bool) else str(v) for k, v in fields.items()}}
        async with self.session.request(route.method, self.base + path, headers=headers, **sent,
                                        timeout=aiohttp.ClientTimeout(total=timeout + 5)) as answer:
            body = await answer.json()
            if answer.status == 200:
                return json_format.ParseDict(body, _response_type(rpc)())
            status = json_format.ParseDict(body, status_pb2.Status())
            return _failure(status, answer.status, answer.headers.get("Retry-After"))


async def events(answer: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The events of an event stream, as (event name, its JSON data), until the stream ends."""
    name, data = "message", []
    async for raw in answer.content:
        line = raw.decode().rstrip("\n")
        if line.startswith(":"):
            continue
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data.append(line[len("data: "):])


async def next_event(stream: AsyncIterator[tuple[str, dict[str, Any]]], timeout: float = 10.0
                     ) -> tuple[str, dict[str, Any]]:
    """The next event of ``stream``, failing after ``timeout`` seconds."""
    return await asyncio.wait_for(anext(stream), timeout)
