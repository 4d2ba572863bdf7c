"""Leader election on the lock algorithm: campaign, proclaim, resign, leader, observe.

After etcd's ``concurrency.Election`` (client/v3/concurrency/election.go).
Election ``E`` is the lock with the internal name ``"\\x01e/" + E``
(:func:`fencepost.client.v1.kinds.election_lock`, a name no caller can
give): each candidate puts one key under its lease, with its value as the
key's value; the leader is the key with the lowest create revision, and the
leadership's fencing token is that key's token (create revision + the token
floor), strictly larger for each new leader. So Campaign is an Acquire with
a value, Resign a Release (or a Withdraw), and everything the lock algorithm
guarantees (first come, first served, the hand-off, a leadership ended by
its lease) holds for elections unchanged.

What elections add:

- Proclaim rewrites the leader's value: one Txn comparing that the key still
  has the leadership's create revision and that no key of the election is
  older (it leads), then putting the new value under the same lease (the
  create revision, and so the token, are unchanged).
- Leader reads the lowest key of the range, with its value, at one revision.
- Observe follows the range: a read at revision R, then an etcd watch from
  R + 1 of the whole range (puts and deletions, with values), keeping the
  candidates' keys in memory; after each revision's events, a change of the
  leader's (lease, token, value) is one :class:`Observed`. Resumed from a
  revision A > 0, the state at A is read (``Range`` at revision A) and only
  the changes after A are reported; when etcd compacted A away, the current
  state is reported with ``compacted`` set. A watch that breaks is resumed
  from the last revision seen.

Errors name the election (its public name), never the internal lock name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fencepost.client.errors import FencepostError, InvalidArgument, Unavailable
from fencepost.client.v1 import etcdops, kinds
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import MAX_VALUE_BYTES, Hold, Keys, prefix_end
from fencepost.client.v1.retry import ETCD_BACKOFF

from ..etcd import NOT_APPLIED, TxnPlan
from .lock import Holder, LockManager, release_refusal
from .validate import validate_lease_id, validate_name, validate_token

__all__ = ["CampaignResult", "Elections", "Leader", "Observed", "public_errors", "validate_election",
           "validate_value"]

_log = logging.getLogger(__name__)


#: etcd's event type of a deletion (mvccpb.Event.DELETE).
_DELETE = 1


@dataclass(frozen=True)
class Leader:
    """One leadership of an election: the leader's lease, its fencing token and its value."""

    lease_id: int
    token: int
    value: bytes


@dataclass(frozen=True)
class CampaignResult:
    """The outcome of a Campaign: elected with ``token``, or (try once only) the current ``leader``."""

    elected: bool
    token: int = 0
    leader: Leader | None = None


@dataclass(frozen=True)
class Observed:
    """One change of an election's leader seen by Observe: the leader (None: none) from ``revision`` on.

    ``compacted``: the revision Observe was asked to resume from was compacted;
    changes between it and this one are unknown.
    """

    leader: Leader | None
    revision: int
    compacted: bool = False


def validate_election(election: str) -> str:
    """Check an election's name (the rules of a lock name).

    Raises:
        InvalidArgument: field ``election``.
    """
    try:
        return validate_name(election)
    except InvalidArgument as exc:
        raise InvalidArgument("election" + exc.message.removeprefix("name"), field="election") from None


def validate_value(value: bytes) -> bytes:
    """Check a leader's value (0 to MAX_VALUE_BYTES bytes).

    Raises:
        InvalidArgument: field ``value``.
    """
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidArgument(f"value is {len(value)} bytes; at most {MAX_VALUE_BYTES}", field="value")
    return value


class Elections:
    """Campaign, Proclaim, Resign, Leader and Observe, on the lock algorithm.

    Args:
        locks: the lock algorithm (its etcd layer and token floor serve here too).
        keys: the key layout.
    """

    def __init__(self, locks: LockManager, keys: Keys) -> None:
        self._locks = locks
        self._keys = keys

    async def campaign(self, election: str, lease_id: int, value: bytes, wait: float | None) -> CampaignResult:
        """Enter ``lease_id`` as a candidate of ``election`` with ``value``; wait until it leads.

        Args:
            election: the election's name (validated here).
            lease_id: the candidate's lease.
            value: the candidate's value (0 to MAX_VALUE_BYTES bytes).
            wait: 0.0 to try once, seconds to wait at most, None without limit.

        Returns:
            elected with the leadership's token; or, trying once, not elected
            with the current leader (nothing is left queued). Idempotent per
            (lease, election): a lease that leads gets the same token again,
            and its value is set to ``value``.

        Raises:
            As :meth:`LockManager.acquire` (InvalidArgument: field ``election`` or ``value``).
        """
        validate_election(election)
        validate_value(value)
        internal = kinds.election_lock(election)
        with public_errors(election):
            result = await self._locks.acquire(internal, lease_id, wait, value=value)
            if result.acquired:
                return CampaignResult(True, token=result.token)
            leader, _ = await self.leader(election)
        return CampaignResult(False, leader=leader)

    async def proclaim(self, election: str, lease_id: int, token: int, value: bytes) -> int:
        """Set the value of the leadership (``election``, ``lease_id``, ``token``): one Txn.

        Returns:
            The etcd revision of the update.

        Raises:
            InvalidArgument: bad election, lease id, token or value.
            NotHolder: the lease does not lead under ``token`` (``current_token``: the leader's).
            StaleTokenError: the lease's candidacy is newer than ``token``.
            LeaseLost: the lease is gone.
            Unavailable: etcd unreachable.
        """
        validate_election(election)
        validate_lease_id(lease_id)
        validate_token(token)
        validate_value(value)
        internal = kinds.election_lock(election)
        tokens = self._locks.tokens
        created = tokens.revision(token)
        created = created if created > 0 else -1  # below the floor: no key has it (0 would match an absent key)
        key = self._keys.contender(internal, lease_id)
        lock = self._keys.lock_prefix(internal)

        def decide(resp: Any) -> tuple[int, Any, Any]:
            if resp.succeeded:
                return int(resp.header.revision), None, None
            mine, owners = (r.response_range.kvs for r in resp.responses)
            return 0, (mine[0] if mine else None), (owners[0] if owners else None)

        def resolve(resp: Any) -> tuple[int, Any, Any]:
            kvs = resp.responses[0].response_range.kvs
            if kvs and int(kvs[0].create_revision) == created and bytes(kvs[0].value) == value:
                return int(kvs[0].mod_revision), None, None  # applied (or the value was already this)
            return NOT_APPLIED  # type: ignore[no-any-return]  # send again: its compares decide

        with public_errors(election):
            revision, mine, owner = await self._locks.etcd.lock_txn(TxnPlan(
                etcdops.txn([etcdops.is_owner(key, created), etcdops.is_first(lock, created)],
                            [etcdops.put(key, value, lease_id=lease_id)],
                            [etcdops.get(key, keys_only=True), etcdops.holder_of(lock)]),
                decide, [etcdops.get(key)], resolve, name=election, lease_id=lease_id), lock)
            if revision:
                return revision
            holder = None
            if owner is not None:
                parsed = self._keys.parse(bytes(owner.key))
                holder = Holder(parsed[1] if parsed else 0, tokens.reported(int(owner.create_revision)))
            alive = True if mine is not None else await self._locks.lease_alive(lease_id)
            raise release_refusal(Hold(election, lease_id, token), mine, holder, alive, floor=tokens.floor)

    async def resign(self, election: str, lease_id: int, token: int, *, also: Sequence[Any] = ()
                     ) -> tuple[int, bool, bool]:
        """End the leadership (``election``, ``lease_id``, ``token``); token 0 withdraws the candidacy.

        ``also``: more ops for the release Txn's success branch (token > 0: a request record, :mod:`.requests`).

        Returns:
            (revision of the resignation, found: whether the lease had a
            candidacy there, held: whether it led); (revision, True, True) for a token > 0.

        Raises:
            As :meth:`LockManager.release` (token > 0) or :meth:`LockManager.withdraw` (token 0).
        """
        validate_election(election)
        validate_lease_id(lease_id)
        internal = kinds.election_lock(election)
        with public_errors(election):
            if token == 0:
                found, held, revision = await self._locks.withdraw(internal, lease_id)
                return revision, found, held
            return await self._locks.release(internal, lease_id, token, also=also), True, True

    async def leader(self, election: str) -> tuple[Leader | None, int]:
        """The current leader of ``election`` (None: none) and the etcd revision it was read at.

        Raises:
            InvalidArgument: bad election.
            DataLoss: tokens would go back (etcd restored from an older snapshot).
            Unavailable: etcd unreachable.
        """
        validate_election(election)
        lock = self._keys.lock_prefix(kinds.election_lock(election))
        with public_errors(election):
            resp = await self._locks.etcd.read([etcdops.holder_of(lock, keys_only=False)], name=election)
            self._locks.tokens.check_serving()
        kvs = resp.responses[0].response_range.kvs
        return (self._leader(kvs[0]) if kvs else None), int(resp.header.revision)

    async def observe(self, election: str, after_revision: int = 0,
                      ready: Callable[[], object] | None = None) -> AsyncIterator[Observed]:
        """Every change of the leader of ``election``, from now or after ``after_revision``.

        Args:
            election: the election's name (validated here).
            after_revision: 0: the first item is the current state; R > 0
                (the revision of the last item a previous observe gave):
                nothing for R itself, then every change after R. When R
                was compacted (or is ahead of etcd), the first item is the
                current state with ``compacted`` set.
            ready: called once the first read succeeded (before any item: a
                resumed observe may give none for a long time).

        Yields:
            :class:`Observed`, one per change of the leader's (lease, token,
            value), in revision order; the caller stops by closing the iterator.

        Raises:
            InvalidArgument: bad election or after_revision.
            Unavailable: etcd unreachable when the first read is made (later
                failures are retried from the last revision seen).
        """
        validate_election(election)
        if after_revision < 0:
            raise InvalidArgument(f"after_revision is {after_revision}; must be >= 0", field="after_revision")
        lock = self._keys.lock_prefix(kinds.election_lock(election))
        end = prefix_end(lock)
        candidates: dict[bytes, Any] = {}  # key -> its KeyValue (create revision, lease, value)
        with public_errors(election):
            first = await self._read(lock, end, after_revision)
        compacted = first is None
        if first is None:
            first = await self._read(lock, end, 0)
            assert first is not None
        for kv in first.kvs:
            candidates[bytes(kv.key)] = kv
        if ready is not None:
            ready()
        revision = int(first.header.revision) if after_revision == 0 or compacted else after_revision
        last = self._lowest(candidates)
        if after_revision == 0 or compacted:
            yield Observed(last, revision, compacted)
        delays = ETCD_BACKOFF.delays()
        while True:
            try:
                stream = self._locks.etcd.watch_range(lock, end, revision + 1)
                try:
                    async for events in stream:
                        delays = ETCD_BACKOFF.delays()
                        for at, batch in _by_revision(events):
                            for event in batch:
                                if event.type == _DELETE:
                                    candidates.pop(bytes(event.kv.key), None)
                                else:
                                    candidates[bytes(event.kv.key)] = event.kv
                            revision = at
                            leader = self._lowest(candidates)
                            if leader != last:
                                last = leader
                                yield Observed(leader, at)
                finally:
                    await stream.aclose()
                # The watch ended: etcd compacted the revision it resumed from. Start over from now.
                fresh = await self._read(lock, end, 0)
                assert fresh is not None
                candidates = {bytes(kv.key): kv for kv in fresh.kvs}
                revision = int(fresh.header.revision)
                leader = self._lowest(candidates)
                if leader != last:
                    last = leader
                    yield Observed(leader, revision, True)
            except Unavailable as exc:  # an etcd blip: resume from the last revision seen
                delay = next(delays)
                _log.debug("observe of %r: watch failed (%s); resuming from revision %d in %.2f s",
                           election, exc.message, revision + 1, delay)
                await asyncio.sleep(delay)

    async def _read(self, lock: bytes, end: bytes, revision: int) -> Any:
        """The election's keys with values at ``revision`` (0: now); None when that revision is compacted."""
        request = rpc_pb2.RangeRequest(key=lock, range_end=end, revision=revision)
        if revision:
            return await self._locks.etcd.range_at(request)
        return await self._locks.etcd.range(request)

    def _lowest(self, candidates: dict[bytes, Any]) -> Leader | None:
        if not candidates:
            return None
        return self._leader(min(candidates.values(), key=lambda kv: int(kv.create_revision)))

    def _leader(self, kv: Any) -> Leader:
        return Leader(int(kv.lease), self._locks.tokens.reported(int(kv.create_revision)), bytes(kv.value))


def _by_revision(events: list[Any]) -> list[tuple[int, list[Any]]]:
    """Watch events grouped by their revision (one etcd Txn each), in order."""
    groups: list[tuple[int, list[Any]]] = []
    for event in events:
        at = int(event.kv.mod_revision)
        if groups and groups[-1][0] == at:
            groups[-1][1].append(event)
        else:
            groups.append((at, [event]))
    return groups


@contextlib.contextmanager
def public_errors(election: str) -> Iterator[None]:
    """Say the election's name, not its internal lock name, in the FencepostErrors raised within."""
    internal = kinds.election_lock(election)
    try:
        yield
    except FencepostError as exc:
        if exc.name == internal:
            exc.name = election
        if exc.message:  # "lock '\x01e/E' not granted ..." reads "election 'E' not granted ..."
            exc.message = exc.message.replace(f"lock {internal!r}", f"election {election!r}").replace(
                repr(internal), repr(election))
            exc.args = (exc.message,)
        raise
