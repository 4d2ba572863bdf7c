"""The parts of a running :class:`~.coordinator.Coordinator` that tests, the admin commands and benchmarks read.

Each is None (or empty) before ``start()``. A mixin of the coordinator's class: it reads the attributes that
``Coordinator.__init__`` and ``start()`` set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fencepost.client.v1.keys import Keys

if TYPE_CHECKING:
    from ..admission.capacity import Capacity
    from ..admission.overload import LoopLag
    from ..api.service import LockService
    from ..recipes.lock import LockManager
    from ..recipes.tokens import TokenFloor
    from ..recipes.watch import DeleteWatcher

__all__ = ["CoordinatorParts"]


class CoordinatorParts:
    """Read-only views of a coordinator's etcd-side modules and capacity monitors."""

    _tokens: TokenFloor | None
    _keys: Keys
    _locks: LockManager | None
    _watcher: DeleteWatcher | None
    _service: LockService | None
    _loop_lag: LoopLag | None
    _capacity: Capacity | None

    @property
    def tokens(self) -> TokenFloor | None:
        """The token floor (after ``start()``): why tokens would go back (``refusing``), the floor in use."""
        return self._tokens

    @property
    def keys(self) -> Keys:
        """The key layout of this coordinator's prefix."""
        return self._keys

    @property
    def locks(self) -> LockManager | None:
        """The lock algorithm (after ``start()``), on this coordinator's etcd layer, watcher and token floor."""
        return self._locks

    @property
    def watcher(self) -> DeleteWatcher | None:
        """The shared deletion watcher of the lock keys (after ``start()``)."""
        return self._watcher

    def state_sizes(self) -> dict[str, int]:
        """The entries of each in-memory table (:meth:`..api.service.LockService.state_sizes`); {} before start()."""
        return self._service.state_sizes() if self._service is not None else {}

    @property
    def loop_lag(self) -> LoopLag | None:
        """The overload monitor (after ``start()``): how far behind this coordinator is."""
        return self._service.loop_lag if self._service is not None else self._loop_lag

    @property
    def capacity(self) -> Capacity | None:
        """Whether this coordinator is past its capacity (after ``start()``; see :mod:`..admission.capacity`)."""
        return self._service.capacity if self._service is not None else self._capacity
