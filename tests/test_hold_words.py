"""The client's errors and reprs name an election or a semaphore as such, never as a lock (issue 13's closing
note): a campaign or permit acquire that times out (on the coordinator, or waiting for this client's own hold),
a check or release of a released leadership or permit, and a permit handle's repr with its slot."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.client import AsyncLockClient, LockClient, LockTimeout, NotHolder


async def test_timeouts_and_released_holds_name_the_election_or_semaphore(address: str) -> None:
    """Every message names "election 'e'" or "semaphore 's'"; none says "lock" or shows an internal name."""
    async with AsyncLockClient(address) as a, AsyncLockClient(address) as b:
        leader = await a.campaign("e", "a", ttl=10.0)
        permit = await a.semaphore("s", 1, ttl=10.0).acquire()
        timeouts = []
        for timeout in (0, 0.2):
            with pytest.raises(LockTimeout) as caught:
                await b.campaign("e", "b", ttl=10.0, timeout=timeout)
            timeouts.append(caught.value)
            with pytest.raises(LockTimeout) as caught:
                await b.semaphore("s", 1, ttl=10.0).acquire(timeout=timeout)
            timeouts.append(caught.value)
        with pytest.raises(LockTimeout) as caught:  # this client leads under that lease: a local wait
            await a.campaign("e", "again", ttl=10.0, timeout=0.2)
        timeouts.append(caught.value)
        with pytest.raises(LockTimeout) as caught:
            await a.semaphore("s", 1, ttl=10.0).acquire(timeout=0.2)
        timeouts.append(caught.value)
        for exc in timeouts:
            assert exc.name in ("e", "s"), exc
            assert ("election 'e'" if exc.name == "e" else "semaphore 's'") in exc.message, exc.message
            assert "lock" not in exc.message and "\x01" not in exc.message, exc.message

        assert repr(permit).startswith(f"<AsyncLockHandle name='s' slot={permit.slot} lease_id=")
        await leader.release()
        await permit.release()
        for handle, words in ((leader, "leadership of election 'e'"), (permit, f"permit {permit.slot} of "
                                                                              "semaphore 's'")):
            with pytest.raises(NotHolder) as released:
                handle.check()
            assert released.value.message == f"{words} was released"
            with pytest.raises(NotHolder) as again:
                await handle.release()
            assert again.value.message == f"{words} was already released"
        lock = await a.acquire("x", ttl=10.0)
        await lock.release()
        with pytest.raises(NotHolder) as released:  # a lock's messages are as they were
            lock.check()
        assert released.value.message == "lock was released"



def _sync_permit_repr(address: str) -> tuple[int, str]:
    with LockClient(address) as client, client.semaphore("sync", 2, ttl=10.0) as permit:
        return permit.slot, repr(permit)


async def test_sync_permit_handle_repr_shows_its_slot(address: str) -> None:
    """LockClient's permit handle repr carries the slot too."""
    slot, shown = await asyncio.to_thread(_sync_permit_repr, address)
    assert shown.startswith(f"<LockHandle name='sync' slot={slot} lease_id="), shown
