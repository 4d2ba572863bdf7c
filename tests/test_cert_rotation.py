"""Client certificates that rotate on disk (issue 25, item 1): the next handshake uses the renewed files.

The client's certificate and key live in a directory laid out as a
Kubernetes Secret volume (what cert-manager and the kubelet write):
``cert.pem`` and ``key.pem`` are symlinks into ``..data``, itself a symlink
to a versioned directory, and a renewal swaps ``..data`` at once. The old
certificate is short-lived (trustme, ``not_after`` a few seconds ahead); the
coordinator (a real grpc.aio LockService over mTLS, tests/lock_servers.py)
restarts after it expired.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
import trustme

import fencepost.client as fc
from fencepost.client import TlsConfig

from . import lock_servers, tls_pki
from .conftest import cli_env
from .lock_servers import Start
from .test_client_tls import Observed, Records
from .tls_pki import Pki

pki = tls_pki.pki  # the fixtures
serve = lock_servers.serve

#: Seconds the first client certificate is valid: time enough for the clients and ``fencepost run`` to start.
SHORT = 12.0


class SecretVolume:
    """cert.pem and key.pem in ``directory``, swapped as the kubelet updates a Secret volume (``..data`` symlink)."""

    def __init__(self, directory: Path, ca: trustme.CA) -> None:
        self.dir = directory
        self.ca = ca
        self.versions = 0
        for name in ("cert.pem", "key.pem"):
            os.symlink(f"..data/{name}", directory / name)

    def issue(self, seconds: float) -> datetime.datetime:
        """Swap in a new certificate valid for ``seconds`` from now; returns its expiry (notAfter)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        # X.509 times have whole seconds: round the expiry down, so that it is never later than said.
        not_after = (now + datetime.timedelta(seconds=seconds)).replace(microsecond=0)
        leaf = self.ca.issue_cert("client@fencepost.test", not_before=now - datetime.timedelta(minutes=5),
                                  not_after=not_after)
        self.versions += 1
        version = self.dir / f"..v{self.versions}"
        version.mkdir()
        (version / "cert.pem").write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
        (version / "key.pem").write_bytes(leaf.private_key_pem.bytes())
        tmp = self.dir / "..data_tmp"
        os.symlink(version.name, tmp)
        os.replace(tmp, self.dir / "..data")
        return not_after

    def tls(self, ca_file: str) -> TlsConfig:
        return TlsConfig(ca=ca_file, cert=self.dir / "cert.pem", key=self.dir / "key.pem")

    def flags(self, ca_file: str) -> list[str]:
        return ["--ca", ca_file, "--cert", str(self.dir / "cert.pem"), "--key", str(self.dir / "key.pem")]


async def until_past(moment: datetime.datetime) -> None:
    """Wait until the wall clock is past ``moment`` (a certificate's expiry), by a margin."""
    async with asyncio.timeout(60):
        while datetime.datetime.now(datetime.timezone.utc) < moment + datetime.timedelta(seconds=1):
            await asyncio.sleep(0.2)


def _name() -> str:
    return f"rot:{uuid.uuid4().hex[:8]}"


@pytest.fixture
def records() -> Records:
    logger = logging.getLogger("fencepost.client")
    handler = Records()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_holds_when_client_certificate_rotates_survive_a_restart_after_expiry(
        pki: Pki, serve: Start, tmp_path: Path, records: Records) -> None:
    """Async and sync clients and ``fencepost run`` hold locks and a permit over mTLS; their certificate is
    renewed on disk (a ..data symlink swap); the coordinator restarts after the old one expired: every hold is
    still held with the same fencing token, and run's command was never stopped."""
    server = await serve(pki.server(client_ca=pki.ca))
    address = server.address
    volume = SecretVolume(tmp_path, pki.ca)
    expiry = volume.issue(SHORT)
    x, y, z, w, sem_name = _name(), _name(), _name(), _name(), _name()
    stop = tmp_path / "stop"
    child = f'echo "$FENCEPOST_TOKEN"; while [ ! -e "{stop}" ]; do sleep 0.1; done; echo done'
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost.client.cli", "run", z, "--ttl", "10", "--address", address,
        *volume.flags(pki.ca_file), "--", "sh", "-c", child,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**cli_env(), "GRPC_VERBOSITY": "NONE"})
    try:
        async with Observed(address, tls=volume.tls(pki.ca_file), connect_timeout=30.0) as client:
            with fc.LockClient(address, tls=volume.tls(pki.ca_file), connect_timeout=30.0) as sync_client:
                hx = await client.acquire(x, ttl=10.0, timeout=5.0)
                hy = await client.acquire(y, ttl=10.0, timeout=5.0)
                permit = await client.semaphore(sem_name, 2, ttl=10.0).acquire(timeout=5.0)
                hw = await asyncio.to_thread(sync_client.acquire, w, 10.0, 5.0)
                assert proc.stdout is not None
                z_token = int(await asyncio.wait_for(proc.stdout.readline(), 20))
                assert datetime.datetime.now(datetime.timezone.utc) < expiry, "the clients started too slowly"

                volume.issue(3600.0)  # renewed before the old certificate expires, as cert-manager does
                await until_past(expiry)
                await server.stop()
                client.answered.clear()
                await server.start(address, pki.server(client_ca=pki.ca))

                # The KeepAlive stream reconnects (a new handshake, with the renewed certificate).
                await asyncio.wait_for(client.answered.wait(), 20)
                for handle in (hx, hy):
                    assert (await client.describe(handle.name)).holder_token == handle.token
                    assert not handle.lost.is_set(), handle.lost_reason
                assert not permit.lost.is_set(), permit.lost_reason
                described = await asyncio.to_thread(sync_client.describe, w)
                assert described.holder_token == hw.token
                assert (await client.describe(z)).holder_token == z_token
                assert proc.returncode is None, "run stopped its command"
                read_again = records.messages(logging.INFO, "TLS files read again")
                assert read_again and str(tmp_path / "cert.pem") in read_again[0], records.records
                await hx.release()
                await hy.release()
                await permit.release()
                await asyncio.to_thread(hw.release)
        stop.touch()
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, (out, err)
        assert out.decode().strip() == "done", (out, err)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.communicate()


async def test_stream_when_client_certificate_expired_names_the_file_and_expiry_once(
        pki: Pki, serve: Start, tmp_path: Path, records: Records) -> None:
    """Not renewed: after the restart the coordinator refuses the expired certificate; the KeepAlive stream
    warns once, naming the certificate's file and its expiry, and a call's TlsError says the same."""
    server = await serve(pki.server(client_ca=pki.ca))
    address = server.address
    volume = SecretVolume(tmp_path, pki.ca)
    expiry = volume.issue(6.0)
    async with Observed(address, tls=volume.tls(pki.ca_file), connect_timeout=5.0) as client:
        handle = await client.acquire(_name(), ttl=10.0, timeout=5.0)
        await until_past(expiry)
        await server.stop()
        await server.start(address, pki.server(client_ca=pki.ca))
        said = f"tls.cert ({tmp_path / 'cert.pem'}) expired at {expiry.strftime('%Y-%m-%dT%H:%M:%SZ')}"

        def told() -> bool:
            return bool(records.messages(logging.WARNING, said))

        await records.wait(told, 20)
        with pytest.raises(fc.TlsError, match="expired at"):
            await client.describe(handle.name)

        def broke_again() -> bool:
            return len(records.messages(logging.DEBUG, "keepalive stream")) >= 4

        await records.wait(broke_again, 20)
        assert len(records.messages(logging.WARNING, said)) == 1, records.messages(logging.WARNING, "")
