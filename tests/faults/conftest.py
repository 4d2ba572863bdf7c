"""Fixtures of the fault-injection suite (field cases F01-F12, listed in docs/reliability.md).

Profiles:

- **short** (default, CI): every case runs in a shortened form (fewer
  holders, shorter spacing and holds) so that the whole fault suite stays
  within about a minute and a half on 2 cores.
- **soak**: ``FENCEPOST_SOAK=1 python -m pytest tests/faults`` runs the long
  forms the cases state: F01's random-freeze workload (5 workers, 120 s;
  skipped in the short profile, whose F01 is the scripted paused holder);
  F02/F03 with T = 4 s; F04 with 20 holders and
  members killed 10 s apart; F05 with 10 holders; F10 holding a lock for
  ``FENCEPOST_SOAK_MINUTES`` (default 10) with the shipped options, and its
  strict variant with the shipped client pings (20 s) against a server
  that wants 60 s between pings, T = 300 s, for as long.

Short-profile figures (2 cores): F02/F03 T = 2 s; F04 5 holders, members
killed 3 s apart; F05 4 holders; F10 a 21 s hold (one client HTTP/2 ping),
and a strict variant scaled down (client pings every 0.2 s, server wants
10 s) for 10 s. The suite's files here take about 95 s in all.

Fixtures:

- ``proxy_to(target)``: a started :class:`tests.harness.proxy.Proxy`, stopped
  after the test.
- ``etcd_cluster``: a 3-member :class:`tests.harness.cluster.EtcdCluster`
  shared by a module; tests that kill or pause members leave it with every
  member running again (the fixture restarts any that are not).
- ``cluster_coordinator``: an in-process Coordinator given all three
  endpoints, over the test's prefix.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cluster import EtcdCluster
from tests.harness.proxy import Proxy

#: True when the long (soak) profile was asked for with FENCEPOST_SOAK=1.
SOAK = os.environ.get("FENCEPOST_SOAK", "") not in ("", "0")
#: Minutes of F10's long hold in the soak profile.
SOAK_MINUTES = float(os.environ.get("FENCEPOST_SOAK_MINUTES", "10"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In the soak profile, the long forms here run past the suite's 120 s per-test timeout: lift it for them."""
    if SOAK:
        here = Path(__file__).parent
        for item in items:
            if item.path.is_relative_to(here):
                item.add_marker(pytest.mark.timeout(0))


@pytest.fixture
def proxy_to() -> Iterator[Callable[[str], Proxy]]:
    """Start proxies to given targets; every one is stopped after the test."""
    proxies: list[Proxy] = []

    def start(target: str) -> Proxy:
        proxy = Proxy(target).start()
        proxies.append(proxy)
        return proxy

    try:
        yield start
    finally:
        for proxy in proxies:
            proxy.stop()


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster for one test module."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("cluster"), size=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def healthy_cluster(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    """The module's cluster with every member running and a leader, before and after the test."""
    _heal(etcd_cluster)
    try:
        yield etcd_cluster
    finally:
        _heal(etcd_cluster)


def _heal(cluster: EtcdCluster) -> None:
    for i, member in enumerate(cluster.members):
        if member.paused:
            cluster.resume(i)
        if member.pid is None:
            cluster.restart(i)
    cluster.wait_leader(15)


@pytest.fixture
async def cluster_coordinator(healthy_cluster: EtcdCluster, prefix: str) -> AsyncIterator[Any]:
    """A Coordinator served in-process on 127.0.0.1:0, given every member's endpoint."""
    from fencepost.coordinator.process.coordinator import Coordinator

    coord = Coordinator(healthy_cluster.endpoints, listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


def log_figure(request: pytest.FixtureRequest, **figures: Any) -> None:
    """Record measured figures of a case on the test's report (shown with -rA / in junit)."""
    for key, value in figures.items():
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        request.node.user_properties.append((key, text))
        print(f"FIGURE {request.node.name} {key}={text}")

