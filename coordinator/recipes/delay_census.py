"""Counting the running lock-delays of every lock under the prefix, for the metrics (issue 25, item 8).

A lock-delay that runs (:mod:`.lock_delay`: its wait key exists) keeps a
name from every caller until it ends; the gauges ``fencepost_lock_delays``
and ``fencepost_lock_delay_remaining_seconds`` show how many run and the
longest time left, so that an alert can tell an operator before callers do
(``fencepost locks`` lists them, ``fencepost admin end-lock-delay`` ends one).
"""

from __future__ import annotations

import asyncio
import logging

from fencepost.client.errors import FencepostError
from fencepost.client.v1 import etcdops
from fencepost.client.v1.keys import Keys, prefix_end

from ..etcd import EtcdClient
from ..telemetry.metrics import LockMetrics
from .lock_delay import DELAY_INFIX, WAIT

__all__ = ["CENSUS_SECONDS", "CENSUS_TTL_READS", "DelayCensus"]

_log = logging.getLogger(__name__)

#: How often :class:`DelayCensus` counts the running lock-delays, in seconds.
CENSUS_SECONDS = 5.0
#: Most waits whose time left one census asks etcd for (one LeaseTimeToLive each).
CENSUS_TTL_READS = 1000


class DelayCensus:
    """Counts the lock-delays running under the prefix, for ``fencepost_lock_delays`` and the longest time left.

    Every :data:`CENSUS_SECONDS` one keys-only Range of ``<prefix>!delay!`` (every lock's record and wait)
    and one LeaseTimeToLive per wait (at most :data:`CENSUS_TTL_READS`; past them a wait counts as running):
    the whole cluster's delays, so every coordinator reports the same figures.

    Args:
        etcd: the coordinator's etcd layer.
        keys: the key layout.
        metrics: where the figures go (:meth:`~..telemetry.metrics.LockMetrics.lock_delays`).
    """

    def __init__(self, etcd: EtcdClient, keys: Keys, metrics: LockMetrics) -> None:
        self._etcd = etcd
        self._keys = keys
        self._metrics = metrics

    async def count(self) -> tuple[int, int]:
        """(locks whose delay runs now, the longest time left among them in seconds).

        Raises:
            Unavailable: etcd unreachable.
        """
        start = self._keys.prefix + DELAY_INFIX
        waits: list[int] = []
        request = etcdops.RangeRequest(key=start, range_end=prefix_end(start), keys_only=True, limit=10_000)
        while True:
            resp = await self._etcd.range(request)
            waits += [int(kv.lease) for kv in resp.kvs if bytes(kv.key).endswith(b"!" + WAIT)]
            if not resp.more:
                break
            request = etcdops.RangeRequest(key=bytes(resp.kvs[-1].key) + b"\0", range_end=prefix_end(start),
                                           keys_only=True, limit=10_000, revision=int(resp.header.revision))
        gate = asyncio.Semaphore(32)

        async def left(lease_id: int) -> int:
            async with gate:
                return (await self._etcd.lease_ttl(lease_id))[0]

        lefts = await asyncio.gather(*(left(lease) for lease in waits[:CENSUS_TTL_READS]))
        running = sum(1 for seconds in lefts if seconds >= 0) + len(waits[CENSUS_TTL_READS:])
        return running, max((seconds for seconds in lefts if seconds >= 0), default=0)

    async def run(self) -> None:
        """Count every :data:`CENSUS_SECONDS` until cancelled (a failed count keeps the last figures)."""
        while True:
            try:
                self._metrics.lock_delays(*await self.count())
            except FencepostError as exc:
                _log.debug("could not count the running lock-delays: %s", exc)
            await asyncio.sleep(CENSUS_SECONDS)
