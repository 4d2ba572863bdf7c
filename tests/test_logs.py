"""`fencepost serve --log-format`: one log line per lifecycle event, as JSON or as text with key=value fields."""

from __future__ import annotations

import asyncio
import time
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.telemetry.events import trace_id_of

from .conftest import LISTENING, ChildProcess, child_env, describe_waiters_is, wait_for
from .owned_stub import OwnedStub

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _serve_argv(etcd: EmbeddedEtcd, prefix: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
            "--etcd-endpoints", etcd.endpoint, "--prefix", prefix, "--grace-seconds", "1", *flags]


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` parsed as one JSON object (a line that does not parse fails the test)."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"a log line is not JSON: {line!r}")
        assert isinstance(record, dict), line
        assert {"time", "level", "logger", "message"} <= record.keys(), record
        assert record["time"].endswith("Z") and "T" in record["time"], record
        records.append(record)
    return records


async def _next(stream: Any) -> lock_pb2.KeepAliveResponse:
    response = await stream.read()
    assert response is not grpc.aio.EOF
    return response


async def test_json_log_of_a_workload(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> None:
    """Each lifecycle event of a workload is one JSON line with the ids and tokens the client saw, in order."""
    log = tmp_path / "serve.log"
    child = ChildProcess(_serve_argv(etcd, prefix, "--log-format", "json", "--log-level", "DEBUG"), log_path=log)
    try:
        match = await child.await_line(LISTENING, 30)
        address = f"{match.group(1)}:{match.group(2)}"
        traced = (("traceparent", TRACEPARENT),)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = OwnedStub(channel)
            a = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), metadata=traced)).lease_id
            b = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30))).lease_id
            stream = stub.KeepAlive(metadata=traced)
            await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=a, request_id=1)))
            assert (await _next(stream)).keepalive.ttl_seconds > 0

            t1 = (await stub.Acquire(lock_pb2.AcquireRequest(name="job", lease_id=a, wait_ms=5000))).token
            await stream.write(lock_pb2.KeepAliveRequest(watch=lock_pb2.WatchHold(name="job", lease_id=a, token=t1)))
            waiting = asyncio.ensure_future(stub.Acquire(lock_pb2.AcquireRequest(name="job", lease_id=b,
                                                                               wait_ms=10_000)))
            await wait_for(lambda: describe_waiters_is(stub, "job", 1), 10, what="B waits")
            seen_waiting = time.monotonic()
            await wait_for(lambda: time.monotonic() > seen_waiting, 1, what="the clock to move")
            b_waited_at_least = time.monotonic() - seen_waiting  # B is queued all along
            await stub.Release(lock_pb2.ReleaseRequest(name="job", lease_id=a, token=t1))
            t2 = (await waiting).token
            released = await _next(stream)  # told on the stream, not logged: the release event says it
            assert (released.hold_ended.lease_id, released.hold_ended.token) == (a, t1)
            await stub.Release(lock_pb2.ReleaseRequest(name="job", lease_id=b, token=t2))
            t3 = (await stub.Acquire(lock_pb2.AcquireRequest(name="job", lease_id=a, wait_ms=5000))).token
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Release(lock_pb2.ReleaseRequest(name="job", lease_id=a, token=t1), metadata=traced)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

            await stream.write(lock_pb2.KeepAliveRequest(watch=lock_pb2.WatchHold(name="job", lease_id=a, token=t3)))
            assert (await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=a))).found
            ended = await _next(stream)
            assert (ended.hold_ended.lease_id, ended.hold_ended.token) == (a, t3)
            await stream.write(lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=a, request_id=2)))
            assert (await _next(stream)).keepalive.ttl_seconds <= 0
            await stream.done_writing()
            assert await stream.read() is grpc.aio.EOF

            left_open = stub.KeepAlive()  # open at SIGTERM: ended by the shutdown
            await left_open.write(lock_pb2.KeepAliveRequest(
                keepalive=lock_pb2.LeaseKeepAlive(lease_id=b, request_id=1)))
            assert (await _next(left_open)).keepalive.ttl_seconds > 0
            child.signal(signal.SIGTERM)
            with pytest.raises(grpc.aio.AioRpcError):
                await left_open.read()
        assert await asyncio.to_thread(child.proc.wait, 15) == 0
    finally:
        child.kill()

    records = _json_lines(log.read_text())
    events = [r for r in records if "event" in r]
    assert [r["event"] for r in events].count("etcd_connected") == 1
    events = [r for r in events if r["event"] != "etcd_connected"]  # from the health monitor, at any time
    peer_a = events[2]["peer"]
    assert peer_a.startswith("ipv4:127.0.0.1:")
    strip = ("time", "message", "logger", "peer", "waited_s", "duration_s", "revision")
    got = [{k: v for k, v in r.items() if k not in strip} for r in events]
    expected: list[Any] = [
        {"level": "DEBUG", "event": "lease_granted", "lease_id": a, "ttl_s": 30, "trace_id": TRACE_ID},
        {"level": "DEBUG", "event": "lease_granted", "lease_id": b, "ttl_s": 30},
        {"level": "INFO", "event": "stream_open", "trace_id": TRACE_ID},
        {"level": "DEBUG", "event": "grant", "name": "job", "lease_id": a, "token": t1},
        # The waiter's grant and the release that let it in are logged by two calls at about the same time.
        [{"level": "DEBUG", "event": "release", "name": "job", "lease_id": a, "token": t1},
         {"level": "DEBUG", "event": "grant", "name": "job", "lease_id": b, "token": t2}],
        {"level": "DEBUG", "event": "release", "name": "job", "lease_id": b, "token": t2},
        {"level": "DEBUG", "event": "grant", "name": "job", "lease_id": a, "token": t3},
        {"level": "INFO", "event": "refusal", "call": "Release", "reason": "STALE_TOKEN", "name": "job",
         "lease_id": a, "token": t1, "current_token": t3, "trace_id": TRACE_ID},
        # The revoke's answer and the stream's report of the deletion, also about the same time.
        [{"level": "DEBUG", "event": "lease_revoked", "lease_id": a, "found": True},
         {"level": "INFO", "event": "hold_ended", "name": "job", "lease_id": a, "token": t3,
          "reason": "NOT_HOLDER", "trace_id": TRACE_ID}],
        {"level": "INFO", "event": "lease_expired", "lease_id": a, "trace_id": TRACE_ID},
        {"level": "INFO", "event": "stream_close", "ended": "half_closed", "leases": 1, "holds": 2,
         "trace_id": TRACE_ID},
        {"level": "INFO", "event": "stream_open"},
        {"level": "INFO", "event": "shutdown", "grace_s": 1.0, "streams": 1},
        {"level": "INFO", "event": "stream_close", "ended": "shutdown", "leases": 1, "holds": 0},
    ]
    flat: list[dict[str, Any]] = []
    for item in expected:  # an unordered pair takes the order it was logged in
        if isinstance(item, list):
            flat.extend(sorted(item, key=lambda r: got.index(r) if r in got else -1))
        else:
            flat.append(item)
    assert got == flat
    waited = [r for r in events if r["event"] == "grant"]
    # B waited for A's release: at least while the test saw it queued (A's own wait was an immediate grant,
    # which under load can take longer than B's queueing did: no comparison between the two).
    assert waited[1]["waited_s"] >= round(b_waited_at_least, 6) > 0 and waited[0]["waited_s"] >= 0
    assert [r["peer"] for r in events if r["event"] != "shutdown"] == [peer_a] * (len(events) - 1)  # one channel
    assert events[-1]["duration_s"] >= 0


def test_text_log_appends_fields(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> None:
    """In text, an event's line keeps its message and has its fields appended as key=value."""
    log = tmp_path / "serve.log"
    child = ChildProcess(_serve_argv(etcd, prefix, "--log-format", "text"), log_path=log)
    try:
        match = child.wait_line(LISTENING, 30)
        with grpc.insecure_channel(f"{match.group(1)}:{match.group(2)}") as channel:
            stub = OwnedStub(channel)
            with pytest.raises(grpc.RpcError):
                stub.Release(lock_pb2.ReleaseRequest(name="two words", lease_id=12345, token=7))
        assert child.terminate() == 0
    finally:
        child.kill()
    lines = log.read_text().splitlines()
    refusal = [line for line in lines if "Release refused" in line]
    assert len(refusal) == 1, lines
    assert " INFO fencepost.coordinator.api.status: Release refused: LEASE_EXPIRED: " in refusal[0]
    assert ' call=Release reason=LEASE_EXPIRED name="two words" lease_id=12345 peer=ipv4:127.0.0.1:' in refusal[0]
    assert any(line.endswith("etcd reachable: SERVING") for line in lines), lines  # no fields: unchanged
    assert any("shutting down" in line and line.endswith(" grace_s=1.0 streams=0") for line in lines), lines


@pytest.mark.parametrize("how", [["--log-format", "bogus"], []])
def test_serve_when_log_format_is_bogus(how: list[str]) -> None:
    """A --log-format (or FENCEPOST_LOG_FORMAT) other than text, json or auto exits 2 naming the flag."""
    env = child_env()
    env["FENCEPOST_LOG_FORMAT"] = "bogus"
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", *how],
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("fencepost serve: error: --log-format is 'bogus'"), result.stderr


@pytest.mark.parametrize("terminal", [True, False])
def test_auto_log_format(etcd: EmbeddedEtcd, prefix: str, terminal: bool) -> None:
    """Without --log-format, stderr gets text when it is a terminal and JSON lines otherwise."""
    reader, writer = os.openpty() if terminal else os.pipe()
    env = child_env()
    env.pop("FENCEPOST_LOG_FORMAT", None)
    proc = subprocess.Popen(_serve_argv(etcd, prefix), stdout=subprocess.PIPE, stderr=writer, text=True,
                            env=env, start_new_session=True)
    os.close(writer)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = LISTENING.search(line)
            if match:
                break
        with grpc.insecure_channel(f"{match.group(1)}:{match.group(2)}") as channel:
            # An answer comes from the event loop, so the SIGTERM handler (set before it runs) is in place.
            OwnedStub(channel).Describe(lock_pb2.DescribeRequest(name="x"), timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        chunks = []
        while True:
            try:
                chunk = os.read(reader, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(reader)
        if proc.stdout is not None:
            proc.stdout.close()
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    shutdown = [line for line in text.splitlines() if "shutting down" in line]
    assert len(shutdown) == 1, text
    if terminal:
        assert " INFO fencepost.coordinator: shutting down: " in shutdown[0]
        assert not shutdown[0].startswith("{")
    else:
        assert [r.get("event") for r in _json_lines(text)][-1] == "shutdown"


@pytest.mark.parametrize(("header", "expected"), [
    (TRACEPARENT, TRACE_ID),
    (f"01-{TRACE_ID}-00f067aa0ba902b7-01-future", TRACE_ID),
    (f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra", None),
    (f"ff-{TRACE_ID}-00f067aa0ba902b7-01", None),
    (f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01", None),
    (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),
    (f"00-{TRACE_ID}-{'0' * 16}-01", None),
    ("00-abc-def-01", None),
])
def test_trace_id_of_when_traceparent_is(header: str, expected: str | None) -> None:
    """Only a well-formed W3C traceparent gives a trace id; a malformed one is ignored."""
    assert trace_id_of([("other", "x"), ("traceparent", header)]) == expected
    assert trace_id_of(None) is None
