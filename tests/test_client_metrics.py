"""Client metrics: a LockClient or AsyncLockClient given a prometheus_client registry reports to it.

A real coordinator and etcd; each outcome of the workload is known, so every count is exact.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from etcd3aio import Etcd3Client
from prometheus_client import CollectorRegistry

from fencepost.client import AsyncLockClient, FencepostError, InvalidArgument, LockClient, LockHeld, LockTimeout
from fencepost.client.v1.keys import Keys

from .conftest import wait_for


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def _outcomes(registry: CollectorRegistry) -> dict[str, float]:
    return {outcome: value for outcome in ("granted", "held", "timeout", "error", "cancelled")
            if (value := _value(registry, "fencepost_client_acquires_total", outcome=outcome))}


async def test_client_metrics_of_a_known_workload(address: str, etcd_client: Etcd3Client, prefix: str) -> None:
    """Two clients on one registry: every acquire counted once by outcome, a lost hold by its reason,
    keepalive round trips observed."""
    registry = CollectorRegistry()
    async with AsyncLockClient(address, metrics=registry) as one, AsyncLockClient(address, metrics=registry) as two:
        held = await one.acquire("m", ttl=10)
        with pytest.raises(LockHeld):
            await two.try_acquire("m", ttl=10)
        with pytest.raises(LockTimeout):
            await two.acquire("m", ttl=10, timeout=0.2)
        waiting = asyncio.ensure_future(two.acquire("m", ttl=10))
        async def queued() -> bool:
            return (await one.describe("m")).waiter_count == 1

        await wait_for(queued, 10, 0.02, "the waiting acquire queued")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert _outcomes(registry) == {"granted": 1, "held": 1, "timeout": 1, "cancelled": 1}
        assert _value(registry, "fencepost_client_acquire_wait_seconds_count") == 1

        # The holder's key deleted under it: the coordinator reports the end (NOT_HOLDER), counted once.
        assert etcd_client.kv is not None
        await etcd_client.kv.delete(Keys(prefix).contender("m", held.lease_id), timeout=5)
        await asyncio.wait_for(held.lost.wait(), 10)
        assert held.lost_reason == "NOT_HOLDER"
        assert _value(registry, "fencepost_client_losses_total", reason="NOT_HOLDER") == 1

        again = await two.acquire("m", ttl=10, timeout=5)
        await again.release()
        assert _outcomes(registry) == {"granted": 2, "held": 1, "timeout": 1, "cancelled": 1}
        assert _value(registry, "fencepost_client_acquire_wait_seconds_count") == 2

        async def answered() -> bool:
            return (_value(registry, "fencepost_client_keepalive_rtt_seconds_count") or 0) >= 2

        await wait_for(answered, 10, 0.02, "a keepalive of each client's lease answered")
        assert 0 < (_value(registry, "fencepost_client_keepalive_rtt_seconds_sum") or 0) < 10
    with pytest.raises(FencepostError, match="closed"):
        await two.acquire("m", ttl=10)
    assert _outcomes(registry) == {"granted": 2, "held": 1, "timeout": 1, "cancelled": 1, "error": 1}
    assert _value(registry, "fencepost_client_losses_total", reason="NOT_HOLDER") == 1  # close() loses nothing


async def test_sync_client_reports_to_its_registry(address: str) -> None:
    """LockClient passes ``metrics`` to the client it runs."""
    registry = CollectorRegistry()

    def work() -> None:
        with LockClient(address, metrics=registry) as client:
            with client.lock("sync-m", ttl=10) as handle:
                assert handle.token > 0

    await asyncio.to_thread(work)
    assert _outcomes(registry) == {"granted": 1}
    assert _value(registry, "fencepost_client_losses_total", reason="NOT_HOLDER") is None


@pytest.mark.parametrize("metrics", [object(), "registry", CollectorRegistry])
def test_client_when_metrics_is_not_a_registry(metrics: Any) -> None:
    """``metrics`` must be a CollectorRegistry instance: InvalidArgument naming the field, nothing contacted."""
    with pytest.raises(InvalidArgument) as info:
        AsyncLockClient("127.0.0.1:1", metrics=metrics)
    assert info.value.field == "metrics"


def test_client_without_registry_does_not_import_prometheus_client() -> None:
    """prometheus_client is not a dependency of the client: without ``metrics`` it is never imported."""
    code = ("import sys\n"
            "from fencepost.client import LockClient\n"
            "LockClient('127.0.0.1:1')\n"
            "sys.exit(1 if 'prometheus_client' in sys.modules else 0)\n")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
