"""The ``fencepost-async-shared`` peer of the bench (:mod:`_peers`): one ``AsyncLockClient`` for every user."""

from __future__ import annotations

from typing import Any

from _peers import TTL, Described

from fencepost.client import AsyncLockClient


class FencepostAsyncShared(Described):
    """One ``AsyncLockClient`` shared by every user: the tasks of one process (see the module docstring)."""

    kind = "fencepost-async-shared"
    sync = False

    def __init__(self, address: str) -> None:
        self.address = address
        self._client: AsyncLockClient | None = None

    async def user(self, i: int) -> Any:
        if self._client is None:
            self._client = AsyncLockClient(self.address)
            await self._client.connect()
        client = self._client

        class User:
            async def acquire(self, name: str) -> Any:
                return await client.acquire(name, ttl=TTL)

            async def release(self, name: str, grant: Any) -> None:
                await grant.release()

            async def close(self) -> None:
                pass  # the peer's close() closes the shared client

        return User()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        await super().close()
