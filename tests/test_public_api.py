"""The public members of the hold handles: what an application may call, and nothing of the client's bookkeeping.

A handle is the only writer of its own state, through methods the client's
modules call (``_mark_lost``, ``_start_release``, ...). Those stay out of the
public API: an application that called ``mark_released()`` would see a hold
as released while the coordinator still holds it for its lease. A new public
member of a handle is a deliberate change of the API: add it here and to
docs/python.md.
"""

from __future__ import annotations

import inspect

import pytest

import fencepost.client as client

_HOLD = {"check", "deadline", "is_valid", "lease_id", "lease_secret", "lost_reason", "margin", "name", "on_lost",
         "read", "release", "released", "slot", "token", "ttl", "valid_for"}
_ASYNC = _HOLD | {"cancel_on_lost", "kind", "local_name", "what"}
_SYNC = _HOLD | {"wait_lost"}
_ELECTION = {"proclaim", "resign"}
_MULTI = {"check", "deadline", "is_valid", "lease_id", "lease_secret", "lost_name", "lost_reason", "margin", "names",
          "on_lost", "release", "released", "token_for", "tokens", "ttl", "valid_for"}

PUBLIC = {
    "AsyncLockHandle": _ASYNC,
    "Leadership": _ASYNC | _ELECTION | {"text"},
    "LockHandle": _SYNC,
    "SyncLeadership": _SYNC | _ELECTION | {"text", "value"},
    "AsyncSemaphore": {"acquire", "describe", "try_acquire"},
    "Semaphore": {"acquire", "describe", "try_acquire"},
    "LeaderObserver": {"stop"},
    "AsyncMultiLockHandle": _MULTI | {"cancel_on_lost"},
    "MultiLockHandle": _MULTI | {"wait_lost"},
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_members_of_handles(name: str) -> None:
    cls = getattr(client, name)
    public = {member for member in dir(cls) if not member.startswith("_")}
    assert public == PUBLIC[name], f"{name}: added {sorted(public - PUBLIC[name])}, gone {sorted(PUBLIC[name] - public)}"


def test_leader_observer_takes_the_client() -> None:
    """``LeaderObserver(client, election, callback)``, as :meth:`LockClient.on_leader` makes it."""
    assert list(inspect.signature(client.LeaderObserver).parameters) == ["client", "election", "callback"]
