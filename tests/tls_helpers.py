"""Certificates and channels for the TLS tests: files replaced as deploy tools do, and new connections."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import trustme

from fencepost.client.v1 import lock_pb2
from .owned_stub import OwnedStub


def install(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` at once (a new file renamed over the old one, as deploy tools do)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def install_server_cert(ca: trustme.CA, files: Path) -> None:
    """A server certificate for 127.0.0.1 from ``ca`` into ``files``/cert.pem and key.pem."""
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    install(files / "cert.pem", b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    install(files / "key.pem", leaf.private_key_pem.bytes())


def client_credentials(trust: trustme.CA | None, client_ca: trustme.CA | None = None) -> grpc.ChannelCredentials:
    """Channel credentials trusting ``trust``, with a client certificate from ``client_ca`` if given."""
    root = trust.cert_pem.bytes() if trust is not None else None
    if client_ca is None:
        return grpc.ssl_channel_credentials(root)
    leaf = client_ca.issue_cert("lock-user@example.com")
    return grpc.ssl_channel_credentials(root, leaf.private_key_pem.bytes(), leaf.cert_chain_pems[0].bytes())


def open_channel(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    """A channel with a connection of its own (no subchannel shared with an earlier channel): a new handshake."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, credentials, options=options)


async def call_fails(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode | None:
    """Describe on a new connection: None when it works, else the failed call's status code."""
    async with open_channel(address, credentials) as channel:
        try:
            await OwnedStub(channel).Describe(lock_pb2.DescribeRequest(name="probe"), timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return None


async def acquire_release(address: str, credentials: grpc.ChannelCredentials, name: str) -> int:
    """A full LeaseGrant, Acquire, Release, LeaseRevoke on a new connection; returns the token."""
    async with open_channel(address, credentials) as channel:
        stub = OwnedStub(channel)
        lease = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5), timeout=10)
        got = await stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease.lease_id, wait_ms=5000), timeout=10)
        assert got.acquired
        await stub.Release(lock_pb2.ReleaseRequest(name=name, lease_id=lease.lease_id, token=got.token), timeout=10)
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=10)
        return int(got.token)
