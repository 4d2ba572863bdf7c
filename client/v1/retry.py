"""The backoff policy of every retry loop, in the client and in the coordinator.

Exponential backoff with full jitter (AWS Architecture Blog, "Exponential
Backoff And Jitter", 2015): the n-th delay is drawn uniformly from
``[0, min(cap, base * 2**n)]``, so that many clients retrying after one
outage spread out instead of arriving together. Which errors are worth a
retry is the caller's decision; this module only says how long to wait.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff", "CLIENT_BACKOFF", "ETCD_BACKOFF"]


@dataclass(frozen=True)
class Backoff:
    """Delays of a retry loop: exponential growth from ``base`` to ``cap``, full jitter.

    Args:
        base: The first ceiling, in seconds (> 0).
        cap: The largest ceiling, in seconds (>= base).

    Example::

        delays = CLIENT_BACKOFF.delays()
        while not await try_once():
            await asyncio.sleep(next(delays))
    """

    base: float
    cap: float

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got base={self.base} cap={self.cap}")

    def ceilings(self) -> Iterator[float]:
        """The ceiling of each successive delay, in seconds: base, 2 base, ... up to cap, forever."""
        ceiling = self.base
        while True:
            yield ceiling
            ceiling = min(self.cap, ceiling * 2)

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """Successive delays in seconds, each uniform in [0, its ceiling], forever.

        Args:
            rng: The random source (a seeded ``random.Random`` in tests); the module's by default.
        """
        uniform = (rng or random).uniform
        for ceiling in self.ceilings():
            yield uniform(0.0, ceiling)


#: The client's reconnects and retried calls: 0.05 s growing to 2 s.
CLIENT_BACKOFF = Backoff(base=0.05, cap=2.0)
#: The coordinator's retries of etcd (watch restarts, re-reads, waits through an etcd blip).
ETCD_BACKOFF = Backoff(base=0.05, cap=2.0)
