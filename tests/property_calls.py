"""The property test's side of the wire (tests/test_property.py): a coordinator served by a thread of its own,
the callers (one channel each), unary calls checked as they end (:func:`checked_call`: in time, an allowed
code, a refusal with its ErrorInfo), and KeepAlive streams read by threads (:class:`Stream`)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.details import DOMAIN, ErrorReason
from fencepost.coordinator.process.coordinator import Coordinator

from .conftest import error_info

LOCKS = "/fencepost.v1.LockService"
#: Deadline of every call, in seconds; a blocking Acquire gets :data:`WAIT_DEADLINE` (keeps sequences short).
DEADLINE = 3.0
WAIT_DEADLINE = 1.0
#: How late past its deadline a call may end before it counts as a hang, in seconds.
SLACK_SECONDS = 2.0
#: Leases granted with a TTL below this (seconds) may expire within a sequence.
VOLATILE_TTL = 120

C = grpc.StatusCode
#: Codes no rule may ever get.
NEVER = {C.UNKNOWN, C.INTERNAL, C.UNIMPLEMENTED, C.DATA_LOSS}
#: Codes any call may get without breaking anything: the coordinator's limits.
ALWAYS = {C.RESOURCE_EXHAUSTED}
KNOWN_REASONS = set(ErrorReason.keys()) - {"ERROR_REASON_UNSPECIFIED"}
#: How each kind of call ended, over the run: (call, code, reason) -> count (printed at the end).
OUTCOMES: Counter[tuple[str, str, str | None]] = Counter()


# ---------------------------------------------------------------- the coordinator, in a thread


class ThreadedCoordinator:
    """A Coordinator served on 127.0.0.1:0 by an event loop in a thread of its own (the test body is sync)."""

    def __init__(self, endpoint: str, prefix: str) -> None:
        self._endpoint = endpoint
        self._prefix = prefix
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="coordinator", daemon=True)
        self.coordinator: Coordinator | None = None

    def _run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> str:
        """Start the loop and the coordinator; returns its address."""
        self._thread.start()

        async def start() -> Coordinator:
            coord = Coordinator([self._endpoint], listen="127.0.0.1:0", prefix=self._prefix)
            await coord.start()
            return coord

        self.coordinator = self._run(start())
        return f"127.0.0.1:{self.coordinator.port}"

    def stop(self) -> None:
        """Stop the coordinator and the loop; idempotent."""
        if self.coordinator is not None:
            self._run(self.coordinator.stop(grace=0))
            self.coordinator = None
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


# ---------------------------------------------------------------- callers, calls and streams


@dataclass
class Lease:
    """A lease the model knows: its owner (caller index), granted TTL, and whether it is alive."""

    lease_id: int
    owner: int
    ttl: int
    alive: bool = True

    @property
    def volatile(self) -> bool:
        """May expire within a sequence (no keepalive is promised)."""
        return self.ttl < VOLATILE_TTL


@dataclass
class Caller:
    """One client: one channel (one connection), its stub, its leases' LeaseGrant answers, its streams."""

    index: int
    channel: grpc.Channel
    stub: lock_pb2_grpc.LockServiceStub
    granted: dict[int, lock_pb2.LeaseGrantResponse] = field(default_factory=dict)
    streams: list[Stream] = field(default_factory=list)


def lease_metadata(caller: Caller, lease_id: int) -> tuple[tuple[str, str], ...]:
    """The metadata ``caller`` sends with a call on lease ``lease_id`` (one of its own, or not).

    The secret of a lease this caller granted (``caller.granted[lease_id]``
    holds its LeaseGrant answer), as ``fencepost-lease-secret``, as its owner
    does; for other leases, nothing (the coordinator refuses NOT_LEASE_OWNER).
    """
    granted = caller.granted.get(lease_id)
    return (("fencepost-lease-secret", granted.lease_secret),) if granted is not None else ()


def keepalive_request(caller: Caller, lease_id: int, kind: str, **fields: Any) -> lock_pb2.KeepAliveRequest:
    """A KeepAliveRequest of ``caller``: ``kind`` "keepalive" (fields: request_id) or "watch"/"unwatch" (name, token).

    The secret of a lease this caller granted goes with it
    (``KeepAliveRequest.lease_secret``, from ``caller.granted[lease_id]``).
    """
    inner = lock_pb2.LeaseKeepAlive(lease_id=lease_id, **fields) if kind == "keepalive" else lock_pb2.WatchHold(
        lease_id=lease_id, **fields)
    granted = caller.granted.get(lease_id)
    return lock_pb2.KeepAliveRequest(**{kind: inner}, lease_secret=granted.lease_secret if granted else "")


@dataclass
class Outcome:
    """How one call ended: its response, or its error's code, ErrorInfo reason and field; and how long it took."""

    response: Any = None
    code: grpc.StatusCode = C.OK
    reason: str | None = None
    field: str | None = None
    details: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.code == C.OK


def checked_call(what: str, fn: Callable[..., Any], request: Any, *, timeout: float = DEADLINE,
                 metadata: tuple[tuple[str, str], ...] = (), allowed: set[grpc.StatusCode]) -> Outcome:
    """Make one unary call and check how it ended: in time, with an allowed code, a refusal with its ErrorInfo."""
    started = time.monotonic()
    try:
        response = fn(request, timeout=timeout, metadata=metadata)
        out = Outcome(response=response)
    except grpc.RpcError as err:
        out = Outcome(code=err.code(), details=err.details() or "")  # type: ignore[attr-defined]
        info = error_info(err)
        if info is not None:
            assert info.domain == DOMAIN, (what, info)
            assert info.reason in KNOWN_REASONS, (what, info)
            out.reason = info.reason
            out.field = info.metadata.get("field")
        else:
            # Only gRPC itself refuses without ErrorInfo: the caller's deadline, a message over the size limit.
            assert out.code in (C.DEADLINE_EXCEEDED, C.RESOURCE_EXHAUSTED, C.CANCELLED), (what, out)
    out.seconds = time.monotonic() - started
    OUTCOMES[(what, out.code.name, out.reason)] += 1
    assert out.seconds <= timeout + SLACK_SECONDS, f"{what} took {out.seconds:.2f} s (deadline {timeout} s)"
    assert out.code not in NEVER, (what, out)
    assert out.code in allowed | ALWAYS | {C.OK}, (what, out)
    return out


@dataclass
class StreamEnd:
    """A KeepAlive stream's end, as its reader saw it."""

    code: grpc.StatusCode
    reason: str | None
    details: str


class Stream:
    """A KeepAlive stream of one caller: requests from a queue, responses read by a thread into another.

    Requests are bytes (serialized here), so that bytes that are no protobuf can be sent too.
    """

    def __init__(self, caller: Caller) -> None:
        self.caller = caller
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self.responses: queue.Queue[lock_pb2.KeepAliveResponse | StreamEnd] = queue.Queue()
        self.end: StreamEnd | None = None
        self.half_closed = False
        self.cancelled = False
        #: A keepalive or watch for a lease not this caller's was sent: the coordinator may end the stream
        #: (PERMISSION_DENIED) when it has checked it, after messages sent later were queued.
        self.sent_foreign = False
        self.events: list[lock_pb2.KeepAliveResponse] = []
        method = caller.channel.stream_stream(f"{LOCKS}/KeepAlive",
                                              response_deserializer=lock_pb2.KeepAliveResponse.FromString)
        self.call = method(self._iterate())
        self._reader = threading.Thread(target=self._read, name="keepalive-reader", daemon=True)
        self._reader.start()

    def _iterate(self) -> Iterator[bytes]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for response in self.call:
                self.responses.put(response)
            self.responses.put(StreamEnd(C.OK, None, ""))
        except grpc.RpcError as err:
            info = error_info(err)
            if info is not None:
                assert info.domain == DOMAIN and info.reason in KNOWN_REASONS, info
            self.responses.put(StreamEnd(err.code(), info.reason if info else None,  # type: ignore[attr-defined]
                                         err.details() or ""))  # type: ignore[attr-defined]

    @property
    def open(self) -> bool:
        return self.end is None and not self.half_closed and not self.cancelled

    def send(self, request: Message | bytes) -> None:
        self._requests.put(request if isinstance(request, bytes) else request.SerializeToString())

    def half_close(self) -> None:
        self.half_closed = True
        self._requests.put(None)

    def cancel(self) -> None:
        self.cancelled = True
        self.call.cancel()
        self._requests.put(None)

    def wait(self, done: Callable[[lock_pb2.KeepAliveResponse], bool] | None, timeout: float = DEADLINE) -> bool:
        """Read responses until one satisfies ``done`` (True) or the stream ends (False); fail past ``timeout``.

        With ``done`` None, wait for the end of the stream.
        """
        deadline = time.monotonic() + timeout + SLACK_SECONDS
        while self.end is None:
            left = deadline - time.monotonic()
            assert left > 0, f"KeepAlive stream: no answer within {timeout} s"
            try:
                item = self.responses.get(timeout=left)
            except queue.Empty:
                continue
            if isinstance(item, StreamEnd):
                self.end = item
                OUTCOMES[("KeepAlive (end)", item.code.name, item.reason)] += 1
                break
            OUTCOMES[("KeepAlive (response)", item.WhichOneof("response") or "", None)] += 1
            self.events.append(item)
            if done is not None and done(item):
                return True
        assert self.end is not None
        return False

    def close(self) -> None:
        if self.end is None:
            self.cancel()
            self.wait(None)
