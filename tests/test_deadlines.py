"""Every call keeps the caller's deadline while etcd does not answer (issue 14, items 6 and 9).

etcd is frozen with SIGSTOP (its TCP connections stay open and silent, the
hard case: no error arrives, only the deadline ends a call). The coordinator
is up. Each call must end at its own deadline, with an error that says etcd
is the one not answering, not the coordinator.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from fencepost.client import AsyncLockClient, Unavailable
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.api.server_info import ETCD_SECONDS
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .child_processes import freeze
from .conftest import cli_env
from .owned_stub import OwnedStub

#: Slack allowed over a deadline: process start-up for the CLI, scheduling on 2 busy cores.
SLACK = 1.5


@pytest.fixture(scope="module")
def frozen_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    """An etcd of this module's own, which the tests freeze and thaw."""
    server = EmbeddedEtcd(tmp_path_factory.mktemp("frozen-etcd"))
    server.start()
    try:
        yield server
    finally:
        pid = server.pid
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        server.stop()


class Freezer:
    """SIGSTOP / SIGCONT of the module's etcd; thawed at the end of each test."""

    def __init__(self, etcd: EmbeddedEtcd) -> None:
        self.etcd = etcd
        self.frozen = False

    def freeze(self) -> None:
        assert self.etcd.pid is not None
        freeze(self.etcd.pid)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen and self.etcd.pid is not None:
            os.kill(self.etcd.pid, signal.SIGCONT)
        self.frozen = False


@pytest.fixture
def member(frozen_etcd: EmbeddedEtcd) -> EmbeddedEtcd:
    """The module's etcd, alive: restarted (same ports and data directory) if it died in an earlier test.

    etcd 3.5.1 (test-only; deploy/ pins a fixed release) panics when a read-only Txn's context ended while it
    was frozen (etcd-io/etcd#14110): seen once in a fresh-clone CI run, after which every later test of the
    module found no etcd.
    """
    if frozen_etcd.pid is None:
        frozen_etcd.stop()
        frozen_etcd.start()
    return frozen_etcd


@pytest.fixture
def freezer(member: EmbeddedEtcd) -> Iterator[Freezer]:
    f = Freezer(member)
    try:
        yield f
    finally:
        f.thaw()


@pytest.fixture
async def coordinator_on_frozen(member: EmbeddedEtcd, prefix: str) -> AsyncIterator[str]:
    coord = Coordinator([member.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield f"127.0.0.1:{coord.port}"
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


async def test_acquire_keeps_its_timeout_while_etcd_is_frozen(coordinator_on_frozen: str, freezer: Freezer) -> None:
    """acquire(ttl=5, timeout=2): Unavailable naming etcd after about 2 s (it was 5 s: the lease grant's own)."""
    async with AsyncLockClient(coordinator_on_frozen) as client:
        freezer.freeze()
        started = time.monotonic()
        with pytest.raises(Unavailable) as err:
            await client.acquire("u2", ttl=5, timeout=2)
        took = time.monotonic() - started
    assert 1.5 <= took <= 2 + SLACK, took
    assert err.value.reason == "ETCD_UNAVAILABLE" and "etcd" in err.value.message, err.value


async def test_acquire_with_a_lease_keeps_its_timeout(coordinator_on_frozen: str, freezer: Freezer) -> None:
    """The lease exists already: the Acquire itself ends at the timeout too."""
    async with AsyncLockClient(coordinator_on_frozen) as client:
        first = await client.acquire("u3", ttl=10)
        await first.release()
        freezer.freeze()
        started = time.monotonic()
        with pytest.raises(Unavailable) as err:
            await client.acquire("u3", ttl=10, timeout=1)
        took = time.monotonic() - started
        freezer.thaw()
    assert 0.8 <= took <= 1 + SLACK, took
    assert err.value.reason == "ETCD_UNAVAILABLE", err.value


async def test_release_while_etcd_is_frozen_says_why(coordinator_on_frozen: str, freezer: Freezer) -> None:
    """Item 9: a release that fails while etcd is down raises Unavailable with a message, not 'etcd: '."""
    async with AsyncLockClient(coordinator_on_frozen, connect_timeout=2) as client:
        handle = await client.acquire("u5", ttl=10)
        freezer.freeze()
        with pytest.raises(Unavailable) as err:
            await handle.release()
        freezer.thaw()
        assert err.value.reason == "ETCD_UNAVAILABLE"
        message = err.value.message
        assert message.startswith("etcd: ") and len(message) > len("etcd: Txn timed out"), message


async def test_server_info_while_etcd_is_frozen_answers_within_its_deadline(coordinator_on_frozen: str,
                                                                              freezer: Freezer) -> None:
    """ServerInfo answers before the call's 1 s deadline with the local part, etcd marked unavailable."""
    async with grpc.aio.insecure_channel(coordinator_on_frozen) as channel:
        stub = OwnedStub(channel)
        before = await stub.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=5)
        assert before.etcd.available and before.contender_keys == 0, before
        freezer.freeze()
        started = time.monotonic()
        resp = await stub.ServerInfo(lock_pb2.ServerInfoRequest(), timeout=1)  # DEADLINE_EXCEEDED would raise
        took = time.monotonic() - started
        freezer.thaw()
    assert took < 1.0, took
    assert resp.etcd.available is False and "etcd" in resp.etcd.error, resp.etcd
    assert resp.etcd.revision == 0 and resp.etcd.server_version == "" and resp.etcd.cluster_id == 0
    assert (resp.contender_keys, resp.held_locks, resp.waiters) == (-1, -1, -1)
    assert resp.instance_id == before.instance_id and resp.version == before.version
    assert resp.listen_address == coordinator_on_frozen and list(resp.etcd.endpoints) == list(before.etcd.endpoints)


async def test_server_info_while_etcd_is_frozen_without_a_deadline_takes_2_s(coordinator_on_frozen: str,
                                                                             freezer: Freezer) -> None:
    """client.server_info() (no deadline shorter than its connect timeout): etcd gets 2 s, then the answer."""
    async with AsyncLockClient(coordinator_on_frozen) as client:
        await client.server_info()  # connected
        freezer.freeze()
        started = time.monotonic()
        info = await client.server_info()
        took = time.monotonic() - started
        freezer.thaw()
    assert 1.5 <= took <= ETCD_SECONDS + SLACK, took
    assert info.etcd.available is False and info.etcd.error and info.etcd.revision is None
    assert info.held_locks is None and info.contender_keys is None


def _cli(*argv: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", *argv], capture_output=True, text=True,
                            env=cli_env(), timeout=timeout)
    return result, time.monotonic() - started


@pytest.fixture
def frozen_process(member: EmbeddedEtcd, prefix: str, tmp_path: Path) -> Iterator[str]:
    """A coordinator process on the module's etcd (the CLI runs in another process anyway)."""
    from .conftest import CoordinatorProcess

    proc = CoordinatorProcess(member.endpoint, prefix, tmp_path)
    try:
        yield proc.start()
    finally:
        proc.kill()


def test_cli_acquire_keeps_its_timeout(frozen_process: str, freezer: Freezer) -> None:
    """`fencepost acquire u4 --ttl 5 --timeout 2` exits after about 2 s, naming etcd (it took 5.15 s)."""
    freezer.freeze()
    result, took = _cli("acquire", "u4", "--ttl", "5", "--timeout", "2", "--address", frozen_process)
    assert result.returncode == 1, result
    assert took <= 2 + SLACK + 1.0, took  # + interpreter start-up
    assert "etcd" in result.stderr, result.stderr


def test_cli_status_tells_etcd_down_from_coordinator_down(frozen_process: str, freezer: Freezer) -> None:
    """`fencepost status NAME` with etcd frozen: the coordinator answered; etcd did not."""
    freezer.freeze()
    result, took = _cli("status", "u6", "--address", frozen_process)
    if "no answer from the coordinator" in result.stderr:
        # Its answer leaves 0.5 s before the CLI's deadline: a coordinator starved that long by a loaded machine
        # misses it (seen once in a full run). One that never tells etcd's silence fails this second look too.
        result, took = _cli("status", "u6", "--address", frozen_process)
    assert result.returncode == 1, result
    assert "cannot reach the coordinator" not in result.stderr, result.stderr
    assert "the coordinator at" in result.stderr and "its etcd did not" in result.stderr, result.stderr
    assert took <= 5 + SLACK + 1.0, took
    health, _ = _cli("status", "--json", "--address", frozen_process)
    report: dict[str, Any] = json.loads(health.stdout)
    (coordinator,) = report["coordinators"]
    assert coordinator["status"] != "UNREACHABLE", report
    assert coordinator["info"]["etcd"]["available"] is False, report  # ServerInfo answers without etcd
