"""Listing the held locks: pages of etcd range reads at one revision.

A lock is the key range ``<prefix><encoded name>/`` (:mod:`fencepost.client.v1.keys`);
sorted by key, the contenders of one lock are adjacent, because every key
between two keys that share the prefix ``<encoded name>/`` shares it too. A
page is read with keys-only Range requests in key order, from the page's
start key, at one etcd revision: the first page's, carried in the page token
with the next page's start key, so that the pages of one listing are one
snapshot. The holder of each lock is its contender with the lowest create
revision (its fencing token), the waiters the others.

Names are percent-encoded byte by byte with no safe characters, and ``%``
itself is encoded, so a name starts with ``P`` exactly when its encoded form
starts with P's encoded form: the prefix filter is a key range too.

Elections and semaphores are locks with internal names (:mod:`fencepost.client.v1.kinds`:
a control character first, ``%01`` encoded) that no caller can give: they
are not listed. Their keys come before every lock's (no name a caller can
give encodes to a key below ``%02``), so a listing of every lock starts
after them (:func:`first_lock_key`).

A lock that a lock-delay holds back (:mod:`.lock_delay`: its holder was
lost and the delay runs, or starts at the next Acquire) is listed too, with
no holder and the delay's time left: among the held locks when it has
contenders (all of them waiters), and, when it has none, after every lock
with contenders, from a second key range, the lock-delay keys
``<prefix>!delay!<encoded name>!`` of the names under the prefix (a page
token whose start key is in that range continues there). So a name that a
delay hides is never missing from a listing.

etcd keeps no time of a grant. :class:`GrantTimes` remembers, on this
coordinator's monotonic clock, the grants it made itself; a hold granted by
another replica (or before a restart) is listed with ``held_seconds = -1``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import grpc

from fencepost.client.errors import FencepostError, InvalidArgument
from fencepost.client.v1 import etcdops, kinds
from fencepost.client.v1.keys import MAX_NAME_BYTES, Hold, Keys, prefix_end
from fencepost.client.v1.names import forbidden_problem

from ..etcd import EtcdClient
from ..etcd.failures import Failure, classify
from .snapshots import Holder, holding
from .lock_delay import (DELAY_INFIX, DelayState, delay_range, delay_seconds, delay_state, held_back_by,
                         wait_lease)
from .tokens import TokenFloor

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "GrantTimes", "ListedLock", "LockPage", "delayed_range",
           "first_lock_key", "list_locks"]

#: Locks in a page when the request's page_size is 0.
DEFAULT_PAGE_SIZE = 100
#: Most locks in one page (each costs one LeaseTimeToLive call).
MAX_PAGE_SIZE = 1000
#: Keys read per etcd Range request while filling a page.
RANGE_BATCH = 1000
#: LeaseTimeToLive calls in flight at once while filling a page.
TTL_CONCURRENCY = 32
_TOKEN_VERSION = "v1"


@dataclass(frozen=True)
class ListedLock:
    """One lock of a page: held, or held back by a lock-delay.

    Attributes:
        name: the lock name.
        holder: the holder's lease id and fencing token; None while a lock-delay holds the lock back.
        waiter_count: contenders queued behind the holders (every contender when held back).
        ttl_remaining_seconds: seconds left on the holder's lease; -1 when it ended or there is no holder.
        ttl_seconds: the holder lease's granted TTL in seconds; 0 when it ended or there is no holder.
        held_seconds: seconds since the grant on this coordinator's clock; -1 when unknown.
        lock_delay: the lock-delay holding it back (``remaining_ms`` > 0: running, that long left;
            :data:`~.lock_delay.PENDING`: starts at the next Acquire; 0 with ``seconds`` > 0: ended since the
            listing's revision); none (0, 0) for a held lock.
        holder_count: the contenders holding together: 1, or a read-write lock's readers before its first
            writer (:func:`.snapshots.holding`); 0 while held back.
    """

    name: str
    holder: Holder | None
    waiter_count: int
    ttl_remaining_seconds: int = -1
    ttl_seconds: int = 0
    held_seconds: float = -1.0
    lock_delay: DelayState = DelayState(0, 0)
    holder_count: int = 0


@dataclass(frozen=True)
class LockPage:
    """One page of a listing: its locks, the token of the next page ("" on the last) and the revision."""

    locks: list[ListedLock]
    next_page_token: str
    revision: int


class GrantTimes:
    """The monotonic time of each grant this coordinator made, for ``held_seconds``.

    Keyed by the whole hold (name, lease id, token), so an entry left behind
    by a hold that ended without a Release here (expiry, another replica's
    Release) never answers for a later grant; the oldest entries are dropped
    past ``capacity``.

    Args:
        capacity: most grants remembered.
        clock: the monotonic clock, seconds (injected in tests).
    """

    def __init__(self, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = capacity
        self._clock = clock
        self._granted: OrderedDict[Hold, float] = OrderedDict()

    def granted(self, hold: Hold) -> None:
        """Record a grant now (an idempotent re-grant of the same hold keeps its first time)."""
        if hold in self._granted:
            return
        self._granted[hold] = self._clock()
        while len(self._granted) > self._capacity:
            self._granted.popitem(last=False)

    @property
    def count(self) -> int:
        """The grants remembered now."""
        return len(self._granted)

    def released(self, hold: Hold) -> None:
        """Forget a hold that was released (or that ended otherwise)."""
        self._granted.pop(hold, None)
        if not self._granted:
            self._granted = OrderedDict()  # a dict keeps its largest table: give it back once empty

    def granted_at(self, hold: Hold) -> float | None:
        """The clock reading of ``hold``'s grant here; None when this coordinator did not grant it."""
        return self._granted.get(hold)

    def held_seconds(self, hold: Hold) -> float:
        """Seconds since ``hold`` was granted here; -1.0 when this coordinator did not grant it."""
        started = self._granted.get(hold)
        return -1.0 if started is None else max(0.0, self._clock() - started)


def first_lock_key(keys: Keys) -> bytes:
    """The lowest key a lock with a caller's name can have: past every internal name's (elections', semaphores').

    Below it there are only the keys of internal names (``<prefix>%01...``)
    and the lock-delay keys (``<prefix>!delay!...``, :mod:`.lock_delay`).
    """
    return prefix_end(keys.name_prefix(kinds.INTERNAL))


def _invalid(field: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"{field} {problem}", field=field)


def validate_prefix(prefix: str) -> str:
    """Check a name prefix: 0 to 256 bytes of UTF-8, no character a name may not hold (Cc, Cf, Zl, Zp).

    Raises:
        InvalidArgument: field ``prefix``.
    """
    size = len(prefix.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise _invalid("prefix", f"is {size} bytes; at most {MAX_NAME_BYTES} bytes of UTF-8")
    problem = forbidden_problem(prefix)
    if problem is not None:
        raise _invalid("prefix", problem)
    return prefix


def page_size_of(page_size: int) -> int:
    """The number of locks of a page: ``page_size``, or :data:`DEFAULT_PAGE_SIZE` for 0.

    Raises:
        InvalidArgument: field ``page_size``, outside 0 to :data:`MAX_PAGE_SIZE`.
    """
    if not 0 <= page_size <= MAX_PAGE_SIZE:
        raise _invalid("page_size", f"is {page_size}; must be 0 (meaning {DEFAULT_PAGE_SIZE}) to {MAX_PAGE_SIZE}")
    return page_size or DEFAULT_PAGE_SIZE


def encode_page_token(revision: int, start: bytes) -> str:
    """The opaque token of the page that starts at key ``start``, read at ``revision``."""
    raw = f"{_TOKEN_VERSION}:{revision}:".encode() + start
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str, first: bytes, end: bytes, also: tuple[bytes, bytes] | None = None
                      ) -> tuple[int, bytes]:
    """Check a page token against the listing's key range ``[first, end)`` (or the range ``also``, when given).

    Returns:
        (revision, start key).

    Raises:
        InvalidArgument: field ``page_token``: malformed, or its start key is
            outside the range (a token of another prefix).
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, revision, start = raw.split(b":", 2)
        rev = int(revision)
    except (binascii.Error, ValueError) as exc:
        raise _invalid("page_token", "is not a next_page_token of ListLocks") from exc
    if version != _TOKEN_VERSION.encode() or rev <= 0:
        raise _invalid("page_token", "is not a next_page_token of ListLocks")
    if not first <= start < end and not (also is not None and also[0] <= start < also[1]):
        raise _invalid("page_token", "belongs to a listing with another prefix")
    return rev, start


async def list_locks(etcd: EtcdClient, keys: Keys, prefix: str, page_size: int, page_token: str,
                     grants: GrantTimes, tokens: TokenFloor | None = None) -> LockPage:
    """Read one page of the locks whose names start with ``prefix``: held, or held back by a lock-delay.

    Args:
        etcd: the coordinator's etcd layer.
        keys: the key layout.
        prefix: the name prefix ("" for every lock).
        page_size: most locks in the page, 0 for :data:`DEFAULT_PAGE_SIZE`.
        page_token: "" for the first page, else the previous page's ``next_page_token``.
        grants: this coordinator's grant times (``held_seconds``).
        tokens: turns the holders' create revisions into fencing tokens, and
            refuses while tokens would go back; None for a floor of 0.

    Returns:
        The page, read at the listing's revision: first the locks with
        contenders in key order, then the locks without any that a lock-delay
        holds back; TTLs and delays' time left as etcd reports them now.

    Raises:
        InvalidArgument: bad prefix, page_size or page_token (also when the
            token's revision was compacted: start the listing again).
        DataLoss: tokens would go back (etcd restored from an older snapshot).
        Unavailable: etcd unreachable.
    """
    limit = page_size_of(page_size)
    first = keys.name_prefix(validate_prefix(prefix))
    end = prefix_end(first)
    idle = delayed_range(keys, prefix)
    revision, start = (0, first) if not page_token else decode_page_token(page_token, first, end, idle)
    page: list[tuple[str, list[tuple[int, int, bool]], list[Any]]] = []  # (name, contenders, delay keys)
    next_start = b""
    try:
        if not idle[0] <= start < idle[1]:  # the locks with contenders first
            revision, page, next_start = await _contended(etcd, keys, max(start, first_lock_key(keys)), end,
                                                          revision, limit)
            start = idle[0]
        if not next_start:
            revision, more, next_start = await _held_back_idle(etcd, keys, start, idle[1], revision, limit - len(page))
            page += more
    except FencepostError as exc:
        if isinstance(exc.__cause__, grpc.RpcError) and classify(exc.__cause__) is Failure.COMPACTED:
            raise _invalid("page_token", f"names etcd revision {revision}, which was compacted: "
                                         "list again from the first page") from exc
        raise
    to_token: Callable[[int], int] = int
    if tokens is not None:
        tokens.check_serving()
        to_token = tokens.reported
    listed = await _with_ttls(etcd, page, grants, to_token)
    return LockPage(listed, encode_page_token(revision, next_start) if next_start else "", revision)


def delayed_range(keys: Keys, prefix: str) -> tuple[bytes, bytes]:
    """The key range of the lock-delay keys of every lock whose name starts with ``prefix`` (a valid prefix)."""
    start = keys.prefix + DELAY_INFIX + keys.name_prefix(prefix)[len(keys.prefix):]
    return start, prefix_end(start)


async def _contended(etcd: EtcdClient, keys: Keys, start: bytes, end: bytes, revision: int, limit: int
                     ) -> tuple[int, list[tuple[str, list[tuple[int, int, bool]], list[Any]]], bytes]:
    """The locks with contenders in ``[start, end)`` at ``revision`` (0: now), at most ``limit``.

    Returns:
        (the revision read at, [(name, [(create revision, lease id, reader?)], the delay keys when a lock-delay
        holds it back, else [])], the start key of the next page or b"").
    """
    locks: list[tuple[str, list[tuple[int, int, bool]]]] = []  # (name, [(create revision, lease id, reader?)])
    next_start = b""
    while True:
        request = etcdops.RangeRequest(key=start, range_end=end, revision=revision, limit=RANGE_BATCH,
                                       keys_only=True)
        resp = await etcd.range(request)
        revision = revision or int(resp.header.revision)
        for kv in resp.kvs:
            key = bytes(kv.key)
            parsed = keys.parse(key)
            if parsed is None or kinds.is_internal(parsed[0]):
                continue  # not a contender key of a caller's lock
            name, lease_id = parsed
            if not locks or locks[-1][0] != name:
                if len(locks) == limit:
                    next_start = keys.lock_prefix(name)
                    break
                locks.append((name, []))
            locks[-1][1].append((int(kv.create_revision), lease_id, keys.is_reader(key)))
        if next_start or not resp.more:
            break
        start = bytes(resp.kvs[-1].key) + b"\0"
    held_back = await _held_back(etcd, keys, locks, revision)
    return revision, [(name, contenders, held_back.get(name, [])) for name, contenders in locks], next_start


async def _held_back(etcd: EtcdClient, keys: Keys, locks: list[tuple[str, list[tuple[int, int, bool]]]],
                     revision: int) -> dict[str, list[Any]]:
    """The delay keys of each of ``locks`` that a lock-delay holds back (:mod:`.lock_delay`): nobody holds it.

    One keys-and-values Range of the page's delay keys at ``revision`` (they sort as the names do).
    """
    if not locks:
        return {}
    # Not always in the names' order: "a/" sorts after "ab/", but "a!" before "ab!".
    ranges = [delay_range(keys, keys.lock_prefix(name)) for name, _ in locks]
    request = etcdops.RangeRequest(key=min(ranges), range_end=prefix_end(max(ranges)), revision=revision)
    resp = await etcd.range(request)
    if not resp.kvs:
        return {}
    by_lock: dict[bytes, list[Any]] = {}
    for kv in resp.kvs:
        key = bytes(kv.key)
        by_lock.setdefault(key[:key.rindex(b"!") + 1], []).append(kv)
    held_back = {}
    for name, contenders in locks:
        found = by_lock.get(delay_range(keys, keys.lock_prefix(name)))
        revision_of_head, lease_id, _ = min(contenders)
        if found is not None and held_back_by(found, lease_id, revision_of_head):
            held_back[name] = found
    return held_back


async def _held_back_idle(etcd: EtcdClient, keys: Keys, start: bytes, end: bytes, revision: int, room: int
                          ) -> tuple[int, list[tuple[str, list[tuple[int, int, bool]], list[Any]]], bytes]:
    """The locks without contenders whose delay keys in ``[start, end)`` hold them back, at most ``room``.

    Their delay keys are read in key order at ``revision`` (0: now); each candidate's contender range is
    counted at that revision (one count per lock with delay keys: a hold's own record has a contender).

    Returns:
        (the revision read at, [(name, [], delay keys)], the start key of the next page or b"").
    """
    found: list[tuple[str, list[tuple[int, int, bool]], list[Any]]] = []
    gate = asyncio.Semaphore(TTL_CONCURRENCY)

    async def contended(name: str) -> bool:
        async with gate:
            request = etcdops.RangeRequest(key=keys.lock_prefix(name), range_end=prefix_end(keys.lock_prefix(name)),
                                           revision=revision, count_only=True)
            return int((await etcd.range(request)).count) > 0

    while True:
        resp = await etcd.range(etcdops.RangeRequest(key=start, range_end=end, revision=revision, limit=RANGE_BATCH))
        revision = revision or int(resp.header.revision)
        groups: dict[bytes, list[Any]] = {}
        for kv in resp.kvs:
            key = bytes(kv.key)
            groups.setdefault(key[:key.rindex(b"!") + 1], []).append(kv)
        if resp.more and len(groups) > 1:
            groups.pop(max(groups))  # it may go on in the next batch: read it again there
        names = {start_key: _name_of(keys, start_key) for start_key in groups}
        candidates = [k for k, name in names.items() if name is not None]
        busy = await asyncio.gather(*(contended(names[k]) for k in candidates))  # type: ignore[arg-type]
        for start_key, is_contended in zip(candidates, busy, strict=True):
            if is_contended:
                continue  # held (its holder's own record), or listed among the locks with contenders
            if len(found) == room:
                return revision, found, start_key
            found.append((names[start_key], [], groups[start_key]))  # type: ignore[arg-type]
        if not resp.more:
            return revision, found, b""
        start = prefix_end(max(groups))


def _name_of(keys: Keys, start: bytes) -> str | None:
    """The caller's lock name whose delay range is ``start`` (``<prefix>!delay!<encoded name>!``); None for an
    internal name's or a key no name encodes to."""
    try:
        name = unquote(start[len(keys.prefix) + len(DELAY_INFIX):-1].decode(), errors="strict")
    except UnicodeDecodeError:
        return None
    if kinds.is_internal(name) or delay_range(keys, keys.lock_prefix(name)) != start:
        return None
    return name


async def _with_ttls(etcd: EtcdClient, page: list[tuple[str, list[tuple[int, int, bool]], list[Any]]],
                     grants: GrantTimes, to_token: Callable[[int], int]) -> list[ListedLock]:
    """Each lock of ``page`` with its holder lease's TTL left and granted TTL, or its lock-delay's time left
    (one LeaseTimeToLive per lease: holders' and delays' waits)."""
    gate = asyncio.Semaphore(TTL_CONCURRENCY)
    leases = sorted({min(contenders)[1] if not delays else wait_lease(delays)
                     for _, contenders, delays in page} - {0})

    async def ttl(lease_id: int) -> tuple[int, int]:
        async with gate:
            return await etcd.lease_ttl(lease_id)

    ttls = dict(zip(leases, await asyncio.gather(*(ttl(lease) for lease in leases)), strict=True))
    listed = []
    for name, contenders, delays in page:
        if delays:
            state = delay_state(delays, None, ttls.get(wait_lease(delays), (-1, 0))[0])
            if not state.seconds:  # the wait ended since the listing's revision
                state = DelayState(delay_seconds(delays), 0)
            listed.append(ListedLock(name, None, len(contenders), lock_delay=state))
            continue
        revision, lease_id, read = min(contenders)
        token = to_token(revision)
        held = Hold(kinds.read_lock(name) if read else name, lease_id, token)
        holders = holding([Holder(lease, 0, reads) for _, lease, reads in sorted(contenders)])
        listed.append(ListedLock(name, Holder(lease_id, token, read), len(contenders) - holders, *ttls[lease_id],
                                 held_seconds=grants.held_seconds(held), holder_count=holders))
    return listed
