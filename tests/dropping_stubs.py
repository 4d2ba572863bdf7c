"""The real etcd stubs, with the answer of chosen calls dropped: lost answers on a real etcd.

:class:`DroppingStubs` is a ``stubs`` factory for the coordinator's
``EtcdClient``: each member's channel gets the generated stubs
(``Stubs.on``), wrapped so that every unary call is recorded and passed on
to the real etcd, but for the calls planned with :meth:`DroppingStubs.drop`:

- ``applied=True``: the call reaches etcd and applies there, then the caller
  gets the planned error instead of etcd's answer (kept in :attr:`lost`);
- ``applied=False``: the call is dropped before it is sent, and the caller
  gets the planned error.

Streams (``LeaseKeepAlive``, ``Watch``) pass through untouched.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from fencepost.coordinator.etcd import Stubs

from .fake_etcd import rpc_error

#: The unary methods of etcd's KV, Lease and Auth services that the coordinator calls.
UNARY = frozenset({"Range", "Put", "DeleteRange", "Txn", "Compact", "LeaseGrant", "LeaseRevoke", "LeaseTimeToLive",
                   "LeaseLeases", "Authenticate"})


@dataclass
class Call:
    """One unary call the client made: the member it went to, the method, and etcd's answer (None if none)."""

    member: int
    method: str
    response: Any = None


@dataclass
class DroppingStubs:
    """Real stubs on each member's channel, recording every unary call and dropping the planned answers."""

    calls: list[Call] = field(default_factory=list)
    #: etcd's answers to the calls that applied but whose answer the caller never got, in order.
    lost: list[Any] = field(default_factory=list)
    #: The planned drops of each method, in order: (the error the caller gets, whether etcd applies the call).
    plan: dict[str, collections.deque[tuple[grpc.StatusCode, bool]]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque))

    def factory(self) -> Callable[[grpc.aio.Channel], Stubs]:
        """The ``stubs`` argument of ``EtcdClient``: member i (in endpoint order) records calls as i."""
        members = itertools.count()

        def make(channel: grpc.aio.Channel) -> Stubs:
            real, index = Stubs.on(channel), next(members)
            return Stubs(kv=_Service(self, index, real.kv), lease=_Service(self, index, real.lease),
                         watch=real.watch, auth=_Service(self, index, real.auth), maintenance=real.maintenance)

        return make

    def drop(self, method: str, code: grpc.StatusCode, *, applied: bool) -> None:
        """Make the next call of ``method`` fail with ``code``: after etcd applied it when ``applied``,
        else without sending it."""
        assert method in UNARY, method
        self.plan[method].append((code, applied))

    def methods(self) -> list[str]:
        """The methods called, in order."""
        return [call.method for call in self.calls]

    def next_drop(self, method: str) -> tuple[grpc.StatusCode, bool] | None:
        """Take the next planned drop of ``method``, None when there is none."""
        planned = self.plan.get(method)
        return planned.popleft() if planned else None


class _Service:
    """One member's stub of one etcd service, its unary methods wrapped."""

    def __init__(self, stubs: DroppingStubs, member: int, real: Any) -> None:
        self._stubs = stubs
        self._member = member
        self._real = real

    def __getattr__(self, method: str) -> Any:
        real = getattr(self._real, method)
        if method not in UNARY:
            return real
        stubs, member = self._stubs, self._member

        async def call(request: Any, **kwargs: Any) -> Any:
            record = Call(member, method)
            stubs.calls.append(record)
            planned = stubs.next_drop(method)
            if planned is None:
                record.response = await real(request, **kwargs)
                return record.response
            code, applied = planned
            if applied:
                stubs.lost.append(await real(request, **kwargs))
            raise rpc_error(code)

        return call
