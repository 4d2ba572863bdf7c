"""Listing the sessions (live leases) for operators: ``ListSessions`` and ``fencepost admin sessions``.

Every lease granted by a coordinator has an ownership record
``<prefix>.lease.<16 hex>`` attached to it (:mod:`..admission.ownership`), so the
records, in key order, are the leases in lease id order. A page is one
Range over the records at the listing's revision (the first page's, carried
in the page token with the next start key, as in :mod:`.listing`); then,
when the page is served, one LeaseTimeToLive with ``keys = true`` per lease
(its TTLs and attached keys: its contender keys and its record), and one
read Txn of the first contender of each lock named by those keys: a
contender key that is its lock's first is a hold, the others are waits. A
lease that ended since the listing's revision is left out of its page.

Elections and semaphores are locks with internal names (:mod:`fencepost.client.v1.kinds`);
a session shows them by kind (:func:`shown`): ``election:E``, ``semaphore:S#i``
(a permit's slot), ``semaphore:S`` (a place in the queue without a permit),
as SessionInfo.holds says in proto/fencepost/v1/lock.proto.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fencepost.client.v1 import etcdops, kinds
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import Keys, prefix_end

from ..admission.ownership import OwnerRecord
from ..etcd import EtcdClient
from .listing import TTL_CONCURRENCY, decode_page_token, encode_page_token, page_size_of

__all__ = ["Session", "SessionPage", "list_sessions", "shown"]

#: Holder reads per etcd Txn (etcd refuses a Txn of more than 128 ops by default).
HOLDERS_PER_TXN = 100


@dataclass(frozen=True)
class Session:
    """One live lease of a page.

    Attributes:
        lease_id: the etcd lease id.
        owner: the certificate identity that granted it; None without one (or an unreadable record).
        ttl_seconds: the granted TTL in seconds.
        ttl_remaining_seconds: seconds left, as etcd reports it now.
        holds: the names of the locks it holds, sorted (elections and semaphores as :func:`shown` says).
        waits: the names of the locks it waits for, sorted (likewise).
    """

    lease_id: int
    owner: str | None
    ttl_seconds: int
    ttl_remaining_seconds: int
    holds: list[str] = field(default_factory=list)
    waits: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SessionPage:
    """One page of sessions, the next page's token ("" on the last) and the records' revision."""

    sessions: list[Session]
    next_page_token: str
    revision: int


async def list_sessions(etcd: EtcdClient, keys: Keys, page_size: int, page_token: str) -> SessionPage:
    """Read one page of the live leases that have an ownership record.

    Args:
        etcd: the coordinator's etcd layer (its calls end at the caller's deadline, see ``etcd.bounded``).
        keys: the key layout.
        page_size: most leases in the page, 0 for 100 (:data:`.listing.DEFAULT_PAGE_SIZE`), at most 1000.
        page_token: "" for the first page, else the previous page's ``next_page_token``.

    Returns:
        The page.

    Raises:
        InvalidArgument: field ``page_size`` or ``page_token``.
        Unavailable: etcd unreachable, or the page's revision was compacted.
    """
    size = page_size_of(page_size)
    first, end = keys.lease_records, prefix_end(keys.lease_records)
    revision, start = decode_page_token(page_token, first, end) if page_token else (0, first)
    resp = await etcd.range(rpc_pb2.RangeRequest(key=start, range_end=end, limit=size, revision=revision))
    revision = revision or int(resp.header.revision)
    next_token = encode_page_token(revision, bytes(resp.kvs[-1].key) + b"\0") if resp.more and resp.kvs else ""
    records: list[tuple[int, str | None]] = []
    for kv in resp.kvs:
        try:
            lease_id = int(bytes(kv.key)[len(first):], 16)
        except ValueError:
            continue
        try:
            owner = OwnerRecord.decode(bytes(kv.value)).owner
        except ValueError:
            owner = None
        records.append((lease_id, owner))
    gate = asyncio.Semaphore(TTL_CONCURRENCY)

    async def lookup(lease_id: int) -> tuple[int, int, list[bytes]]:
        async with gate:
            return await etcd.lease_keys(lease_id)

    looked = await asyncio.gather(*(lookup(lease_id) for lease_id, _ in records))
    contended: dict[int, list[str]] = {}
    for (lease_id, _), (left, _granted, attached) in zip(records, looked, strict=True):
        if left >= 0:
            contended[lease_id] = sorted({parsed[0] for key in attached
                                          if (parsed := keys.parse(key)) is not None and parsed[1] == lease_id})
    holders = await _holders(etcd, keys, sorted({name for names in contended.values() for name in names}))
    sessions = []
    for (lease_id, owner), (left, granted, _attached) in zip(records, looked, strict=True):
        if lease_id not in contended:
            continue
        names = contended[lease_id]
        holds, waits = shown([n for n in names if holders.get(n) == lease_id],
                             [n for n in names if holders.get(n) != lease_id])
        sessions.append(Session(lease_id, owner, granted, left, holds=holds, waits=waits))
    return SessionPage(sessions, next_token, revision)


def shown(holds: list[str], waits: list[str]) -> tuple[list[str], list[str]]:
    """One lease's holds and waits (lock names, internal ones included) as ListSessions shows them, sorted.

    Lock names stay as they are. An election's lock is ``election:E``; a
    semaphore's slot lock is ``semaphore:S#i``; its queue lock is a wait
    ``semaphore:S`` (whether first in the queue or not), left out when the
    lease holds a permit of S. Other internal names are left out.

    Args:
        holds: the lock names whose first contender is the lease's key.
        waits: the other lock names the lease has a key in.

    Returns:
        (holds, waits) as shown.
    """
    public = {name: kinds.public_hold(name) for name in (*holds, *waits)}
    permits = {hold.name for hold in public.values() if hold.kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE
               and hold.slot >= 0}
    shown_holds: list[str] = []
    shown_waits: list[str] = []
    for names, into in ((holds, shown_holds), (waits, shown_waits)):
        for name in names:
            kind, label, slot = public[name]
            if kind == kinds.HoldKind.HOLD_KIND_ELECTION:
                into.append(f"election:{label}")
            elif kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE and slot >= 0:
                into.append(f"semaphore:{label}#{slot}")
            elif kind == kinds.HoldKind.HOLD_KIND_SEMAPHORE:
                if label not in permits:
                    shown_waits.append(f"semaphore:{label}")
            elif not kinds.is_internal(name):
                into.append(name)
    return sorted(shown_holds), sorted(set(shown_waits))


async def _holders(etcd: EtcdClient, keys: Keys, names: list[str]) -> dict[str, int]:
    """The holder lease of each of ``names`` that is held now (read Txns of one keys-only Range, limit 1, each)."""
    holders: dict[str, int] = {}
    for at in range(0, len(names), HOLDERS_PER_TXN):
        batch = names[at:at + HOLDERS_PER_TXN]
        resp = await etcd.read([etcdops.holder_of(keys.lock_prefix(name)) for name in batch])
        for name, answer in zip(batch, resp.responses, strict=True):
            for kv in answer.response_range.kvs:
                parsed = keys.parse(bytes(kv.key))
                if parsed is not None:
                    holders[name] = parsed[1]
    return holders
