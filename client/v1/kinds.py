"""Hold kinds: where elections and semaphores live among the locks.

An election and a semaphore are built from locks whose *internal* names no
caller can give: a lock name has no control characters (``validate_name``),
and every internal name starts with one. So the etcd keys of election ``E``
are those of the lock ``"\\x01e/" + E`` (``<prefix>%01e%2F<E encoded>/<lease>``),
in no user lock's key range, and the whole lock algorithm (queue, watch,
hand-off, tokens, withdraw) serves them unchanged. A semaphore ``S`` of N
permits is a queue, the lock ``"\\x01q/" + S`` whose first N contenders may
hold a permit, plus one lock per permit slot ``i``, ``"\\x01s/" + S +
"\\x02" + str(i)``, held (try once) by the contender that got that slot: the
slot's token is the create revision of its key, so it grows per slot.
A read hold of lock ``N`` (a read-write lock's reader) is named ``"\\x01r/" +
N``; its key is in ``N``'s own range (:meth:`fencepost.client.v1.keys.Keys.contender`),
so that a plain holder of ``N`` is its writer.
Internal names appear only inside the coordinator and inside the client's
bookkeeping; on the wire a hold is (kind, public name, slot)
(``WatchHold``/``HoldEnded`` in proto/fencepost/v1/lock.proto).
"""

from __future__ import annotations

from typing import NamedTuple

from .lock_pb2 import HoldKind

__all__ = [
    "HoldKind", "PublicHold", "READ_TAG", "describe", "election_lock", "internal_name", "is_internal", "public_hold",
    "read_lock",
    "semaphore_queue", "semaphore_slot", "semaphore_slots", "semaphore_permits_record",
]

#: Every internal lock name starts with this (a control character: never in a caller's name).
INTERNAL = "\x01"
ELECTION_TAG = "\x01e/"
QUEUE_TAG = "\x01q/"
SLOT_TAG = "\x01s/"
#: A read hold's internal name is this and its lock's name.
READ_TAG = "\x01r/"
#: Separates a semaphore's name from its slot number in a slot lock's name.
SLOT_SEPARATOR = "\x02"


class PublicHold(NamedTuple):
    """A hold's kind, public name (lock, election or semaphore) and permit slot (0 unless a semaphore)."""

    kind: int
    name: str
    slot: int


def is_internal(name: str) -> bool:
    """Whether ``name`` is an internal lock name (an election's, a semaphore's queue or slot)."""
    return name.startswith(INTERNAL)


def election_lock(election: str) -> str:
    """The internal lock name of election ``election``."""
    return ELECTION_TAG + election


def read_lock(name: str) -> str:
    """The internal name of a read hold of lock ``name`` (its key lies in ``name``'s range)."""
    return READ_TAG + name


def semaphore_queue(name: str) -> str:
    """The internal lock name of semaphore ``name``'s queue (its first N contenders may hold permits)."""
    return QUEUE_TAG + name


def semaphore_slot(name: str, slot: int) -> str:
    """The internal lock name of permit slot ``slot`` of semaphore ``name``."""
    return f"{SLOT_TAG}{name}{SLOT_SEPARATOR}{slot}"


def semaphore_slots(name: str) -> str:
    """The name prefix shared by every slot lock of semaphore ``name`` (and no other semaphore's)."""
    return SLOT_TAG + name + SLOT_SEPARATOR


def semaphore_permits_record(name: str) -> str:
    """The internal name whose lock prefix holds semaphore ``name``'s number of permits (key ``<range>permits``)."""
    return "\x01p/" + name


def describe(name: str) -> str:
    """An internal or public lock name as a person reads it: ``lock 'a'``, ``election 'a'``,
    ``semaphore 'a' slot 2`` (``semaphore 'a'`` for a place in its queue)."""
    public = public_hold(name)
    if public.kind == HoldKind.HOLD_KIND_ELECTION:
        return f"election {public.name!r}"
    if public.kind == HoldKind.HOLD_KIND_SEMAPHORE:
        return f"semaphore {public.name!r}" + (f" slot {public.slot}" if public.slot >= 0 else "")
    if public.kind == HoldKind.HOLD_KIND_READ:
        return f"read lock {public.name!r}"
    return f"lock {public.name!r}"


def internal_name(kind: int, name: str, slot: int = 0) -> str:
    """The internal lock name of a hold of ``kind`` on ``name`` (``slot`` for a semaphore permit).

    Raises:
        ValueError: an unknown kind.
    """
    if kind == HoldKind.HOLD_KIND_LOCK:
        return name
    if kind == HoldKind.HOLD_KIND_ELECTION:
        return election_lock(name)
    if kind == HoldKind.HOLD_KIND_SEMAPHORE:
        return semaphore_slot(name, slot)
    if kind == HoldKind.HOLD_KIND_READ:
        return read_lock(name)
    raise ValueError(f"unknown hold kind {kind}")


def public_hold(name: str) -> PublicHold:
    """The (kind, public name, slot) of an internal or public lock name (the inverse of :func:`internal_name`).

    A semaphore's queue is reported as a semaphore hold of slot -1 (a place in its queue, not a permit).
    """
    if name.startswith(ELECTION_TAG):
        return PublicHold(HoldKind.HOLD_KIND_ELECTION, name[len(ELECTION_TAG):], 0)
    if name.startswith(SLOT_TAG):
        public, _, slot = name[len(SLOT_TAG):].rpartition(SLOT_SEPARATOR)
        return PublicHold(HoldKind.HOLD_KIND_SEMAPHORE, public, int(slot))
    if name.startswith(READ_TAG):
        return PublicHold(HoldKind.HOLD_KIND_READ, name[len(READ_TAG):], 0)
    if name.startswith(QUEUE_TAG):
        return PublicHold(HoldKind.HOLD_KIND_SEMAPHORE, name[len(QUEUE_TAG):], -1)
    return PublicHold(HoldKind.HOLD_KIND_LOCK, name, 0)
