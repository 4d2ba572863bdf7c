"""Leader election, client side: campaign, proclaim, resign, leader, observe.

After etcd's ``concurrency.Election`` (client/v3/concurrency/election.go),
on the coordinator's Campaign, Proclaim, Resign, Leader and Observe calls
(proto/fencepost/v1/lock.proto).

A leadership is a hold like a lock's: :class:`Leadership` *is* an
:class:`~fencepost.client.AsyncLockHandle` of kind ``HOLD_KIND_ELECTION``,
kept under a lease of the client's pool, watched on the KeepAlive stream and
lost exactly as a lock hold is (``lost``, ``on_lost``, ``cancel_on_lost``,
the local deadline). Its fencing token is strictly larger for each new
leader of the election: pass it to the storage with every write the leader
makes, as for a lock. A :class:`CampaignRecipe` plugs the election's calls
(Campaign, Resign, Resign with token 0) into the acquire loop and the
release of :class:`~.holds.Holds` in place of the lock's, so leases, local
exclusion, retries and clean-up are the lock's.

:func:`observe` follows the leader across reconnects: each Observe stream
is resumed with ``after_revision`` = the revision of the last message, on
whichever coordinator the transport reaches, and nothing is yielded twice
or out of order (a leadership whose token is lower than one already
yielded, or the same leadership and value again, is dropped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from .._transport import wire
from .._transport.transport import current_task_cancelling
from ..errors import (
    FencepostError,
    InvalidArgument,
    LeaseLost,
    LockHeld,
    NotHolder,
    StaleTokenError,
    Unavailable,
    from_rpc_error,
)
from ..handle import AsyncLockHandle
from ..v1 import kinds
from ..v1 import lock_pb2 as pb
from ..v1.keys import MAX_VALUE_BYTES, OBSERVE_ACCEPTED_METADATA
from ..v1.retry import CLIENT_BACKOFF
from .recipe import LEASE_EXPIRED, NOT_HOLDER, Recipe, bounded, wait_request

if TYPE_CHECKING:
    from .._leases.lease import Lease
    from .._transport.transport import Transport
    from .holds import Holds

__all__ = ["CampaignRecipe", "LeaderInfo", "Leadership", "check_election", "check_value", "leader", "observe"]

log = logging.getLogger("fencepost.client")

ELECTION = kinds.HoldKind.HOLD_KIND_ELECTION

#: gRPC codes after which an Observe stream is resumed on the next coordinator.
_RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                        grpc.StatusCode.INTERNAL})


@dataclasses.dataclass(frozen=True)
class LeaderInfo:
    """The leader of an election, as Leader or Observe report it.

    Attributes:
        value: The leader's value (Campaign, then Proclaim), bytes as on the wire, also when a str was
            given (sent as UTF-8): :attr:`text` gives that str back.
        lease_id: The leader's lease.
        token: The leadership's fencing token.
        revision: The etcd revision from which this is the leader (of the read, for Leader).
        skipped: Observe only: True when history before this item is unknown: etcd compacted the
            revisions the observer missed while its stream was down (a coordinator failover or an outage),
            so leaders (and values) between the previous leader reported and this one may be missing. The
            Observe stream's ``compacted`` flag, carried to the next leader reported (a None item cannot
            carry it). Always False from Leader.
    """

    value: bytes
    lease_id: int
    token: int
    revision: int = 0
    skipped: bool = False

    @property
    def text(self) -> str:
        """The value as the str given to ``campaign`` or ``proclaim`` (sent as UTF-8; ``value`` is the bytes).

        Raises:
            UnicodeDecodeError: the value is bytes that are not UTF-8 (given as bytes, not as a str).
        """
        return self.value.decode("utf-8")


def check_election(election: str) -> str:
    """Check an election's name client-side (the rules of a lock name).

    Raises:
        InvalidArgument: field "election".
    """
    try:
        return wire.check_name(election)
    except InvalidArgument as exc:
        raise InvalidArgument("election" + exc.message.removeprefix("name").removeprefix(" name"),
                              field="election") from None


def check_value(value: bytes | str) -> bytes:
    """A leader's value as bytes (a str is UTF-8 encoded), 0 to ``MAX_VALUE_BYTES`` (32768) bytes.

    Raises:
        InvalidArgument: not bytes or str, a str that UTF-8 cannot encode (a lone surrogate), or too long
            (field "value").
    """
    if isinstance(value, str):
        try:
            value = value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"value is a str that is not valid Unicode ({exc.reason} at position "
                                  f"{exc.start}); give bytes for a value that is not text", field="value") from None
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"value must be bytes or str, not {type(value).__name__}", field="value")
    value = bytes(value)
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidArgument(f"value is {len(value)} bytes; at most {MAX_VALUE_BYTES}", field="value")
    return value


class Leadership(AsyncLockHandle):
    """The leadership of an election: a hold with a fencing token, lost like a lock's.

    Returned by :meth:`AsyncLockClient.campaign`. Everything of
    :class:`AsyncLockHandle` applies (``token``, ``lease_id``, ``lost``,
    ``on_lost``, ``cancel_on_lost``, ``valid_for``, ``check``); ``name``
    is the election's name. :meth:`release` is :meth:`resign`.

    Attributes:
        value: The value the leader publishes (Campaign's, then the last Proclaim's), bytes; :attr:`text`
            gives back a str that was given.
    """

    def __init__(self, election: str, lease: Lease, token: int, value: bytes,
                 release: Callable[[AsyncLockHandle], Awaitable[None]],
                 proclaim: Callable[[Leadership, bytes], Awaitable[None]]) -> None:
        super().__init__(election, lease, token, release, kind=ELECTION)
        self.value = value
        self._proclaim_fn = proclaim

    @property
    def text(self) -> str:
        """The value as the str given to ``campaign`` or ``proclaim`` (see :attr:`LeaderInfo.text`).

        Raises:
            UnicodeDecodeError: the value is bytes that are not UTF-8.
        """
        return self.value.decode("utf-8")

    async def proclaim(self, value: bytes | str) -> None:
        """Publish a new value without a new election (the token is unchanged).

        Args:
            value: bytes, or a str sent as UTF-8; 0 to 32768 bytes (MAX_VALUE_BYTES).

        Raises:
            InvalidArgument: bad value (field "value").
            NotHolder: this lease no longer leads under this token (then ``lost`` is set too).
            LeaseLost: the lease is gone.
            Unavailable: no coordinator reachable.
        """
        self._check_fork()
        await self._proclaim_fn(self, check_value(value))

    async def resign(self) -> None:
        """Give up the leadership (Resign); the next candidate leads. As :meth:`release`."""
        await self.release()

    def __repr__(self) -> str:
        return super().__repr__().replace("<AsyncLockHandle name=", "<Leadership election=", 1)


class CampaignRecipe(Recipe):
    """One campaign in ``election`` (Campaign), withdrawn by Resign with token 0, released by Resign.

    Its holds are keyed by their internal names
    (:func:`fencepost.client.v1.kinds.election_lock`), so that election ``E``
    and lock ``E`` never share a slot; the acquire loop's own errors name
    that internal lock (the client says the election's name instead).

    Args:
        holds: The client's holds and leases.
        election: The election's name (checked).
        value: What the leader publishes (checked).
    """

    acting = "campaigning"
    withdraw_failure_level = logging.DEBUG

    def __init__(self, holds: Holds, election: str, value: bytes = b"") -> None:
        super().__init__(holds, kinds.election_lock(election))
        self.election = election
        self.value = value

    def held_here(self, lease_id: int, *, waiting: bool) -> str:
        return f"election {self.election!r} is led by this client (lease {lease_id:#x})"

    def not_granted_now(self, held: LockHeld) -> str:
        return (f"election {self.election!r}: not elected within 0 s: led by lease {held.holder_lease_id:#x} "
                f"(token {held.holder_token})")

    async def acquire_call(self, lease: Lease, until: float | None, try_once: bool) -> AsyncLockHandle:
        election, holds = self.election, self.holds
        request_id = wire.new_request_id()  # the same on every attempt (only the wait left changes)
        make = wait_request(lambda wait_ms, forever: pb.CampaignRequest(
            election=election, lease_id=lease.lease_id, value=self.value, wait_ms=wait_ms, wait_forever=forever,
            request_id=request_id), try_once=try_once, call_timeout=holds.call_timeout)
        resp = await holds.transport.call("Campaign", make, until=until, idempotent=True, name=election,
                                          lease_id=lease.lease_id, secret=lease.secret)
        if not resp.elected:
            leader = resp.leader if resp.HasField("leader") else pb.LeaderInfo()
            raise LockHeld(f"election {election!r} is led by lease {leader.lease_id:#x} with token {leader.token}",
                           name=election, lease_id=lease.lease_id, holder_lease_id=int(leader.lease_id),
                           holder_token=int(leader.token))
        return Leadership(election, lease, int(resp.token), self.value, self.release, self.proclaim)

    async def withdraw_call(self, lease: Lease) -> str | None:
        """Resign with token 0: withdraw the candidacy an abandoned Campaign may have left."""
        holds = self.holds
        await holds.transport.call(
            "Resign", lambda _left: (pb.ResignRequest(election=self.election, lease_id=lease.lease_id),
                                     holds.call_timeout),
            until=None, idempotent=True, name=self.election, lease_id=lease.lease_id, secret=lease.secret)
        return None

    async def release_call(self, handle: AsyncLockHandle, until: float) -> None:
        holds = self.holds
        # One request id per leadership: a retry of its Resign answers as the first did.
        request = pb.ResignRequest(election=handle.name, lease_id=handle.lease_id, token=handle.token,
                                   request_id=handle._release_request_id())
        await holds.transport.call("Resign", lambda left: (request, bounded(holds.call_timeout, left)),
                                   until=until, idempotent=True, name=handle.name, lease_id=handle.lease_id,
                                   token=handle.token, secret=handle.lease_secret)

    async def proclaim(self, handle: Leadership, value: bytes) -> None:
        """Set ``handle``'s value (Proclaim, idempotent: retried on UNAVAILABLE); a refusal loses the hold.

        Raises:
            NotHolder, StaleTokenError, LeaseLost: the leadership is gone (``handle.lost`` is set).
            Unavailable, FencepostError: as the coordinator answered.
        """
        handle.check()
        holds = self.holds
        request = pb.ProclaimRequest(election=handle.name, lease_id=handle.lease_id, token=handle.token, value=value)
        try:
            await holds.transport.call("Proclaim", lambda left: (request, bounded(holds.call_timeout, left)),
                                       until=None, idempotent=True, name=handle.name, lease_id=handle.lease_id,
                                       token=handle.token, secret=handle.lease_secret)
        except (NotHolder, StaleTokenError, LeaseLost) as err:
            if isinstance(err, LeaseLost):
                holds.pool.lose(handle._lease, LEASE_EXPIRED)
            holds.pool.lose_hold(handle, err.reason or NOT_HOLDER)
            raise
        handle.value = value


async def leader(transport: Transport, election: str, timeout: float) -> LeaderInfo | None:
    """The current leader of ``election`` (Leader), None when it has none.

    Raises:
        InvalidArgument: bad election.
        Unavailable: no coordinator reachable.
    """
    resp = await transport.call("Leader", lambda _left: (pb.LeaderRequest(election=election), timeout),
                                until=None, idempotent=True, name=election)
    if not resp.HasField("leader"):
        return None
    return LeaderInfo(bytes(resp.leader.value), int(resp.leader.lease_id), int(resp.leader.token),
                      int(resp.revision))


async def observe(transport: Transport, election: str, *, ensure_open: Callable[[], Awaitable[None]]
                  ) -> AsyncIterator[LeaderInfo | None]:
    """Every change of the leader of ``election``: a :class:`LeaderInfo`, or None when it has no leader.

    The first item is the current state. Across a broken stream (a
    coordinator stopped or failed over) the Observe call is made again with
    ``after_revision``, so no change is missed (unless etcd compacted that
    history meanwhile: then the current state follows, and the next leader
    yielded has ``skipped`` set, as etcd's Election.Observe cannot say what
    it missed) and none repeated: a leader whose token is below the last one
    yielded, or the same leader with the same value, is never yielded again;
    nor two Nones in a row. A gap after which the same leader (same token and
    value) is still there is not flagged: no other leadership can have come
    between (a leader's key keeps its create revision while it lives).

    Once a coordinator has accepted the Observe, the observation goes on
    through any later outage (it resumes when a coordinator answers again,
    as the KeepAlive stream does); only the first connection is bounded by
    ``connect_timeout``.

    Raises:
        InvalidArgument: bad election.
        AccessDenied: the policy does not allow ``describe`` on ``election``.
        Unavailable: no coordinator reachable for ``connect_timeout`` seconds before the first Observe
            was accepted.
    """
    after = 0
    accepted = False  # a coordinator accepted an Observe (its initial metadata came): outages are waited out
    last: tuple[int, bytes] | None = None  # (token, value) last yielded
    yielded_none = False
    gap = False  # etcd compacted history this observer missed: said on the next leader yielded
    loop = asyncio.get_running_loop()
    delays = CLIENT_BACKOFF.delays()
    failing_since: float | None = None
    refused: FencepostError | None = None  # the last Observe a coordinator refused (not accepted yet)
    while True:
        await ensure_open()
        channel, stub = transport.channel, transport.stub
        assert channel is not None and stub is not None
        try:
            if failing_since is not None:
                # Before the first acceptance, connect_timeout bounds the whole attempt; after it, each
                # wait for a connection is bounded, and the loop waits the outage out.
                await transport.wait_connected(
                    (loop.time() if accepted else failing_since) + transport.connect_timeout)
            call = stub.Observe(pb.ObserveRequest(election=election, after_revision=after))
            try:
                # A resumed Observe sends nothing until the leader changes: its initial metadata (sent when
                # the coordinator accepts it) says the stream is up again.
                metadata = await call.initial_metadata()
                # A coordinator marks its acceptance (after its first etcd read); one that refuses the
                # Observe at once sends no metadata. (A coordinator older than the mark sends empty metadata
                # on acceptance: the call then still runs.)
                if any(key == OBSERVE_ACCEPTED_METADATA for key, _ in metadata or ()) or (
                        not metadata and not call.done()):
                    accepted, failing_since, delays = True, None, CLIENT_BACKOFF.delays()
                async for resp in call:
                    failing_since, delays = None, CLIENT_BACKOFF.delays()
                    if resp.compacted and not (resp.HasField("leader") and last is not None and (
                            int(resp.leader.token), bytes(resp.leader.value)) == last):
                        log.warning("fencepost: observe of %r resumed after revision %d, which etcd compacted: "
                                    "changes up to revision %d are unknown", election, after, int(resp.revision))
                        gap = True
                    after = int(resp.revision)
                    if not resp.HasField("leader"):
                        if not yielded_none:
                            yielded_none = True
                            yield None
                        continue
                    info = LeaderInfo(bytes(resp.leader.value), int(resp.leader.lease_id), int(resp.leader.token),
                                      after, gap)
                    if last is not None and (info.token < last[0] or (info.token, info.value) == last):
                        continue
                    last, yielded_none, gap = (info.token, info.value), False, False
                    yield info
            finally:
                call.cancel()
        except grpc.aio.AioRpcError as err:
            if err.code() not in _RESUMABLE or current_task_cancelling():
                raise from_rpc_error(err, name=election) from err
            log.debug("fencepost: observe of %r broke (%s); resuming after revision %d", election, err.code(), after)
            refused = from_rpc_error(err, name=election)
            if refused.reason is None:  # a broken connection, not a coordinator's own answer
                refused = None
        except grpc.aio.UsageError:  # the channel was closed by a rotation: use the new one
            pass
        except Unavailable:
            if not accepted:
                if refused is not None:  # the last coordinator that answered refused: say why
                    raise refused from None
                raise
            log.debug("fencepost: observe of %r: no coordinator reachable yet; still trying", election)
        now = loop.time()
        if failing_since is None:
            failing_since = now
        elif now - failing_since > transport.connect_timeout and not accepted:
            if refused is not None:  # a coordinator answered, and refused (ETCD_UNAVAILABLE): say so
                raise refused
            raise Unavailable(f"observe of {election!r}: no coordinator reachable", name=election)
        transport.rotate(channel, force=True)
        await asyncio.sleep(next(delays))
