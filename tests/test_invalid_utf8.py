"""Names that are not valid UTF-8 on the wire (issue 14, item 8): INVALID_ARGUMENT naming the field, no traceback.

Raw gRPC against a real coordinator: each request is serialized with the
bytes twin of its type (``string`` fields as ``bytes``), so that the name
field can hold bytes that are not UTF-8. Before, protobuf's DecodeError
reached grpc.aio: UNKNOWN ("Unexpected DecodeError") and an ERROR traceback
in the coordinator's log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import LEASE_SECRET_METADATA
from fencepost.coordinator.api.decode import bytes_twin, invalid_text_field
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import assert_invalid_field, count_keys, error_info, wait_for
from .metrics_scrape import scrape

LOCKS = "fencepost.v1.LockService"
BAD_NAMES = {"byte-0xff": b"inv:\xff", "truncated": b"\xc3", "surrogate-encoded": b"a\xed\xa0\x80"}


def twin_bytes(request_type: Any, **fields: Any) -> bytes:
    """A ``request_type`` message with ``fields`` (a name as bytes), serialized."""
    return bytes_twin(request_type.DESCRIPTOR)(**fields).SerializeToString()


def unary(channel: grpc.aio.Channel, method: str, response_type: Any) -> Any:
    """A unary call of ``method`` taking already serialized request bytes."""
    return channel.unary_unary(f"/{LOCKS}/{method}", response_deserializer=response_type.FromString)


def assert_quiet_log(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing at ERROR, and no traceback, in what the coordinator (and grpc.aio) logged."""
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, [(r.name, r.getMessage()) for r in loud]
    assert "DecodeError" not in caplog.text and "Traceback" not in caplog.text


@pytest.mark.parametrize("bad", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
async def test_unary_calls_when_name_is_not_utf8(
    channel: grpc.aio.Channel, prefix: str, etcd_client: Etcd3Client, caplog: pytest.LogCaptureFixture, bad: bytes
) -> None:
    """Acquire, Release and Describe with a name that is not UTF-8: INVALID_ARGUMENT naming "name", nothing logged at ERROR."""
    caplog.set_level(logging.DEBUG)
    calls = [
        ("Acquire", lock_pb2.AcquireRequest, lock_pb2.AcquireResponse, {"lease_id": 1, "wait_ms": 0}),
        ("Release", lock_pb2.ReleaseRequest, lock_pb2.ReleaseResponse, {"lease_id": 1, "token": 5}),
        ("Describe", lock_pb2.DescribeRequest, lock_pb2.DescribeResponse, {}),
    ]
    for method, request_type, response_type, fields in calls:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await unary(channel, method, response_type)(twin_bytes(request_type, name=bad, **fields), timeout=5)
        assert_invalid_field(info.value, "name")
        assert "UTF-8" in info.value.details()
    assert_quiet_log(caplog)
    assert await count_keys(etcd_client, prefix) == 0


async def open_stream(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(f"/{LOCKS}/KeepAlive",
                                 response_deserializer=lock_pb2.KeepAliveResponse.FromString)()


@pytest.mark.parametrize("kind", ["watch", "unwatch"])
async def test_keepalive_stream_when_watched_name_is_not_utf8(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """A WatchHold whose name is not UTF-8 ends the KeepAlive stream with INVALID_ARGUMENT naming "name"."""
    caplog.set_level(logging.DEBUG)
    grant = unary(channel, "LeaseGrant", lock_pb2.LeaseGrantResponse)
    lease = await grant(lock_pb2.LeaseGrantRequest(ttl_seconds=5).SerializeToString(), timeout=5)
    stream = await open_stream(channel)
    await stream.write(lock_pb2.KeepAliveRequest(
        keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease.lease_id, request_id=1),
        lease_secret=lease.lease_secret).SerializeToString())
    ack = await asyncio.wait_for(stream.read(), 10)
    assert ack.keepalive.request_id == 1  # the stream works until the bad message
    hold = bytes_twin(lock_pb2.WatchHold.DESCRIPTOR)(name=b"inv:\xff", lease_id=lease.lease_id, token=3)
    request = bytes_twin(lock_pb2.KeepAliveRequest.DESCRIPTOR)()
    getattr(request, kind).CopyFrom(hold)
    await stream.write(request.SerializeToString())
    code = await asyncio.wait_for(stream.code(), 10)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, await stream.details())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(stream.read(), 10)
    assert_invalid_field(info.value, "name")
    revoke = unary(channel, "LeaseRevoke", lock_pb2.LeaseRevokeResponse)
    await revoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id).SerializeToString(), timeout=5,
                 metadata=((LEASE_SECRET_METADATA, lease.lease_secret),))
    assert_quiet_log(caplog)


@pytest.mark.parametrize("method", ["Acquire", "Describe", "LeaseGrant"])
@pytest.mark.parametrize("data", [b"\xff\xff", b"\x0a\xff", b"\x10" + b"\xff" * 11],
                         ids=["wire-type-7", "truncated-length", "overlong-varint"])
async def test_unparsable_bytes_when_not_a_utf8_problem(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture, method: str, data: bytes
) -> None:
    """Bytes that protobuf cannot parse at all are INVALID_ARGUMENT / INVALID_FIELD without a field, no traceback.

    Before, UNKNOWN ("Unexpected DecodeError") and an ERROR traceback; found by tests/test_property.py.
    """
    caplog.set_level(logging.DEBUG)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await unary(channel, method, lock_pb2.DescribeResponse)(data, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    detail = error_info(info.value)
    assert detail is not None and detail.reason == "INVALID_FIELD" and "field" not in detail.metadata
    assert f"not a valid {method}Request" in info.value.details()
    assert_quiet_log(caplog)


async def test_keepalive_stream_when_message_is_no_protobuf(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    """A KeepAlive message that protobuf cannot parse ends the stream with INVALID_ARGUMENT, no traceback."""
    caplog.set_level(logging.DEBUG)
    stream = await open_stream(channel)
    await stream.write(b"\xff\xff")
    assert await asyncio.wait_for(stream.code(), 10) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(stream.read(), 10)
    detail = error_info(info.value)
    assert detail is not None and detail.reason == "INVALID_FIELD" and "field" not in detail.metadata
    assert_quiet_log(caplog)


def test_invalid_text_field_names_the_first_bad_string() -> None:
    """invalid_text_field finds a string field that is not UTF-8, nested ones too; None for valid or unparsable bytes."""
    assert invalid_text_field(lock_pb2.DescribeRequest.DESCRIPTOR, twin_bytes(lock_pb2.DescribeRequest,
                                                                              name=b"\xff")) == "name"
    assert invalid_text_field(lock_pb2.DescribeRequest.DESCRIPTOR, twin_bytes(lock_pb2.DescribeRequest,
                                                                              name=b"ok")) is None
    nested = bytes_twin(lock_pb2.KeepAliveRequest.DESCRIPTOR)()
    nested.watch.name = b"\xc3"
    assert invalid_text_field(lock_pb2.KeepAliveRequest.DESCRIPTOR, nested.SerializeToString()) == "name"
    assert invalid_text_field(lock_pb2.DescribeRequest.DESCRIPTOR, b"\xff\xff") is None


@pytest.fixture
async def metered(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Coordinator]:
    """A coordinator with its metrics endpoint on 127.0.0.1:0."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_metrics_when_name_is_not_utf8(metered: Coordinator) -> None:
    """The refusals are counted by the gRPC metrics with code InvalidArgument, unary and stream alike."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{metered.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await unary(channel, "Describe", lock_pb2.DescribeResponse)(
                twin_bytes(lock_pb2.DescribeRequest, name=b"\xff"), timeout=5)
        stream = await open_stream(channel)
        request = bytes_twin(lock_pb2.KeepAliveRequest.DESCRIPTOR)()
        request.watch.name = b"\xff"
        await stream.write(request.SerializeToString())
        assert await asyncio.wait_for(stream.code(), 10) == grpc.StatusCode.INVALID_ARGUMENT

    async def counted() -> bool:
        s = await scrape(metered.metrics_address)
        return (s.handled("Describe") == {"InvalidArgument": 1.0}
                and s.handled("KeepAlive", kind="bidi_stream") == {"InvalidArgument": 1.0})

    await wait_for(counted, 10, 0.02, "the refusals counted as InvalidArgument")
