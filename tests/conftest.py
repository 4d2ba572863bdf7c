"""Test harness: a real etcd, a real coordinator, and fault helpers.

- ``etcd``: one EmbeddedEtcd for the whole run (session scope).
- ``prefix``: a random etcd key prefix per test, so tests never see each
  other's locks.
- ``coordinator``: a Coordinator served in-process on 127.0.0.1:0 over that
  prefix; ``stub`` is the generated LockService stub on a channel to it.
- ``etcd_client``: an etcd3aio client to look at etcd directly (keys under the
  prefix, leases).
- ``CoordinatorProcess`` / ``ChildProcess``: coordinators and lock holders in
  separate OS processes, to stop, freeze (SIGSTOP) or kill (tests/child_processes.py;
  ``coordinator_process`` and ``spawn`` make them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from etcd3aio import Etcd3Client, prefix_range_end
from google.rpc import error_details_pb2, status_pb2

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import LEASE_RECORD_INFIX, RECORDS_LEASE_MARK, REQUEST_RECORD_INFIX
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.requests import RECORDS_TTL_SECONDS
from fencepost.coordinator.recipes.tokens import RECORD_SUFFIX
from . import provision
# Re-exported: tests import the child-process helpers from here too.
from .child_processes import (CLIENT_ENV, LISTENING, REPO, ChildProcess, CliResult,  # noqa: F401
                              CoordinatorProcess, child_env, cli_env)
from .owned_stub import OwnedStub

# `fencepost serve` children stop at their first SIGTERM (no drain) unless a test asks for a drain
# (--drain-seconds, CoordinatorProcess(drain_seconds=...)): tests restart coordinators under their clients.
os.environ.setdefault("FENCEPOST_DRAIN_SECONDS", "0")


def pytest_configure(config: pytest.Config) -> None:
    """Let the test setup's installs (tests/provision.py) and figures write on the terminal past pytest's
    capture: through the terminal reporter, or on stderr in an xdist worker (whose stdout, where its
    reporter writes, never reaches the terminal; its stderr does)."""
    worker = hasattr(config, "workerinput")

    def terminal(line: str) -> None:
        capture = config.pluginmanager.getplugin("capturemanager")
        reporter = None if worker else config.pluginmanager.getplugin("terminalreporter")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            if reporter is None:
                print(line, file=sys.stderr, flush=True)
                return
            reporter.write("\n")  # off the progress dots (-q keeps no track of its line)
            reporter.write_line(line)

    provision.terminal = terminal


# ---------------------------------------------------------------- etcd


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    """One real single-member etcd for the whole test run."""
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd"))
    server.start()
    try:
        yield server
        problems = asyncio.run(_orphans(server.endpoint))
        assert not problems, "after the tests, etcd holds state no live client owns:\n" + "\n".join(problems)
    finally:
        server.stop()


#: Seconds between the two looks at each lease's TTL in :func:`_orphans` (etcd counts TTLs in whole seconds).
RENEWAL_PROBE_SECONDS = 1.5


async def _orphans(endpoint: str) -> list[str]:
    """What the suite left in its etcd that no live client owns (issue 14: no state outlives its call).

    Once every test has ended, no client is alive, so: no lease may still be
    renewed by anyone (its TTL must go down between two looks), and every
    lock key must hang on a lease (a key without one would never go). Leases
    that tests abandon on purpose (a holder killed with SIGKILL, raw stub
    calls) are left to expire by their TTL and are not problems.
    """
    client = Etcd3Client([endpoint])
    await client.connect()
    try:
        assert client.lease is not None and client.kv is not None
        key = b"/fencepost-test/"
        resp = await client.kv.get(key, prefix_range_end(key), keys_only=True, timeout=5)
        # Guard records (beside a test's lock prefix, in "<prefix>.records/") are data, not lock keys;
        # so is the coordinators' token record ("<prefix>.tokens", see coordinator/recipes/tokens.py), and a
        # semaphore's permits record ("<prefix>%01p%2F<name>/permits", see coordinator/recipes/semaphore.py).
        problems = [f"lock key {kv.key!r} is attached to no lease" for kv in resp.kvs
                    if not kv.lease and b".records/" not in kv.key and not kv.key.endswith(RECORD_SUFFIX)
                    and not (b"/%01p%2F" in kv.key and kv.key.endswith(b"/permits"))]
        leases = [lease.ID for lease in (await client.lease.leases(timeout=5)).leases]
        first = {lid: (await client.lease.time_to_live(lid, timeout=5)).TTL for lid in leases}
        await asyncio.sleep(RENEWAL_PROBE_SECONDS)  # a measurement of renewals, not a synchronisation
        for lid, ttl in first.items():
            now = (await client.lease.time_to_live(lid, timeout=5)).TTL
            if ttl > 0 and now >= ttl:
                problems.append(f"lease {lid:#x} is still renewed (TTL {ttl} s, then {now} s)")
        return problems
    finally:
        await client.close()


@pytest.fixture
def prefix() -> str:
    """A fresh etcd key prefix for one test."""
    return f"/fencepost-test/{uuid.uuid4().hex}/"


@pytest.fixture
async def etcd_client(etcd: EmbeddedEtcd) -> AsyncIterator[Etcd3Client]:
    """An etcd3aio client on the session etcd, to inspect keys and leases."""
    client = Etcd3Client([etcd.endpoint])
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


async def count_keys(client: Etcd3Client, prefix: str) -> int:
    """Count the lock keys under ``prefix`` in etcd (the token record and leases' ownership records are not)."""
    return len(await list_keys(client, prefix))


async def list_keys(client: Etcd3Client, prefix: str) -> list[bytes]:
    """List the lock keys under ``prefix`` in etcd (without the token record ``<prefix>.tokens``, the
    ownership records ``<prefix>.lease.<id>`` of leases and the request records ``<prefix>.request.<id>``)."""
    assert client.kv is not None
    key = prefix.encode()
    resp = await client.kv.get(key, prefix_range_end(key), keys_only=True, timeout=5)
    records = (key + LEASE_RECORD_INFIX, key + REQUEST_RECORD_INFIX)
    return [kv.key for kv in resp.kvs if not kv.key.endswith(RECORD_SUFFIX) and not kv.key.startswith(records)]


async def lease_ids(client: Etcd3Client) -> set[int]:
    """The ids of every live lease in etcd but the coordinators' records leases (see ``records_leases``)."""
    assert client.lease is not None
    resp = await client.lease.leases(timeout=5)
    ids = {lease.ID for lease in resp.leases} - await records_leases(client)
    # A records lease is granted first and marked by a Put after: one that this listing caught in
    # between has no marker yet. It is the only lease of the records TTL that carries no key.
    for lease_id in list(ids):
        ttl = await client.lease.time_to_live(lease_id, keys=True, timeout=5)
        if ttl.TTL == -1 or (ttl.grantedTTL == RECORDS_TTL_SECONDS and not ttl.keys):  # gone, or a records lease
            ids.discard(lease_id)
    return ids


async def records_leases(client: Etcd3Client) -> set[int]:
    """The coordinators' records leases (coordinator/recipes/requests.py): never kept alive, they hold request
    records for 60 to 120 s after a call, each marked by a key ``<prefix>.request.~<16 hex>``."""
    assert client.kv is not None
    key = b"/fencepost-test/"
    resp = await client.kv.get(key, prefix_range_end(key), keys_only=True, timeout=5)
    mark = REQUEST_RECORD_INFIX + RECORDS_LEASE_MARK
    return {int(kv.lease) for kv in resp.kvs if mark in kv.key and kv.lease}


# ---------------------------------------------------------------- coordinator


@pytest.fixture
async def coordinator(etcd: EmbeddedEtcd, prefix: str) -> AsyncIterator[Any]:
    """A Coordinator served in-process on 127.0.0.1:0, over the test's prefix."""
    from fencepost.coordinator.process.coordinator import Coordinator

    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    await asyncio.wait_for(coord.start(), 20)
    try:
        yield coord
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)


@pytest.fixture
def address(coordinator: Any) -> str:
    """The in-process coordinator's address, ``127.0.0.1:PORT``."""
    return f"127.0.0.1:{coordinator.port}"


@pytest.fixture
async def channel(address: str) -> AsyncIterator[grpc.aio.Channel]:
    """A grpc.aio channel to the in-process coordinator."""
    chan = grpc.aio.insecure_channel(address)
    try:
        yield chan
    finally:
        await chan.close()


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> OwnedStub:
    """The LockService stub on ``channel``, presenting the secret of each lease it granted (the lease's owner)."""
    return OwnedStub(channel)


async def describe(stub: lock_pb2_grpc.LockServiceStub, name: str) -> lock_pb2.DescribeResponse:
    """Describe one lock through the raw stub."""
    return await stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=5)


async def describe_waiters_is(stub: lock_pb2_grpc.LockServiceStub, name: str, n: int) -> bool:
    """True when lock ``name`` has exactly ``n`` waiters queued."""
    return (await describe(stub, name)).waiter_count == n


async def wait_for(predicate: Any, timeout: float, interval: float = 0.02, what: str = "condition") -> None:
    """Poll an async or sync predicate until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


# ---------------------------------------------------------------- errors


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The google.rpc.ErrorInfo packed in a failed call's status details, if any."""
    trailing = err.trailing_metadata() or ()  # type: ignore[attr-defined]
    for key, value in trailing:
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info
    return None


def assert_invalid_field(err: grpc.RpcError, field: str) -> None:
    """Assert that a call failed with INVALID_ARGUMENT / INVALID_FIELD naming ``field``."""
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())  # type: ignore[attr-defined]
    info = error_info(err)
    assert info is not None, f"no ErrorInfo in the status details: {err.details()}"  # type: ignore[attr-defined]
    assert info.domain == "fencepost.dev"
    assert info.reason == "INVALID_FIELD"
    assert info.metadata.get("field") == field, dict(info.metadata)


# ---------------------------------------------------------------- child processes (tests/child_processes.py)


@pytest.fixture
def coordinator_process(
    etcd: EmbeddedEtcd, prefix: str, tmp_path: Path
) -> Iterator[CoordinatorProcess]:
    """A (not yet started) coordinator in a child process, killed after the test."""
    proc = CoordinatorProcess(etcd.endpoint, prefix, tmp_path)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start Python scripts in child processes; every one is killed after the test.

    Usage: ``child = spawn(script_text, arg1, arg2)``.
    """
    children: list[ChildProcess] = []

    def start(script: str, *args: str) -> ChildProcess:
        index = len(children)
        path = tmp_path / f"child-{index}.py"
        path.write_text(script)
        child = ChildProcess(
            [sys.executable, str(path), *args], log_path=tmp_path / f"child-{index}.log"
        )
        children.append(child)
        return child

    try:
        yield start
    finally:
        for child in children:
            child.kill()


# ---------------------------------------------------------------- client unit tests


@pytest.fixture
def no_connect(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record every channel the client tries to open (none should be)."""
    opened: list[str] = []

    def refuse(target: str, *args: object, **kwargs: object) -> None:
        opened.append(target)
        raise AssertionError(f"the client opened a channel to {target}")

    monkeypatch.setattr(grpc.aio, "insecure_channel", refuse)
    monkeypatch.setattr(grpc.aio, "secure_channel", refuse)
    yield opened
    assert opened == []
