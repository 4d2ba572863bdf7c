"""etcd auth with JWT tokens (issue 25, item 6): a change to etcd's users makes the coordinator's token stale.

A JWT carries the auth store's revision it was issued at; once a user or
role is added, etcd refuses it ("auth: revision in header is old") until
the coordinator authenticates again, whatever the JWT's own TTL. The real
embedded etcd runs with ``--auth-token jwt,...`` (an RSA key pair made with
cryptography) and auth enabled as in tests/test_etcd_connect.py.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fencepost.client import AsyncLockClient
from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc
from fencepost.coordinator.etcd import EtcdAuth
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .test_etcd_connect import PASSWORD, enable_auth

PREFIX = "/fencepost-auth/"


@pytest.fixture(scope="module")
def jwt_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    """A real etcd with JWT auth tokens (RS256, 10 minutes: longer than the test) and auth enabled."""
    keys = tmp_path_factory.mktemp("jwt-keys")
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (keys / "jwt.key").write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
    (keys / "jwt.pub").write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    token = f"jwt,pub-key={keys / 'jwt.pub'},priv-key={keys / 'jwt.key'},sign-method=RS256,ttl=10m"
    etcd = EmbeddedEtcd(tmp_path_factory.mktemp("jwt-etcd"), auth_token=token)
    etcd.start()
    try:
        asyncio.run(enable_auth(etcd.endpoint, PREFIX))
        yield etcd
    finally:
        etcd.stop()


async def _add_user(endpoint: str, name: str) -> None:
    """As root, add etcd user ``name``: the auth store's revision grows."""
    async with grpc.aio.insecure_channel(f"dns:///{endpoint}") as channel:
        auth = rpc_pb2_grpc.AuthStub(channel)
        root = await auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="root-pw"), timeout=5)
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=name, password="pw-" + name), timeout=5,
                           metadata=(("token", root.token),))


async def test_locks_when_an_etcd_user_is_added_keep_working_with_jwt_tokens(
        jwt_etcd: EmbeddedEtcd, caplog: pytest.LogCaptureFixture) -> None:
    """A lock held and one waited for when another etcd user is added: the holder renews and releases, the
    waiter gets the lock, a new lock is granted and described; the coordinator authenticated again."""
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator")
    coordinator = Coordinator([jwt_etcd.endpoint], listen="127.0.0.1:0", prefix=f"{PREFIX}jwt-{uuid.uuid4().hex[:6]}/",
                              etcd_auth=EtcdAuth("locks", PASSWORD))
    try:
        await asyncio.wait_for(coordinator.start(), 20)
        async with AsyncLockClient(coordinator.address) as holder, AsyncLockClient(coordinator.address) as waiter:
            held = await holder.acquire("held", ttl=5.0, timeout=10.0)
            waiting = asyncio.ensure_future(waiter.acquire("held", ttl=5.0, timeout=30.0))
            async with asyncio.timeout(10):
                while (await holder.describe("held")).waiter_count < 1:
                    await asyncio.sleep(0.05)

            await _add_user(jwt_etcd.endpoint, f"app-{uuid.uuid4().hex[:6]}")

            # The holder's lease is renewed past its TTL after the change, then it releases.
            loop = asyncio.get_running_loop()
            past_ttl = loop.time() + 6.0
            while loop.time() < past_ttl:
                assert (await holder.describe("held")).holder_token == held.token
                assert not held.lost.is_set(), held.lost_reason
                await asyncio.sleep(0.5)
            await held.release()
            got = await asyncio.wait_for(waiting, 20)
            assert got.token > held.token
            fresh = await holder.acquire("fresh", ttl=5.0, timeout=10.0)
            assert (await holder.describe("fresh")).holder_token == fresh.token
            await fresh.release()
            await got.release()
    finally:
        await coordinator.stop(0)
    troubles = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                and ("NOT_SERVING" in r.getMessage() or "revision" in r.getMessage())]
    assert not troubles, troubles
