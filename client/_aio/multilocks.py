"""The asyncio client's multi-lock calls: acquire_all, try_acquire_all, lock_all (a layer of AsyncLockClient).

Each runs :func:`~fencepost.client._recipes.multilock.acquire_all`: one
AcquireAll call for every name, after the local exclusion of each
(docs/multilocks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from .._recipes.multilock import AsyncMultiLockHandle, acquire_all, check_names
from .._transport import wire
from ..errors import FencepostError, LeaseLost, Unavailable
from .queries import QueryCalls

__all__ = ["MultiLockCalls"]


class MultiLockCalls(QueryCalls):
    """The multi-lock calls of :class:`~fencepost.client.AsyncLockClient` (see its docstring)."""

    # ------------------------------------------------------------------ multi-locks

    async def acquire_all(self, names: Sequence[str], ttl: float = 10.0,
                          timeout: float | None = None) -> AsyncMultiLockHandle:
        """Acquire every lock of ``names`` together, or none, waiting up to ``timeout`` seconds.

        One etcd transaction queues the caller in every lock at one revision,
        so no two callers deadlock whatever order they give the names
        (docs/multilocks.md); each name gets its own fencing token. A timeout,
        a cancellation or a failure leaves no key of any name.

        Args:
            names: 2 to 32 distinct lock names, any order.
            ttl: Lease TTL in seconds, as for :meth:`acquire`.
            timeout: Seconds to wait, 0 to 86400 (0 tries once); None waits until granted.

        Returns:
            The multi-lock's handle: ``tokens`` (name -> token), ``token_for(name)``, ``release()``, ``lost``.

        Raises:
            InvalidArgument: bad names (field ``names``), ttl or timeout (before any RPC).
            LockTimeout: not every name granted within ``timeout``.
            LeaseLost: the lease was lost, or a name's key was deleted, while waiting.
            ResourceExhausted, Unavailable, FencepostError: as :meth:`acquire`.
        """
        return await self._acquire_all(names, ttl, timeout, try_once=False)

    async def try_acquire_all(self, names: Sequence[str], ttl: float = 10.0) -> AsyncMultiLockHandle:
        """Acquire every lock of ``names`` if all are free now, else none, without waiting.

        Raises:
            LockHeld: a name is held (``name``: the first found held, with its holder's lease and token);
                nothing was taken.
            InvalidArgument, Unavailable, FencepostError: as :meth:`acquire_all`.
        """
        return await self._acquire_all(names, ttl, None, try_once=True)

    @contextlib.asynccontextmanager
    async def lock_all(self, names: Sequence[str], ttl: float = 10.0,
                       timeout: float | None = None) -> AsyncIterator[AsyncMultiLockHandle]:
        """Hold every lock of ``names`` for the body of an ``async with`` block (see :meth:`acquire_all`).

        Releases on exit (one call). If a name was lost while the body ran and
        the body raised nothing, LeaseLost is raised on exit; a cancellation
        caused by ``handle.cancel_on_lost()`` surfaces as LeaseLost.

        Example::

            async with client.lock_all(["acct:1", "acct:2"], ttl=10, timeout=5) as h:
                await debit("acct:1", 10, token=h.token_for("acct:1"))
                await credit("acct:2", 10, token=h.token_for("acct:2"))
        """
        handle = await self.acquire_all(names, ttl=ttl, timeout=timeout)
        try:
            yield handle
        except BaseException as exc:
            with contextlib.suppress(FencepostError):
                await handle.release()
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and handle.lost_reason is not None and task is not None \
                    and task.uncancel() == 0:
                raise LeaseLost(f"multi-lock hold was lost: {handle.lost_name!r} first", name=handle.lost_name,
                                lease_id=handle.lease_id, reason=handle.lost_reason) from exc
            raise
        await handle.release()

    async def _acquire_all(self, names: Sequence[str], ttl: float, timeout: float | None, *,
                           try_once: bool) -> AsyncMultiLockHandle:
        self._check_fork()
        checked = check_names(names)
        ttl_s = wire.ttl_to_wire(ttl)
        timeout = wire.check_timeout(timeout)
        await self._ensure_open(checked[0])
        until = None if timeout is None else asyncio.get_running_loop().time() + timeout
        with self._metrics.acquiring(self._leases.clock):
            try:
                return await acquire_all(self._holds, checked, ttl_s, until, try_once=try_once)
            except Unavailable as exc:
                closed = self._closed_error(checked[0])
                if closed is not None:
                    raise closed from exc
                raise
