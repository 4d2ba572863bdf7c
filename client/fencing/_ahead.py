"""Tokens ahead of the lock service: a write refused although its writer still holds its lock.

A guard refuses a write with token ``t`` when the record has accepted a higher
token ``s``. Normally ``s`` came from a later holder of the same lock: the
writer lost the lock (a pause past its TTL) and its late write is rightly
refused. But while the writer's hold is live, no later holder of that lock
exists, and every earlier one had a lower token (a lock's tokens grow from
one holder to the next). So ``s > t`` under a live hold means the record holds
a token the lock service has not reached yet: **the stored token is ahead of
the lock service**. Its causes:

- etcd was restored from an older snapshot (or its data replaced) and no
  coordinator could tell, and ``fencepost admin recover-tokens`` was not run:
  tokens went back, and every new holder of the lock is refused until the
  tokens pass ``s`` again (docs/deploy.md, "Restoring etcd from a snapshot");
- the record is also written under another lock name (one record, one lock:
  docs/fencing.md);
- an operator ended the hold (``fencepost admin revoke``) a moment before and
  the writer had not heard yet.

The guard then raises :class:`StoredTokenAheadError` (a
:class:`~fencepost.client.StaleTokenError`: nothing changes for code that
stops on a refused write) and counts it in ``guard.ahead`` and
``fencepost_guard_token_ahead_total{storage}`` besides ``rejected``, so that
an alert fires (deploy/observability/alerts.yaml, ``FencepostStoredTokenAhead``).

How a guard knows the hold is live: give it the lock handle (or any object
with ``.token`` and ``.is_valid()``, a :class:`TokenHold`) where it takes the
token. After a refusal it asks ``is_valid()``: the handle's conservative local
deadline (send time of the last acknowledged keepalive + TTL - margin, on the
monotonic clock) has not passed, so the lease lived without a break from the
grant to the refusal; a pause past the TTL makes it false, and the refusal is
then the ordinary stale one. A bare ``int`` token carries no such knowledge:
its refusal is always a plain ``StaleTokenError``. The etcd guard needs no
handle: its Txn sees, at the refusal's revision, that the writer's lock key
still exists with the writer's token.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ..errors import StaleTokenError

__all__ = ["REASON_TOKEN_AHEAD", "StoredTokenAheadError", "TokenHold", "ahead_message", "is_live"]

_log = logging.getLogger("fencepost.client.fencing")

#: The client-local reason of :class:`StoredTokenAheadError`.
REASON_TOKEN_AHEAD = "TOKEN_AHEAD"


class TokenHold(Protocol):
    """What a guard takes in place of a token to tell a rewind from a stale writer: a lock handle.

    ``LockHandle``, ``AsyncLockHandle`` and the election's and semaphore's
    handles all are; so is any object with these two members.
    """

    @property
    def token(self) -> int:
        """The hold's fencing token."""
        ...

    def is_valid(self) -> bool:
        """Whether the hold is still believed live (its local deadline has not passed)."""
        ...


class StoredTokenAheadError(StaleTokenError):
    """A guard refused a write whose writer still held its lock: the record's token is ahead of the lock service.

    Raised instead of a plain :class:`StaleTokenError` when the refused write
    came with a live hold (a lock handle whose ``is_valid()`` was still true
    after the refusal; the etcd guard: the writer's lock key still had its
    token in the refusal's Txn). Most likely etcd's revisions went back (a
    restore from an older snapshot) without ``fencepost admin recover-tokens
    --above T``, T at least :attr:`current_token`; else the record is written
    under two lock names. Counted in ``rejected`` and ``ahead`` and in
    ``fencepost_guard_token_ahead_total``.

    Attributes:
        token: The writer's token (offered).
        current_token: The record's token, higher than any the lock service has
            reached for this lock.
        reason: ``"TOKEN_AHEAD"`` (client-local).
    """

    def __init__(self, message: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("reason", REASON_TOKEN_AHEAD)
        super().__init__(message, **kwargs)


def is_live(hold: TokenHold | None) -> bool:
    """Whether ``hold`` says it is still live (False for None, and when ``is_valid()`` raises)."""
    if hold is None:
        return False
    try:
        return bool(hold.is_valid())
    except Exception:  # noqa: BLE001 - a hold that cannot tell is not known to be live
        _log.debug("is_valid() of %r failed", hold, exc_info=True)
        return False


def ahead_message(token: int, current_token: int) -> str:
    """The message of a :class:`StoredTokenAheadError`: both tokens, the likely causes and the fix."""
    return (f"write with fencing token {token} refused: the record has accepted fencing token {current_token}, "
            f"although this writer still holds its lock: the stored token is ahead of the lock service. etcd was "
            f"probably restored from an older snapshot without 'fencepost admin recover-tokens --above T' (T at "
            f"least {current_token}; docs/deploy.md, 'Restoring etcd from a snapshot'), or the record is also "
            f"written under another lock name")
