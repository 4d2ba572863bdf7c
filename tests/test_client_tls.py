"""The clients over TLS: TlsConfig's checks, real handshakes, and a TlsError naming each failure's cause.

The servers are plain ``grpc.aio`` servers with ``grpc.ssl_server_credentials``
serving the real LockService on the test etcd (tests/lock_servers.py); the
certificates come from trustme (tests/tls_pki.py). Each failure case is a
real handshake failing; the client must raise TlsError well before its
connect_timeout, with the cause in words.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

import fencepost.client as fc
from fencepost.client import TlsConfig
from fencepost.client._transport import handshake as _handshake
from fencepost.client._transport import tls as _tls
from fencepost.client._transport import transport as _transport
from fencepost.client.v1 import lock_pb2 as pb

from . import lock_servers, tls_pki
from .lock_servers import LockServer, Start
from .tls_pki import OTHER_NAME, Pki

pki = tls_pki.pki  # the fixtures
serve = lock_servers.serve

#: A connect_timeout far above what any TLS failure may take to be reported.
PATIENT = 30.0
#: How long a certain TLS failure may take to be raised.
PROMPT = 5.0

def _name() -> str:
    return f"tls:{uuid.uuid4().hex[:8]}"


def refused_address() -> str:
    """A 127.0.0.1 address that refuses connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


# ---------------------------------------------------------------- TlsConfig: the files, checked at construction


def _bad_configs(pki: Pki, tmp: Path) -> dict[str, tuple[Any, str, str]]:
    """id -> (tls argument, field, words of the message)."""
    text = tmp / "notes.txt"
    text.write_text("not a certificate\n")
    key = serialization.load_pem_private_key(pki.client.leaf.private_key_pem.bytes(), None)
    encrypted = tmp / "encrypted-key.pem"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"secret")))
    missing = str(tmp / "missing.pem")
    return {
        "ca-missing": (TlsConfig(ca=missing), "tls.ca", "cannot read"),
        "ca-directory": (TlsConfig(ca=str(tmp)), "tls.ca", "cannot read"),
        "ca-no-pem": (TlsConfig(ca=str(text)), "tls.ca", "holds no PEM certificate"),
        "ca-is-a-key": (TlsConfig(ca=pki.client.key), "tls.ca", "holds no PEM certificate"),
        "ca-empty-path": (TlsConfig(ca=""), "tls.ca", "empty"),
        "ca-bytes-path": (TlsConfig(ca=pki.ca_file.encode()), "tls.ca", "must be a path"),  # type: ignore[arg-type]
        "cert-without-key": (TlsConfig(ca=pki.ca_file, cert=pki.client.cert), "tls.key", "without its key"),
        "key-without-cert": (TlsConfig(key=pki.client.key), "tls.cert", "without its certificate"),
        "cert-missing": (TlsConfig(cert=missing, key=pki.client.key), "tls.cert", "cannot read"),
        "cert-is-a-key": (TlsConfig(cert=pki.client.key, key=pki.client.key), "tls.cert", "holds no PEM certificate"),
        "key-no-pem": (TlsConfig(cert=pki.client.cert, key=str(text)), "tls.key", "holds no PEM private key"),
        "key-of-another-cert": (TlsConfig(cert=pki.client.cert, key=pki.other_client.key), "tls.key",
                                "is not the key of the certificate"),
        "key-encrypted": (TlsConfig(cert=pki.client.cert, key=str(encrypted)), "tls.key", "encrypted"),
        "server-name-empty": (TlsConfig(server_name=""), "tls.server_name", "non-empty"),
        "server-name-space": (TlsConfig(server_name="a b"), "tls.server_name", "white space"),
        # A lone surrogate was a bare UnicodeEncodeError from connect() (issue 14, item 9).
        "server-name-not-utf8": (TlsConfig(server_name="a\udcff"), "tls.server_name", "valid UTF-8"),
        "not-a-config": ("yes", "tls", "TlsConfig"),
    }


BAD_CONFIG_IDS = ["ca-missing", "ca-directory", "ca-no-pem", "ca-is-a-key", "ca-empty-path", "ca-bytes-path",
                  "cert-without-key", "key-without-cert", "cert-missing", "cert-is-a-key", "key-no-pem",
                  "key-of-another-cert", "key-encrypted", "server-name-empty", "server-name-space",
                  "server-name-not-utf8", "not-a-config"]


@pytest.mark.parametrize("case", BAD_CONFIG_IDS)
def test_client_init_when_tls_settings_are_bad(case: str, pki: Pki, tmp_path: Path, no_connect: list[str]) -> None:
    """A bad TLS file or setting is InvalidArgument naming the field, when the client is made, without a channel."""
    tls, field, words = _bad_configs(pki, tmp_path)[case]
    for cls in (fc.AsyncLockClient, fc.LockClient):
        with pytest.raises(fc.InvalidArgument) as info:
            cls("127.0.0.1:7420", tls=tls)
        assert info.value.field == field, (case, info.value)
        assert words in str(info.value), (case, str(info.value))


def test_client_init_when_tls_settings_are_good(pki: Pki, no_connect: list[str]) -> None:
    """Good files (str or Path), ready grpc credentials, or TlsConfig() alone make a client without connecting."""
    for tls in (TlsConfig(ca=Path(pki.ca_file), cert=Path(pki.client.cert), key=pki.client.key),
                TlsConfig(), TlsConfig(server_name=OTHER_NAME),
                grpc.ssl_channel_credentials(Path(pki.ca_file).read_bytes())):
        assert fc.AsyncLockClient("127.0.0.1:7420", tls=tls).addresses == ("127.0.0.1:7420",)
        fc.LockClient("127.0.0.1:7420", tls=tls).close()


# ---------------------------------------------------------------- gRPC's texts, read


_LAST = "failed to connect to all addresses; last error: "
_VERIFY = ("UNKNOWN: ipv4:127.0.0.1:7420: Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
           "error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: ")

#: gRPC 1.85.3's details in each case (recorded against real servers) -> the words of the cause, None: not TLS.
RECORDED: dict[str, tuple[str, str | None]] = {
    "wrong-ca": (_LAST + _VERIFY + "unable to get local issuer certificate: OK",
                 "is not signed by a CA in tls.ca (/ca.pem) (CERTIFICATE_VERIFY_FAILED: unable to get local issuer"),
    "expired": (_LAST + _VERIFY + "certificate has expired: OK",
                "has expired (CERTIFICATE_VERIFY_FAILED: certificate has expired)"),
    "name-mismatch": (_LAST + "UNKNOWN: ipv4:127.0.0.1:7420: Custom verification check failed with error: "
                      "UNAUTHENTICATED: Hostname Verification Check failed.",
                      "does not name '127.0.0.1' (set tls.server_name to a name it carries)"),
    "tls-client-to-plaintext": (_LAST + "UNKNOWN: ipv4:127.0.0.1:7420: Tls handshake failed (TSI_PROTOCOL_FAILURE): "
                                "SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: "
                                "Invalid certificate verification context: OK",
                                "does not speak TLS (WRONG_VERSION_NUMBER)"),
    "older-grpc-wording": ("Ssl handshake failed: SSL_ERROR_SSL: error:1000007d:SSL routines:"
                           "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED", "failed verification (CERTIFICATE_VERIFY_FAILED)"),
    "client-refused-with-alert": (_LAST + "UNKNOWN: ipv4:127.0.0.1:7420: Tls handshake failed (TSI_PROTOCOL_FAILURE): "
                                  "SSL_ERROR_SSL: error:10000418:SSL routines:OPENSSL_internal:TLSV1_ALERT_UNKNOWN_CA",
                                  "requires a client certificate, and none was given"),
    "socket-closed": (_LAST + "UNAVAILABLE: ipv4:127.0.0.1:7420: Socket closed", None),
    "refused": (_LAST + "UNAVAILABLE: ipv4:127.0.0.1:7420: Connection refused", None),
    "deadline": ("Deadline Exceeded", None),
}


@pytest.mark.parametrize("case", list(RECORDED))
def test_cause_when_reading_grpc_details(case: str) -> None:
    """Each recorded gRPC text maps to its cause; texts that do not show a TLS failure map to None."""
    details, words = RECORDED[case]
    security = _tls.Security(credentials=grpc.ssl_channel_credentials(), trusted="tls.ca (/ca.pem)")
    cause = _handshake.cause(security, details, "127.0.0.1:7420")
    if words is None:
        assert cause is None, cause
    else:
        assert cause is not None and words in cause, cause
    assert _handshake.cause(_tls.PLAINTEXT, details, "127.0.0.1:7420") is None


# ---------------------------------------------------------------- working TLS


async def _round_trip(address: str, tls: TlsConfig | grpc.ChannelCredentials) -> int:
    """Acquire, describe and release one lock through ``address``; returns the token."""
    name = _name()
    async with fc.AsyncLockClient(address, tls=tls, connect_timeout=PROMPT) as client:
        handle = await client.acquire(name, ttl=5.0, timeout=5.0)
        assert (await client.describe(name)).holder_token == handle.token
        await handle.release()
        return handle.token


async def test_clients_over_tls_and_mtls(pki: Pki, serve: Start) -> None:
    """TLS with tls.ca, mTLS with a client certificate, ready grpc credentials, and the sync client all work."""
    tls_server = await serve(pki.server())
    mtls_server = await serve(pki.server(client_ca=pki.ca))
    assert await _round_trip(tls_server.address, TlsConfig(ca=pki.ca_file)) > 0
    mtls = TlsConfig(ca=pki.ca_file, cert=pki.client.cert, key=pki.client.key)
    assert await _round_trip(mtls_server.address, mtls) > 0
    creds = grpc.ssl_channel_credentials(Path(pki.ca_file).read_bytes(), pki.client.leaf.private_key_pem.bytes(),
                                         pki.client.leaf.cert_chain_pems[0].bytes())
    assert await _round_trip(mtls_server.address, creds) > 0

    def sync() -> bool:
        with fc.LockClient(mtls_server.address, tls=mtls, connect_timeout=PROMPT) as client:
            return client.describe(_name()).held

    assert await asyncio.to_thread(sync) is False


async def test_client_when_server_name_is_set_checks_that_name(pki: Pki, serve: Start) -> None:
    """A certificate naming only fencepost.test is accepted at 127.0.0.1 with server_name, refused without."""
    server = await serve(pki.server(pki.named))
    assert await _round_trip(server.address, TlsConfig(ca=pki.ca_file, server_name=OTHER_NAME)) > 0
    with pytest.raises(fc.TlsError, match="does not name '127.0.0.1' \\(set tls.server_name"):
        await _round_trip(server.address, TlsConfig(ca=pki.ca_file))


async def test_client_over_tls_on_a_unix_socket(pki: Pki, serve: Start) -> None:
    """Over a unix socket the name checked is localhost, unless server_name says otherwise."""
    sockdir = tempfile.mkdtemp(prefix="fp-")
    try:
        server = await serve(pki.server(), bind=f"unix:{sockdir}/tls.sock")
        assert await _round_trip(server.address, TlsConfig(ca=pki.ca_file)) > 0
        with pytest.raises(fc.TlsError, match=f"does not name '{OTHER_NAME}' \\(tls.server_name\\)"):
            await _round_trip(server.address, TlsConfig(ca=pki.ca_file, server_name=OTHER_NAME))
    finally:
        for name in os.listdir(sockdir):
            os.unlink(os.path.join(sockdir, name))
        os.rmdir(sockdir)


# ---------------------------------------------------------------- each failure, named


#: id -> (server: "tls" | "expired" | "mtls" | "plaintext", client tls, words of the cause)
FAILURES: dict[str, tuple[str, Callable[[Pki], Any], str]] = {
    "wrong-ca": ("tls", lambda p: TlsConfig(ca=p.other_ca_file),
                 "the coordinator's certificate is not signed by a CA in tls.ca ({other_ca}) "
                 "(CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate)"),
    "system-roots": ("tls", lambda p: TlsConfig(),
                     "the coordinator's certificate is not signed by a CA in "),
    "expired": ("expired", lambda p: TlsConfig(ca=p.ca_file),
                "the coordinator's certificate has expired (CERTIFICATE_VERIFY_FAILED: certificate has expired)"),
    "name-mismatch": ("tls", lambda p: TlsConfig(ca=p.ca_file, server_name="other.example"),
                      "the coordinator's certificate does not name 'other.example' (tls.server_name)"),
    "client-cert-required": ("mtls", lambda p: TlsConfig(ca=p.ca_file),
                             "the coordinator requires a client certificate, and none was given: "
                             "set tls.cert and tls.key"),
    "client-cert-other-ca": ("mtls", lambda p: TlsConfig(ca=p.ca_file, cert=p.other_client.cert,
                                                         key=p.other_client.key),
                             "the coordinator refused the client certificate in tls.cert ({other_cert})"),
    "opaque-credentials-without-client-cert": (
        "mtls", lambda p: grpc.ssl_channel_credentials(Path(p.ca_file).read_bytes()),
        "it requires a client certificate, or does not trust the one in the given credentials"),
    "plaintext-client-to-tls": ("tls", lambda p: None,
                                "plaintext connection to {address} failed: the coordinator speaks TLS, "
                                "and this client connects without it (give tls)"),
    "tls-client-to-plaintext": ("plaintext", lambda p: TlsConfig(ca=p.ca_file),
                                "the coordinator does not speak TLS (WRONG_VERSION_NUMBER)"),
}


async def _failing_server(kind: str, pki: Pki, serve: Start) -> LockServer:
    credentials = {"tls": pki.server(), "expired": pki.server(pki.expired),
                   "mtls": pki.server(client_ca=pki.ca), "plaintext": None}[kind]
    return await serve(credentials)


@pytest.mark.parametrize("case", list(FAILURES))
async def test_connect_when_tls_fails_raises_tls_error_at_once(case: str, pki: Pki, serve: Start) -> None:
    """Each TLS failure is a TlsError (an Unavailable) naming the address and the cause, well before connect_timeout."""
    kind, make_tls, words = FAILURES[case]
    server = await _failing_server(kind, pki, serve)
    client = fc.AsyncLockClient(server.address, tls=make_tls(pki), connect_timeout=PATIENT)
    started = time.monotonic()
    with pytest.raises(fc.TlsError) as info:
        await client.connect()
    elapsed = time.monotonic() - started
    await client.close()
    err = info.value
    assert isinstance(err, fc.Unavailable)
    assert elapsed < PROMPT, (case, elapsed, str(err))
    assert err.address == server.address and server.address in str(err)
    expected = words.format(other_ca=pki.other_ca_file, other_cert=pki.other_client.cert, address=server.address)
    assert expected in str(err), (case, str(err))
    assert err.cause is not None and err.cause in str(err)


async def test_sync_client_when_tls_fails_raises_tls_error(pki: Pki, serve: Start) -> None:
    """LockClient raises the same TlsError from its first call."""
    server = await serve(pki.server(client_ca=pki.ca))

    def sync() -> None:
        with fc.LockClient(server.address, tls=TlsConfig(ca=pki.ca_file), connect_timeout=PATIENT) as client:
            client.describe(_name())

    with pytest.raises(fc.TlsError, match="requires a client certificate"):
        await asyncio.wait_for(asyncio.to_thread(sync), PROMPT)


async def test_connect_when_every_address_fails_tls_names_each(pki: Pki, serve: Start) -> None:
    """With several addresses, TlsError comes once every one has failed its handshake, naming each."""
    first = await serve(pki.server(pki.expired))
    second = await serve(pki.server(client_ca=pki.ca))
    client = fc.AsyncLockClient([first.address, second.address], tls=TlsConfig(ca=pki.ca_file),
                                connect_timeout=PATIENT)
    with pytest.raises(fc.TlsError) as info:
        await asyncio.wait_for(client.connect(), PROMPT)
    await client.close()
    text = str(info.value)
    assert text.startswith("TLS handshake failed with every coordinator: ")
    assert f"{first.address}: the coordinator's certificate has expired" in text
    assert f"{second.address}: the coordinator requires a client certificate" in text


async def test_connect_when_one_address_fails_tls_uses_the_next(pki: Pki, serve: Start) -> None:
    """An address whose handshake fails is skipped: the client works through the next one."""
    bad = await serve(pki.server(pki.expired))
    good = await serve(pki.server())
    async with fc.AsyncLockClient([bad.address, good.address], tls=TlsConfig(ca=pki.ca_file),
                                  connect_timeout=PATIENT) as client:
        assert (await asyncio.wait_for(client.describe(_name()), PROMPT)).held is False
        assert client.address == good.address


async def test_connect_when_tls_fails_and_another_address_is_down_is_unavailable(pki: Pki, serve: Start) -> None:
    """A TLS failure next to an address that refuses is no certain answer: Unavailable at connect_timeout, naming it."""
    bad = await serve(pki.server(pki.expired))
    client = fc.AsyncLockClient([bad.address, refused_address()], tls=TlsConfig(ca=pki.ca_file),
                                connect_timeout=1.5)
    with pytest.raises(fc.Unavailable) as info:
        await client.connect()
    await client.close()
    assert not isinstance(info.value, fc.TlsError)
    assert f"TLS handshake with {bad.address} failed: the coordinator's certificate has expired" in str(info.value)


class RacedTransport(_transport.Transport):
    """A fail-fast transport whose first connection to ``late`` fails before its wait begins.

    The race a loaded machine makes: gRPC finishes (and fails) the handshake
    between the channel's creation and the wait's first look at it, so the
    wait sees a failure it cannot tell from a stale one.
    """

    def __init__(self, *args: Any, late: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.late = late
        self.raced = False

    async def _wait_ready(self, channel: grpc.aio.Channel, address: str, timeout: float, *, once: bool) -> str:
        if address == self.late and not self.raced:
            self.raced = True
            state = channel.get_state(try_to_connect=True)
            async with asyncio.timeout(PROMPT):
                while state != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                    await channel.wait_for_state_change(state)
                    state = channel.get_state(try_to_connect=True)
        return await super()._wait_ready(channel, address, timeout, once=once)


async def test_fail_fast_call_when_a_handshake_failed_before_its_wait_names_the_tls_cause(pki: Pki,
                                                                                            serve: Start) -> None:
    """One address down, the other's handshake failed early: the down one counts once, the TLS cause is said.

    Before, the early failure sent the rotation back to the down address, which counted as a second address
    failed: "every connection attempt failed", the TLS cause lost (a CLI test failed so in a fresh-clone CI run).
    """
    mtls = await serve(pki.server(client_ca=pki.ca))
    transport = RacedTransport([refused_address(), mtls.address], connect_timeout=PATIENT, fail_fast=True,
                               security=_tls.security(TlsConfig(ca=pki.ca_file)), late=mtls.address)
    transport.open()
    request = pb.DescribeRequest(name=_name())
    try:
        with pytest.raises(fc.FencepostError) as info:
            await asyncio.wait_for(transport.call("Describe", lambda left: (request, PROMPT), until=None,
                                                  idempotent=True), 2 * PROMPT)
    finally:
        await transport.close()
    assert transport.raced
    assert "requires a client certificate, and none was given" in str(info.value), info.value


# ---------------------------------------------------------------- the keepalive stream


class Observed(fc.AsyncLockClient):
    """Sets ``answered`` when a message arrives on the KeepAlive stream (the client's observation hook)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answered = asyncio.Event()

    def _on_response(self, response: Any) -> None:
        self.answered.set()
        super()._on_response(response)


class Records(logging.Handler):
    """Collects the fencepost.client log records; ``wait`` blocks until a predicate holds over them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.changed.set()

    def messages(self, level: int, words: str) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level and words in r.getMessage()]

    async def wait(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


async def test_stream_when_tls_breaks_keeps_retrying_logs_once_and_recovers(pki: Pki, serve: Start) -> None:
    """The coordinator comes back with a certificate of another CA: the stream retries, warns once, calls fail
    at once with TlsError; once the certificate is fixed the stream reconnects and the hold was never lost."""
    server = await serve(pki.server())
    address = server.address
    records = Records()
    logger = logging.getLogger("fencepost.client")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        async with Observed(address, tls=TlsConfig(ca=pki.ca_file), connect_timeout=PATIENT) as client:
            handle = await client.acquire(_name(), ttl=10.0, timeout=5.0)
            await asyncio.wait_for(client.answered.wait(), PROMPT)
            await server.stop()
            client.answered.clear()
            await server.start(address, pki.server(pki.other_client))  # signed by another CA

            def broken_three_times() -> bool:
                return len(records.messages(logging.DEBUG, "unable to get local issuer certificate")) >= 3

            await records.wait(broken_three_times, 8.0)
            warnings = records.messages(logging.WARNING, "keepalive stream cannot be opened")
            assert len(warnings) == 1, warnings
            assert f"TLS handshake with {address} failed: the coordinator's certificate is not signed" in warnings[0]

            started = time.monotonic()
            with pytest.raises(fc.TlsError, match="is not signed by a CA in tls.ca"):
                await client.describe(handle.name)
            assert time.monotonic() - started < PROMPT

            await server.stop()
            await server.start(address, pki.server())
            # At once: the failure gRPC still reports until its reconnect backoff ends is not trusted.
            assert (await client.describe(handle.name)).holder_token == handle.token
            await asyncio.wait_for(client.answered.wait(), 8.0)
            assert not handle.lost.is_set(), handle.lost_reason
            await handle.release()
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
