"""Bad input, systematically (issue 9, item 6): random sequences of valid and invalid RPCs against one coordinator.

A hypothesis ``RuleBasedStateMachine`` drives one real coordinator (in a
thread of its own, with its own event loop, on the session's real etcd)
through the raw sync stubs of three callers (one channel, so one connection,
each), every call with a deadline. Rules send LeaseGrant (TTL 0, negative,
huge), LeaseRevoke (own, another caller's, unknown, 0, negative, 2**63-1
lease ids), Acquire (ASCII, Unicode, empty, 300-byte and 60 KiB names, names
with "/", "%", NUL, bytes that are not UTF-8; wait_ms 0, small, negative,
huge, wait_forever; own, foreign and unknown leases), Release (right, wrong,
stale, huge, negative tokens), Withdraw, Describe, ListLocks (page sizes
negative and huge, bad page tokens), ServerInfo, KeepAlive streams (open,
keepalives and watches for own, foreign and unknown leases, unwatch,
half-close, cancel mid-stream, two streams per caller interleaved, bytes
that are no protobuf), raw bytes that are no protobuf to Acquire, and one
request type sent to another method.

After each step:

- the call returned or failed within its deadline plus :data:`SLACK_SECONDS`;
- a failure has a status code allowed for that rule (never UNKNOWN or
  INTERNAL), and a refusal by the coordinator carries one
  ``google.rpc.ErrorInfo`` of domain ``fencepost.dev`` with a known
  ErrorReason (only gRPC's own refusals, such as a message over the size
  limit, and the caller's own deadline come without);
- a success agrees with the model kept from earlier successes (a Release or
  Withdraw succeeds only for the holder; a grant only of a free lock, or
  again to its holder with the same token);
- the coordinator still serves, and for each lock name the step touched,
  Describe agrees with the model: at most one holder, the one the model
  has, no waiter left behind, and every new grant of a name has a token
  larger than every earlier token of that name (over all sequences);
- nothing was logged at ERROR and no record carries a traceback
  (grpc.aio's "Unexpected error", asyncio's "Exception in callback").

Leases granted with a TTL under :data:`VOLATILE_TTL` may expire during a
sequence: the model lets their holds vanish (and only theirs).

Settings: by default 50 sequences of up to 40 steps, derandomized with seed
:data:`DEFAULT_SEED` and no example database, so that a failure in CI is the
same failure on a laptop (30 to 45 s on 2 cores). A soak:
``FENCEPOST_PROPERTY_EXAMPLES=2000 python -m pytest -q tests/test_property.py``
(``FENCEPOST_PROPERTY_STEPS`` sets the steps per sequence,
``FENCEPOST_PROPERTY_SEED`` another seed, or ``random`` for a fresh one,
which is printed). The test prints how many sequences and steps it ran.

Lease ownership: every call made with a lease gets its metadata from
:func:`_lease_metadata`; PERMISSION_DENIED is an allowed answer to a call on
another caller's lease, and so is a success (which the model records).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.details import DOMAIN, ErrorReason
from fencepost.coordinator.api.decode import bytes_twin
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import error_info

LOCKS = "/fencepost.v1.LockService"
#: Deadline of every call, in seconds; a blocking Acquire gets :data:`WAIT_DEADLINE` (keeps sequences short).
DEADLINE = 3.0
WAIT_DEADLINE = 1.0
#: How late past its deadline a call may end before it counts as a hang, in seconds.
SLACK_SECONDS = 2.0
#: Leases granted with a TTL below this (seconds) may expire within a sequence.
VOLATILE_TTL = 120
CALLERS = 3
MAX_STREAMS_PER_CALLER = 2

DEFAULT_SEED = 20_250_609
EXAMPLES = int(os.environ.get("FENCEPOST_PROPERTY_EXAMPLES", "50"))
STEPS = int(os.environ.get("FENCEPOST_PROPERTY_STEPS", "40"))
_SEED_ENV = os.environ.get("FENCEPOST_PROPERTY_SEED", "")
SHRINK = os.environ.get("FENCEPOST_PROPERTY_SHRINK", "") not in ("", "0")
SEED = random.randrange(2**32) if _SEED_ENV == "random" else int(_SEED_ENV or DEFAULT_SEED)

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


def _lease_metadata(caller: Caller, lease_id: int) -> tuple[tuple[str, str], ...]:
    """The metadata ``caller`` sends with a call on lease ``lease_id`` (one of its own, or not).

    The secret of a lease this caller granted (``caller.granted[lease_id]``
    holds its LeaseGrant answer), as ``fencepost-lease-secret``, as its owner
    does; for other leases, nothing (the coordinator refuses NOT_LEASE_OWNER).
    """
    granted = caller.granted.get(lease_id)
    return (("fencepost-lease-secret", granted.lease_secret),) if granted is not None else ()


def _keepalive_request(caller: Caller, lease_id: int, kind: str, **fields: Any) -> lock_pb2.KeepAliveRequest:
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


def _call(what: str, fn: Callable[..., Any], request: Any, *, timeout: float = DEADLINE,
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


# ---------------------------------------------------------------- strategies

#: A few names that collide often (so that holders, waiters and tokens meet), some odd but valid.
POOL_NAMES = ["a", "jobs/1", "a/b", "%2F", "100%", "ключ", "名前", "emoji-\U0001f512", " spaced ", "..",
              "x" * 256]
BAD_NAMES = ["", "x" * 257, "n" * (60 * 1024), "a\x00b", "new\nline", "\x7f", "tab\t"]
valid_names = st.sampled_from(POOL_NAMES) | st.text(min_size=1, max_size=40).filter(
    lambda s: all(ord(ch) >= 0x20 and ord(ch) != 0x7F for ch in s) and len(s.encode()) <= 256)
any_names = st.one_of(st.sampled_from(POOL_NAMES), st.sampled_from(POOL_NAMES), valid_names,
                      st.sampled_from(BAD_NAMES), st.text(max_size=20))
#: Bytes that are not UTF-8, for a name sent with the request's bytes twin.
binary_names = st.sampled_from([b"\xff", b"inv:\xff", b"\xc3", b"a\xed\xa0\x80"]) | st.binary(min_size=1, max_size=20)
INT64 = st.integers(-(2**63), 2**63 - 1)
ttls = st.one_of(st.sampled_from([0, -1, -(2**63), 86_401, 2**63 - 1, 2**40]), st.sampled_from([1, 2, 5]),
                 st.sampled_from([300, 86_400]), st.integers(VOLATILE_TTL, 86_400), INT64)
ODD_LEASES = [0, -1, -(2**63), 2**63 - 1, 0x7EADBEEF12345]
#: (wait_ms, wait_forever); wait_ms from 0 (try once) to invalid values; most calls try once.
waits = st.one_of(
    st.just((0, False)), st.just((0, False)), st.just((0, False)),
    st.tuples(st.sampled_from([1, 50, 300, 5_000, 86_400_000]), st.just(False)),
    st.tuples(st.sampled_from([-1, -(2**63), 86_400_001, 2**63 - 1, 2**40]), st.booleans()),
    st.tuples(st.sampled_from([0, 1]), st.just(True)),
)


def _valid_name(name: str) -> bool:
    """The wire contract (lock.proto, AcquireRequest.name): 1 to 256 bytes of UTF-8, no control characters."""
    return 0 < len(name.encode("utf-8", "surrogatepass")) <= 256 and all(
        ord(ch) >= 0x20 and ord(ch) != 0x7F for ch in name)


# ---------------------------------------------------------------- the machine


@dataclass
class Totals:
    """Sequences and steps run, over all examples (reported at the end)."""

    sequences: int = 0
    steps: int = 0


class FencepostMachine(RuleBasedStateMachine):
    """Random calls of three callers on one coordinator; the model is what successful calls said."""

    address = ""
    #: Highest token ever granted per name, over all sequences (tokens only grow).
    max_token: dict[str, int] = {}
    totals = Totals()
    log_records: list[logging.LogRecord] = []

    def __init__(self) -> None:
        super().__init__()
        self.totals.sequences += 1
        options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per caller (the limits' "caller")
        self.callers = []
        for i in range(CALLERS):
            channel = grpc.insecure_channel(self.address, options=options)
            self.callers.append(Caller(i, channel, lock_pb2_grpc.LockServiceStub(channel)))
        self.leases: dict[int, Lease] = {}
        self.holders: dict[str, tuple[int, int]] = {}  # name -> (lease_id, token)
        self.ended: list[tuple[str, int, int]] = []  # holds that ended through a call of ours
        self.dirty: set[str] = set()
        self.tokens_seen: list[int] = []
        self.request_id = 0
        self.log_seen = len(self.log_records)

    # ------------------------------------------------------------ helpers

    def _lease_for(self, caller: Caller, data: st.DataObject) -> int:
        """A lease id for a call of ``caller``: its own, another caller's, a dead one, or an odd one."""
        own = [lid for lid, lease in self.leases.items() if lease.owner == caller.index]
        foreign = [lid for lid, lease in self.leases.items() if lease.owner != caller.index]
        choices = [st.sampled_from(ODD_LEASES)]
        if own:
            choices += [st.sampled_from(own)] * 4
        if foreign:
            choices.append(st.sampled_from(foreign))
        return data.draw(st.one_of(choices), label="lease_id")

    def _owner(self, lease_id: int) -> int | None:
        lease = self.leases.get(lease_id)
        return lease.owner if lease else None

    def _foreign(self, caller: Caller, lease_id: int) -> bool:
        """Not a lease of ``caller``'s own: another caller's, or one the model does not know (no owner)."""
        return self._owner(lease_id) != caller.index

    def _alive(self, lease_id: int) -> bool | None:
        """True alive, False gone, None: may have expired (volatile)."""
        lease = self.leases.get(lease_id)
        if lease is None or not lease.alive:
            return False
        return None if lease.volatile else True

    def _lease_gone(self, lease_id: int) -> None:
        lease = self.leases.get(lease_id)
        if lease is not None:
            lease.alive = False
        for name, (holder, token) in list(self.holders.items()):
            if holder == lease_id:
                self._hold_ended(name)

    def _hold_ended(self, name: str) -> None:
        holder, token = self.holders.pop(name)
        self.ended.append((name, holder, token))
        self.dirty.add(name)

    def _granted(self, name: str, lease_id: int, token: int) -> None:
        """A grant of ``name`` to ``lease_id`` with ``token``: check it against the model, then record it."""
        current = self.holders.get(name)
        if current is not None and current[0] == lease_id:
            assert token == current[1], f"{name!r}: the holder lease got a new token {token} (had {current[1]})"
            return
        if current is not None:
            assert self._alive(current[0]) is None, f"{name!r} granted to {lease_id:#x} while {current} holds it"
            self._lease_gone(current[0])  # it can only have expired
        assert token > self.max_token.get(name, 0), (
            f"{name!r}: token {token} not above the earlier {self.max_token.get(name)}")
        self.max_token[name] = token
        self.holders[name] = (lease_id, token)
        self.tokens_seen.append(token)
        self.dirty.add(name)

    def _may_have_expired(self, lease_id: int, out: Outcome, what: str) -> None:
        """A LEASE_EXPIRED answer: only for a lease that is gone, or volatile (which is then gone)."""
        alive = self._alive(lease_id)
        assert alive is not True, f"{what}: LEASE_EXPIRED for live lease {lease_id:#x}: {out}"
        self._lease_gone(lease_id)

    # ------------------------------------------------------------ leases

    @initialize()
    def one_lease_each(self) -> None:
        """Each caller starts with a lease (TTL 300 s), so that most sequences reach grants and releases."""
        for caller in self.callers:
            out = _call("LeaseGrant", caller.stub.LeaseGrant, lock_pb2.LeaseGrantRequest(ttl_seconds=300),
                        allowed=set())
            caller.granted[out.response.lease_id] = out.response
            self.leases[out.response.lease_id] = Lease(out.response.lease_id, caller.index, out.response.ttl_seconds)

    @rule(data=st.data(), ttl=ttls)
    def lease_grant(self, data: st.DataObject, ttl: int) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        out = _call("LeaseGrant", caller.stub.LeaseGrant, lock_pb2.LeaseGrantRequest(ttl_seconds=ttl),
                    allowed={C.INVALID_ARGUMENT})
        valid = 1 <= ttl <= 86_400
        if not out.ok:
            if out.code == C.INVALID_ARGUMENT:
                assert not valid and out.field == "ttl_seconds", out
            return
        assert valid, f"LeaseGrant granted TTL {ttl}"
        lease_id, granted = out.response.lease_id, out.response.ttl_seconds
        assert lease_id > 0 and granted >= ttl and lease_id not in self.leases, out.response
        caller.granted[lease_id] = out.response
        self.leases[lease_id] = Lease(lease_id, caller.index, granted)

    @rule(data=st.data())
    def lease_revoke(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        lease_id = self._lease_for(caller, data)
        out = _call("LeaseRevoke", caller.stub.LeaseRevoke, lock_pb2.LeaseRevokeRequest(lease_id=lease_id),
                    metadata=_lease_metadata(caller, lease_id),
                    allowed={C.INVALID_ARGUMENT, C.PERMISSION_DENIED})
        if out.code == C.INVALID_ARGUMENT:
            assert lease_id <= 0 and out.field == "lease_id", out
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        elif out.ok:
            alive = self._alive(lease_id)
            assert lease_id > 0
            if alive is not None:
                assert out.response.found == alive, (lease_id, out.response)
            self._lease_gone(lease_id)

    # ------------------------------------------------------------ locks

    @rule(data=st.data(), name=any_names, wait=waits)
    def acquire(self, data: st.DataObject, name: str, wait: tuple[int, bool]) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        lease_id = self._lease_for(caller, data)
        wait_ms, forever = wait
        blocking = wait_ms != 0 or forever
        request = lock_pb2.AcquireRequest(name=name, lease_id=lease_id, wait_ms=wait_ms, wait_forever=forever)
        out = _call("Acquire", caller.stub.Acquire, request, timeout=WAIT_DEADLINE if blocking else DEADLINE,
                    metadata=_lease_metadata(caller, lease_id),
                    allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED, C.DEADLINE_EXCEEDED})
        self._acquired(caller, name, lease_id, wait, out)

    @rule(data=st.data(), name=st.sampled_from(POOL_NAMES[:4]),
          wait=st.sampled_from([(0, False)] * 6 + [(50, False), (300, False), (0, True)]))
    def acquire_pool(self, data: st.DataObject, name: str, wait: tuple[int, bool]) -> None:
        """Acquire one of a few names with a live lease (most often its own): where holders meet."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        live = [lid for lid, lease in self.leases.items() if lease.alive]
        own = [lid for lid in live if self.leases[lid].owner == caller.index]
        if not live:
            return
        lease_id = data.draw(st.sampled_from(own * 3 + live if own else live), label="lease_id")
        wait_ms, forever = wait
        blocking = wait_ms != 0 or forever
        request = lock_pb2.AcquireRequest(name=name, lease_id=lease_id, wait_ms=wait_ms, wait_forever=forever)
        out = _call("Acquire", caller.stub.Acquire, request, timeout=WAIT_DEADLINE if blocking else DEADLINE,
                    metadata=_lease_metadata(caller, lease_id),
                    allowed={C.FAILED_PRECONDITION, C.PERMISSION_DENIED, C.DEADLINE_EXCEEDED})
        self._acquired(caller, name, lease_id, wait, out)

    def _acquired(self, caller: Caller, name: str, lease_id: int, wait: tuple[int, bool], out: Outcome) -> None:
        wait_ms, forever = wait
        valid_wait = 0 <= wait_ms <= 86_400_000 and not (forever and wait_ms)
        if _valid_name(name):
            self.dirty.add(name)
        if out.code == C.INVALID_ARGUMENT:
            assert out.field in ("name", "lease_id", "wait_ms"), out
            assert {"name": not _valid_name(name), "lease_id": lease_id <= 0, "wait_ms": not valid_wait}[out.field], out
            return
        if out.code == C.RESOURCE_EXHAUSTED:
            return  # a limit of the coordinator's, or gRPC's own on the message size
        assert _valid_name(name) and lease_id > 0 and valid_wait, (name[:40], lease_id, wait, out)
        if out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id) and out.reason in ("NOT_LEASE_OWNER", "ACCESS_DENIED"), out
        elif out.code == C.FAILED_PRECONDITION:
            assert out.reason == "LEASE_EXPIRED", out
            self._may_have_expired(lease_id, out, "Acquire")
        elif out.code == C.DEADLINE_EXCEEDED:
            assert wait != (0, False), f"a try-once Acquire timed out: {out}"
            if out.reason is None:
                # The caller's own deadline: the outcome is unknown; the lease's owner gives up with Withdraw.
                owner = self.callers[self._owner(lease_id) or 0]
                w = _call("Withdraw", owner.stub.Withdraw, lock_pb2.WithdrawRequest(name=name, lease_id=lease_id),
                          metadata=_lease_metadata(owner, lease_id), allowed=set())
                current = self.holders.get(name)
                if w.response.held:
                    assert current is None or current[0] == lease_id or self._alive(current[0]) is None, (
                        f"{name!r}: Withdraw of a timed-out Acquire found lease {lease_id:#x} holding, "
                        f"the model has {current}")
                    if current is not None:
                        self._hold_ended(name)  # ours (granted just before the deadline) or expired
                elif current is not None and current[0] == lease_id:
                    assert self._alive(lease_id) is None, (name, lease_id, w.response)
                    self._lease_gone(lease_id)
            else:
                assert out.reason == "ACQUIRE_TIMEOUT", out
                current = self.holders.get(name)
                assert current is not None and current[0] != lease_id, (
                    f"{name!r}: ACQUIRE_TIMEOUT, but the model's holder is {current}")
        elif out.ok:
            r = out.response
            if r.acquired:
                assert self._alive(lease_id) is not False, f"Acquire granted on dead lease {lease_id:#x}: {r}"
                assert r.token > 0, r
                self._granted(name, lease_id, r.token)
            else:
                assert wait == (0, False), f"a blocking Acquire answered acquired=false: {r}"
                current = self.holders.get(name)
                assert current is not None, f"{name!r}: acquired=false, yet nobody holds it in the model: {r}"
                assert (r.holder.lease_id, r.holder.token) == current, (current, r)
                assert current[0] != lease_id, f"{name!r}: refused to its own holder: {r}"

    @rule(data=st.data(), name=any_names)
    def acquire_binary_name(self, data: st.DataObject, name: str) -> None:
        """A name that is not UTF-8 (sent with the request's bytes twin): INVALID_ARGUMENT "name"."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        raw = data.draw(binary_names, label="raw_name")
        lease_id = self._lease_for(caller, data)
        try:
            raw.decode()
            return  # valid UTF-8 after all: covered by acquire
        except UnicodeDecodeError:
            pass
        method = data.draw(st.sampled_from(["Acquire", "Describe", "Release", "Withdraw"]), label="method")
        twin = bytes_twin(getattr(lock_pb2, f"{method}Request").DESCRIPTOR)(name=raw)
        if method != "Describe":
            twin.lease_id = lease_id
        call = caller.channel.unary_unary(f"{LOCKS}/{method}")
        out = _call(method, call, twin.SerializeToString(), metadata=_lease_metadata(caller, lease_id),
                    allowed={C.INVALID_ARGUMENT})
        assert out.code == C.INVALID_ARGUMENT and out.field == "name", out

    @rule(data=st.data(), name=any_names)
    def release(self, data: st.DataObject, name: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        current = self.holders.get(name)
        choices = [st.sampled_from([0, -1, -(2**63), 2**63 - 1]), INT64]
        if self.tokens_seen:
            choices.append(st.sampled_from(self.tokens_seen))
        if current is not None:
            choices += [st.just(current[1])] * 3 + [st.sampled_from([current[1] - 1, current[1] + 1])]
        token = data.draw(st.one_of(choices), label="token")
        if current is not None and data.draw(st.booleans(), label="holder's lease"):
            lease_id = current[0]
        else:
            lease_id = self._lease_for(caller, data)
        out = _call("Release", caller.stub.Release, lock_pb2.ReleaseRequest(name=name, lease_id=lease_id, token=token),
                    metadata=_lease_metadata(caller, lease_id),
                    allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        if _valid_name(name):
            self.dirty.add(name)
        if out.code == C.INVALID_ARGUMENT:
            assert out.field in ("name", "lease_id", "token"), out
            assert {"name": not _valid_name(name), "lease_id": lease_id <= 0, "token": token <= 0}[out.field], out
            return
        if out.code == C.RESOURCE_EXHAUSTED:
            return
        assert _valid_name(name) and lease_id > 0 and token > 0, (name[:40], lease_id, token, out)
        mine = current is not None and current == (lease_id, token)
        if out.ok:
            assert mine, f"Release of {name!r} by ({lease_id:#x}, {token}) succeeded; the model's holder is {current}"
            self._hold_ended(name)
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        else:
            assert out.reason in ("NOT_HOLDER", "STALE_TOKEN", "LEASE_EXPIRED"), out
            if out.reason == "LEASE_EXPIRED":
                self._may_have_expired(lease_id, out, "Release")
            elif current is not None and current[0] == lease_id:
                # The model has this lease holding: an older token is stale, a newer one was never granted,
                # and only an expiry (of a volatile lease) explains the refusal of the right one.
                if token < current[1]:
                    assert out.reason == "STALE_TOKEN", (current, token, out)
                elif token > current[1]:
                    assert out.reason == "NOT_HOLDER", (current, token, out)
                else:
                    assert self._alive(lease_id) is None, (name, current, token, out)
                    self._lease_gone(lease_id)
            else:
                assert out.reason == "NOT_HOLDER", (current, lease_id, token, out)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release_holder(self, data: st.DataObject) -> None:
        """Release a held lock: by its lease's owner or another caller, with its token or a neighbour of it."""
        name = data.draw(st.sampled_from(sorted(self.holders)), label="name")
        lease_id, token = self.holders[name]
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        offered = data.draw(st.sampled_from([token] * 4 + [token - 1, token + 1, 2**63 - 1]), label="token")
        out = _call("Release", caller.stub.Release,
                    lock_pb2.ReleaseRequest(name=name, lease_id=lease_id, token=offered),
                    metadata=_lease_metadata(caller, lease_id),
                    allowed={C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        self.dirty.add(name)
        if out.ok:
            assert offered == token, f"Release of {name!r} with token {offered} succeeded; the holder has {token}"
            self._hold_ended(name)
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        elif out.code == C.FAILED_PRECONDITION:
            if out.reason == "LEASE_EXPIRED" or (offered == token and self._alive(lease_id) is None):
                self._may_have_expired(lease_id, out, "Release")
            elif offered < token:
                assert out.reason == "STALE_TOKEN", out
            else:
                assert out.reason == "NOT_HOLDER" and offered != token, out

    @rule(data=st.data(), name=any_names)
    def withdraw(self, data: st.DataObject, name: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        current = self.holders.get(name)
        if current is not None and data.draw(st.booleans(), label="holder's lease"):
            lease_id = current[0]
        else:
            lease_id = self._lease_for(caller, data)
        out = _call("Withdraw", caller.stub.Withdraw, lock_pb2.WithdrawRequest(name=name, lease_id=lease_id),
                    metadata=_lease_metadata(caller, lease_id),
                    allowed={C.INVALID_ARGUMENT, C.PERMISSION_DENIED})
        if _valid_name(name):
            self.dirty.add(name)
        if out.code == C.INVALID_ARGUMENT:
            assert out.field in ("name", "lease_id"), out
            assert {"name": not _valid_name(name), "lease_id": lease_id <= 0}[out.field], out
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        elif out.ok:
            r = out.response
            held = current is not None and current[0] == lease_id
            assert r.found == r.held, f"Withdraw found a waiter of {name!r}: nobody should wait: {r}"
            if held and not r.held:
                assert self._alive(lease_id) is None, (name, current, r)
                self._lease_gone(lease_id)
            else:
                assert r.held == held, (name, lease_id, current, r)
                if held:
                    self._hold_ended(name)

    @rule(data=st.data(), name=any_names)
    def describe(self, data: st.DataObject, name: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        out = _call("Describe", caller.stub.Describe, lock_pb2.DescribeRequest(name=name),
                    allowed={C.INVALID_ARGUMENT})
        if out.code == C.INVALID_ARGUMENT:
            assert not _valid_name(name) and out.field == "name", out
        elif out.ok:
            assert _valid_name(name)
            self.dirty.add(name)

    @rule(data=st.data(),
          page_size=st.sampled_from([0, 1, 2, 3, 1000, -1, -(2**31), 2**31 - 1]),
          page_token=st.sampled_from(["", "", "", "", "garbage", "%%%", "AAAA", "\x00", "é"]) | st.text(max_size=30),
          list_prefix=st.sampled_from(["", "", "a", "jobs/", "ключ", "\x00", "x" * 300]))
    def list_locks(self, data: st.DataObject, page_size: int, page_token: str, list_prefix: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        request = lock_pb2.ListLocksRequest(prefix=list_prefix, page_size=page_size, page_token=page_token)
        pages = 0
        while True:
            out = _call("ListLocks", caller.stub.ListLocks, request, allowed={C.INVALID_ARGUMENT})
            if out.code == C.INVALID_ARGUMENT:
                assert out.field in ("prefix", "page_size", "page_token"), out
                assert pages == 0, f"a page token of the coordinator's own was refused: {out}"
                return
            if not out.ok:
                return
            for lock in out.response.locks:
                assert lock.name.startswith(list_prefix), (list_prefix, lock.name)
                current = self.holders.get(lock.name)
                if request.page_token == "" or pages > 0:
                    assert current == (lock.holder.lease_id, lock.holder.token) or (
                        current is not None and self._alive(current[0]) is None), (lock, current)
            pages += 1
            if not out.response.next_page_token or pages >= 5:
                return
            request = lock_pb2.ListLocksRequest(prefix=list_prefix, page_size=page_size,
                                                page_token=out.response.next_page_token)

    @rule(data=st.data())
    def server_info(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        out = _call("ServerInfo", caller.stub.ServerInfo, lock_pb2.ServerInfoRequest(), allowed=set())
        assert out.response.serving and out.response.etcd.available, out.response

    @rule(data=st.data(), payload=st.binary(max_size=64) | st.sampled_from([b"\xff\xff", b"\x0a", b"\x0a\xff",
                                                                          b"\x10" + b"\xff" * 11, b"\x08"]))
    def garbage_bytes(self, data: st.DataObject, payload: bytes) -> None:
        """Bytes that are (mostly) no protobuf, to Acquire: a typed refusal, never UNKNOWN."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        call = caller.channel.unary_unary(f"{LOCKS}/Acquire", response_deserializer=lock_pb2.AcquireResponse.FromString)
        out = _call("Acquire (garbage)", call, payload,
                    allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        assert not out.ok, f"Acquire of bytes {payload!r} succeeded: {out.response}"

    @rule(data=st.data())
    def wrong_message_type(self, data: st.DataObject) -> None:
        """One request type sent to another method: parsed as that method's request, refused or answered."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        request = data.draw(st.sampled_from([
            lock_pb2.LeaseGrantRequest(ttl_seconds=5), lock_pb2.ListLocksRequest(prefix="a", page_size=3),
            lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=7, request_id=1)),
            lock_pb2.WatchHold(name="a", lease_id=9, token=3)]), label="request")
        method = data.draw(st.sampled_from(["Acquire", "Release", "Describe", "Withdraw"]), label="method")
        response_type = getattr(lock_pb2, f"{method}Response")
        call = caller.channel.unary_unary(f"{LOCKS}/{method}", response_deserializer=response_type.FromString)
        out = _call(f"{method} ({type(request).__name__})", call, request.SerializeToString(),
                    allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        # Nothing parsed here names a lease of the model (ids 3, 7, 9): no grant, no release, nothing withdrawn
        # (a try-once Acquire of a held lock answers acquired=false without looking at the lease).
        if out.ok:
            assert method in ("Describe", "Withdraw", "Acquire"), (method, request, out)
            assert not (out.response.found if method == "Withdraw" else method == "Acquire" and out.response.acquired), out

    # ------------------------------------------------------------ KeepAlive streams

    def _streams(self) -> list[Stream]:
        return [s for c in self.callers for s in c.streams if s.open]

    @rule(data=st.data())
    def stream_open(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        if sum(s.open for s in caller.streams) >= MAX_STREAMS_PER_CALLER:
            return
        caller.streams.append(Stream(caller))

    def _check_end(self, stream: Stream, allowed: set[grpc.StatusCode]) -> None:
        end = stream.end
        if end is None:
            return
        if stream.cancelled:
            assert end.code in (C.CANCELLED, C.OK), end
            return
        assert end.code not in NEVER, end
        assert end.code in allowed | ALWAYS | {C.OK}, end
        if end.code != C.OK:
            assert end.reason in KNOWN_REASONS, end

    @precondition(lambda self: self._streams())
    @rule(data=st.data())
    def stream_keepalive(self, data: st.DataObject) -> None:
        stream = data.draw(st.sampled_from(self._streams()), label="stream")
        lease_id = self._lease_for(stream.caller, data)
        self.request_id += 1
        rid = self.request_id
        stream.send(_keepalive_request(stream.caller, lease_id, "keepalive", request_id=rid))
        stream.sent_foreign |= self._foreign(stream.caller, lease_id)
        if lease_id <= 0:
            return  # never forwarded to etcd: no answer (the client's deadline counts it as not acknowledged)
        acked = stream.wait(lambda r: r.WhichOneof("response") == "keepalive" and r.keepalive.request_id == rid)
        self._check_end(stream, {C.PERMISSION_DENIED})
        if not acked:  # a foreign lease's refusal (of this message, or of an earlier one) ended the stream
            assert self._foreign(stream.caller, lease_id) or (
                stream.sent_foreign and stream.end is not None and stream.end.code == C.PERMISSION_DENIED), stream.end
            return
        ack = [r.keepalive for r in stream.events if r.keepalive.request_id == rid][-1]
        assert ack.lease_id == lease_id, ack
        alive = self._alive(lease_id)
        if alive is True:
            assert ack.ttl_seconds > 0, (lease_id, ack)
        elif alive is False:
            assert ack.ttl_seconds <= 0, (lease_id, ack)
        elif ack.ttl_seconds <= 0:
            self._lease_gone(lease_id)

    @precondition(lambda self: self._streams())
    @rule(data=st.data(), name=any_names, token=st.sampled_from([0, -1, 2**63 - 1]) | INT64)
    def stream_watch(self, data: st.DataObject, name: str, token: int) -> None:
        """Watch (or unwatch) a hold: any triple is taken; one that ended through our calls is reported at once."""
        stream = data.draw(st.sampled_from(self._streams()), label="stream")
        kind = data.draw(st.sampled_from(["watch", "unwatch", "ended"]), label="kind")
        if kind == "ended" and self.ended:
            name, lease_id, token = data.draw(st.sampled_from(self.ended), label="ended hold")
        else:
            lease_id = self._lease_for(stream.caller, data)
        stream.send(_keepalive_request(stream.caller, lease_id, "unwatch" if kind == "unwatch" else "watch",
                                       name=name, token=token))
        stream.sent_foreign |= self._foreign(stream.caller, lease_id)
        if kind == "ended" and (name, lease_id, token) in self.ended:
            def reported(r: lock_pb2.KeepAliveResponse) -> bool:
                e = r.hold_ended
                return r.WhichOneof("response") == "hold_ended" and (e.name, e.lease_id, e.token) == (
                    name, lease_id, token)
            if any(reported(r) for r in stream.events):
                return  # already reported on this stream (a watch of it before)
            got = stream.wait(reported)
            self._check_end(stream, {C.PERMISSION_DENIED})
            assert got or self._foreign(stream.caller, lease_id) or (
                stream.sent_foreign and stream.end is not None and stream.end.code == C.PERMISSION_DENIED), (
                f"no HoldEnded for ended hold {(name, lease_id, token)}: {stream.end}")
        else:
            # Nothing to wait for; a refusal of the stream (a bad name) comes as its end.
            self._check_end(stream, {C.INVALID_ARGUMENT, C.PERMISSION_DENIED})

    @precondition(lambda self: self._streams())
    @rule(data=st.data(), how=st.sampled_from(["half-close", "cancel", "garbage"]))
    def stream_end(self, data: st.DataObject, how: str) -> None:
        stream = data.draw(st.sampled_from(self._streams()), label="stream")
        if how == "half-close":
            stream.half_close()
            stream.wait(None)
            self._check_end(stream, {C.INVALID_ARGUMENT, C.PERMISSION_DENIED})
        elif how == "cancel":
            stream.cancel()
            stream.wait(None)
            self._check_end(stream, set())
        else:
            stream.send(data.draw(st.sampled_from([b"\xff\xff", b"\x0a\xff", b"\x12\x05\x0a\x03\xff\xfe\xfd"]),
                                  label="garbage"))
            stream.wait(None)
            assert stream.end is not None and stream.end.code == C.INVALID_ARGUMENT, stream.end
            self._check_end(stream, {C.INVALID_ARGUMENT})

    # ------------------------------------------------------------ after each step

    @invariant()
    def coordinator_agrees(self) -> None:
        """The coordinator serves, agrees with the model on every name the step touched, and logged no error."""
        self.totals.steps += 1
        stub = self.callers[0].stub
        names = sorted(self.dirty) or ["a"]
        self.dirty.clear()
        for name in names:
            out = _call("Describe (check)", stub.Describe, lock_pb2.DescribeRequest(name=name), allowed=set())
            d = out.response
            current = self.holders.get(name)
            assert d.waiter_count == 0, f"{name!r}: waiters left behind: {d}"
            if current is not None and not d.held:
                assert self._alive(current[0]) is None, f"{name!r}: the model's holder {current} is gone: {d}"
                self._lease_gone(current[0])
                current = None
            if d.held:
                assert current == (d.holder.lease_id, d.holder.token), (
                    f"{name!r}: held by {d.holder.lease_id:#x}/{d.holder.token}; the model has {current}")
                assert d.holder.token <= self.max_token[name]
            else:
                assert current is None, (name, current, d)
        loud = [r for r in self.log_records[self.log_seen:] if r.levelno >= logging.ERROR or r.exc_info]
        self.log_seen = len(self.log_records)
        assert not loud, [(r.name, r.getMessage(), r.exc_text) for r in loud]

    def teardown(self) -> None:
        try:
            for caller in self.callers:
                for stream in caller.streams:
                    stream.close()
            for lease in self.leases.values():
                if lease.alive:
                    owner = self.callers[lease.owner]
                    owner.stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=DEADLINE,
                                           metadata=_lease_metadata(owner, lease.lease_id))
        finally:
            for caller in self.callers:
                caller.channel.close()


class _Records(logging.Handler):
    """Keeps every record logged (by the coordinator, grpc, asyncio) while the test runs."""

    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        self.into.append(record)


@pytest.fixture
def threaded_coordinator(etcd: EmbeddedEtcd, prefix: str) -> Iterator[str]:
    """A coordinator served by its own event loop thread; yields its address."""
    tc = ThreadedCoordinator(etcd.endpoint, prefix)
    try:
        yield tc.start()
    finally:
        tc.stop()


def test_random_call_sequences_keep_the_lock_invariants(threaded_coordinator: str) -> None:
    """Random sequences of valid and invalid calls: typed refusals in time, one holder per name, tokens rising."""
    records: list[logging.LogRecord] = []
    handler = _Records(records)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    FencepostMachine.address = threaded_coordinator
    FencepostMachine.max_token = {}
    FencepostMachine.totals = totals = Totals()
    FencepostMachine.log_records = records
    machine = seed(SEED)(FencepostMachine)
    started = time.monotonic()
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], derandomize=False,
            print_blob=True, report_multiple_bugs=False,
            # Shrinking replays sequences against a live server, whose timing varies: slow, and may not replay.
            phases=list(Phase) if SHRINK else [p for p in Phase if p != Phase.shrink]))
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        print(f"\nproperty test: seed {SEED}, {totals.sequences} sequences, {totals.steps} steps, "
              f"{time.monotonic() - started:.1f} s")
        if os.environ.get("FENCEPOST_PROPERTY_VERBOSE"):
            for (what, code, reason), n in sorted(OUTCOMES.items(), key=str):
                print(f"  {what:24} {code:20} {reason or '':16} {n}")
    assert totals.sequences >= min(EXAMPLES, 10) and totals.steps > totals.sequences
