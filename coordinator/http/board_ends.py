"""Why a hold shown on the lock board ended: exact for the calls this coordinator served, inferred otherwise.

etcd says only that a key was deleted, never why. The board's timeline
tells an ended hold's ``reason`` (with ``exact``: whether the coordinator
knows it or infers it, and ``by``: the call, when known):

- ``released`` (exact): a Release, ReleaseAll, ReleasePermit, Resign or Withdraw served
  here deleted the holder's key;
- ``revoked`` (exact): a LeaseRevoke or AdminRevoke served here revoked the
  holder's lease; (inferred) the lease is gone and the board's estimate of
  its expiry (LeaseTimeToLive, :mod:`.board_feed`) still had more than
  :data:`REVOKED_MARGIN_MS` to run: revoked through another coordinator or
  worker, or with etcdctl;
- ``expired`` (inferred): the lease is gone at (or after) its estimated
  expiry: its holder stopped renewing it;
- ``key_deleted``: the key was deleted while its lease lives (exact as a
  fact; the call is not known: a Release through another coordinator or
  worker, or a key deleted by hand); with ``by`` ``recover-tokens`` (exact)
  when the token record was written at the deletion's revision (``fencepost
  admin recover-tokens`` deletes every lock key in that Txn);
- ``lease_ended`` (inferred): the lease is gone and the board had no
  estimate of its expiry (its TTL was not read yet);
- ``unknown``: etcd could not be asked whether the lease lives.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.releases import ServedEnds

__all__ = ["RECOVER_TOKENS", "REVOKED_MARGIN_MS", "Why", "inferred", "served"]

#: TTL left on a lease's estimate past which a lease that is gone was revoked, not expired, in milliseconds:
#: etcd reports TTLs in whole seconds, so an estimate may be up to a second early.
REVOKED_MARGIN_MS = 1500
#: ``by`` of the keys deleted by ``fencepost admin recover-tokens``.
RECOVER_TOKENS = "recover-tokens"
#: Slack on a hold's start when matching a call served here to it, seconds: the watch may tell a grant a little
#: after the Release that ends it began.
_SLACK_SECONDS = 1.0


@dataclass(frozen=True)
class Why:
    """Why a hold ended: ``reason`` (see the module docstring), whether it is ``exact``, the call ``by`` if known."""

    reason: str
    exact: bool
    by: str | None = None


def served(ends: ServedEnds, name: str, lease_id: int, since_ms: int | None, *, recovered: bool) -> Why | None:
    """The exact reason, when a call served here (or a token recovery) ended the hold; None otherwise.

    Args:
        ends: the deletions and revokes served here.
        name, lease_id: the hold's internal lock name and lease.
        since_ms: when the board saw the hold begin (monotonic milliseconds); None: unknown.
        recovered: the token record was written at the deletion's revision.
    """
    if recovered:
        return Why("key_deleted", True, RECOVER_TOKENS)
    revoked = ends.revoked_by(lease_id)
    if revoked is not None:
        return Why("revoked", True, revoked)
    since = 0.0 if since_ms is None else since_ms / 1000 - _SLACK_SECONDS
    deleted = ends.deleted_by(name, lease_id, since)
    return Why("released", True, deleted) if deleted is not None else None


def inferred(lease_alive: bool, expires_ms: int | None, deleted_ms: int) -> Why:
    """The reason inferred from etcd's answer and the board's estimate of the lease's expiry.

    Args:
        lease_alive: whether the lease still existed when asked after the deletion.
        expires_ms: the estimated expiry of the lease when its key was deleted (monotonic ms); None: unknown.
        deleted_ms: when the deletion was seen (monotonic ms).
    """
    if lease_alive:
        return Why("key_deleted", True)
    if expires_ms is None:
        return Why("lease_ended", False)
    return Why("revoked" if expires_ms - deleted_ms > REVOKED_MARGIN_MS else "expired", False)
