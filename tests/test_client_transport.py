"""Unit tests of the transport and the client's lifecycle, without a coordinator.

Behaviour against a real coordinator is tested elsewhere (test_locks.py, tests/faults/).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from concurrent import futures

import grpc
import pytest

import fencepost.client as fc
from fencepost.client._transport.transport import Transport
from fencepost.client.handle import AsyncLockHandle
from fencepost.client.v1 import lock_pb2 as pb

from . import tls_pki
from .client_fakes import (
    UNUSED_ADDRESS,
    NOT_HOLDER,
    Parts,
)
from .tls_pki import Pki

pki = tls_pki.pki  # the fixture


# ---------------------------------------------------------------- the transport


def refused_address() -> str:
    """A 127.0.0.1 address that refuses connections (a port bound, never listened on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_call_when_fail_fast_and_every_address_refuses() -> None:
    """A fail-fast transport tries each address once and gives up well before its connect_timeout."""
    transport = Transport([refused_address(), refused_address()], connect_timeout=30.0, fail_fast=True)
    transport.open()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(fc.Unavailable) as info:
            await transport.call("Describe", lambda _left: (pb.DescribeRequest(name="n"), 1.0), until=None,
                                 idempotent=True, name="n")
    finally:
        await transport.close()
    assert loop.time() - started < 15.0
    assert (info.value.name, info.value.reason, info.value.code) == ("n", None, None)
    with pytest.raises(fc.FencepostError, match="closed"):
        await transport.call("Describe", lambda _left: (pb.DescribeRequest(name="n"), 1.0), until=None,
                             idempotent=True)


# ---------------------------------------------------------------- the client


async def test_lock_when_cancel_on_lost_fires(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside lock(), a cancellation by cancel_on_lost surfaces as LeaseLost and the task is not left cancelling."""
    parts = Parts()
    handle = parts.hold(parts.lease())
    client = fc.AsyncLockClient(UNUSED_ADDRESS)

    async def fake_acquire(name: str, ttl: float = 10.0, timeout: float | None = None, **_: Any) -> AsyncLockHandle:
        return handle

    monkeypatch.setattr(client, "acquire", fake_acquire)
    with pytest.raises(fc.LeaseLost) as info:
        async with client.lock("a") as h:
            h.cancel_on_lost()
            asyncio.get_running_loop().call_soon(parts.pool.lose_hold, h, NOT_HOLDER)
            await asyncio.Event().wait()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert info.value.reason == NOT_HOLDER and handle.released
    assert parts.transport.calls.empty()  # the server ended the hold: no Release is sent for it


async def test_connect_when_no_coordinator_listens() -> None:
    """connect() raises Unavailable after connect_timeout, leaves no task behind, and the client is closed."""
    client = fc.AsyncLockClient(UNUSED_ADDRESS, connect_timeout=0.3)
    with pytest.raises(fc.Unavailable):
        await client.connect()
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("fencepost")] == []
    with pytest.raises(fc.FencepostError):
        await client.acquire("n")


# ---------------------------------------------------------------- the sync client's private loop, closed


#: Run in a subprocess (argv: seconds, a refused address, an mTLS coordinator's
#: address, its CA file): sync clients made, failing to connect (refused; TLS
#: handshake refused for want of a client certificate; a bad TLS file) and
#: closed, over and over, as in a user's retry loop.
_CONNECT_FAILURES_SCRIPT = """
import sys, time
import fencepost.client as fc

seconds, refused, mtls, ca_file = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
tls = fc.TlsConfig(ca=ca_file)
errors = set()
end = time.monotonic() + seconds
while time.monotonic() < end:
    for addresses, config in (([refused], None), ([refused, mtls], tls), ([mtls], tls)):
        client = fc.LockClient(addresses, tls=config, connect_timeout=0.05)
        try:
            client.acquire("x", ttl=5, timeout=1)
        except (fc.Unavailable, fc.TlsError) as err:
            errors.add(type(err).__name__)
        finally:
            client.close()
    try:
        fc.LockClient([refused, mtls], tls=fc.TlsConfig(ca=ca_file + ".missing"))
    except fc.InvalidArgument:
        errors.add("InvalidArgument")
print(" ".join(sorted(errors)))
"""


def test_sync_client_close_when_connects_fail(pki: Pki) -> None:
    """Sync clients whose connects fail, closed in a loop, leave gRPC nothing to deliver to their closed loops.

    gRPC answers a connectivity watch on the watching loop a few milliseconds
    after its channel is closed; a loop closed before the answer made grpc.aio
    print "Exception in callback PollerCompletionQueue._handle_events ...
    RuntimeError: Event loop is closed" from the next client's loop.
    """
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_secure_port("127.0.0.1:0", pki.server(client_ca=pki.ca))
    server.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CONNECT_FAILURES_SCRIPT, "4", refused_address(), f"127.0.0.1:{port}", pki.ca_file],
            capture_output=True, text=True, timeout=60)
    finally:
        server.stop(0)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["InvalidArgument", "TlsError", "Unavailable"], proc.stdout
    for words in ("Event loop is closed", "Exception in callback", "never awaited", "Traceback"):
        assert words not in proc.stderr, proc.stderr
