"""GrpcServerMetrics on a tiny grpc.aio service: every call kind, every way a call ends.

The service ``test.Probe`` speaks raw bytes (identity serializers), so that
each method can end the way a test needs: returned, aborted, raised,
cancelled by the client, past its deadline. Counts are read from the
interceptor's own registry; the server records a call's end after grpc.aio
has sent its status, so each test first waits for that record, then asserts
exact values.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from fencepost.client.v1 import details
from fencepost.client.v1.details import ErrorReason
from fencepost.coordinator.telemetry.interceptor import GO_CODE_NAMES, GO_DEFAULT_BUCKETS, GrpcServerMetrics, rpc_type

from .conftest import wait_for

SERVICE = "test.Probe"


def _bytes(message: bytes) -> bytes:
    return message


def _strict(message: bytes) -> bytes:
    """A request deserializer that refuses ``bad`` (as protobuf refuses a malformed message)."""
    if message == b"bad":
        raise ValueError("cannot parse the request")
    return message


class Probe:
    """The test service's behaviours; ``forever`` is never set, so waiting on it lasts until cancelled."""

    def __init__(self) -> None:
        self.forever = asyncio.Event()
        self.waiting = 0

    async def unary(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def abort(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "aborted")
        raise AssertionError("abort returned")

    async def abort_with_status(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort_with_status(details.status_for(ErrorReason.TOO_MANY_WAITERS, "too many"))
        raise AssertionError("abort_with_status returned")

    async def raises(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise RuntimeError("a bug in the handler")

    async def set_code(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        context.set_code(grpc.StatusCode.NOT_FOUND)
        return b""

    async def set_code_then_raise(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        context.set_code(grpc.StatusCode.PERMISSION_DENIED)
        raise RuntimeError("refused")

    async def wait(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.waiting += 1
        await self.forever.wait()
        return request

    async def stream(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(len(request)):
            yield request[i:i + 1]

    async def stream_write(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.write(b"first")
        await context.write(b"second")

    async def stream_abort(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield b"one"
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, "no more")

    async def stream_forever(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield b"one"
        self.waiting += 1
        await self.forever.wait()

    async def client_stream(self, requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        return str(len([r async for r in requests])).encode()

    async def bidi(self, requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            if request == b"stop":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "stop")
            yield request

    async def bidi_read_write(self, requests: Any, context: grpc.aio.ServicerContext) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            await context.write(request)


def _handlers(probe: Probe) -> grpc.GenericRpcHandler:
    uu, us = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
    su, ss = grpc.stream_unary_rpc_method_handler, grpc.stream_stream_rpc_method_handler
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": uu(probe.unary, _bytes, _bytes),
        "Abort": uu(probe.abort, _bytes, _bytes),
        "AbortWithStatus": uu(probe.abort_with_status, _bytes, _bytes),
        "Raises": uu(probe.raises, _bytes, _bytes),
        "SetCode": uu(probe.set_code, _bytes, _bytes),
        "SetCodeThenRaise": uu(probe.set_code_then_raise, _bytes, _bytes),
        "Wait": uu(probe.wait, _bytes, _bytes),
        "Stream": us(probe.stream, _bytes, _bytes),
        "StreamWrite": us(probe.stream_write, _bytes, _bytes),
        "StreamAbort": us(probe.stream_abort, _bytes, _bytes),
        "StreamForever": us(probe.stream_forever, _bytes, _bytes),
        "ClientStream": su(probe.client_stream, _bytes, _bytes),
        "Bidi": ss(probe.bidi, _strict, _bytes),
        "BidiReadWrite": ss(probe.bidi_read_write, _bytes, _bytes),
    })


class Served:
    """The probe service and the health service on one grpc.aio server, with the interceptor."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = GrpcServerMetrics(self.registry)
        self.probe = Probe()
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(interceptors=[self.metrics])
        self.server.add_generic_rpc_handlers([_handlers(self.probe)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")

    def value(self, name: str, method: str, kind: str, code: str | None = None, service: str = SERVICE) -> float:
        """A sample's value; -1.0 when there is no such series."""
        labels = {"grpc_type": kind, "grpc_service": service, "grpc_method": method}
        if code is not None:
            labels["grpc_code"] = code
        value = self.registry.get_sample_value(name, labels)
        return -1.0 if value is None else value

    def handled(self, method: str, kind: str, service: str = SERVICE) -> dict[str, float]:
        """The non-zero ``grpc_server_handled_total`` counts of one method, by ``grpc_code``."""
        counts = {code: self.value("grpc_server_handled_total", method, kind, code, service)
                  for code in GO_CODE_NAMES.values()}
        return {code: n for code, n in counts.items() if n}

    def counts(self, method: str, kind: str, service: str = SERVICE) -> tuple[float, float, float, float]:
        """(started, received, sent, handling_seconds count) of one method."""
        return (self.value("grpc_server_started_total", method, kind, service=service),
                self.value("grpc_server_msg_received_total", method, kind, service=service),
                self.value("grpc_server_msg_sent_total", method, kind, service=service),
                self.value("grpc_server_handling_seconds_count", method, kind, service=service))

    async def ended(self, method: str, kind: str, service: str = SERVICE, n: int = 1) -> dict[str, float]:
        """Wait until ``n`` calls of ``method`` are counted as handled; return the counts by code."""
        await wait_for(lambda: sum(self.handled(method, kind, service).values()) >= n, 5, 0.01,
                       f"{n} handled call(s) of {method}")
        return self.handled(method, kind, service)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """The probe and health services served on 127.0.0.1:0 with GrpcServerMetrics installed."""
    s = Served()
    await s.server.start()
    try:
        yield s
    finally:
        await s.channel.close()
        await s.server.stop(0)


def _unary(served: Served, method: str) -> Any:
    return served.channel.unary_unary(f"/{SERVICE}/{method}")


async def _code_of(call: Any) -> grpc.StatusCode:
    """The status code a call ended with, as the client received it."""
    code: grpc.StatusCode = await call.code()
    return code


def test_labels_are_go_grpc_prometheus_ones() -> None:
    """grpc_type values, all 17 status codes in Go's spelling, and client_golang's default buckets."""
    assert [rpc_type(False, False), rpc_type(True, False), rpc_type(False, True), rpc_type(True, True)] == [
        "unary", "client_stream", "server_stream", "bidi_stream"]
    assert set(GO_CODE_NAMES) == set(grpc.StatusCode)
    assert GO_CODE_NAMES[grpc.StatusCode.CANCELLED] == "Canceled"
    assert GO_CODE_NAMES[grpc.StatusCode.FAILED_PRECONDITION] == "FailedPrecondition"
    assert GO_DEFAULT_BUCKETS == (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)


async def test_unary_calls_that_return(served: Served) -> None:
    """Two OK calls: started, one message received and one sent each, handled OK, two latencies observed."""
    assert await _unary(served, "Unary")(b"a") == b"a"
    assert await _unary(served, "Unary")(b"b") == b"b"
    assert await served.ended("Unary", "unary", n=2) == {"OK": 2}
    assert served.counts("Unary", "unary") == (2, 2, 2, 2)


async def test_unary_call_when_handler_aborts(served: Served) -> None:
    """``context.abort`` is counted with the code it sent; no message was sent."""
    assert await _code_of(_unary(served, "Abort")(b"")) == grpc.StatusCode.FAILED_PRECONDITION
    assert await served.ended("Abort", "unary") == {"FailedPrecondition": 1}
    assert served.counts("Abort", "unary") == (1, 1, 0, 1)


async def test_unary_call_when_handler_aborts_with_status(served: Served) -> None:
    """``context.abort_with_status`` (the coordinator's way) is counted with the status's code."""
    assert await _code_of(_unary(served, "AbortWithStatus")(b"")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await served.ended("AbortWithStatus", "unary") == {"ResourceExhausted": 1}
    assert served.counts("AbortWithStatus", "unary") == (1, 1, 0, 1)


async def test_unary_call_when_handler_raises(served: Served) -> None:
    """An exception escaping the handler is UNKNOWN, as the client sees it."""
    assert await _code_of(_unary(served, "Raises")(b"")) == grpc.StatusCode.UNKNOWN
    assert await served.ended("Raises", "unary") == {"Unknown": 1}
    assert served.counts("Raises", "unary") == (1, 1, 0, 1)


async def test_unary_call_when_handler_sets_a_code(served: Served) -> None:
    """A code set with ``set_code`` is what is counted, whether the handler then returns or raises."""
    assert await _code_of(_unary(served, "SetCode")(b"")) == grpc.StatusCode.NOT_FOUND
    assert await _code_of(_unary(served, "SetCodeThenRaise")(b"")) == grpc.StatusCode.PERMISSION_DENIED
    assert await served.ended("SetCode", "unary") == {"NotFound": 1}
    assert await served.ended("SetCodeThenRaise", "unary") == {"PermissionDenied": 1}
    assert served.counts("SetCode", "unary") == (1, 1, 0, 1)


async def test_unary_call_when_client_cancels(served: Served) -> None:
    """A call the client cancels while the handler waits is CANCELLED ("Canceled")."""
    call = _unary(served, "Wait")(b"")
    await wait_for(lambda: served.probe.waiting == 1, 5, 0.01, "the handler to wait")
    call.cancel()
    assert await served.ended("Wait", "unary") == {"Canceled": 1}
    assert served.counts("Wait", "unary") == (1, 1, 0, 1)


async def test_unary_call_when_deadline_passes(served: Served) -> None:
    """A call whose deadline passes while the handler waits is DEADLINE_EXCEEDED, as the client sees it."""
    assert await _code_of(_unary(served, "Wait")(b"", timeout=0.2)) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await served.ended("Wait", "unary") == {"DeadlineExceeded": 1}


async def test_server_stream_from_an_async_generator(served: Served) -> None:
    """Each message the generator yields is counted as sent; one request received; OK at the end."""
    got = [m async for m in served.channel.unary_stream(f"/{SERVICE}/Stream")(b"abc")]
    assert got == [b"a", b"b", b"c"]
    assert await served.ended("Stream", "server_stream") == {"OK": 1}
    assert served.counts("Stream", "server_stream") == (1, 1, 3, 1)


async def test_server_stream_written_with_context_write(served: Served) -> None:
    """A coroutine handler writing with ``context.write`` (the aio health Watch's style) is counted too."""
    got = [m async for m in served.channel.unary_stream(f"/{SERVICE}/StreamWrite")(b"")]
    assert got == [b"first", b"second"]
    assert await served.ended("StreamWrite", "server_stream") == {"OK": 1}
    assert served.counts("StreamWrite", "server_stream") == (1, 1, 2, 1)


async def test_server_stream_when_handler_aborts(served: Served) -> None:
    """A stream aborted after one message: that message counted, and the abort's code."""
    call = served.channel.unary_stream(f"/{SERVICE}/StreamAbort")(b"")
    assert await call.read() == b"one"
    assert await _code_of(call) == grpc.StatusCode.OUT_OF_RANGE
    assert await served.ended("StreamAbort", "server_stream") == {"OutOfRange": 1}
    assert served.counts("StreamAbort", "server_stream") == (1, 1, 1, 1)


async def test_server_stream_when_client_cancels(served: Served) -> None:
    """A stream the client cancels while the handler waits is CANCELLED, with the one message it got."""
    call = served.channel.unary_stream(f"/{SERVICE}/StreamForever")(b"")
    assert await call.read() == b"one"
    await wait_for(lambda: served.probe.waiting == 1, 5, 0.01, "the handler to wait")
    call.cancel()
    assert await served.ended("StreamForever", "server_stream") == {"Canceled": 1}
    assert served.counts("StreamForever", "server_stream") == (1, 1, 1, 1)


async def test_client_stream(served: Served) -> None:
    """Each streamed request is counted as received; the one response as sent."""
    async def requests() -> AsyncIterator[bytes]:
        for r in (b"1", b"2", b"3", b"4"):
            yield r

    assert await served.channel.stream_unary(f"/{SERVICE}/ClientStream")(requests()) == b"4"
    assert await served.ended("ClientStream", "client_stream") == {"OK": 1}
    assert served.counts("ClientStream", "client_stream") == (1, 4, 1, 1)


async def test_bidi_stream(served: Served) -> None:
    """An echo stream: messages both ways counted one by one, OK when the client half-closes."""
    call = served.channel.stream_stream(f"/{SERVICE}/Bidi")()
    for message in (b"x", b"y"):
        await call.write(message)
        assert await call.read() == message
    await call.done_writing()
    assert await _code_of(call) == grpc.StatusCode.OK
    assert await served.ended("Bidi", "bidi_stream") == {"OK": 1}
    assert served.counts("Bidi", "bidi_stream") == (1, 2, 2, 1)


async def test_bidi_stream_when_handler_aborts(served: Served) -> None:
    """A bidi stream the server aborts is counted with the abort's code, after the messages before it."""
    call = served.channel.stream_stream(f"/{SERVICE}/Bidi")()
    await call.write(b"x")
    assert await call.read() == b"x"
    await call.write(b"stop")
    assert await _code_of(call) == grpc.StatusCode.INVALID_ARGUMENT
    assert await served.ended("Bidi", "bidi_stream") == {"InvalidArgument": 1}
    assert served.counts("Bidi", "bidi_stream") == (1, 2, 1, 1)


async def test_bidi_stream_when_a_request_cannot_be_parsed(served: Served) -> None:
    """A request that fails to deserialize ends the stream UNKNOWN; it is not counted as received."""
    call = served.channel.stream_stream(f"/{SERVICE}/Bidi")()
    await call.write(b"x")
    assert await call.read() == b"x"
    await call.write(b"bad")
    assert await _code_of(call) == grpc.StatusCode.UNKNOWN
    assert await served.ended("Bidi", "bidi_stream") == {"Unknown": 1}
    assert served.counts("Bidi", "bidi_stream") == (1, 1, 1, 1)


async def test_bidi_stream_with_context_read_and_write(served: Served) -> None:
    """A coroutine handler reading with ``context.read`` and writing with ``context.write`` is counted."""
    call = served.channel.stream_stream(f"/{SERVICE}/BidiReadWrite")()
    for message in (b"p", b"q", b"r"):
        await call.write(message)
        assert await call.read() == message
    await call.done_writing()
    assert await _code_of(call) == grpc.StatusCode.OK
    assert await served.ended("BidiReadWrite", "bidi_stream") == {"OK": 1}
    assert served.counts("BidiReadWrite", "bidi_stream") == (1, 3, 3, 1)


async def test_unknown_method_is_not_counted(served: Served) -> None:
    """A method no service has is UNIMPLEMENTED and leaves no series (no label from a client's typo)."""
    assert await _code_of(_unary(served, "Nope")(b"")) == grpc.StatusCode.UNIMPLEMENTED
    assert await _unary(served, "Unary")(b"") == b""  # a later call is counted: the server saw both
    await served.ended("Unary", "unary")
    names = {s.labels.get("grpc_method") for family in served.registry.collect() for s in family.samples}
    assert "Nope" not in names and "Unary" in names


async def test_health_watch_keeps_working(served: Served) -> None:
    """The aio health service's Watch (a coroutine writing for ever) streams SERVING then each change."""
    await served.health.set("", health_pb2.HealthCheckResponse.SERVING)
    stub = health_pb2_grpc.HealthStub(served.channel)
    call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
    assert (await call.read()).status == health_pb2.HealthCheckResponse.SERVING
    await served.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert (await call.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch = ("Watch", "server_stream", "grpc.health.v1.Health")
    # The handler's write() returns once grpc has sent the message: maybe just after the client got it.
    await wait_for(lambda: served.counts(*watch)[2] == 2, 5, 0.01, "two messages counted as sent")
    assert served.counts(*watch)[:2] == (1, 1)
    assert served.handled(*watch) == {}  # still open
    call.cancel()
    assert await served.ended(*watch) == {"Canceled": 1}
    assert served.counts(*watch) == (1, 1, 2, 1)


async def test_initialize_creates_every_series_at_zero(served: Served) -> None:
    """``initialize`` creates each method's series at 0, all 17 codes of handled, before any call."""
    served.metrics.initialize([health_pb2.DESCRIPTOR.services_by_name["Health"]])
    check = ("Check", "unary", "grpc.health.v1.Health")
    assert served.counts(*check) == (0, 0, 0, 0)
    assert served.counts("Watch", "server_stream", "grpc.health.v1.Health") == (0, 0, 0, 0)
    assert {code: served.value("grpc_server_handled_total", *check[:2], code, check[2])
            for code in GO_CODE_NAMES.values()} == dict.fromkeys(GO_CODE_NAMES.values(), 0.0)
    assert served.value("grpc_server_started_total", "Unary", "unary") == -1.0  # not initialised, not called


async def test_handler_is_wrapped_once_per_method(served: Served) -> None:
    """The wrapped handler is cached: a second call of a method reuses it (the per-call cost stays small)."""
    seen: list[grpc.RpcMethodHandler] = []
    inner = served.metrics.intercept_service

    async def spy(continuation: Any, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await inner(continuation, details)
        seen.append(handler)
        return handler

    served.metrics.intercept_service = spy  # type: ignore[method-assign]
    await _unary(served, "Unary")(b"1")
    await _unary(served, "Unary")(b"2")
    assert len(seen) == 2 and seen[0] is seen[1]
