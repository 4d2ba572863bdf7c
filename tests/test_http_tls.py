"""The HTTP/JSON API with TLS, client certificates and an access policy (issue 24): the HTTP port serves the gRPC
port's certificate, requires the same client certificates, and each caller's identity gets exactly the gRPC
port's policy decisions (ACCESS_DENIED twins) and owns its leases on both ports. New certificate files are taken
up at the next HTTPS handshake. Real etcd, real coordinator, trustme certificates."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
import trustme

from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.admission.access import Policy
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.tls import ServerTls

from .http_callers import Failure, GrpcCaller, HttpCaller
from .test_http_twins import acquire, grant, revoke
from .test_policy_enforced import POLICY, Pki, pki  # noqa: F401 - pki is a fixture
from .client_identities import Identity
from .tls_helpers import install_server_cert, open_channel


def client_ssl(ca: trustme.CA, identity: Identity | None) -> ssl.SSLContext:
    """A client context trusting ``ca``, presenting ``identity``'s certificate if given."""
    context = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    if identity is not None:
        context.load_cert_chain(identity.cert, identity.key)
    return context


@pytest.fixture
async def policed(etcd: EmbeddedEtcd, prefix: str, pki: Pki,  # noqa: F811
                  tmp_path: Path) -> AsyncIterator[Coordinator]:
    """A coordinator with mTLS, the policy of tests/test_policy_enforced.py and the HTTP API."""
    (tmp_path / "policy.toml").write_text(POLICY)
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, http_listen="127.0.0.1:0",
                              tls=ServerTls(pki.dir / "cert.pem", pki.dir / "key.pem", pki.dir / "client-ca.pem"),
                              policy=Policy.from_file(tmp_path / "policy.toml"))
    await asyncio.wait_for(coordinator.start(), 20)
    try:
        yield coordinator
    finally:
        await coordinator.stop(0)


def denied(failure: object, action: str, name: str | None) -> None:
    assert isinstance(failure, Failure), failure
    assert (failure.code, failure.reason) == (grpc.StatusCode.PERMISSION_DENIED, "ACCESS_DENIED"), failure
    assert failure.metadata.get("action") == action and failure.metadata.get("name") == name, failure.metadata
    if failure.http_status is not None:
        assert failure.http_status == 403


async def test_policy_over_https_is_the_grpc_ports(policed: Coordinator, pki: Pki) -> None:  # noqa: F811
    """Each identity is allowed and denied over HTTPS as over gRPC: ACCESS_DENIED (403) naming the action and name;
    a lease of one identity is the other's to neither renew nor revoke (NOT_LEASE_OWNER), on either port."""
    address = f"https://{policed.http_address}"
    async with open_channel(policed.address, pki.billing.credentials) as bc, \
            open_channel(policed.address, pki.worker.credentials) as wc, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki.ca, pki.billing))) as bs, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki.ca, pki.worker))) as ws:
        for billing, worker in ((GrpcCaller(bc), GrpcCaller(wc)), (HttpCaller(bs, address), HttpCaller(ws, address))):
            b_lease, w_lease = await grant(billing), await grant(worker)
            held = await billing("Acquire", lock_pb2.AcquireRequest(name="billing/invoices",
                                                                     lease_id=b_lease.lease_id))
            assert held.acquired  # no secret: the certificate's identity owns the lease
            denied(await billing("Acquire", lock_pb2.AcquireRequest(name="jobs/nightly", lease_id=b_lease.lease_id)),
                   "acquire", "jobs/nightly")
            denied(await billing("ServerInfo", lock_pb2.ServerInfoRequest()), "admin", None)
            denied(await worker("Release", lock_pb2.ReleaseRequest(name="billing/invoices", lease_id=b_lease.lease_id,
                                                                    token=held.token)), "release", "billing/invoices")
            denied(await worker("Describe", lock_pb2.DescribeRequest(name="billing/invoices")),
                   "describe", "billing/invoices")
            for rpc, request in (("LeaseKeepAlive", lock_pb2.LeaseKeepAliveRequest(lease_id=b_lease.lease_id)),
                                 ("LeaseRevoke", lock_pb2.LeaseRevokeRequest(lease_id=b_lease.lease_id))):
                refused = await worker(rpc, request)
                assert isinstance(refused, Failure) and refused.reason == "NOT_LEASE_OWNER", (rpc, refused)
            renewed = await billing("LeaseKeepAlive", lock_pb2.LeaseKeepAliveRequest(lease_id=b_lease.lease_id))
            assert isinstance(renewed, lock_pb2.LeaseKeepAliveResponse)
            await revoke(billing, b_lease)
            await revoke(worker, w_lease)


async def test_a_lease_granted_over_grpc_is_its_identitys_over_https(policed: Coordinator,
                                                                     pki: Pki) -> None:  # noqa: F811
    """The worker's lease, granted over gRPC, is held, watched and released over HTTPS by the same identity
    without its secret; a caller without a client certificate cannot even connect."""
    address = f"https://{policed.http_address}"
    async with open_channel(policed.address, pki.worker.credentials) as wc, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki.ca, pki.worker))) as ws:
        lease = await grant(GrpcCaller(wc))
        over_http = HttpCaller(ws, address)
        held = await over_http("Acquire", lock_pb2.AcquireRequest(name="jobs/nightly", lease_id=lease.lease_id))
        assert held.acquired
        async with ws.get(f"{address}/v1/locks/jobs%2Fnightly:watch",
                          params={"leaseId": str(lease.lease_id), "token": str(held.token)}) as watch:
            assert watch.status == 200
            assert (await watch.content.readline()) == b"event: watching\n"
        released = await over_http("Release", lock_pb2.ReleaseRequest(name="jobs/nightly", lease_id=lease.lease_id,
                                                                       token=held.token))
        assert isinstance(released, lock_pb2.ReleaseResponse)
        await revoke(over_http, lease)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki.ca, None))) as anonymous:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            async with anonymous.get(f"{address}/v1/server") as answer:
                await answer.read()


async def test_new_certificate_files_serve_the_next_https_handshake(etcd: EmbeddedEtcd, prefix: str,
                                                                    tmp_path: Path) -> None:
    """TLS without client certificates: the certificate files replaced by one from another CA are served at the
    next HTTPS connection (no restart, no SIGHUP), as on the gRPC port."""
    first, second = trustme.CA(), trustme.CA()
    install_server_cert(first, tmp_path)
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, http_listen="127.0.0.1:0",
                              tls=ServerTls(tmp_path / "cert.pem", tmp_path / "key.pem"))
    await asyncio.wait_for(coordinator.start(), 20)
    address = f"https://{coordinator.http_address}/v1/locks/probe"

    async def described(ca: trustme.CA) -> bool:
        connector = aiohttp.TCPConnector(ssl=client_ssl(ca, None), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            try:
                async with session.get(address) as answer:
                    return answer.status == 200
            except aiohttp.ClientConnectorError:
                return False

    try:
        assert await described(first) and not await described(second)
        install_server_cert(second, tmp_path)
        assert await described(second) and not await described(first)
    finally:
        await coordinator.stop(0)
